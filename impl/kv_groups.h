// Several KV groups in one pool (pkv_pool_create_groups; issue 19), after
// vLLM's hybrid allocator: every group draws block ids from ONE budget (a
// block id serves one group at a time), each sequence has one block table
// per group, and the prefix cache is keyed by (block hash, group) like vLLM's
// BlockHashWithGroupId, with the same chained hash for every group.
//
// Storage scheme (reported, not allocated: these pools are manager only):
// as vLLM, a block id's bytes hold one group's pages for all of that
// group's layers, so groups alias one arena and a block costs the largest
// group's page; bytes_per_block() is that, and a sequence's memory is the
// blocks it holds in all groups times it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "free_block_queue.h"
#include "hash/block_hash.h"
#include "kv_pool.h"

namespace pagedkv {

class GroupBatch;
struct GroupPageTable;

// Limits of pkv_pool_create_groups: groups per pool, and model layers per
// group (as pkv_pool_options.num_layers of a single-group pool).
inline constexpr uint32_t kMaxGroups = 64;
inline constexpr uint32_t kMaxGroupLayers = 65536;

// Values equal PKV_GROUP_*.
enum class GroupKind : uint32_t { kFull = 0, kSlidingWindow = 1, kMla = 2, kRecurrent = 3 };

struct GroupSpec {
  GroupKind kind = GroupKind::kFull;
  uint32_t num_layers = 1;
  std::vector<uint32_t> layer_ids;  // empty = not given
  uint32_t num_kv_heads = 0, head_dim = 0;
  uint32_t sliding_window = 0;              // tokens, kSlidingWindow only
  uint32_t kv_lora_rank = 0, rope_dim = 0;  // kMla only
  uint64_t state_bytes = 0;                 // kRecurrent: one layer's state
  DType dtype = DType::kBF16;
  // kRecurrent: step plans give a snapshot slot at every block boundary
  // inside each query chunk (PKV_GROUP_SNAPSHOT_EVERY_BLOCK), so a prompt
  // prefilled in one chunk can be hit at any of them.
  bool snapshot_every_block = false;
};

// Bytes one block of the group takes over all its layers: K and V pages
// (heads x head_dim each), one latent of kv_lora_rank + rope_dim (MLA, no
// V), or one state (recurrent: a block is a state slot, whatever the tokens).
uint64_t group_block_bytes(const GroupSpec& g, uint32_t block_size);

struct GroupStats {
  uint64_t num_used_blocks = 0;    // blocks of this group held by sequences
  uint64_t num_cached_blocks = 0;  // (hash, group) entries in the prefix cache
  uint64_t num_null_entries = 0;   // table entries the sliding window released
  uint64_t bytes_per_block = 0;    // this group's page over its layers
};

class GroupPool {
 public:
  // Validates (Error kInvalidArgument naming base->field or groups[i].field).
  static std::shared_ptr<GroupPool> create(const PoolOptions& base, std::vector<GroupSpec> groups);

  const PoolOptions& options() const { return opts_; }
  uint32_t num_groups() const { return uint32_t(groups_.size()); }
  const GroupSpec& group(uint32_t g) const { return groups_[g]; }
  uint64_t bytes_per_block() const { return bytes_per_block_; }
  // The group holding model layer `model_layer` and its index among that
  // group's layers (layer_ids, or numbered through the groups in order).
  bool layer(uint32_t model_layer, uint32_t* group, uint32_t* index) const;
  uint64_t num_kv_scales() const { return 0; }  // no storage

  SeqId seq_create(const SeqOptions& o);
  // Longest prefix every group can serve (see find_hit), capped so one token
  // is left to compute; attaches those blocks to an empty sequence.
  uint64_t match_prefix(SeqId id, const int32_t* tokens, uint64_t n);
  void append(SeqId id, const int32_t* tokens, uint64_t n, uint32_t lookahead);
  uint64_t blocks_needed(SeqId id, uint64_t n, uint32_t lookahead) const;
  SeqId fork(SeqId parent);
  void truncate(SeqId id, uint64_t num_tokens);
  // Room in the sequence's vectors for num_tokens tokens (pkv_seq_reserve).
  void reserve(SeqId id, uint64_t num_tokens);
  void free(SeqId id);
  SeqInfo seq_info(SeqId id) const;
  // Copies the sequence's table of group g into out (cap entries); returns
  // its length. Released window entries read as the null block 0.
  uint64_t block_table(SeqId id, uint32_t g, int32_t* out, uint64_t cap) const;
  // Group 0's (pkv_seq_get_block_table on a multi-group pool).
  uint64_t block_table(SeqId id, int32_t* out, uint64_t cap) const {
    return block_table(id, 0, out, cap);
  }
  PoolStats stats() const;
  GroupStats group_stats(uint32_t g) const;
  // Copy-on-write copies (src, dst) recorded for group g since the last
  // call, oldest first, for the engine to execute before the next step.
  // Returns their count; copies them out and forgets them only if it is at
  // most cap.
  uint64_t take_copies(uint32_t g, int32_t* src, int32_t* dst, uint64_t cap);
  // Invariants (ref counts = table references, free queue = ref 0 blocks,
  // cache entries point at blocks of their group holding their hash); ""
  // when they all hold.
  std::string check() const;
  std::string validate() const { return check(); }  // as Pool::validate
  // pkv_pool_destroy: plans that still hold the pool fail cleanly after it.
  void close();

 private:
  friend class GroupBatch;  // step plans (group_plan.cpp)
  // The longest hit, in blocks, of hashes[0, max_blocks) that every group
  // can serve from the cache, as vLLM's HybridKVCacheCoordinator computes
  // it: each group gives the longest hit it can serve at or below the
  // current length, until a fixed point. out[g] receives the group's blocks
  // (0 = null for window entries before the window). Caller holds mu_.
  uint64_t find_hit(const std::vector<BlockHash>& hashes, uint64_t max_blocks,
                    std::vector<std::vector<int32_t>>* out) const;

  struct Seq {
    HashContext ctx;
    int32_t priority = 0;
    std::vector<int32_t> tokens;
    std::vector<BlockHash> hashes;            // of the full blocks
    std::vector<std::vector<int32_t>> table;  // per group
    std::vector<uint64_t> num_null;           // per group: leading released entries
    // Recurrent groups: the table holds the live state slot alone; before
    // the first append, the state to start from (a prefix hit's snapshot or
    // a fork parent's slot, held by a reference), 0 = the initial state.
    std::vector<int32_t> state_src;
    uint64_t num_cached = 0;
    // Leading tokens whose K/V (and state) a committed step wrote, or a
    // prefix hit brought; only their full blocks enter the prefix cache
    // once the pool plans steps (planned_).
    uint64_t num_computed = 0;
    // Per group: bumped when an entry of the table changes other than by
    // appending pages or releasing them to the window (a copy-on-write or
    // state move, a truncate, a hit), so a persistent page table row knows
    // what to rewrite (group_plan_table.h).
    std::vector<uint32_t> version;
    uint32_t epoch = 0;    // bumped by a truncate that drops tokens: a plan's commit skips it
    bool planned = false;  // its computed count follows committed plans
  };
  struct Key {
    BlockHash hash;
    uint32_t group;
    bool operator==(const Key& o) const { return group == o.group && hash == o.hash; }
  };
  struct KeyHasher {
    uint64_t seed;
    size_t operator()(const Key& k) const noexcept;
  };
  struct Need {
    uint64_t fresh = 0, cow = 0, gain = 0;
  };

  GroupPool(const PoolOptions& base, std::vector<GroupSpec> groups);
  Seq& seq_or_throw(SeqId id);
  const Seq& seq_or_throw(SeqId id) const;
  // A new sequence id: the pool's tag in the top 16 bits (as a single-group
  // pool's ids, sequence.h), so an id used on another pool is unknown there,
  // and a counter below it that never repeats.
  SeqId new_id();
  Need need_of(const Seq& s, uint64_t n, uint32_t lookahead) const;
  uint64_t window_end(uint32_t g, uint64_t n0) const;  // blocks wholly before n0's window
  bool recurrent(uint32_t g) const { return groups_[g].kind == GroupKind::kRecurrent; }
  // A sliding window of one token: no block of it is ever read again, and
  // vLLM caches none of them (its SlidingWindowManager's
  // reachable_block_mask), so it has no prefix-cache entries and no hits.
  bool uncacheable_window(uint32_t g) const {
    return groups_[g].kind == GroupKind::kSlidingWindow && groups_[g].sliding_window <= 1;
  }
  // Whether the state at the sequence's current length (a block boundary)
  // should be kept as a snapshot, keyed by its last block's hash.
  bool snapshot_due(const Seq& s, uint32_t g) const;
  int32_t allocate(uint32_t g);
  void release(int32_t b);
  // The releases of one free of one group (a sequence's table, a window's
  // blocks, a truncated tail) while one lives: their blocks without a key go
  // to the head as one run in release order, the first released reused
  // first, as vLLM's free_blocks prepends them (BlockPool::ReleaseBatch).
  using ReleaseBatch = FreeBlockQueue::FrontRun;  // constructed from queue_
  // Records a copy-on-write or state copy; src and dst stay referenced
  // until take_copies hands it out.
  void record_copy(uint32_t g, int32_t src, int32_t dst);
  // Best effort: a block whose map entry cannot be allocated stays
  // uncached (a later lookup misses it), so no caller is left half done.
  void cache(int32_t b, uint32_t g, const BlockHash& h) noexcept;
  void uncache(int32_t b);
  int32_t lookup(const BlockHash& h, uint32_t g) const;
  uint64_t hit_of_group(uint32_t g, const std::vector<BlockHash>& hashes, uint64_t max_blocks,
                        std::vector<int32_t>* out) const;
  void hash_full_blocks(Seq& s);
  // A recurrent group's part of append of a sequence n0 tokens long before
  // it; keep: snapshot_due before the append's allocations.
  void append_state(Seq& s, uint32_t g, bool keep, uint64_t n0);
  // Caches the full blocks of s from block `from` that its computed tokens
  // cover, in every attention group.
  void cache_computed(const Seq& s, uint64_t from);

  PoolOptions opts_;
  std::vector<GroupSpec> groups_;
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> layers_;  // -> (group, index)
  uint64_t bytes_per_block_ = 0;
  BlockHash root_;
  mutable std::mutex mu_;
  int32_t num_blocks_ = 0;
  std::vector<int32_t> ref_;
  std::vector<int32_t> group_of_;  // group of a used or cached block; -1 none
  std::vector<int32_t> pin_;       // references held by pending copies
  // References held by open step plans' snapshot slots (group_snapshots.cpp).
  std::vector<int32_t> plan_hold_;
  std::vector<BlockHash> key_;  // hash of a cached block (empty = not cached)
  // When each cached block entered the cache (a pool-wide counter): a lookup
  // among blocks of equal hash returns the oldest, as vLLM's
  // BlockHashToBlockMap (an insertion-ordered dict) and single-group pools do.
  std::vector<uint64_t> cached_at_;
  uint64_t cache_clock_ = 0;
  FreeBlockQueue queue_;
  std::unordered_multimap<Key, int32_t, KeyHasher> cache_;
  std::unordered_map<SeqId, Seq> seqs_;
  PoolTag tag_;  // no live pool of either kind shares it (pool_tag.h)
  // Above every id an earlier holder of the tag handed out (PoolTag).
  SeqId next_id_ = SeqId(tag_.first_generation()) << 24;
  std::vector<std::vector<std::pair<int32_t, int32_t>>> copies_;
  // Per group: the persistent page table the last such plan used.
  std::vector<std::shared_ptr<GroupPageTable>> kept_tables_;
  // Set by the first step plan: from then on appended tokens count as
  // computed only once a committed plan covers them (before, as manager
  // calls alone always did, at append).
  bool planned_ = false;
  bool closed_ = false;
  uint64_t query_tokens_ = 0, hit_tokens_ = 0, evictions_ = 0, cow_ = 0;
};

}  // namespace pagedkv
