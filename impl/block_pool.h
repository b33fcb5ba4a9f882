// The block pool (DESIGN.md §3): ref counts, the free queue, block hashes and
// the prefix cache, pending copy-on-write copies and KV events. Block 0 is
// the null block: never allocated, freed or cached. Not thread-safe by
// itself: the owning Pool serialises calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "event_queue.h"
#include "free_block_queue.h"
#include "hash/block_hash.h"
#include "prefix_cache.h"

namespace pagedkv {

struct CopyPair {
  int32_t src, dst;
};

struct BlockPoolTestPeer;  // tests corrupt state to prove validate() notices

// Retention priorities (pkv_seq_set_retention). Only cached blocks carry
// one; a block without a hash is at the default.
constexpr uint32_t kPriorityMin = 0;
constexpr uint32_t kPriorityDefault = 35;  // TensorRT-LLM's default, so configs carry over
constexpr uint32_t kPriorityPinned = 100;  // never evicted; capped by max_pinned_blocks

// Told of each cached, fully written block that allocate() evicts, before
// its hash goes (the offload tiers, impl/tier/): it may only take note,
// never block or throw; the block's bytes stay until the pool next writes.
class EvictSink {
 public:
  virtual void on_evict(int32_t id, const BlockHash& h, uint64_t lora_id) noexcept = 0;

 protected:
  ~EvictSink() = default;
};

class BlockPool {
 public:
  static constexpr int32_t kNullBlock = 0;

  BlockPool() = default;
  BlockPool(int32_t num_blocks, bool enable_caching, EventQueue* events);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_free() const { return queue_.size(); }
  int32_t num_used() const { return num_used_; }
  int32_t num_cached() const { return cache_.num_blocks(); }
  bool caching() const { return caching_; }
  uint64_t num_evictions() const { return num_evictions_; }

  int32_t ref(int32_t id) const { return ref_[id]; }
  const BlockHash& hash(int32_t id) const { return hash_[id]; }
  bool in_free_queue(int32_t id) const { return queue_.contains(id); }
  const FreeBlockQueue& queue() const { return queue_; }

  // Pops the head of the free queue (evicting its cached hash, lazily) and
  // returns it with ref 1. The caller checks num_free() first.
  // Never throws (the eviction's event is stored or counted as dropped);
  // callers reserve event room first so nothing is dropped.
  int32_t allocate() noexcept {
    int32_t id = queue_.pop_front();
    if (!hash_[id].empty()) evict(id);
    ref_[id] = 1;
    counts_[id].fill = 0;
    counts_[id].written = 0;
    ++num_used_;
    return id;
  }
  // Starts loading what the next allocate() reads and writes: the queue's
  // head block (anywhere in the pool's arrays) and its links. A decode
  // step opens a block every ~16 sequences, so the lines arrive in time.
  void prefetch_allocation() const {
    const int32_t id = queue_.front();
    if (id >= num_blocks_) return;  // a sentinel: the queue is empty
    __builtin_prefetch(&hash_[id]);
    __builtin_prefetch(&ref_[id], 1);
    __builtin_prefetch(&counts_[id], 1);
    queue_.prefetch_links(id);
  }
  // One more holder of a block that is in use or sits in the free queue
  // (a prefix-cache hit: "touch").
  void touch(int32_t id) noexcept {
    if (ref_[id] == 0) {
      queue_.remove(id);
      if (ret_) ++ret_->arm[id];  // in use: a pending expiry no longer applies
      ++num_used_;
      filled_ += counts_[id].fill;
    }
    ++ref_[id];
  }
  void share(int32_t id) noexcept { ++ref_[id]; }  // id already in use
  // The releases of one free (a sequence's blocks, a window's, a truncated
  // tail) while one lives form one batch (release).
  class ReleaseBatch {
   public:
    explicit ReleaseBatch(BlockPool& p) noexcept : run_(p.queue_) {}

   private:
    FreeBlockQueue::FrontRun run_;
  };
  // Drops one holder; at zero, hashed blocks go to the tail (cached longest),
  // the others to the head (reused first). Within a ReleaseBatch the blocks
  // without a hash go to the head in the order released, as one run: the
  // first released is reused first (vLLM's free_blocks prepends a free's
  // uncached blocks as one list).
  void release(int32_t id) noexcept {
    if (--ref_[id] == 0) {
      --num_used_;
      filled_ -= counts_[id].fill;
      if (ret_) {
        release_retained(id);
      } else if (hash_[id].empty()) {
        queue_.push_front_run(id);
      } else {
        queue_.push_back(id);
      }
    }
  }

  // Slots of a block holding tokens (kv_bytes_used): [0, fill) was written
  // for some holder. Set by the writer (appends write only blocks they hold
  // alone) and by a truncate of the only holder; a shared block keeps the
  // fill of its fullest holder. filled() sums it over used blocks, so stats
  // need no walk over the tables.
  uint32_t fill(int32_t id) const { return counts_[id].fill; }
  void set_fill(int32_t id, uint32_t f) noexcept {
    if (ref_[id] > 0) filled_ += uint64_t(f) - counts_[id].fill;
    counts_[id].fill = uint16_t(f);
  }
  void add_filled_slot(int32_t id) noexcept {  // id in use: one more token (decode)
    ++counts_[id].fill;
    ++filled_;
  }
  // Per block: its fill and written counts (block_size <= 1024), side by
  // side: a decode step reads and updates both, one cache line.
  struct Counts {
    uint16_t fill = 0, written = 0;
    // One more token, at slot off, holding no K/V yet (add_filled_slot and
    // Pool::clamp_written without the pool's filled total).
    void add_token(uint32_t off) noexcept {
      ++fill;
      if (written > off) written = uint16_t(off);
    }
  };
  // A steady decode step's loop (step_plan_steady.cpp) updates its blocks'
  // counts through this pointer (add_filled_slot without the total) and
  // adds the step's slots to the total once.
  Counts* counts_for_decode() noexcept { return counts_.data(); }
  void add_filled(uint64_t n) noexcept { filled_ += n; }
  uint64_t filled() const { return filled_; }

  // Leading slots of a block whose K/V was written (DESIGN.md §9): by a
  // committed step, a block copy or a swap-in. Slots of a sequence are
  // computed in order (a plan's queries are each sequence's last tokens),
  // so a count of leading slots is the whole state. Reset by allocate;
  // lowered by the sole holder that appends new tokens into written slots
  // or truncates them. Only fully written blocks may be hit by a lookup.
  uint32_t written(int32_t id) const { return counts_[id].written; }
  // Starts loading the prefix-cache slot a block hashed h would go to.
  void prefetch_cache_slot(const BlockHash& h) const {
    if (caching_) cache_.prefetch(h);
  }
  // Starts loading what cache_block(id, h, ...) writes (a step's filled
  // blocks lie anywhere in the pool's arrays: one miss each, overlapped).
  void prefetch_cache_block(int32_t id, const BlockHash& h) const {
    if (!caching_) return;
    __builtin_prefetch(&hash_[id], 1);
    __builtin_prefetch(&lora_[id], 1);
    cache_.prefetch_insert(id, h);
  }
  // Starts loading a block's fill and written counts (see SeqTable::prefetch).
  void prefetch_counts(int32_t id) const { __builtin_prefetch(&counts_[id]); }
  void set_written(int32_t id, uint32_t w) noexcept { counts_[id].written = uint16_t(w); }
  bool fully_written(int32_t id) const { return counts_[id].written >= block_size_; }
  void set_block_size(uint32_t bs) { block_size_ = bs; }

  // Room for n more events, before a caller starts mutating (may throw).
  void reserve_events(size_t n) {
    if (events_) events_->reserve(n);
  }

  void set_evict_sink(EvictSink* s) { sink_ = s; }

  // Any cached block holding h, or -1.
  int32_t lookup(const BlockHash& h) const { return caching_ ? cache_.find(h) : -1; }
  // Any cached, fully written block holding h, or -1: what a prefix hit
  // may attach (a block registered at append but not yet written, or whose
  // step was aborted, is skipped).
  int32_t lookup_written(const BlockHash& h) const;
  // Registers a full block under h (no-op if caching is off or the block
  // already holds a hash) and records a STORED event. tokens: the block's
  // token ids, kept for partial hits when they are enabled.
  void cache_block(int32_t id, const BlockHash& h, const BlockHash* parent, uint32_t num_tokens,
                   uint64_t lora_id, const int32_t* tokens = nullptr) noexcept;
  // Takes block id's hash out of the cache (REMOVED event).
  void uncache_block(int32_t id) noexcept;
  // Forgets every hash (ALL_CLEARED event).
  void reset_cache() noexcept;

  // Copy-on-write copies recorded but not yet executed on storage.
  void add_pending_copy(int32_t src, int32_t dst) { pending_.push_back({src, dst}); }
  std::vector<CopyPair>& pending_copies() { return pending_; }
  const std::vector<CopyPair>& pending_copies() const { return pending_; }

  // ---- Partial-block hits (pkv_pool_options.enable_partial_reuse).
  // Keeps, per cached block, its parent hash (root for a first block) in a
  // second table keyed by parent, and its token ids, so that the cached
  // children of a prefix can be compared token by token.
  void enable_partial(const BlockHash& root, uint32_t block_size);
  bool partial_enabled() const { return partial_ != nullptr; }
  // Calls f(block, tokens) for each cached, fully written block whose
  // parent is parent (nullptr = a first block), at most max_visits of them.
  template <class F>
  void for_each_child(const BlockHash* parent, size_t max_visits, F&& f) const {
    if (!partial_) return;
    size_t n = 0;
    for (int32_t b = partial_->children.find(parent ? *parent : partial_->root);
         b >= 0 && n < max_visits; b = partial_->children.next_duplicate(b), ++n)
      if (fully_written(b)) f(b, partial_->tokens.data() + size_t(b) * block_size_);
  }
  // Bytes the partial-hit index takes (docs, stats of its cost).
  uint64_t partial_index_bytes() const;

  // ---- Retention priorities (pkv_pool_options.enable_retention).
  void enable_retention(uint64_t max_pinned);
  bool retention() const { return ret_ != nullptr; }
  uint32_t priority(int32_t id) const { return ret_ ? ret_->prio[id] : kPriorityDefault; }
  uint64_t priority_duration(int32_t id) const { return ret_ ? ret_->dur[id] : 0; }
  // Sets a cached block's priority (and the duration it lasts once the
  // block is free); moves it in the free queue if it sits there; records a
  // PRIORITY event when it changes. Blocks without a hash stay at the default.
  void set_priority(int32_t id, uint32_t p, uint64_t duration_ns) noexcept;
  uint64_t num_pinned() const { return ret_ ? ret_->pinned : 0; }
  // Whether id, free or when its last holder releases it, sits in the
  // free queue's held level (a cached block at PKV_PRIORITY_PINNED), which
  // allocation never takes: such a block is not among num_free(), and
  // taking or releasing it changes num_free() by nothing.
  bool held(int32_t id) const {
    return ret_ && !hash_[id].empty() && ret_->prio[id] == kPriorityPinned;
  }
  uint64_t max_pinned() const { return ret_ ? ret_->max_pinned : 0; }
  // The pool's clock: expires the priorities whose time came (they fall back
  // to the default level, in it by when they were last freed: LRU).
  void advance_clock(uint64_t now_ns) noexcept;
  // Cached blocks per priority (out[0..100]).
  void priority_counts(uint64_t* out) const;

  // Structural invariants of the pool alone (queue, cache, ref/queue
  // agreement, null block); "" when all hold.
  std::string check() const;

 private:
  friend struct BlockPoolTestPeer;
  void evict(int32_t id) noexcept;
  void release_retained(int32_t id) noexcept;  // ref reached 0 with retention on
  void push_event_priority(int32_t id) noexcept;
  std::string check_retention() const;

  struct Partial {
    BlockHash root;
    BlockArray<BlockHash> parent;  // per block, while cached
    BlockArray<int32_t> tokens;    // [num_blocks][block_size]
    PrefixCache children;          // parent hash -> cached blocks
  };
  struct Expiry {
    uint64_t at_ns;
    int32_t block;
    uint32_t arm;
    bool operator>(const Expiry& o) const { return at_ns > o.at_ns; }
  };
  struct Retention {
    std::vector<uint8_t> prio;
    std::vector<uint64_t> dur;       // ns a priority lasts once the block is free; 0 = for good
    std::vector<uint32_t> arm;       // bumped when a pending expiry stops applying
    std::vector<uint64_t> released;  // per block: when it was last freed (a counter)
    uint64_t releases = 0;
    std::vector<Expiry> heap;  // min-heap on at_ns; capacity reserved up front
    uint64_t pinned = 0, max_pinned = 0, now_ns = 0;
  };
  std::unique_ptr<Partial> partial_;
  std::unique_ptr<Retention> ret_;

  int32_t num_blocks_ = 0;
  bool caching_ = true;
  int32_t num_used_ = 0;
  uint64_t num_evictions_ = 0;
  BlockArray<int32_t> ref_;
  BlockArray<BlockHash> hash_;
  BlockArray<uint64_t> lora_;  // for REMOVED events
  BlockArray<Counts> counts_;
  // Set by the owning Pool; 0 (tests of the block pool alone) counts every
  // block as written.
  uint32_t block_size_ = 0;
  uint64_t filled_ = 0;
  FreeBlockQueue queue_;
  PrefixCache cache_;
  std::vector<CopyPair> pending_;
  EventQueue* events_ = nullptr;
  EvictSink* sink_ = nullptr;
};

}  // namespace pagedkv
