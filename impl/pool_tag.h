// The 16-bit tag each live pool puts in its sequence ids (sequence.h), so
// that an id used on another pool is unknown there. Tags are handed out
// round-robin, skipping live ones: no two live pools share a tag. A
// destroyed pool's tag comes back (65535 pool creations later), and its
// stale ids must not name the new holder's sequences: each tag remembers
// the highest generation (bits 24..47 of an id) any holder handed out, and
// the next holder's ids start above it. A tag whose generations are half
// used up is never handed out again.
#pragma once

#include <cstdint>

namespace pagedkv {

class PoolTag {
 public:
  // Throws Error(kOutOfMemory) when no tag is free (65535 pools live).
  PoolTag();
  ~PoolTag();
  PoolTag(const PoolTag&) = delete;
  PoolTag& operator=(const PoolTag&) = delete;

  uint16_t value() const { return value_; }
  // The first generation this holder may use: every id an earlier holder
  // of the tag handed out has a lower one.
  uint32_t first_generation() const { return floor_ + 1; }
  // The highest generation this holder handed out, told before it goes.
  void note_generation(uint32_t gen) {
    if (gen > used_) used_ = gen;
  }

  // A tag is retired once its next holder would start past this.
  static constexpr uint32_t kRetireAt = 1u << 23;

 private:
  uint16_t value_;
  uint32_t floor_ = 0;  // generations earlier holders used
  uint32_t used_ = 0;
};

}  // namespace pagedkv
