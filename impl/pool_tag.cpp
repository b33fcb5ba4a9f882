#include "pool_tag.h"

#include <bitset>
#include <mutex>
#include <vector>

#include "error.h"

namespace pagedkv {

namespace {

struct Registry {
  std::mutex mu;
  std::bitset<65536> taken;      // live, or retired; tag 0 is never handed out
  std::vector<uint32_t> floors;  // by tag: generations handed out so far (grows as tags are)
  uint32_t next = 1;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: pools may outlive statics
  return *r;
}

}  // namespace

PoolTag::PoolTag() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (uint32_t tries = 0; tries < 65535; ++tries) {
    const uint32_t t = r.next;
    r.next = t == 65535 ? 1 : t + 1;
    if (!r.taken[t]) {
      if (r.floors.size() <= t) r.floors.resize(t + 1, 0);  // may throw: before any change
      r.taken[t] = true;
      value_ = uint16_t(t);
      floor_ = r.floors[t];
      return;
    }
  }
  fail(Errc::kOutOfMemory,
       "no pool tag is free: 65535 pools are live (or tags retired), the most whose sequence "
       "ids can be told apart");
}

PoolTag::~PoolTag() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const uint32_t floor = used_ > floor_ ? used_ : floor_;
  r.floors[value_] = floor;
  // Retired: the next holder's ids would start too close to the top of the
  // generation range, where slots are retired after one use.
  r.taken[value_] = floor >= kRetireAt;
}

}  // namespace pagedkv
