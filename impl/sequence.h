// Sequences and the slot table that names them. A sequence id is
// (generation << 32) | slot; a slot's generation grows each time it is
// freed, so a stale id never reaches a reused slot, and ids are never 0.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hash/block_hash.h"

namespace pagedkv {

using SeqId = uint64_t;

struct Sequence {
  std::vector<int32_t> tokens;    // every token appended, incl. a cached prefix
  std::vector<int32_t> blocks;    // block table; 0 = released by the sliding window
  std::vector<BlockHash> hashes;  // chained hashes of the full blocks (caching on)
  HashContext ctx;
  int32_t priority = 0;
  uint64_t num_cached = 0;  // tokens attached by match_prefix
  uint64_t version = 0;     // bumped by every change of the table or tokens
  uint64_t num_null = 0;    // leading table entries released to the null block
  uint64_t plan_mark = 0;   // batch-prepare epoch, to reject duplicates

  void reset() {
    tokens.clear();
    blocks.clear();
    hashes.clear();
    ctx = HashContext{};
    priority = 0;
    num_cached = 0;
    ++version;
    num_null = 0;
    plan_mark = 0;
  }
};

class SeqTable {
 public:
  // The live sequence named by id, or nullptr.
  Sequence* find(SeqId id) {
    uint32_t slot = uint32_t(id), gen = uint32_t(id >> 32);
    if (slot >= slots_.size()) return nullptr;
    Slot& s = slots_[slot];
    return s.live && s.gen == gen ? s.seq.get() : nullptr;
  }
  const Sequence* find(SeqId id) const { return const_cast<SeqTable*>(this)->find(id); }

  // A new empty sequence; its id through *id.
  Sequence& add(SeqId* id) {
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slots_.emplace_back();
      slot = uint32_t(slots_.size() - 1);
      free_.reserve(slots_.capacity());  // so remove() never allocates
    }
    Slot& s = slots_[slot];
    if (!s.seq) s.seq = std::make_unique<Sequence>();
    s.seq->reset();
    s.live = true;
    ++live_;
    *id = (SeqId(s.gen) << 32) | slot;
    return *s.seq;
  }

  void remove(SeqId id) {
    uint32_t slot = uint32_t(id);
    Slot& s = slots_[slot];
    s.live = false;
    if (++s.gen == 0) s.gen = 1;
    // Keep small buffers for reuse; drop big ones so a finished long
    // request does not pin its memory.
    if (s.seq->tokens.capacity() > (1u << 16)) {
      s.seq = std::make_unique<Sequence>();
    }
    free_.push_back(slot);
    --live_;
  }

  size_t size() const { return live_; }
  bool full() const { return slots_.size() >= 0xffffffffu && free_.empty(); }

  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].live) f((SeqId(slots_[i].gen) << 32) | i, *slots_[i].seq);
  }
  void clear() {
    slots_.clear();
    free_.clear();
    live_ = 0;
  }

 private:
  struct Slot {
    uint32_t gen = 1;
    bool live = false;
    std::unique_ptr<Sequence> seq;
  };
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  size_t live_ = 0;
};

std::string seq_name(SeqId id);  // "seq 0x0000000100000002"

}  // namespace pagedkv
