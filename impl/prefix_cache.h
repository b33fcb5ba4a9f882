// The prefix cache: block hash -> the blocks holding that content. Equal
// hashes may map to several blocks (two sequences filled the same block at
// once, or a full hit recomputed its last block); they are kept in the order
// they were cached, and a lookup returns the oldest, as vLLM's
// BlockHashToBlockMap (an insertion-ordered dict) does.
//
// Only blocks can hold hashes, so the number of distinct keys never exceeds
// the number of blocks: a fixed open-addressing table (linear probing,
// backward-shift deletion) sized once at 2x the blocks never rehashes and
// never allocates. Digests are not stored: a slot holds a block id (the
// digest is that block's hash in the pool's hash array) and the low 32
// bits of the digest's keyed hash below, which give its home slot and
// tell most other digests of a probe run apart without reading their
// hashes (a random miss each: the hash array is 40 bytes a block). Blocks
// sharing a hash hang off the slot's block in an intrusive doubly linked
// chain.
//
// Digests come from what requests send, so an outsider can aim them (forcing
// some bits of even a SHA-256 digest is cheap): the slot of a key is a hash
// of the whole digest keyed by a per-table random secret (XXH3 with a secret,
// which xxHash offers for exactly this), so aimed digests land spread out.
#pragma once

#include <cstdint>
#include <vector>

#include "hash/block_hash.h"
#include "huge_pages.h"

namespace pagedkv {

class PrefixCache {
 public:
  PrefixCache() = default;
  // hashes: the pool's per-block hash array (num_blocks of them), indexed
  // by block id; it must outlive the cache and not move.
  PrefixCache(const BlockHash* hashes, int32_t num_blocks);

  // Any block holding hash h, or -1.
  int32_t find(const BlockHash& h) const;
  // The next block in block's chain of equal hashes, or -1.
  int32_t next_duplicate(int32_t block) const { return dup_next_[block]; }
  // Adds block (its hash already set in the hash array; not yet in the map).
  void insert(int32_t block);
  // Starts loading the slot where h's probe starts, ahead of an insert or
  // find (a batch of inserts then overlaps its cache misses).
  void prefetch(const BlockHash& h) const { __builtin_prefetch(&slots_[key_of(h) & mask_]); }
  // Starts loading what insert(block) of a block hashed h writes: its home
  // slot and the block's chain links.
  void prefetch_insert(int32_t block, const BlockHash& h) const {
    __builtin_prefetch(&slots_[key_of(h) & mask_], 1);
    __builtin_prefetch(&dup_next_[block], 1);
    __builtin_prefetch(&dup_prev_[block], 1);
  }
  // Removes block (in the map under its current hash).
  void erase(int32_t block);
  void clear();

  int32_t num_blocks() const { return num_entries_; }  // blocks in the map
  // "" if every mapped block holds the slot's hash, chains are consistent and
  // the count matches; otherwise what broke.
  const char* check() const;
  // Whether block is in the map (walks its hash's chain), for validation.
  bool contains(int32_t block) const;
  // The longest distance of a mapped key from its home slot (probes a
  // lookup may take), for tests of the table's spread.
  size_t max_displacement() const;
  // The slot where h's probe starts (tests build colliding keys with it).
  size_t home_slot(const BlockHash& h) const { return key_of(h) & mask_; }
  size_t table_slots() const { return slots_.size(); }

 private:
  // The keyed hash of a digest, cut to 32 bits: a table has at most 2^32
  // slots (2 x at most 2^31 - 1 blocks), so its home slot is key & mask_.
  uint32_t key_of(const BlockHash& h) const;
  size_t slot_of(const BlockHash& h) const;  // slot holding h's chain, or npos
  static constexpr size_t npos = ~size_t(0);

  struct Slot {
    int32_t block;  // heading the chain, -1 = empty
    uint32_t key;   // key_of(its hash)
  };

  const BlockHash* hashes_ = nullptr;
  std::vector<uint8_t> secret_;  // XXH3 secret, random per table
  BlockArray<Slot> slots_;
  size_t mask_ = 0;
  BlockArray<int32_t> dup_next_, dup_prev_;  // chain links, -1 = none
  // At a chain's head: its last block (where the next duplicate joins), -1
  // when the head is alone. Unused elsewhere.
  BlockArray<int32_t> dup_tail_;
  int32_t num_entries_ = 0;
};

}  // namespace pagedkv
