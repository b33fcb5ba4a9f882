// Sequences and the slot table that names them. A sequence id is
// tag << 48 | generation << 24 | slot (docs/conventions.md; opaque to
// users): the tag names the pool (pool_tag.h), so an id used on another
// pool is unknown; a slot's generation grows each time it is freed, so a
// stale id never reaches a reused slot; a slot whose generation is used up
// is retired instead of wrapping. Ids are never 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hash/block_hash.h"
#include "token_arena.h"

namespace pagedkv {

using SeqId = uint64_t;
// Block hashes; with an arena's allocator, in a pool's TokenArena.
using HashVector = std::vector<BlockHash, ArenaAllocator<BlockHash>>;

// A retention priority for tokens [begin, end) of a sequence
// (pkv_retention_range).
struct RetentionRange {
  uint64_t begin = 0, end = 0;
  uint32_t priority = 0;
  uint64_t duration_ns = 0;  // 0 = for good
};

// Hot fields first: with the slot header, tokens, version, tail_shared and
// the block table's begin and end fill the slot's first 64-byte line, all a
// decode append reads; the second line holds what batched appends, step
// plans and commits read besides (SeqTable::prefetch loads both), except
// the capacities of the block table and the hashes, read only when a block
// is opened or filled.
struct Sequence {
  Sequence() = default;
  explicit Sequence(TokenArena* arena)
      : tokens(ArenaAllocator<int32_t>(arena)), hashes(ArenaAllocator<BlockHash>(arena)) {}
  // Every token appended, incl. a cached prefix; in the pool's TokenArena.
  TokenVector tokens;
  // Bumped by every change of the table or tokens; plans compare it for
  // equality, so 32 bits suffice (a plan would have to outlive 2^32 changes).
  uint32_t version = 0;
  // False promises that the blocks from index tokens/block_size on (the
  // partial tail and lookahead blocks) are ours alone and hold no hash, so
  // the hot append path need not read their ref counts. Set by fork and
  // truncate; cleared by the append that finds it true again.
  bool tail_shared = false;
  // Block table; 0 = released by the sliding window. Its begin and end
  // share the slot's first line with the above (its capacity, read only
  // when a block is added, is on the second).
  std::vector<int32_t> blocks;
  uint64_t plan_mark = 0;  // batch-prepare epoch, to reject duplicates
  // End of the positions whose K/V this sequence knows written: a
  // committed step covered them, or they were attached as written prefix
  // hits. The sliding window releases relative to it. Whether a slot is
  // written is the block's state (BlockPool::written); this is the
  // sequence's own progress, never ahead of it (validate checks).
  uint64_t num_committed = 0;
  // Bumped by truncate: a step prepared before it wrote K/V of tokens that
  // may have been replaced, so its commit must not mark their slots.
  uint32_t writes_epoch = 0;
  // Bumped by every change of the block table (not by appends into a block
  // it already holds): a step plan reuses the previous plan's page row of
  // a sequence whose table_version did not change (step_plan_rows.h).
  uint32_t table_version = 0;
  // The table versions [append_from, append_to] differ only by blocks
  // appended at the end of the table (no block replaced or released):
  // persistent page tables (step_plan_table.h) then write only the new
  // blocks of a row built at a version in that run. Only the appends below
  // extend the run; any other bump of table_version breaks it (the next
  // append starts a new run), so a change made elsewhere is never taken
  // for an append.
  uint32_t append_from = 0, append_to = 0;
  uint64_t num_null = 0;  // leading table entries released to the null block
  // Chained hashes of the full blocks (caching on); in the pool's
  // TokenArena too: as sequences grow, vectors doubled on the heap took
  // fresh pages a fault at a time (~2 a decode step of 1024 sequences).
  HashVector hashes;
  int32_t priority = 0;
  uint64_t num_cached = 0;  // tokens attached by match_prefix
  void bump_table_appended() {
    if (append_to != table_version) append_from = table_version;
    append_to = ++table_version;
  }
  // Whether the table at version v was a prefix of the current one.
  bool table_extends(uint32_t v) const {
    return append_to == table_version && v - append_from <= table_version - append_from;
  }
  HashContext ctx;
  std::vector<RetentionRange> retention;  // empty = the default priority

  void reset() {
    tokens.clear();
    blocks.clear();
    hashes.clear();
    ++version;
    num_null = 0;
    tail_shared = false;
    priority = 0;
    num_cached = 0;
    num_committed = 0;
    ++writes_epoch;
    plan_mark = 0;
    ++table_version;
    ctx = HashContext{};
    retention.clear();
  }
};

class SeqTable {
 public:
  // Sequences the library holds for itself (a transfer's export pin, an
  // import still running) have ordinary ids, and the next slot's id is easy
  // to guess: a caller freeing or appending to one would free blocks a peer
  // is reading, or hand an import's blocks to others while it writes them.
  // find() answers a hidden sequence only to a thread inside an
  // InternalScope (the library's own calls on it).
  class InternalScope {
   public:
    InternalScope() { ++depth(); }
    ~InternalScope() { --depth(); }
    InternalScope(const InternalScope&) = delete;
    InternalScope& operator=(const InternalScope&) = delete;
    static bool active() { return depth() > 0; }

   private:
    static int& depth() {
      thread_local int d = 0;
      return d;
    }
  };

  static constexpr int kSlotBits = 24, kGenBits = 24, kTagShift = kSlotBits + kGenBits;
  static constexpr uint32_t kMaxSlots = 1u << kSlotBits;
  static constexpr uint32_t kMaxGen = (1u << kGenBits) - 1;

  // arena: where the sequences' tokens live (null: the heap); it must
  // outlive the table. Slots start at generation first_gen: ids of earlier
  // tables with the same tag have lower ones (PoolTag).
  explicit SeqTable(uint16_t tag = 0, TokenArena* arena = nullptr, uint32_t first_gen = 1)
      : tag_(tag), arena_(arena), first_gen_(first_gen) {}

  // The live sequence named by id, or nullptr (another pool's id included).
  Sequence* find(SeqId id) {
    if (uint16_t(id >> kTagShift) != tag_) return nullptr;
    const uint32_t slot = uint32_t(id) & (kMaxSlots - 1), gen = uint32_t(id >> kSlotBits) & kMaxGen;
    if (slot >= size_) return nullptr;
    Slot& s = at(slot);
    return s.live && s.gen == gen && (!s.hidden || InternalScope::active()) ? &s.seq : nullptr;
  }
  // Hides (or shows again) the live sequence id names (see InternalScope).
  void set_hidden(SeqId id, bool hidden) {
    const uint32_t slot = uint32_t(id) & (kMaxSlots - 1);
    if (slot < size_) at(slot).hidden = hidden;
  }
  const Sequence* find(SeqId id) const { return const_cast<SeqTable*>(this)->find(id); }
  // Starts loading the slot id names (batched calls touch ~1000 sequences
  // per step: issued a few iterations ahead, the loads overlap).
  void prefetch(SeqId id) {
    const uint32_t slot = uint32_t(id) & (kMaxSlots - 1);
    if (slot < size_) {
      const char* p = reinterpret_cast<const char*>(&at(slot));
      __builtin_prefetch(p);
      __builtin_prefetch(p + 64);
    }
  }

  // A new empty sequence; its id through *id.
  Sequence& add(SeqId* id) {
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      // Allocate everything before changing anything: a failure leaves the
      // table as it was.
      if (free_.capacity() <= size_) free_.reserve(2 * size_ + 16);  // remove() never allocates
      if (size_ % kChunk == 0) {
        chunks_.reserve(chunks_.size() + 1);
        chunks_.push_back(std::make_unique<Chunk>());
      }
      slot = size_++;
      at(slot).gen = first_gen_;
    }
    Slot& s = at(slot);
    if (s.gen > max_gen_) max_gen_ = s.gen;
    s.seq.reset();
    // A new chunk's slots use the heap until here.
    if (s.seq.tokens.get_allocator().arena != arena_)
      s.seq.tokens = TokenVector(TokenAlloc(arena_));
    if (s.seq.hashes.get_allocator().arena != arena_) s.seq.hashes = HashVector(HashAlloc(arena_));
    s.live = true;
    ++live_;
    *id = make_id(s.gen, slot);
    return s.seq;
  }

  void remove(SeqId id) {
    const uint32_t slot = uint32_t(id) & (kMaxSlots - 1);
    Slot& s = at(slot);
    s.live = false;
    s.hidden = false;
    --live_;
    if (s.gen == kMaxGen) {
      // Its next generation would wrap to one a stale id still holds: the
      // slot is never used again (one slot per 2^24 - 1 frees of it).
      s.seq = Sequence(arena_);
      ++retired_;
      ++removals_;
      return;
    }
    ++s.gen;
    ++removals_;
    // Keep small buffers for reuse; drop big ones so a finished long
    // request does not pin its memory. Token ids and block hashes always
    // go back to the arena, whose free lists are their reuse, so that a
    // region whose sequences all finished can go back to the system.
    if (s.seq.tokens.capacity() > (1u << 16)) {
      s.seq = Sequence(arena_);
    } else if (arena_ != nullptr) {
      TokenVector(TokenAlloc(arena_)).swap(s.seq.tokens);
      HashVector(HashAlloc(arena_)).swap(s.seq.hashes);
    }
    free_.push_back(slot);
  }

  size_t size() const { return live_; }
  bool full() const { return size_ == kMaxSlots && free_.empty(); }
  size_t num_retired() const { return retired_; }
  // The highest generation an id of this table had (0: none), through clear().
  uint32_t max_generation() const { return max_gen_; }
  // Sequences removed (or the table cleared) so far: while it is unchanged,
  // every live Sequence* taken from find() still names the same sequence
  // (a slot is only reused after a remove). Step plans rely on it.
  uint64_t removals() const { return removals_; }

  template <class F>
  void for_each(F&& f) const {
    for (uint32_t i = 0; i < size_; ++i) {
      const Slot& s = const_cast<SeqTable*>(this)->at(i);
      if (s.live) f(make_id(s.gen, i), s.seq);
    }
  }
  void clear() {
    chunks_.clear();
    free_.clear();
    size_ = 0;
    live_ = 0;
    retired_ = 0;
    ++removals_;
  }

  // Tests reach a used-up generation without 2^24 create/free cycles: sets
  // the generation of a free slot (the next add() that takes it uses gen).
  void set_generation_for_testing(uint32_t slot, uint32_t gen) {
    if (slot < size_ && !at(slot).live && gen >= 1 && gen <= kMaxGen) at(slot).gen = gen;
  }

 private:
  struct alignas(64) Slot {
    uint32_t gen = 1;
    bool live = false;
    bool hidden = false;  // see InternalScope
    Sequence seq;
  };
  // The token vector's allocator has state, which makes Sequence not
  // standard-layout; GCC and clang still lay it out and answer offsetof.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
  static_assert(offsetof(Slot, seq) + offsetof(Sequence, tail_shared) < 64 &&
                    offsetof(Slot, seq) + offsetof(Sequence, blocks) + 2 * sizeof(void*) <= 64,
                "a decode append's fields must share the slot's first cache line");
  static_assert(offsetof(Slot, seq) + offsetof(Sequence, num_null) + 8 <= 128,
                "a plan's fields must lie in the slot's first two cache lines");
#pragma GCC diagnostic pop
  // Fixed-size chunks keep slot addresses stable as the table grows.
  static constexpr uint32_t kChunk = 64;
  struct Chunk {
    Slot slots[kChunk];
  };
  Slot& at(uint32_t slot) { return chunks_[slot / kChunk]->slots[slot % kChunk]; }
  SeqId make_id(uint32_t gen, uint32_t slot) const {
    return (SeqId(tag_) << kTagShift) | (SeqId(gen) << kSlotBits) | slot;
  }

  using TokenAlloc = ArenaAllocator<int32_t>;
  using HashAlloc = ArenaAllocator<BlockHash>;
  uint16_t tag_;
  TokenArena* arena_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<uint32_t> free_;
  uint32_t size_ = 0;  // slots ever used
  size_t live_ = 0;
  size_t retired_ = 0;
  uint32_t first_gen_ = 1;
  uint32_t max_gen_ = 0;
  uint64_t removals_ = 0;
};

std::string seq_name(SeqId id);  // "seq 0x0001000001000002"
// Why id names no live sequence of the pool whose ids carry tag: freed or
// never made (" is stale or unknown"), or another pool's id, which the
// caller should hear about (a sequence used on the wrong pool).
std::string unknown_seq(SeqId id, uint16_t tag);

}  // namespace pagedkv
