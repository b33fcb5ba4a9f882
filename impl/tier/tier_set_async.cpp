// TierSet on a backend with asynchronous host copies (CUDA): page-locked
// host slots, offloads issued on the tiers' own stream and published when
// their event completed, loads queued on the plan's stream with their slots
// held until the copy completed. tier_set.h says why each wait is where it
// is; everything here runs with mu_ held unless it says it drops it.
#include <algorithm>
#include <chrono>

#include "error.h"
#include "tier/slot_hash.h"
#include "tier/tier_set.h"

namespace pagedkv {

namespace {

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

// How often the copy thread looks at its copies' events while any is in
// flight (a device->host copy of one block takes some microseconds to a
// few milliseconds). A new offload wakes it at once.
constexpr auto kPollOffloads = std::chrono::microseconds(50);
constexpr auto kPollLoads = std::chrono::microseconds(200);
// Pinned buffers for blocks on their way between the device and the file
// tier: a load reads the file slot into one and copies it to the device
// from there; an offload into a file tier alone copies the block into one
// and writes the file from there.
constexpr int32_t kLoadStaging = 4;
constexpr int32_t kOffloadStaging = 4;

// Clears a flag on every way out of a scope (issue_queued may throw
// half-way; a flush waiting for the flag must still wake).
struct FlagGuard {
  bool& flag;
  std::condition_variable& cv;
  ~FlagGuard() {
    flag = false;
    cv.notify_all();
  }
};

}  // namespace

void TierSet::init_async(const TierOptions&) {
  tier_stream_ = backend_->stream_create();
  fence_ = backend_->event_create(false);
  tail_ = backend_->event_create(false);
  chain_ = backend_->event_create(false);
  // Reserved first: a buffer allocated is a buffer recorded (and freed).
  lstage_.reserve(kLoadStaging);
  lstage_free_.reserve(kLoadStaging);
  ostage_.reserve(kOffloadStaging);
  ostage_free_.reserve(kOffloadStaging);
  if (file_)
    for (int32_t i = 0; i < kLoadStaging; ++i) {
      lstage_.push_back(static_cast<char*>(backend_->host_alloc_pinned(slot_bytes_)));
      lstage_free_.push_back(i);
    }
  if (!host_)
    for (int32_t i = 0; i < kOffloadStaging; ++i) {
      ostage_.push_back(static_cast<char*>(backend_->host_alloc_pinned(slot_bytes_)));
      ostage_free_.push_back(i);
    }
  batch_.reserve(ring_.size());
}

void TierSet::destroy_async() noexcept {
  // The thread is gone (or never started): only this thread touches the
  // state now, mu_ or not. Every copy still queued on the device completes
  // before the memory it reads or writes is freed.
  for (const Inflight& f : inflight_) {
    try {
      backend_->event_synchronize(f.done);
    } catch (...) {
    }
    backend_->event_destroy(f.done);
  }
  inflight_.clear();
  if (tier_stream_) {
    try {
      backend_->synchronize(tier_stream_);
    } catch (...) {
    }
  }
  for (LoadBatch& b : loads_) {
    try {
      backend_->event_synchronize(b.end);
    } catch (...) {
    }
    backend_->event_destroy(b.start);
    backend_->event_destroy(b.end);
  }
  loads_.clear();
  for (void* e : free_events_) backend_->event_destroy(e);
  for (void* e : free_timing_events_) backend_->event_destroy(e);
  free_events_.clear();
  free_timing_events_.clear();
  for (void** e : {&fence_, &tail_, &chain_}) {
    if (*e) backend_->event_destroy(*e);
    *e = nullptr;
  }
  if (tier_stream_) backend_->stream_destroy(tier_stream_);
  tier_stream_ = nullptr;
  for (char* p : lstage_) backend_->host_free_pinned(p);
  for (char* p : ostage_) backend_->host_free_pinned(p);
  lstage_.clear();
  ostage_.clear();
  lstage_free_.clear();
  ostage_free_.clear();
}

void* TierSet::take_event(bool timing) {
  std::vector<void*>& free = timing ? free_timing_events_ : free_events_;
  if (!free.empty()) {
    void* e = free.back();
    free.pop_back();
    return e;
  }
  return backend_->event_create(timing);
}

void TierSet::put_event(void* ev, bool timing) noexcept {
  if (!ev) return;
  try {
    (timing ? free_timing_events_ : free_events_).push_back(ev);
  } catch (...) {
    backend_->event_destroy(ev);
  }
}

void TierSet::run_async() {
  try {
    backend_->bind_thread();
  } catch (...) {  // a device error: each call below still selects the device itself
  }
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    try {
      if (size_ > 0) {
        issue_queued(lock);
      } else if (!inflight_.empty()) {
        complete_offloads(lock, false);
        if (!inflight_.empty() && size_ == 0 && !stopping_) work_cv_.wait_for(lock, kPollOffloads);
      } else if (!loads_.empty()) {
        // Loads' slots go back as soon as their copies completed, not only
        // at the next plan.
        drain_loads(false);
        if (!loads_.empty() && size_ == 0 && !stopping_) work_cv_.wait_for(lock, kPollLoads);
      } else {
        work_cv_.wait(lock, [&] { return stopping_ || size_ > 0; });
      }
    } catch (...) {  // out of memory for an event or a queue entry: that offload is lost
      if (!lock.owns_lock()) lock.lock();
    }
  }
  idle_cv_.notify_all();
}

void TierSet::issue_queued(std::unique_lock<std::mutex>& lock) {
  issuing_ = true;
  FlagGuard guard{issuing_, idle_cv_};
  batch_.clear();
  while (size_ > 0) {
    batch_.push_back(ring_[head_]);  // reserved for the ring's capacity
    head_ = (head_ + 1) % ring_.size();
    --size_;
  }
  // Each block's last writes were queued (on the stream the pool last
  // planned on, or ordered before it) before its eviction queued the job
  // and recorded the fence there (enqueue), so the fence's latest record
  // follows them all.
  try {
    backend_->stream_wait_event(tier_stream_, fence_);
  } catch (...) {  // the device failed: nothing can be ordered, nothing is copied
    for (size_t i = 0; i < batch_.size(); ++i) ++(host_ ? host_stats_ : file_stats_).num_dropped;
    return;
  }
  bool issued = false;
  for (const Job& j : batch_) {
    if (stopping_) break;
    if ((host_ && host_->find(j.hash) >= 0) || (file_ && file_->find(j.hash) >= 0))
      continue;  // already kept
    int32_t slot = -1, stage = -1;
    char* dst;
    if (host_) {
      slot = host_slot(lock);  // may drop the lock to demote an entry into the file
      // A host tier full of copies still in flight (a burst of evictions
      // larger than the tier): the oldest completes and becomes the LRU
      // entry to demote, as the copy thread of a CPU pool would have it.
      while (slot < 0 && !inflight_.empty()) {
        complete_offloads(lock, true);
        slot = host_slot(lock);
      }
      if (slot < 0) {
        ++host_stats_.num_dropped;  // every entry pinned
        continue;
      }
      dst = host_->data(slot);
    } else {
      // A file tier alone: through a staging buffer, written to the file
      // when the copy completed; with every buffer in flight, the oldest
      // copy is waited for (on this thread only).
      while (ostage_free_.empty() && !inflight_.empty()) complete_offloads(lock, true);
      if (ostage_free_.empty()) {
        ++file_stats_.num_dropped;
        continue;
      }
      stage = ostage_free_.back();
      ostage_free_.pop_back();
      dst = ostage_[size_t(stage)];
    }
    void* ev = nullptr;
    try {
      ev = take_event(false);
      backend_->copy_block_to_host_async(arena_, j.block, dst, tier_stream_);
      backend_->event_record(ev, tier_stream_);
      inflight_.push_back({j, slot, stage, ev});
      issued = true;
    } catch (...) {
      // Whatever was queued finishes before the slot is reused.
      try {
        backend_->synchronize(tier_stream_);
      } catch (...) {
      }
      put_event(ev, false);
      if (slot >= 0)
        host_->release(slot);
      else
        ostage_free_.push_back(stage);
      ++(host_ ? host_stats_ : file_stats_).num_dropped;
    }
  }
  if (issued) {
    try {
      backend_->event_record(tail_, tier_stream_);
      tail_recorded_ = true;
    } catch (...) {
      // The next writer cannot be ordered after the copies on the device:
      // the host waits for them instead.
      try {
        backend_->synchronize(tier_stream_);
      } catch (...) {
      }
    }
  }
}

void TierSet::complete_offloads(std::unique_lock<std::mutex>& lock, bool block) {
  while (!inflight_.empty()) {
    void* ev = inflight_.front().done;
    bool done = true, failed = false;
    try {
      if (block) {
        // Only this thread pops inflight_: the front stays while unlocked.
        lock.unlock();
        backend_->event_synchronize(ev);
        lock.lock();
      } else {
        done = backend_->event_query(ev);
      }
    } catch (...) {
      if (!lock.owns_lock()) lock.lock();
      failed = true;  // a device error: the slot's bytes are unknown
    }
    if (!done) break;
    if (failed) {
      const Inflight f = inflight_.front();
      inflight_.pop_front();
      put_event(f.done, false);
      if (f.slot >= 0)
        host_->release(f.slot);
      else
        ostage_free_.push_back(f.staging);
      ++(host_ ? host_stats_ : file_stats_).num_dropped;
    } else {
      complete_front(lock);
    }
    if (block) break;
  }
  if (size_ == 0 && !issuing_ && inflight_.empty()) idle_cv_.notify_all();
}

void TierSet::complete_front(std::unique_lock<std::mutex>& lock) {
  const Inflight f = inflight_.front();
  inflight_.pop_front();
  put_event(f.done, false);
  const Job& j = f.job;
  if (f.slot >= 0) {
    // The copy completed: the slot holds the block as it was. Hashed
    // unlocked (kBusy: nobody else sees the slot), then published.
    lock.unlock();
    SlotHash sh;
    sh.update(host_->data(f.slot), slot_bytes_);
    const uint64_t sum = sh.digest();
    lock.lock();
    if (host_->find(j.hash) >= 0) {  // the same block was offloaded twice in flight
      host_->release(f.slot);
      return;
    }
    host_->publish(f.slot, j.hash, sum, j.lora);
    ++host_stats_.num_stored;
    host_stats_.bytes_stored += slot_bytes_;
    push_event(EventType::kStored, Medium::kHost, f.slot, j.hash, j.lora);
    return;
  }
  // A file tier alone: the staged block goes into a file slot, hashed as
  // it is written.
  char* src = ostage_[size_t(f.staging)];
  const int32_t fslot = file_->find(j.hash) >= 0 ? -1 : file_slot();
  if (fslot < 0) {
    if (file_->find(j.hash) < 0) ++file_stats_.num_dropped;  // every entry pinned
    ostage_free_.push_back(f.staging);
    return;
  }
  lock.unlock();
  SlotHash sh;
  sh.update(src, slot_bytes_);
  const uint64_t sum = sh.digest();
  struct iovec iov {
    src, slot_bytes_
  };
  const bool ok = file_->write(fslot, 0, &iov, 1);
  lock.lock();
  ostage_free_.push_back(f.staging);
  if (!ok) {
    ++file_stats_.num_io_errors;
    file_->release(fslot);
    return;
  }
  file_->publish(fslot, j.hash, sum, j.lora);
  ++file_stats_.num_stored;
  file_stats_.bytes_stored += slot_bytes_;
  push_event(EventType::kStored, Medium::kFile, fslot, j.hash, j.lora);
}

void TierSet::begin_loads(void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!async_) return;
  cur_ = LoadBatch{};
  cur_.stream = stream;
  loading_ = true;
  // Never throws (a plan may call it after changing sequences): without
  // its events (a device error) the batch is waited for at its end.
  try {
    cur_.start = take_event(true);
    cur_.end = take_event(true);
    backend_->event_record(cur_.start, stream);
  } catch (...) {
    put_event(cur_.start, true);
    put_event(cur_.end, true);
    cur_.start = cur_.end = nullptr;
  }
}

void TierSet::end_loads() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!loading_) return;
  loading_ = false;
  try {
    if (!cur_.end) throw Error(Errc::kCuda, "no event");
    backend_->event_record(cur_.end, cur_.stream);
    loads_.push_back(std::move(cur_));
  } catch (...) {
    // Without its event the batch is waited for here, and let go.
    try {
      backend_->synchronize(cur_.stream);
    } catch (...) {
    }
    for (const TierRef& r : cur_.pinned) level(r.medium)->unpin(r.slot);
    for (int32_t s : cur_.staging) lstage_free_.push_back(s);
    put_event(cur_.start, true);
    put_event(cur_.end, true);
  }
  cur_ = LoadBatch{};
}

bool TierSet::load_async(const TierRef& r, int32_t block, const BlockHash& h,
                         std::unique_lock<std::mutex>& lock) {
  TierLevel* l = level(r.medium);
  TierStats& s = st(r.medium);
  if (!loading_ || l->state(r.slot) != TierLevel::State::kReady || l->hash(r.slot) != h) {
    l->unpin(r.slot);
    return false;
  }
  const uint64_t t0 = now_ns();
  const uint64_t want = l->checksum(r.slot);
  const int mi = r.medium == Medium::kHost ? 0 : 1;
  if (r.medium == Medium::kHost) {
    // The slot is pinned (no demotion, no reuse) and published (its
    // offload completed): verified here, on the host, before any byte of it
    // reaches the device; then it stays pinned until the copy completed.
    const char* src = l->data(r.slot);
    lock.unlock();
    SlotHash sh;
    sh.update(src, slot_bytes_);
    const bool ok = sh.digest() == want;
    lock.lock();
    if (!ok) {
      l->unpin(r.slot);
      ++s.num_checksum_failures;
      remove(*l, r.slot);
      return false;
    }
    try {
      cur_.pinned.push_back(r);  // before the copy: a throw leaves nothing queued
      backend_->copy_block_from_host_async(arena_, block, src, cur_.stream);
    } catch (...) {
      if (!cur_.pinned.empty() && cur_.pinned.back().slot == r.slot &&
          cur_.pinned.back().medium == r.medium)
        cur_.pinned.pop_back();
      try {
        backend_->synchronize(cur_.stream);
      } catch (...) {
      }
      l->unpin(r.slot);
      ++s.num_io_errors;
      return false;  // the block stays unwritten
    }
  } else {
    // File: read into a pinned staging buffer, verified there, copied to
    // the device from it. With every buffer in use, earlier loads' copies
    // are waited for (the slots the plan needs come first).
    if (lstage_free_.empty()) drain_loads(false);
    if (lstage_free_.empty() && !loads_.empty()) drain_loads(true);
    if (lstage_free_.empty()) {
      // All of them hold this batch's copies so far: wait for those.
      try {
        backend_->synchronize(cur_.stream);
      } catch (...) {
        l->unpin(r.slot);
        ++s.num_io_errors;
        return false;
      }
      for (int32_t i : cur_.staging) lstage_free_.push_back(i);
      cur_.staging.clear();
    }
    const int32_t stage = lstage_free_.back();
    lstage_free_.pop_back();
    char* buf = lstage_[size_t(stage)];
    lock.unlock();
    struct iovec iov {
      buf, slot_bytes_
    };
    const bool io = l->read(r.slot, 0, &iov, 1);
    uint64_t sum = 0;
    if (io) {
      SlotHash sh;
      sh.update(buf, slot_bytes_);
      sum = sh.digest();
    }
    lock.lock();
    l->unpin(r.slot);  // its bytes are in the staging buffer now
    if (!io || sum != want) {
      ++(io ? s.num_checksum_failures : s.num_io_errors);
      lstage_free_.push_back(stage);
      remove(*l, r.slot);
      return false;
    }
    try {
      cur_.staging.push_back(stage);
      backend_->copy_block_from_host_async(arena_, block, buf, cur_.stream);
    } catch (...) {
      cur_.staging.pop_back();
      try {
        backend_->synchronize(cur_.stream);
      } catch (...) {
      }
      lstage_free_.push_back(stage);
      ++s.num_io_errors;
      return false;
    }
  }
  l->touch(r.slot);
  ++s.num_loaded;
  s.bytes_loaded += slot_bytes_;
  cur_.host_ns[mi] += now_ns() - t0;
  cur_.bytes[mi] += slot_bytes_;
  return true;
}

void TierSet::drain_loads(bool block) {
  while (!loads_.empty()) {
    LoadBatch& b = loads_.front();
    bool done = true;
    try {
      if (block)
        backend_->event_synchronize(b.end);
      else
        done = backend_->event_query(b.end);
    } catch (...) {  // a device error: nothing more will run on it
    }
    if (!done) break;
    finish_load_batch(b);
    loads_.pop_front();
  }
  if (block) idle_cv_.notify_all();
}

void TierSet::finish_load_batch(LoadBatch& b) {
  // load_ns: the host's time (checksums, file reads, issuing the copies)
  // plus the device's time between the batch's first and last copy, shared
  // out by bytes: an upper bound of the latency, as the two overlap.
  uint64_t device_ns = 0;
  try {
    if (b.start && b.end) device_ns = backend_->event_elapsed_ns(b.start, b.end);
  } catch (...) {
  }
  const uint64_t total = b.bytes[0] + b.bytes[1];
  for (int mi = 0; mi < 2; ++mi) {
    if (b.bytes[mi] == 0) continue;
    TierStats& s = mi == 0 ? host_stats_ : file_stats_;
    s.load_ns += b.host_ns[mi] + uint64_t(double(device_ns) * double(b.bytes[mi]) / double(total));
  }
  for (const TierRef& r : b.pinned)
    if (TierLevel* l = level(r.medium)) l->unpin(r.slot);
  for (int32_t i : b.staging) lstage_free_.push_back(i);
  put_event(b.start, true);
  put_event(b.end, true);
  b.start = b.end = nullptr;
}

}  // namespace pagedkv
