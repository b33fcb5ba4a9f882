// One level of the offload tiers (host memory or a file): fixed slots of one
// pool block each (every layer's K and V, [2 * num_layers][block bytes]; an
// MLA pool's latents, [num_layers][block bytes]),
// an index from block hash to slot, an LRU of the slots that hold a
// finished copy, and per-slot xxh3 checksums. Not thread-safe: TierSet
// serialises the bookkeeping; slot bytes are moved outside its lock while
// the slot is kBusy (neither indexed nor in the LRU, so nobody else sees it).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "hash/block_hash.h"

namespace pagedkv {

class Backend;

enum class Medium : uint32_t { kDevice = 0, kHost = 1, kFile = 2 };

class TierLevel {
 public:
  enum class State : uint8_t { kFree, kBusy, kReady };

  // Host memory of slots * slot_bytes (throws Error kOutOfMemory).
  static std::unique_ptr<TierLevel> host(uint64_t slots, size_t slot_bytes);
  // The same in memory the backend's asynchronous copies can use (CUDA:
  // page-locked, so a device copy in or out is DMA that the host does not
  // wait for); freed through the backend, which the level keeps alive.
  static std::unique_ptr<TierLevel> host_pinned(uint64_t slots, size_t slot_bytes,
                                                std::shared_ptr<Backend> backend);
  // One file of slots * slot_bytes in dir, unlinked at once so that nothing
  // outlives the pool (throws Error kInvalidArgument naming the directory).
  static std::unique_ptr<TierLevel> file(const std::string& dir, uint64_t slots, size_t slot_bytes);
  ~TierLevel();
  TierLevel(const TierLevel&) = delete;
  TierLevel& operator=(const TierLevel&) = delete;

  Medium medium() const { return medium_; }
  uint64_t capacity() const { return state_.size(); }
  uint64_t num_ready() const { return index_.size(); }
  size_t slot_bytes() const { return slot_bytes_; }

  // The ready slot holding h, or -1.
  int32_t find(const BlockHash& h) const;
  // A free slot, now kBusy, or -1.
  int32_t take_free();
  // The least recently used ready slot nobody pinned, or -1.
  int32_t lru_victim() const;
  // A ready slot leaves the index and the LRU and becomes kBusy.
  void unpublish(int32_t slot);
  // A kBusy slot goes back to the free list.
  void release(int32_t slot);
  // A kBusy slot whose bytes are complete becomes findable (most recent).
  void publish(int32_t slot, const BlockHash& h, uint64_t checksum, uint64_t lora);
  void touch(int32_t slot);  // most recently used
  void pin(int32_t slot) { ++pins_[slot]; }
  void unpin(int32_t slot) {
    if (pins_[slot] > 0) --pins_[slot];
  }
  void clear();  // every slot free (pins too)

  const BlockHash& hash(int32_t slot) const { return hash_[slot]; }
  uint64_t checksum(int32_t slot) const { return sum_[slot]; }
  uint64_t lora(int32_t slot) const { return lora_[slot]; }
  State state(int32_t slot) const { return state_[slot]; }

  // Host level: the slot's bytes.
  char* data(int32_t slot) const { return mem_ + size_t(slot) * slot_bytes_; }
  // File level: scatter/gather I/O of the part of a slot from byte `at`
  // that iov covers; false on an I/O error, a short transfer or a range
  // past the slot.
  bool read(int32_t slot, size_t at, const struct iovec* iov, int n) const;
  bool write(int32_t slot, size_t at, const struct iovec* iov, int n) const;
  void fail_io_for_testing(bool on) { fail_io_ = on; }
  int fd() const { return fd_; }

  // "" when the index, the LRU and the slot states agree.
  std::string check() const;

 private:
  TierLevel(Medium m, uint64_t slots, size_t slot_bytes);
  void lru_unlink(int32_t slot);
  void lru_push_back(int32_t slot);

  struct KeyedHasher {
    uint64_t seed;
    size_t operator()(const BlockHash& h) const noexcept;
  };

  Medium medium_;
  size_t slot_bytes_;
  char* mem_ = nullptr;  // std::free, or pinned_by_->host_free_pinned
  std::shared_ptr<Backend> pinned_by_;
  int fd_ = -1;
  bool fail_io_ = false;
  std::vector<State> state_;
  std::vector<BlockHash> hash_;
  std::vector<uint64_t> sum_, lora_;
  std::vector<uint32_t> pins_;
  std::vector<int32_t> free_;
  std::vector<int32_t> prev_, next_;  // LRU links; -1 = none
  int32_t lru_head_ = -1, lru_tail_ = -1;
  // Digests come from requests: the index is keyed by a random seed so an
  // outsider cannot aim many digests at one bucket (as in prefix_cache.h).
  std::unordered_map<BlockHash, int32_t, KeyedHasher> index_;
};

}  // namespace pagedkv
