// The pool: block manager (DESIGN.md §3), sequences, KV storage and the
// entry points the C ABI wraps. One mutex serialises every operation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "block_pool.h"
#include "event_queue.h"
#include "hash/block_hash.h"
#include "kernel_types.h"
#include "op_mutex.h"
#include "pool_tag.h"
#include "sequence.h"
#include "step_plan_rows.h"
#include "tensor_arg.h"
#include "tier/tier_set.h"

namespace pagedkv {

struct PoolOptions {
  uint32_t block_size = 16;
  uint64_t num_blocks = 0;  // 0 = derive from memory_budget_bytes
  uint64_t memory_budget_bytes = 0;
  HashAlgo hash_algo = HashAlgo::kSha256Cbor;
  bool enable_prefix_caching = true;
  std::string hash_seed;
  uint32_t sliding_window = 0;
  bool enable_events = false;
  uint32_t max_events = 65536;
  uint32_t num_layers = 0;  // 0 = manager only, no storage
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kBF16;
  int32_t device_type = kDeviceCpu;
  int32_t device_id = 0;
  uint32_t num_threads = 0;
  // Salt and multimodal item hashes hash in separate domains (never equal);
  // off = vLLM's encoding, where a salt and an item hash can collide.
  bool strict_key_domains = false;
  // vLLM 0.33's tagged extra keys (strict_key_domains = 2 in the C ABI;
  // HashContext::tagged). Exclusive with strict_key_domains.
  bool tagged_keys = false;
  // FP8 pools: kv_scale_granularity 0 = per tensor (one scale per layer),
  // 1 = per layer and KV head; k_scales/v_scales hold that many (layer
  // major) or are empty (all 1.0). The pool's current scales: kv_scales().
  uint32_t kv_scale_granularity = 0;
  std::vector<float> k_scales, v_scales;
  // Partial-block prefix hits (match_prefix_partial); keeps the token ids
  // of cached blocks.
  bool enable_partial_reuse = false;
  // Retention priorities (set_retention) and the most blocks that may be
  // pinned (never evicted) at once.
  bool enable_retention = false;
  uint64_t max_pinned_blocks = 0;
  // KV page layout (PKV_KV_LAYOUT_*): 0 MHA (K and V planes), 1 MLA (one
  // latent plane per layer, [num_blocks, block_size, rank + rope]; create()
  // resolves num_kv_heads to 1 and head_dim to rank + rope).
  uint32_t kv_layout = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t qk_rope_head_dim = 0;
  bool is_mla() const { return kv_layout == 1; }
};

// What match_prefix_partial attached: full_tokens from whole cached blocks,
// then partial_tokens copied from the first slots of block copy_src into
// the sequence's new block copy_dst (-1 when none).
struct PrefixMatch {
  uint64_t full_tokens = 0;
  uint32_t partial_tokens = 0;
  int32_t copy_src = -1, copy_dst = -1;
};

// What match_prefix_tiered attached, in tokens, per medium: device hits
// first, then blocks found in the host or file tier (fresh device blocks
// that the next step plan loads).
struct TieredMatch {
  uint64_t device = 0, host = 0, file = 0;
};

struct SeqOptions {
  int32_t priority = 0;
  uint64_t lora_id = 0;
  std::string lora_name;
  std::string lora_path;  // keyed with lora_name on a pool with tagged_keys
  std::string cache_salt;
  std::vector<MmItem> mm_items;
};

// The hash context of a sequence created with o on a pool with opts;
// validates o.mm_items (Error kInvalidArgument naming mm_items[i]).
HashContext make_hash_context(const PoolOptions& opts, const SeqOptions& o);

struct SeqInfo {
  int32_t priority = 0;
  uint64_t num_tokens = 0;
  uint64_t num_cached_tokens = 0;
  uint64_t num_blocks = 0;
  uint64_t num_slots = 0;
  uint64_t lora_id = 0;
  uint64_t num_computed_tokens = 0;
};

struct PoolStats {
  uint32_t block_size = 0;
  uint64_t num_blocks = 0;
  uint64_t num_free_blocks = 0;
  uint64_t num_used_blocks = 0;
  uint64_t num_cached_blocks = 0;
  uint64_t num_seqs = 0;
  uint64_t num_tokens = 0;
  double usage = 0;
  uint64_t prefix_query_tokens = 0;
  uint64_t prefix_hit_tokens = 0;
  uint64_t num_evictions = 0;
  uint64_t num_cow_copies = 0;
  uint64_t num_events_dropped = 0;
  uint64_t kv_bytes_per_block = 0;
  uint64_t kv_bytes_allocated = 0;
  uint64_t kv_bytes_used = 0;
  uint64_t kv_bytes_wasted = 0;
  uint64_t num_partial_hits = 0;
  uint64_t partial_hit_tokens = 0;
  uint64_t num_pinned_blocks = 0;
  uint64_t num_pins_degraded = 0;
};

class Batch;
struct PageTable;

// A steady decode step's entry for one sequence (Pool::DecodeMemo).
struct DecodeTail {
  uint32_t table_version;
  uint32_t block_index;
  int32_t block;
  uint32_t n;          // tokens
  const int32_t* tok;  // tokens.data()
  uint32_t cap;        // tokens.capacity(), at most 2^32 - 1
  uint32_t epoch;      // writes_epoch
  // What cap holds for s: its tokens' capacity, at most 2^32 - 1.
  static uint32_t capacity_of(const Sequence& s) {
    return uint32_t(std::min<uint64_t>(s.tokens.capacity(), UINT32_MAX));
  }
};

class Pool {
 public:
  // Validates opts (Error kInvalidArgument naming the field), creates the
  // backend and storage.
  static std::shared_ptr<Pool> create(const PoolOptions& opts);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // pkv_pool_destroy: frees the sequences now and lets go of the storage;
  // batches that still hold the pool see a closed pool and fail cleanly. A
  // kernel already running keeps the storage (arena_hold_) until it returns.
  void close();

  const PoolOptions& options() const { return opts_; }  // immutable after create
  uint64_t bytes_per_block() const { return bytes_per_block_; }
  bool has_storage() const { return opts_.num_layers > 0; }

  // Sequences.
  // hidden: a sequence the library holds for itself (SeqTable::InternalScope).
  SeqId seq_create(const SeqOptions& opts, bool hidden = false);
  uint64_t match_prefix(SeqId id, const int32_t* tokens, uint64_t n);
  // match_prefix, then (with enable_partial_reuse) a partial hit in the
  // block after the last full hit.
  PrefixMatch match_prefix_partial(SeqId id, const int32_t* tokens, uint64_t n);
  // Replaces the sequence's retention ranges (at most kMaxRetentionRanges).
  void set_retention(SeqId id, const RetentionRange* ranges, uint64_t n);
  static constexpr uint64_t kMaxRetentionRanges = 64;
  // From now on the pool's clock reads now_ns (tests, simulations); until
  // then it is the steady clock.
  void set_clock(uint64_t now_ns);
  void priority_counts(uint64_t* out) const;  // out[0..100]
  void append(SeqId id, const int32_t* tokens, uint64_t n, uint32_t lookahead);
  uint64_t blocks_needed(SeqId id, uint64_t n, uint32_t lookahead) const;
  SeqId fork(SeqId parent, bool hidden = false);
  void truncate(SeqId id, uint64_t num_tokens);
  // Room in the sequence's vectors for num_tokens tokens (pkv_seq_reserve).
  void reserve(SeqId id, uint64_t num_tokens);
  void free(SeqId id);
  // free() of a hidden sequence (a transfer's own).
  void free_internal(SeqId id) {
    SeqTable::InternalScope scope;
    free(id);
  }
  SeqInfo seq_info(SeqId id) const;
  // Batched and fused calls (kv_pool_batch.cpp): all or nothing, messages
  // name the offending index. given: the engine's block hashes of tokens
  // (nullptr = hash here).
  uint64_t match_prefix_hashes(SeqId id, const int32_t* tokens, uint64_t n, const BlockHash* given,
                               uint64_t num_given);
  void append_batch(const SeqId* ids, const int32_t* tokens, uint64_t n);
  void free_batch(const SeqId* ids, uint64_t n);
  struct Admitted {
    SeqId id = 0;
    uint64_t num_cached = 0;
  };
  // tiered: also take the blocks found in the offload tiers after the
  // device hits (as match_prefix_tiered), and say what came from where.
  Admitted admit(const SeqOptions& o, const int32_t* tokens, uint64_t n, const BlockHash* given,
                 uint64_t num_given, uint32_t lookahead, TieredMatch* tiered = nullptr);
  // Copies min(len, capacity) entries; returns the full length.
  uint64_t block_table(SeqId id, int32_t* out, uint64_t capacity) const;
  uint64_t block_hashes(SeqId id, BlockHash* out, uint64_t capacity) const;

  // Offload tiers (kv_pool_tiers.cpp, impl/tier/). attach_tiers: once, on a
  // pool with storage and prefix caching (CPU or CUDA).
  void attach_tiers(const TierOptions& o);
  // given/num_given: precomputed block hashes, as in match_prefix_hashes.
  TieredMatch match_prefix_tiered(SeqId id, const int32_t* tokens, uint64_t n,
                                  const BlockHash* given = nullptr, uint64_t num_given = 0);
  // medium: 1 host, 2 file; Error kInvalidState without that tier.
  TierStats tier_stats(uint32_t medium) const;
  // Waits for queued offloads and runs pending loads.
  void flush_tiers();
  TierSet* tiers_for_testing() { return tiers_.get(); }

  // Stats, events, cache control, validation.
  PoolStats stats() const;
  // tokens: room for capacity * block_size ids, or null (EventQueue::drain).
  size_t drain_events(Event* out, size_t capacity, int32_t* tokens = nullptr);
  int drain_one_event(Event* out, int32_t* tokens, bool tokens_room);  // EventQueue::drain_one
  bool events_enabled() const { return opts_.enable_events; }
  void reset_prefix_cache();
  std::string validate() const;  // "" when every invariant holds

  // Storage.
  TensorArg kv_tensor(uint32_t layer, uint32_t which) const;
  void copy_blocks(const int32_t* src, const int32_t* dst, uint64_t n, void* stream);
  // Throws kInvalidArgument unless the pairs are independent: no block the
  // destination of two pairs, or of one and the source of another.
  void check_copy_pairs(const int32_t* src, const int32_t* dst, uint64_t n) const;
  void swap_blocks(const int32_t* blocks, uint64_t n, void* host, uint64_t host_bytes, bool to_host,
                   void* stream);
  // FP8 scales (pkv_pool_set_kv_scales / get): n entries each, as many as
  // the pool's granularity has; Error kInvalidState on a pool that is not
  // FP8, kInvalidArgument on a wrong count or a scale not finite and > 0.
  uint64_t num_kv_scales() const;
  void set_kv_scales(const float* k, const float* v, uint64_t n);
  void kv_scales(std::vector<float>* k, std::vector<float>* v) const;

  // Transfers between pools (kv_pool_transfer.cpp, impl/ucx/).
  // export_pin: a snapshot of the computed tokens of a sequence and the
  // blocks holding them, pinned by a hidden fork (pin) so that nothing
  // evicts or overwrites them until pin is freed.
  struct ExportSnapshot {
    SeqId pin = 0;
    std::vector<int32_t> tokens, blocks;
    std::vector<BlockHash> hashes;
    uint64_t lora_id = 0;
  };
  ExportSnapshot export_pin(SeqId id);
  // import_begin: a new sequence holding tokens in fresh, unwritten blocks
  // (all or nothing); import_commit marks its every slot written once the
  // K/V arrived; on failure the caller frees it.
  SeqId import_begin(const SeqOptions& o, const int32_t* tokens, uint64_t n);
  void import_commit(SeqId id);
  // The storage and the reference that keeps it alive.
  struct ArenaRef {
    KvArena arena{};
    std::shared_ptr<void> hold;
  };
  ArenaRef arena_ref() const;
  std::vector<int32_t> block_table_copy(SeqId id) const;

  // For tests and benchmarks of the internals.
  const BlockPool& block_pool() const { return blocks_; }
  BlockPool& block_pool_for_testing() { return blocks_; }
  SeqTable& seq_table_for_testing() { return seqs_; }
  const TokenArena& token_arena_for_testing() const { return token_arena_; }
  uint16_t tag() const { return tag_.value(); }
  std::vector<CopyPair> pending_copies() const;
  size_t num_pending_events() const;  // recorded, not yet drained
  void shrink_events_for_testing();   // the next event must grow the ring
  // Replaces the memo of the last step plan (nullptr: the next plan is
  // built from scratch) and returns the old one; tests compare incremental
  // and from-scratch plans with it.
  std::shared_ptr<PlanHost> swap_last_plan_for_testing(std::shared_ptr<PlanHost> p) {
    std::lock_guard<OpMutex> lock(mu_);
    last_plan_.swap(p);
    return p;
  }

 private:
  friend class Batch;
  Pool(const PoolOptions& opts, uint64_t bytes_per_block);

  Sequence& seq_or_throw(SeqId id);
  PrefixMatch match_locked(SeqId id, const int32_t* tokens, uint64_t n, bool partial,
                           const BlockHash* given, uint64_t num_given);
  // The partial-hit candidate after s's full hits (k = 0: none).
  std::pair<int32_t, uint32_t> find_partial(const Sequence& s, const int32_t* tokens,
                                            uint64_t n) const;
  // Retention: the pool's clock applied to the blocks' priorities.
  uint64_t now_ns() const;
  void tick() noexcept {
    if (blocks_.retention()) blocks_.advance_clock(now_ns());
  }
  // The priority (and duration) s's ranges give its block j.
  std::pair<uint32_t, uint64_t> block_retention(const Sequence& s, size_t j) const;
  // Gives s's cached block j (block b) that priority: exactly when s just
  // filled it, else only raising it (another holder may count on it).
  void assign_priority(const Sequence& s, size_t j, bool filled) noexcept;
  const Sequence& seq_or_throw(SeqId id) const;
  // What an append would take: fresh blocks, copy-on-write blocks and the
  // blocks the sliding window would give back (ref 1 ones).
  struct AppendNeed {
    uint64_t fresh = 0, cow = 0, window_first = 0, window_end = 0, window_gain = 0;
  };
  AppendNeed append_need(const Sequence& s, uint64_t n, uint32_t lookahead) const;
  // Hashes the full blocks of s.tokens that have none yet into s.hashes;
  // returns the index of the first new one. The only step of an append
  // that can throw after the tokens went in: on failure s.hashes is as
  // before (the caller takes its tokens back).
  size_t hash_new_blocks(Sequence& s);
  // A sequence's hash context from its options (validated).
  HashContext make_ctx(const SeqOptions& o) const;
  // The leading written blocks of tokens in the prefix cache (capped so a
  // token is left to compute) and their hashes, appended to hits and
  // hashes; changes nothing else. given: precomputed hashes (see
  // match_prefix_hashes), whose first and last links are checked.
  void find_hits(const HashContext& ctx, const int32_t* tokens, uint64_t n, const BlockHash* given,
                 uint64_t num_given, HashVector& hashes, std::vector<int32_t>& hits) const;
  // The part of an append that cannot fail, after append_need was checked
  // against the free blocks, s.tokens holds the new tokens (n0 before) and
  // hash_new_blocks returned h0.
  void apply_append(Sequence& s, uint64_t n0, uint64_t n, const AppendNeed& need,
                    size_t h0) noexcept;
  // The live sequence ids[i] of a batched call, marked with mark (a fresh
  // plan_epoch_); fails naming seqs[i] when it is stale or given twice.
  Sequence* batch_member(const SeqId* ids, uint64_t i, uint64_t mark) {
    Sequence* s = seqs_.find(ids[i]);
    if (__builtin_expect(s == nullptr || s->plan_mark == mark, 0))
      batch_member_fail(ids, i, s != nullptr);
    s->plan_mark = mark;
    return s;
  }
  [[noreturn, gnu::noinline, gnu::cold]] void batch_member_fail(const SeqId* ids, uint64_t i,
                                                                bool found) const;
  // free() once its events are reserved.
  void free_locked(SeqId id, Sequence& s) noexcept;
  // Registers blocks [from, s.hashes.size()) in the prefix cache; no throw.
  void cache_new_blocks(const Sequence& s, size_t from) noexcept;
  // Blocks in [begin, end) of s that we hold alone, that are cached and not
  // fully written: they must leave the prefix cache when we let them go.
  size_t count_unwritten(const Sequence& s, size_t begin, size_t end) const;
  void uncache_unwritten(const Sequence& s, size_t begin, size_t end) noexcept;
  // Leading positions of s whose slots are written (window-released ones
  // count: they were computed before the window let them go).
  // Positions before from are known written (num_committed is a valid
  // hint), so the walk starts there.
  uint64_t computed_tokens(const Sequence& s, uint64_t from = 0) const;
  // Lowers every sequence's committed count to what its blocks hold written
  // (after a copy overwrote blocks it counted on).
  void recount_committed() noexcept;
  bool tail_is_exclusive(const Sequence& s) const;
  // Slots from `from` on of a block about to receive new tokens hold no
  // K/V of them.
  void clamp_written(int32_t b, uint64_t from) noexcept {
    if (blocks_.written(b) > from) blocks_.set_written(b, uint32_t(from));
  }
  // Marks the slots a committed step wrote (see Batch::commit); holds mu_.
  using WrittenRange = ::pagedkv::WrittenRange;  // step_plan_rows.h
  // The written count of each block in ranges after applying them in slot
  // order to the current state: sorted by block, one entry per block.
  std::vector<std::pair<int32_t, uint32_t>> written_after(std::vector<WrittenRange> ranges) const;
  // Applies ranges as written_after computes them (may throw before any
  // change); without a sort when every range is in its own block.
  void apply_written(std::vector<WrittenRange>& ranges);
  // Sets the fill of s's tail blocks (held by s alone) to the tokens s holds.
  void settle_tail_fill(const Sequence& s) noexcept;
  void release_blocks_reverse(const std::vector<int32_t>& blocks, size_t begin,
                              size_t end) noexcept;
  void run_pending_copies(void* stream);  // caller holds mu_
  // Room for run_pending_copies' bookkeeping of n pending copies, so that a
  // call that queues copies can make it before changing anything (may throw).
  void reserve_copies(size_t n);
  // Before the pool writes into its storage, or reads a block a tier hit
  // gave: waits for queued offloads (their blocks' bytes must be copied
  // before anything overwrites them), then loads tier hits into their
  // blocks (a failed load leaves its block unwritten and uncached). Holds
  // mu_; nothing to do without tiers. stream: the one the caller's writes
  // go on next (CUDA: ordered after the offloads on the device; the loads'
  // copies are queued on it).
  void settle_tiers_locked(void* stream) {
    if (tiers_) settle_tiers_slow(stream);
  }
  void settle_tiers_slow(void* stream);
  // Tier hits of a lookup: the hash of each block and its pinned entry.
  using TierHits = std::vector<std::pair<BlockHash, TierRef>>;
  // Follows the chain of block hashes from block `first` (parent: the hash
  // of block first - 1, or root_) through the tiers while it hits, for at
  // most `room` blocks; given: the engine's hashes (nullptr = hash here).
  // The entries found are pinned; on a throw none stays pinned.
  TierHits find_tier_hits(const HashContext& ctx, const int32_t* tokens, uint64_t first,
                          uint64_t room, const BlockHash& parent, const BlockHash* given);
  // Gives each hit a fresh block, cached but not written, appended to
  // s.blocks (s.hashes and s.tokens already hold them, and every vector
  // has room), and queues its load; adds its tokens to r. No throw.
  void attach_tier_hits(Sequence& s, const TierHits& hits, TieredMatch& r) noexcept;
  void pull_tier_events() noexcept;  // the tiers' events into events_
  void check_open() const;
  void check_fp8() const;  // kInvalidState unless the pool stores FP8
  void check_block_ids(const int32_t* ids, uint64_t n, const char* name) const;

  // x / block_size; a shift for the usual power-of-two sizes (a 64-bit
  // division costs more than the rest of a decode append's arithmetic).
  uint64_t div_bs(uint64_t x) const {
    return bs_shift_ >= 0 ? x >> bs_shift_ : x / opts_.block_size;
  }

  mutable OpMutex mu_;
  // Orders the kernels that touch the KV arena (docs/threading.md): writers
  // (cache writes, block copies, swap-in) exclusive, readers (attention,
  // swap-out) shared, so no read of a block races a write to it from
  // another thread. Taken after mu_ or with mu_ released, never before mu_.
  mutable std::shared_mutex kv_mu_;
  int bs_shift_ = -1;
  bool closed_ = false;
  PoolOptions opts_;
  uint64_t bytes_per_block_ = 0;
  // Shared with the storage's deleter, which outlives the pool while a
  // kernel still holds the arena.
  std::shared_ptr<Backend> backend_;
  KvArena arena_{};
  // Owns arena_.base. A kernel that runs outside mu_ copies it first, so
  // close() during the kernel only drops the pool's reference and the
  // memory goes when the last holder lets go (docs/threading.md).
  std::shared_ptr<void> arena_hold_;
  // FP8 pools: the scales as set (granularity of the options); the
  // kernels' per-head copy lives after the planes (arena_.scales).
  std::vector<float> k_scales_, v_scales_;
  void upload_scales();  // k_scales_/v_scales_ -> arena_.scales
  EventQueue events_;
  BlockPool blocks_;
  PoolTag tag_;             // before seqs_, which puts it in every id
  TokenArena token_arena_;  // before seqs_, whose tokens it holds
  SeqTable seqs_;
  BlockHash root_;
  std::unique_ptr<BlockHasher> hasher_;
  uint64_t num_tokens_ = 0;  // over all sequences, for stats
  uint64_t prefix_query_tokens_ = 0;
  uint64_t prefix_hit_tokens_ = 0;
  uint64_t num_cow_copies_ = 0;
  uint64_t num_partial_hits_ = 0, partial_hit_tokens_ = 0, num_pins_degraded_ = 0;
  bool manual_clock_ = false;
  uint64_t manual_now_ns_ = 0;
  uint64_t plan_epoch_ = 0;
  // run_pending_copies: per-block stamps (2 * round = read, + 1 = written)
  // instead of a per-call array; sized once, on the first copy.
  std::vector<uint32_t> copy_stamp_;
  uint32_t copy_round_ = 0;
  std::vector<int32_t> copy_src_, copy_dst_;
  // append_batch's per-sequence work list, kept between calls (small: a
  // 1024-sequence list stays in L1 across its three passes).
  struct BatchItem {
    static constexpr uint32_t kSimple = ~0u;
    Sequence* s;
    uint64_t n0;
    uint32_t h0;
    // Index of its AppendNeed in batch_needs_, or kSimple: the decode fast
    // path (no new block, nothing fills).
    uint32_t need;
  };
  std::vector<BatchItem> batch_items_;
  // The last decode step's ids and the sequences they resolved to
  // (step_plan_steady.cpp): still those sequences, and distinct, while no
  // sequence was freed (SeqTable::removals).
  struct DecodeMemo {
    std::vector<SeqId> ids;
    std::vector<Sequence*> live;
    uint64_t removals = ~uint64_t(0);
    // Each sequence's block after the last steady step (block_index of its
    // table, which held block at table_version): while table_version is
    // unchanged the step takes the block from here, not from the sequence's
    // block table, which sits on a page of its own (step_plan_steady.cpp).
    //
    // With the rest of each entry, the lane: what a steady step needs of a
    // sequence (its token count, its tokens' storage, its writes epoch) as
    // the last steady step left it. While the pool's lock was taken since
    // only by that step's own calls (commit, destroy, layer writes,
    // attention), by const calls (OpMutex::ConstGuard) and by event drains
    // (lane_ops, keep_lane), the lane is exactly each sequence's state, and
    // the next step over the same ids plans from it without first reading
    // every sequence.
    using Tail = DecodeTail;
    std::vector<Tail> tails;
    static constexpr uint64_t kNoLane = ~uint64_t(0);
    uint64_t lane_ops = kNoLane;            // mu_.ops() when the lane was last exact
    const Batch* lane_batch = nullptr;      // the step that wrote it
    bool lane_committed = false;            // and its commit counted every token
    const PageTable* lane_table = nullptr;  // whose rows the step brought up to date
  };
  // This call (holding mu_) is the first since the lane was last exact.
  bool lane_follows() const { return decode_memo_.lane_ops + 1 == mu_.ops(); }
  std::string check_lane() const;  // validate(): the lane, while it stands
  // Called holding mu_ by a call (or one locked section of it) that
  // changes no sequence and no block's counts: event drains, a step's
  // layer writes (until the last, whose commit keeps the lane itself),
  // attention, a plan dropped after its commit.
  void keep_lane() {
    if (lane_follows()) decode_memo_.lane_ops = mu_.ops();
  }
  DecodeMemo decode_memo_;
  void remember_decode(const SeqId* seqs, Sequence* const* live, uint32_t n) noexcept;
  // The steady decode path's append of a token that opens or fills a block
  // (step_plan_steady.cpp).
  [[gnu::noinline]] int32_t append_steady(Sequence& s, uint64_t n0, size_t h0,
                                          int32_t token) noexcept;
  std::vector<AppendNeed> batch_needs_;
  // Incremental step plans (step_plan_rows.h): the last plan's memory and
  // page rows, and a spare buffer for the next plan.
  std::shared_ptr<PlanHost> last_plan_, spare_plan_;
  // Persistent page tables (step_plan_table.h): the last one built.
  std::shared_ptr<PageTable> page_table_;
  // Batch::commit: per-block stamps telling whether a plan's written
  // ranges fall in distinct blocks (then no sort is needed).
  std::vector<uint32_t> written_stamp_;
  uint32_t written_round_ = 0;
  // Offload tiers and the tier hits waiting for their load.
  std::unique_ptr<TierSet> tiers_;
  struct PendingLoad {
    int32_t block;
    BlockHash hash;
    TierRef ref;
  };
  std::vector<PendingLoad> pending_loads_;
  std::vector<Event> tier_events_;  // reused by pull_tier_events
};

}  // namespace pagedkv
