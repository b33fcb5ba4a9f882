// The 16-bit tag each live pool puts in its sequence ids (sequence.h), so
// that an id used on another pool is unknown there. Tags are handed out
// round-robin, skipping live ones: no two live pools share a tag, and a
// destroyed pool's tag comes back only after every other tag was handed out
// since (65535 pool creations later).
#pragma once

#include <cstdint>

namespace pagedkv {

class PoolTag {
 public:
  // Throws Error(kOutOfMemory) when 65535 pools are live.
  PoolTag();
  ~PoolTag();
  PoolTag(const PoolTag&) = delete;
  PoolTag& operator=(const PoolTag&) = delete;

  uint16_t value() const { return value_; }

 private:
  uint16_t value_;
};

}  // namespace pagedkv
