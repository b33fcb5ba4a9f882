// The longest prefix hit that every group of a GroupPool can serve, after
// vLLM's HybridKVCacheCoordinator.find_longest_cache_hit and the per-kind
// managers' find_longest_cache_hit.
#include "kv_groups.h"

namespace pagedkv {

uint64_t GroupPool::hit_of_group(uint32_t g, const std::vector<BlockHash>& hashes,
                                 uint64_t max_blocks, std::vector<int32_t>* out) const {
  out->clear();
  const GroupSpec& spec = groups_[g];
  if (spec.kind == GroupKind::kRecurrent) {
    // A state snapshot at exactly the hit point: the rightmost one.
    for (uint64_t i = max_blocks; i-- > 0;) {
      const int32_t b = lookup(hashes[i], g);
      if (b < 0) continue;
      out->assign(i, 0);
      out->push_back(b);
      return i + 1;
    }
    return 0;
  }
  if (spec.kind != GroupKind::kSlidingWindow) {
    // Full attention (and MLA): every leading block must be cached.
    for (uint64_t i = 0; i < max_blocks; ++i) {
      const int32_t b = lookup(hashes[i], g);
      if (b < 0) break;
      out->push_back(b);
    }
    return out->size();
  }
  // A window of w tokens: a hit of k blocks needs the ceil((w - 1) / bs)
  // blocks before position k * bs (the keys the next token sees). Searched
  // from the right, so the longest such run wins; the leading run counts
  // even if shorter (nothing before it is needed).
  const uint64_t bs = opts_.block_size;
  const uint64_t contiguous = (uint64_t(spec.sliding_window) - 1 + bs - 1) / bs;
  // A window of one token needs no block, and vLLM's SlidingWindowManager
  // caches none of its blocks (reachable_block_mask keeps no tail) and so
  // never hits: such a group serves no hit (cache_computed caches nothing
  // of it either), as in vLLM.
  if (contiguous == 0) return 0;
  uint64_t run = 0;
  for (uint64_t i = max_blocks; i-- > 0;) {
    if (lookup(hashes[i], g) < 0) {
      run = 0;
      continue;
    }
    if (++run >= contiguous) {
      out->assign(i, 0);
      for (uint64_t j = i; j < i + run; ++j) out->push_back(lookup(hashes[j], g));
      return out->size();
    }
  }
  for (uint64_t j = 0; j < run; ++j) out->push_back(lookup(hashes[j], g));
  return run;
}

uint64_t GroupPool::find_hit(const std::vector<BlockHash>& hashes, uint64_t max_blocks,
                             std::vector<std::vector<int32_t>>* out) const {
  out->assign(groups_.size(), {});
  uint64_t hit = std::min<uint64_t>(max_blocks, hashes.size());
  // Each group's answer is the longest hit it serves at or below the
  // current length, so the length only falls; it stops when every group
  // serves it (at most one pass per distinct length).
  for (;;) {
    uint64_t cur = hit;
    for (uint32_t g = 0; g < groups_.size(); ++g) cur = hit_of_group(g, hashes, cur, &(*out)[g]);
    if (cur == hit) return hit;
    hit = cur;
  }
}

}  // namespace pagedkv
