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
// Backends whose storage the host cannot read (CUDA; Backend::
// async_host_copies) move bytes with queued copies instead
// (tier_set_async.cpp): host slots are page-locked, the copy thread only
// *issues* each offload's device->host copy, on a stream of the tiers' own,
// ordered after the work queued before the eviction on the stream the pool
// last planned on (an event recorded there by the evicting thread), and
// hashes and publishes the slot once the copy's event completed.
// flush(stream) then waits only until the queued offloads were issued, and
// makes the next writer's stream wait (on the device) for the last of them. Loads verify
// a slot's checksum on the host and queue its host->device copy on the
// plan's stream; the slot stays pinned until that copy's event completed.
//
// Locking: the owning Pool's mutex, then mu_ here; the copy thread takes
// only mu_, and never holds it while moving bytes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
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
  // arena: the pool's storage, kept alive by hold while the copy thread
  // may read it. max_jobs: the most evictions between two flushes (a block
  // is evicted at most once in between: the pool's block count). backend:
  // the pool's; when it has asynchronous host copies (CUDA) the tiers use
  // them (see above), otherwise (null, CPU) the copy thread copies itself.
  TierSet(const TierOptions& o, const KvArena& arena, std::shared_ptr<void> hold,
          uint32_t block_size, size_t max_jobs, std::shared_ptr<Backend> backend = nullptr);
  // Stops the copy thread; asynchronous copies already queued are waited
  // for (they read and write memory that goes with this object).
  ~TierSet();
  TierSet(const TierSet&) = delete;
  TierSet& operator=(const TierSet&) = delete;

  // Called by the eviction hook with the pool locked. Never blocks on a
  // copy, never allocates, never throws: a full queue drops (counted).
  void enqueue(int32_t block, const BlockHash& h, uint64_t lora) noexcept;
  void on_evict(int32_t id, const BlockHash& h, uint64_t lora_id) noexcept override {
    enqueue(id, h, lora_id);
  }
  // Waits until every queued copy finished (the copy thread is then idle
  // until the next enqueue). Asynchronous: waits until every queued copy
  // was issued, then makes stream (the next writer's; the pool's storage
  // is written only on it from now on) wait on the device for them, and
  // remembers stream as the one later offloads order after (a new stream
  // is first ordered after the previous one).
  void flush(void* stream = nullptr);
  // Asynchronous: waits (on the host) until every queued offload is in its
  // tier and every load's copy completed. Otherwise flush().
  void wait_idle();
  void stop() noexcept;
  bool async() const { return async_; }
  void* source_stream() const;  // the stream of the last flush(stream)

  // Pins and returns the entry holding h (host first), or slot -1. Counts
  // a hit.
  TierRef lookup_pin(const BlockHash& h);
  void unpin(const TierRef& r);
  // Copies the pinned entry into the pool's block (after flush(), so
  // nothing else moves tier bytes), verifies its checksum and unpins it.
  // false: checksum mismatch or I/O error; the entry is dropped, counted,
  // and the block's bytes must not be served.
  // Asynchronous: the copy is queued on the stream of begin_loads (call
  // begin_loads, the loads, then end_loads, after flush(stream)); the slot
  // is released once the copy completed.
  bool load(const TierRef& r, int32_t block, const BlockHash& h);
  void begin_loads(void* stream);
  void end_loads();
  void clear();  // after flush(): every entry goes (reset_prefix_cache)

  TierStats stats(Medium m) const;
  bool has(Medium m) const { return level(m) != nullptr; }
  // Tier events (STORED/REMOVED with medium 1/2) since the last call.
  void take_events(std::vector<Event>* out);
  std::string check() const;

  // Tests: flips one byte of the entry holding h (false: not found),
  // makes file I/O fail, and makes the copy thread sleep ms before each
  // offload (a slow copy: what a writer must wait for).
  bool corrupt_for_testing(const BlockHash& h);
  void fail_io_for_testing(bool on);
  void delay_offloads_for_testing(uint32_t ms) { offload_delay_ms_.store(ms); }

 private:
  std::atomic<uint32_t> offload_delay_ms_{0};
  struct Job {
    int32_t block;
    BlockHash hash;
    uint64_t lora;
  };
  void run();
  void offload(const Job& j);
  // tier_set_async.cpp.
  struct Inflight {
    Job job;
    int32_t slot;     // host slot being filled, or -1: staging (file tier alone)
    int32_t staging;  // offload staging buffer, or -1
    void* done;       // event after the copy
  };
  struct LoadBatch {
    void* stream = nullptr;
    void* start = nullptr;  // timing events around the batch's copies
    void* end = nullptr;
    std::vector<TierRef> pinned;                      // host slots the copies read
    std::vector<int32_t> staging;                     // load staging buffers the copies read
    uint64_t host_ns[2] = {0, 0}, bytes[2] = {0, 0};  // per medium (host, file)
  };
  void init_async(const TierOptions& o);
  void run_async();
  void issue_queued(std::unique_lock<std::mutex>& lock);
  // Completes finished offloads in order (block: wait for the oldest).
  void complete_offloads(std::unique_lock<std::mutex>& lock, bool block);
  void complete_front(std::unique_lock<std::mutex>& lock);
  bool load_async(const TierRef& r, int32_t block, const BlockHash& h,
                  std::unique_lock<std::mutex>& lock);
  // Releases the slots and staging of load batches whose copies completed
  // (block: waits for all of them). With mu_ held.
  void drain_loads(bool block);
  void finish_load_batch(LoadBatch& b);
  void* take_event(bool timing);
  void put_event(void* ev, bool timing) noexcept;
  void destroy_async() noexcept;
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

  // Asynchronous host copies (tier_set_async.cpp); unused otherwise.
  std::shared_ptr<Backend> backend_;
  bool async_ = false;
  bool issuing_ = false;         // the copy thread is issuing taken jobs
  void* tier_stream_ = nullptr;  // the offloads' device->host copies
  void* fence_ = nullptr;        // on source_ at each eviction (enqueue, the evicting thread)
  void* tail_ = nullptr;         // on tier_stream_ after the last issued offload
  void* chain_ = nullptr;        // orders a new source stream after the last
  bool tail_recorded_ = false;
  void* source_ = nullptr;  // the stream the pool last planned on
  bool have_source_ = false;
  std::vector<Job> batch_;
  std::deque<Inflight> inflight_;  // issue order = completion order
  std::vector<void*> free_events_, free_timing_events_;
  std::vector<char*> ostage_, lstage_;  // offload / load staging slots (pinned)
  std::vector<int32_t> ostage_free_, lstage_free_;
  LoadBatch cur_;  // between begin_loads and end_loads
  bool loading_ = false;
  std::deque<LoadBatch> loads_;  // queued, copies maybe not complete

  uint64_t fork_epoch_ = 0;  // fork_epoch.h: the copy thread is the parent's after a fork
  std::thread thread_;       // last: starts after everything above exists
};

}  // namespace pagedkv
