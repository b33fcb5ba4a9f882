// The offload tiers of one pool (pkv_pool_attach_tiers): a host level and,
// below it, an optional file level, and the copy thread that fills them.
//
// Eviction of a cached, written device block only enqueues its id (the
// allocation path never waits). The block's bytes stay valid until the pool
// next writes into its storage, and every writer (a step plan, a block copy,
// a swap-in, a load from a tier) first calls flush(), which waits for the
// queue to drain: that is where an engine waits, if ever. A copy that has
// not finished is not in the index, so a lookup cannot match it. When the
// host level is full, its least recently used entry moves to the file level
// (or is dropped) the same way, on the copy thread. Without a host level
// (host_bytes 0 and a file level) a block goes straight from the pool's
// storage into the file, hashed as it is written: one pass.
//
// Locking: the owning Pool's mutex, then mu_ here; the copy thread takes
// only mu_, and never holds it while moving bytes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "block_pool.h"
#include "event_queue.h"
#include "tier/tier_level.h"

namespace pagedkv {

struct TierOptions {
  uint64_t host_bytes = 0;
  std::string file_dir;
  uint64_t file_bytes = 0;
  uint32_t flags = 0;
};

struct TierStats {
  uint64_t capacity_blocks = 0, num_blocks = 0, bytes = 0;
  uint64_t num_stored = 0, num_removed = 0, num_hits = 0, num_loaded = 0;
  uint64_t bytes_stored = 0, bytes_loaded = 0, load_ns = 0;
  uint64_t num_checksum_failures = 0, num_io_errors = 0, num_dropped = 0;
};

// A matched tier entry, pinned (not evicted) until its load ran.
struct TierRef {
  Medium medium = Medium::kHost;
  int32_t slot = -1;
};

class TierSet final : public EvictSink {
 public:
  // arena: the pool's storage (CPU memory), kept alive by hold while the
  // copy thread may read it. max_jobs: the most evictions between two
  // flushes (a block is evicted at most once in between: the pool's block
  // count).
  TierSet(const TierOptions& o, const KvArena& arena, std::shared_ptr<void> hold,
          uint32_t block_size, size_t max_jobs);
  ~TierSet();  // stops the copy thread
  TierSet(const TierSet&) = delete;
  TierSet& operator=(const TierSet&) = delete;

  // Called by the eviction hook with the pool locked. Never blocks on a
  // copy, never allocates, never throws: a full queue drops (counted).
  void enqueue(int32_t block, const BlockHash& h, uint64_t lora) noexcept;
  void on_evict(int32_t id, const BlockHash& h, uint64_t lora_id) noexcept override {
    enqueue(id, h, lora_id);
  }
  // Waits until every queued copy finished (the copy thread is then idle
  // until the next enqueue).
  void flush();
  void stop() noexcept;

  // Pins and returns the entry holding h (host first), or slot -1. Counts
  // a hit.
  TierRef lookup_pin(const BlockHash& h);
  void unpin(const TierRef& r);
  // Copies the pinned entry into the pool's block (after flush(), so
  // nothing else moves tier bytes), verifies its checksum and unpins it.
  // false: checksum mismatch or I/O error; the entry is dropped, counted,
  // and the block's bytes must not be served.
  bool load(const TierRef& r, int32_t block, const BlockHash& h);
  void clear();  // after flush(): every entry goes (reset_prefix_cache)

  TierStats stats(Medium m) const;
  bool has(Medium m) const { return level(m) != nullptr; }
  // Tier events (STORED/REMOVED with medium 1/2) since the last call.
  void take_events(std::vector<Event>* out);
  std::string check() const;

  // Tests: flips one byte of the entry holding h (false: not found), and
  // makes file I/O fail.
  bool corrupt_for_testing(const BlockHash& h);
  void fail_io_for_testing(bool on);

 private:
  struct Job {
    int32_t block;
    BlockHash hash;
    uint64_t lora;
  };
  void run();
  void offload(const Job& j);
  // A free host slot, demoting or dropping the LRU entry when full; -1 if
  // every entry is pinned. Called and returns with lock held; drops it
  // around file I/O.
  int32_t host_slot(std::unique_lock<std::mutex>& lock);
  // A free file slot, removing the LRU entry when full; -1 if every entry
  // is pinned. With mu_ held.
  int32_t file_slot();
  // No host tier (host_bytes 0): the block goes straight into a file slot,
  // hashed as it is written. Called with lock held; drops it around the I/O.
  void offload_to_file(const Job& j, std::unique_lock<std::mutex>& lock);
  void push_event(EventType t, Medium m, int32_t slot, const BlockHash& h, uint64_t lora);
  void remove(TierLevel& l, int32_t slot);  // unpublish + release + REMOVED
  TierLevel* level(Medium m) const;
  TierStats& st(Medium m) { return m == Medium::kHost ? host_stats_ : file_stats_; }
  // Writes block b's planes into file slot `slot` (write) or reads the slot
  // into them, hashing them in the same pass; false on an I/O error.
  bool file_io_hashed(const TierLevel& l, int32_t slot, int32_t b, bool write, uint64_t* sum) const;
  // Plane p (2 * layer + K/V; an MLA pool's layer p) of block b in the
  // pool's storage.
  char* block_plane(int32_t p, int32_t b) const {
    return static_cast<char*>(arena_.plane_at(p)) + size_t(b) * plane_bytes_;
  }

  KvArena arena_;
  std::shared_ptr<void> hold_;
  uint32_t block_size_;
  size_t plane_bytes_, slot_bytes_;
  std::unique_ptr<TierLevel> host_, file_;  // host_ null: a file tier alone

  mutable std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::vector<Job> ring_;  // fixed capacity: enqueue never allocates
  size_t head_ = 0, size_ = 0;
  bool busy_ = false, stopping_ = false;
  std::vector<Event> events_;
  TierStats host_stats_, file_stats_;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace pagedkv
