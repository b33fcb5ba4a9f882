#include "pool_tag.h"

#include <bitset>
#include <mutex>

#include "error.h"

namespace pagedkv {

namespace {

struct Registry {
  std::mutex mu;
  std::bitset<65536> live;  // tag 0 is never handed out
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
    if (!r.live[t]) {
      r.live[t] = true;
      value_ = uint16_t(t);
      return;
    }
  }
  fail(Errc::kOutOfMemory, "65535 pools are live, the most whose sequence ids can be told apart");
}

PoolTag::~PoolTag() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.live[value_] = false;
}

}  // namespace pagedkv
