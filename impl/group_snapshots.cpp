// Recurrent state snapshots at block boundaries inside a step's query
// chunks (PKV_GROUP_SNAPSHOT_EVERY_BLOCK, pagedkv/groups.h), after vLLM's
// Mamba prefix caching, which keeps a state per block: a prompt prefilled in
// one chunk otherwise leaves a snapshot only where its appends start, so a
// later request sharing part of it hits no recurrent state. A chunked scan
// (Mamba2 SSD, chunked linear attention) can emit the state after any token;
// the plan names, per sequence, the query rows ending a block and a slot for
// each, and the commit caches those slots as the existing snapshots are
// cached: keyed by their block's chained hash, evictable, at the free tail.
#include <unordered_set>

#include "group_plan.h"

namespace pagedkv {

uint64_t GroupBatch::plan_snapshots(const std::vector<GroupPool::Seq*>& live,
                                    const uint32_t* query_counts) {
  GroupPool& p = *pool_;
  const uint64_t bs = p.opts_.block_size;
  const size_t num_seqs = live.size();
  uint64_t total = 0;
  for (uint32_t g = 0; g < p.num_groups(); ++g) {
    if (!p.recurrent(g)) continue;
    Arrays& a = groups_[g];
    a.snap_ptr.assign(num_seqs + 1, 0);  // zeros where the group keeps none
    if (!p.groups_[g].snapshot_every_block || !p.opts_.enable_prefix_caching) continue;
    // Two sequences of one plan may compute the same prefix: one slot per
    // hash, as vLLM caches no duplicate block.
    std::unordered_set<GroupPool::Key, GroupPool::KeyHasher> planned(16, p.cache_.hash_function());
    for (size_t i = 0; i < num_seqs; ++i) {
      const GroupPool::Seq& s = *live[i];
      const uint64_t n = s.tokens.size(), start = n - query_counts[i];
      // Boundaries k * bs with start < k * bs <= n: the state after token
      // k * bs - 1 (one at start was kept when the append began there).
      for (uint64_t k = start / bs + 1; k * bs <= n && k <= s.hashes.size(); ++k) {
        const BlockHash& key = s.hashes[k - 1];
        if (p.lookup(key, g) >= 0 || !planned.insert(GroupPool::Key{key, g}).second) continue;
        a.snap_rows.push_back(int64_t(qptr_[i]) + int64_t(k * bs - 1 - start));
        a.snap_keys.push_back(key);
        a.snap_seq.push_back(uint32_t(i));
      }
      a.snap_ptr[i + 1] = int32_t(a.snap_rows.size());
    }
    a.snap_blocks.assign(a.snap_rows.size(), 0);  // taken by take_snapshots
    total += a.snap_rows.size();
  }
  return total;
}

void GroupBatch::take_snapshots() {
  GroupPool& p = *pool_;
  for (uint32_t g = 0; g < groups_.size(); ++g)
    for (int32_t& b : groups_[g].snap_blocks) {
      b = p.allocate(g);
      ++p.plan_hold_[b];
    }
}

void GroupBatch::keep_snapshots() {
  GroupPool& p = *pool_;
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    Arrays& a = groups_[g];
    // A sequence's deepest snapshot reaches the free tail first, so it is
    // evicted before the shorter prefixes that more requests share (as a
    // sequence frees its blocks tail first).
    for (size_t i = 0; i + 1 < a.snap_ptr.size(); ++i)
      for (int32_t j = a.snap_ptr[i + 1]; j-- > a.snap_ptr[i];) {
        const int32_t b = a.snap_blocks[j];
        // A sequence freed or truncated since prepare is skipped, as its
        // computed count is: counting less is always safe.
        auto it = p.seqs_.find(seqs_[i]);
        const bool alive = it != p.seqs_.end() && it->second.epoch == epochs_[i];
        if (alive && p.lookup(a.snap_keys[j], g) < 0) {
          try {
            p.cache(b, g, a.snap_keys[j]);
          } catch (...) {  // out of memory: the slot goes back uncached
            p.key_[b] = BlockHash{};
          }
        }
        --p.plan_hold_[b];
        p.release(b);
      }
  }
}

void GroupBatch::drop_snapshots() {
  GroupPool& p = *pool_;
  for (uint32_t g = 0; g < groups_.size(); ++g)
    for (int32_t b : groups_[g].snap_blocks) {
      --p.plan_hold_[b];
      p.release(b);
    }
}

}  // namespace pagedkv
