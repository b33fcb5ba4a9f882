#include "tier/slot_hash.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t's size
#include <xxhash.h>

namespace pagedkv {

namespace {

using slot_hash_detail::Impl;

static_assert(sizeof(XXH3_state_t) <= SlotHash::kStateBytes && alignof(XXH3_state_t) <= 64,
              "SlotHash's state buffer is too small for XXH3_state_t");

void lib_reset(void* s) { XXH3_64bits_reset(static_cast<XXH3_state_t*>(s)); }
void lib_update(void* s, const void* p, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(s), p, n);
}
uint64_t lib_digest(const void* s) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(s));
}

const Impl& pick() {
  static const Impl lib{lib_reset, lib_update, lib_digest};
  static const Impl* chosen = [] {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    // __builtin_cpu_supports also checks that the OS saves the ymm state.
    // The CPU before the AVX2 unit's code, which may use AVX2 itself.
    if (__builtin_cpu_supports("avx2"))
      if (const Impl* a = slot_hash_detail::avx2_impl()) return a;
#endif
    return &lib;
  }();
  return *chosen;
}

}  // namespace

SlotHash::SlotHash() { pick().reset(state_); }
void SlotHash::update(const void* p, size_t n) { pick().update(state_, p, n); }
uint64_t SlotHash::digest() const { return pick().digest(state_); }
bool SlotHash::avx2() { return &pick() == slot_hash_detail::avx2_impl(); }

}  // namespace pagedkv
