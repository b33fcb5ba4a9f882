// xxHash's XXH3 compiled for AVX2 inside a baseline x86-64 library (its
// header-only mode: every function static here, nothing clashes with
// libxxhash), called only after a run-time CPU check (slot_hash.cpp).
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tier/slot_hash.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif

#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#define XXH_VECTOR 2  // XXH_AVX2 (defined by the header itself)
#include <xxhash.h>

namespace pagedkv {
namespace slot_hash_detail {
namespace {

static_assert(sizeof(XXH3_state_t) <= SlotHash::kStateBytes && alignof(XXH3_state_t) <= 64,
              "SlotHash's state buffer is too small for XXH3_state_t");

void reset(void* s) { XXH3_64bits_reset(static_cast<XXH3_state_t*>(s)); }
void update(void* s, const void* p, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(s), p, n);
}
uint64_t digest(const void* s) { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(s)); }

}  // namespace

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

const Impl* avx2_impl() {
  static const Impl impl{reset, update, digest};
  return &impl;
}

}  // namespace slot_hash_detail
}  // namespace pagedkv

#else

namespace pagedkv {
namespace slot_hash_detail {
const Impl* avx2_impl() { return nullptr; }
}  // namespace slot_hash_detail
}  // namespace pagedkv

#endif
