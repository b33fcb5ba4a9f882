// What the two KV provenance models (provenance_test.cpp, single-group
// pools; provenance_groups_test.cpp, multi-group pools) share: the hash that
// gives each token's K/V its identity, a sequence's extra keys, and the
// random prompts and keys they drive pools with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace provenance {

inline uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

struct Key {
  uint64_t lora = 0;
  int salt = 0;  // 0 none, else "s<salt>"
};

// One of bases (prompts that share prefixes), sometimes cut short, and up
// to two blocks of tokens 0..2 after it (so that later blocks repeat too).
// r(n): a random number below n (0 for n = 0).
template <class R>
std::vector<int32_t> random_prompt(R&& r, const std::vector<std::vector<int32_t>>& bases,
                                   uint32_t bs) {
  std::vector<int32_t> p = bases[r(bases.size())];
  if (r(3) == 0) p.resize(std::min<size_t>(p.size(), 1 + r(p.size() + 1)));
  const size_t extra = r(2 * bs + 1);
  for (size_t i = 0; i < extra; ++i) p.push_back(int32_t(r(3)));
  if (p.empty()) p.push_back(1);
  return p;
}

// No extra keys, a LoRA id, a salt or both (a quarter of the time each).
template <class R>
Key random_key(R&& r) {
  Key k;
  if (r(4) == 0) k.lora = 1 + r(2);
  if (r(4) == 0) k.salt = 1 + int(r(2));
  return k;
}

}  // namespace provenance
