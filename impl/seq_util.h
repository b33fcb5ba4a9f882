// Small helpers shared by the pool's sequence operations (kv_pool_seq.cpp,
// kv_pool_batch.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

namespace pagedkv::seq_util {

constexpr uint64_t kMaxSeqTokens = uint64_t(std::numeric_limits<int32_t>::max());
// pkv_seq_reserve makes room for at most this many tokens (64 MiB of ids):
// a sequence longer than that grows in amortised steps anyway, and a count
// near kMaxSeqTokens must not ask for gigabytes up front.
constexpr uint64_t kMaxReserveTokens = uint64_t(1) << 24;

inline std::string str(uint64_t v) { return std::to_string(v); }

// Amortised growth: reserve() alone would reallocate on every append.
// The check inline (batched calls grow every sequence's vectors per step),
// the reallocation out of line.
template <class V>
[[gnu::noinline, gnu::cold]] void grow_slow(V& v, size_t need) {
  v.reserve(std::max(need, v.capacity() * 2));
}
template <class V>
inline void grow(V& v, size_t need) {
  if (__builtin_expect(need > v.capacity(), 0)) grow_slow(v, need);
}

}  // namespace pagedkv::seq_util
