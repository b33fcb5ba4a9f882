// The checksum of a tier slot: xxh3-64 streamed over the slot's pieces (the
// digest of XXH3_64bits over their concatenation). Where the CPU has AVX2 it
// runs xxHash's own AVX2 code, compiled into slot_hash_avx2.cpp: distro
// builds of libxxhash target baseline SSE2, where hashing a block cost about
// as much as copying it, and the tiers do both on every offload and load.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedkv {

class SlotHash {
 public:
  SlotHash();  // reset
  void update(const void* p, size_t n);
  uint64_t digest() const;
  // True when update() runs the AVX2 code (tests, the bench's header).
  static bool avx2();

  // Room for either implementation's XXH3_state_t (576 bytes, 64-aligned
  // in xxHash 0.8; each side static_asserts its own fits).
  static constexpr size_t kStateBytes = 1024;

 private:
  alignas(64) unsigned char state_[kStateBytes];
};

namespace slot_hash_detail {
// The AVX2 build (slot_hash_avx2.cpp); null outside x86-64 GCC/clang.
struct Impl {
  void (*reset)(void* state);
  void (*update)(void* state, const void* p, size_t n);
  uint64_t (*digest)(const void* state);
};
const Impl* avx2_impl();
}  // namespace slot_hash_detail

}  // namespace pagedkv
