#include "tier/tier_set.h"

#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstring>

#include "error.h"
#include "fork_epoch.h"
#include "tier/slot_hash.h"

namespace pagedkv {

namespace {

constexpr size_t kMaxPendingEvents = 1 << 16;  // beyond: dropped (the pool's own ring counts)

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

// Blocks move in chunks small enough to stay in L2 between their copy (or
// read) and their hash, so memory is read once.
constexpr size_t kChunk = 128 << 10;

// Copies with non-temporal stores where dst and n allow (x86-64): the
// destination is not read first (no read-for-ownership), so a copy moves
// 2 bytes of memory traffic per byte instead of 3, as glibc's memcpy does
// for large copies; the bytes are not needed in cache afterwards.
void copy_streaming(char* dst, const char* src, size_t n) {
#if defined(__x86_64__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0 && n % 64 == 0) {
    for (size_t i = 0; i < n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// Each chunk is hashed from the source (which brings it into cache) and
// then copied from cache: memory is read once and written once. The slot's
// bytes are not written by anyone while they move (kBusy or pinned), so the
// hashed bytes are the copied bytes. Callers end with fence_streaming().
void copy_hashed(char* dst, const char* src, size_t n, SlotHash& h) {
  for (size_t at = 0; at < n; at += kChunk) {
    const size_t len = std::min(kChunk, n - at);
    h.update(src + at, len);
    copy_streaming(dst + at, src + at, len);
  }
}

// Orders the non-temporal stores before what follows (publishing the slot,
// marking the block written) for every other thread.
void fence_streaming() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace

TierSet::TierSet(const TierOptions& o, const KvArena& arena, std::shared_ptr<void> hold,
                 uint32_t block_size, size_t max_jobs, std::shared_ptr<Backend> backend)
    : arena_(arena), hold_(std::move(hold)), block_size_(block_size), backend_(std::move(backend)) {
  fork_epoch_ = fork_epoch();
  async_ = backend_ && backend_->async_host_copies();
  plane_bytes_ = arena_.layout.block_bytes();
  slot_bytes_ = plane_bytes_ * size_t(arena_.num_planes());
  const uint64_t host_slots = o.host_bytes / slot_bytes_;
  // host_bytes 0 with a file tier: no host tier; offloads go straight from
  // the pool's storage into the file, one pass (offload_to_file).
  const bool file_only = o.host_bytes == 0 && !o.file_dir.empty();
  if (host_slots == 0 && !file_only)
    fail(Errc::kInvalidArgument, "host_bytes " + std::to_string(o.host_bytes) +
                                     " holds no block of " + std::to_string(slot_bytes_) +
                                     " bytes (all layers' K and V); 0 means no host tier, "
                                     "which needs a file tier (file_dir)");
  if (host_slots > uint64_t(INT32_MAX))
    fail(Errc::kInvalidArgument,
         "host_bytes " + std::to_string(o.host_bytes) + " holds more than 2^31 - 1 blocks");
  if (!o.file_dir.empty()) {
    const uint64_t file_slots = o.file_bytes / slot_bytes_;
    if (file_slots == 0 || file_slots > uint64_t(INT32_MAX))
      fail(Errc::kInvalidArgument, "file_bytes " + std::to_string(o.file_bytes) + " holds " +
                                       std::to_string(file_slots) + " blocks of " +
                                       std::to_string(slot_bytes_) +
                                       " bytes; [1, 2^31 - 1] are needed with file_dir set");
    file_ = TierLevel::file(o.file_dir, file_slots, slot_bytes_);
  }
  if (!file_only) {
    host_ = async_ ? TierLevel::host_pinned(host_slots, slot_bytes_, backend_)
                   : TierLevel::host(host_slots, slot_bytes_);
    host_stats_.capacity_blocks = host_slots;
  }
  if (file_) file_stats_.capacity_blocks = file_->capacity();
  ring_.resize(std::max<size_t>(max_jobs, 1));
  events_.reserve(256);
  if (async_) {
    try {
      init_async(o);
      thread_ = std::thread([this] { run_async(); });
    } catch (...) {  // no destructor runs: the stream, events and staging go here
      destroy_async();
      throw;
    }
  } else {
    thread_ = std::thread([this] { run(); });
  }
}

TierSet::~TierSet() { stop(); }

void TierSet::stop() noexcept {
  if (forked_since(fork_epoch_)) {
    // A forked child: the copy thread runs in the parent only. Its handle is
    // let go, and the condition variables it waits on are abandoned.
    if (thread_.joinable()) thread_.detach();
    abandon_in_child(work_cv_);
    abandon_in_child(idle_cv_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    size_ = 0;  // queued copies are abandoned: the pool is going away
  }
  work_cv_.notify_all();
  idle_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Copies already issued still read the pool's storage and write host
  // slots (or read them, for loads): they complete before any of it goes.
  if (async_) destroy_async();
}

TierLevel* TierSet::level(Medium m) const {
  return m == Medium::kHost ? host_.get() : m == Medium::kFile ? file_.get() : nullptr;
}

void TierSet::enqueue(int32_t block, const BlockHash& h, uint64_t lora) noexcept {
  if (forked_since(fork_epoch_)) return;  // no copy thread here: not offloaded
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (size_ == ring_.size()) {
      ++(host_ ? host_stats_ : file_stats_).num_dropped;  // the tier it was bound for
      return;
    }
    if (async_) {
      // The fence, recorded here, on the thread evicting (the pool's
      // caller's): a stream handle that names a per-thread stream
      // (cudaStreamPerThread) means this thread's, not the copy thread's,
      // and everything queued so far there, the block's last writes
      // included, is before it. The copy thread's stream waits on its
      // latest record.
      try {
        backend_->event_record(fence_, source_);
      } catch (...) {  // the device failed: the copy could not be ordered
        ++(host_ ? host_stats_ : file_stats_).num_dropped;
        return;
      }
    }
    Job& j = ring_[(head_ + size_) % ring_.size()];
    j.block = block;
    j.hash = h;
    j.lora = lora;
    ++size_;
  }
  work_cv_.notify_one();
}

void TierSet::flush(void* stream) {
  if (forked_since(fork_epoch_)) return;  // a forked child offloads nothing
  std::unique_lock<std::mutex> lock(mu_);
  if (!async_) {
    idle_cv_.wait(lock, [&] { return stopping_ || (size_ == 0 && !busy_); });
    return;
  }
  // Issued, not completed: the device orders the rest.
  idle_cv_.wait(lock, [&] { return stopping_ || (size_ == 0 && !issuing_); });
  if (stopping_) return;
  drain_loads(false);
  try {
    if (have_source_ && stream != source_) {
      // Copies the pool queued on the previous stream (loads, block
      // copies) come before anything on the new one, so that a later
      // offload's fence, recorded on the new stream only, still follows
      // them.
      backend_->event_record(chain_, source_);
      backend_->stream_wait_event(stream, chain_);
    }
    if (tail_recorded_) backend_->stream_wait_event(stream, tail_);
  } catch (...) {
    // A device error: the order the events would give is had by waiting
    // on the host instead (never throws: plans call this after changes).
    for (void* s : {tier_stream_, source_}) {
      try {
        backend_->synchronize(s);
      } catch (...) {
      }
    }
  }
  source_ = stream;
  have_source_ = true;
}

void TierSet::wait_idle() {
  if (!async_ || forked_since(fork_epoch_)) return flush();
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return stopping_ || (size_ == 0 && !issuing_ && inflight_.empty()); });
  drain_loads(true);
}

void* TierSet::source_stream() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_;
}

void TierSet::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || size_ > 0; });
    if (stopping_) break;
    const Job j = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
    --size_;
    busy_ = true;
    lock.unlock();
    if (const uint32_t ms = offload_delay_ms_.load(std::memory_order_relaxed))
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    try {
      offload(j);
    } catch (...) {  // out of memory for an event: the copy is lost, nothing else
    }
    lock.lock();
    busy_ = false;
    if (size_ == 0) idle_cv_.notify_all();
  }
  busy_ = false;
  idle_cv_.notify_all();
}

void TierSet::push_event(EventType t, Medium m, int32_t slot, const BlockHash& h, uint64_t lora) {
  if (events_.size() >= kMaxPendingEvents) return;
  Event e;
  e.type = t;
  e.block_id = slot;
  e.block_hash = h;
  e.num_tokens = block_size_;
  e.lora_id = lora;
  e.medium = uint32_t(m);
  events_.push_back(e);
}

void TierSet::remove(TierLevel& l, int32_t slot) {
  const BlockHash h = l.hash(slot);
  const uint64_t lora = l.lora(slot);
  l.unpublish(slot);
  l.release(slot);
  TierStats& s = st(l.medium());
  ++s.num_removed;
  push_event(EventType::kRemoved, l.medium(), slot, h, lora);
}

int32_t TierSet::host_slot(std::unique_lock<std::mutex>& lock) {
  int32_t slot = host_->take_free();
  if (slot >= 0) return slot;
  const int32_t victim = host_->lru_victim();
  if (victim < 0) return -1;
  const BlockHash h = host_->hash(victim);
  const uint64_t sum = host_->checksum(victim), lora = host_->lora(victim);
  // The victim leaves the host level now (a lookup no longer sees it) and
  // its slot is ours once its bytes went down to the file level.
  host_->unpublish(victim);
  ++host_stats_.num_removed;
  push_event(EventType::kRemoved, Medium::kHost, victim, h, lora);
  if (!file_ || file_->find(h) >= 0) return victim;
  const int32_t fslot = file_slot();
  if (fslot < 0) return victim;  // every file entry pinned: dropped
  lock.unlock();
  struct iovec iov {
    host_->data(victim), slot_bytes_
  };
  const bool ok = file_->write(fslot, 0, &iov, 1);
  lock.lock();
  if (!ok) {
    ++file_stats_.num_io_errors;
    file_->release(fslot);
    return victim;
  }
  // The host bytes go down as they are, with the checksum taken when they
  // came up: corruption in either level is caught on load.
  file_->publish(fslot, h, sum, lora);
  ++file_stats_.num_stored;
  file_stats_.bytes_stored += slot_bytes_;
  push_event(EventType::kStored, Medium::kFile, fslot, h, lora);
  return victim;
}

int32_t TierSet::file_slot() {
  int32_t fslot = file_->take_free();
  if (fslot < 0) {
    fslot = file_->lru_victim();
    if (fslot < 0) return -1;
    remove(*file_, fslot);
    fslot = file_->take_free();
  }
  return fslot;
}

bool TierSet::file_io_hashed(const TierLevel& l, int32_t slot, int32_t b, bool write,
                             uint64_t* sum) const {
  // Planes go in groups of about kChunk bytes, one preadv / pwritev each,
  // hashed while they are in cache (before a write, right after a read):
  // the pool's block is read from or written to memory once.
  const int32_t n = arena_.num_planes();
  constexpr int32_t kMaxIov = 64;
  const int32_t group =
      int32_t(std::min<size_t>(kMaxIov, std::max<size_t>(1, kChunk / plane_bytes_)));
  struct iovec iov[kMaxIov];
  SlotHash sh;
  for (int32_t p0 = 0, k = 0; p0 < n; p0 += k) {
    k = std::min(group, n - p0);
    for (int32_t i = 0; i < k; ++i) iov[i] = {block_plane(p0 + i, b), plane_bytes_};
    if (write)
      for (int32_t i = 0; i < k; ++i) sh.update(iov[i].iov_base, plane_bytes_);
    const size_t at = size_t(p0) * plane_bytes_;
    if (!(write ? l.write(slot, at, iov, k) : l.read(slot, at, iov, k))) return false;
    if (!write)
      for (int32_t i = 0; i < k; ++i) sh.update(iov[i].iov_base, plane_bytes_);
  }
  *sum = sh.digest();
  return true;
}

void TierSet::offload_to_file(const Job& j, std::unique_lock<std::mutex>& lock) {
  const int32_t slot = file_slot();
  if (slot < 0) {
    ++file_stats_.num_dropped;  // every file entry pinned
    return;
  }
  lock.unlock();
  // The block's bytes stay as they are until the pool next writes into its
  // storage, which waits for this copy (flush): the hashed bytes are the
  // written bytes, and the checksum is verified on load as for a demotion.
  uint64_t sum = 0;
  const bool ok = file_io_hashed(*file_, slot, j.block, true, &sum);
  lock.lock();
  if (!ok) {
    ++file_stats_.num_io_errors;
    file_->release(slot);
    return;
  }
  file_->publish(slot, j.hash, sum, j.lora);
  ++file_stats_.num_stored;
  file_stats_.bytes_stored += slot_bytes_;
  push_event(EventType::kStored, Medium::kFile, slot, j.hash, j.lora);
}

void TierSet::offload(const Job& j) {
  std::unique_lock<std::mutex> lock(mu_);
  if ((host_ && host_->find(j.hash) >= 0) || (file_ && file_->find(j.hash) >= 0))
    return;  // already kept
  if (!host_) return offload_to_file(j, lock);
  const int32_t slot = host_slot(lock);
  if (slot < 0) {
    ++host_stats_.num_dropped;
    return;
  }
  lock.unlock();
  // One pass: each chunk is hashed and then copied while it is in cache
  // (the same digest as XXH3_64bits over the whole slot).
  char* dst = host_->data(slot);
  SlotHash sh;
  for (int32_t p = 0; p < arena_.num_planes(); ++p)
    copy_hashed(dst + size_t(p) * plane_bytes_, block_plane(p, j.block), plane_bytes_, sh);
  fence_streaming();
  const uint64_t sum = sh.digest();
  lock.lock();
  host_->publish(slot, j.hash, sum, j.lora);
  ++host_stats_.num_stored;
  host_stats_.bytes_stored += slot_bytes_;
  push_event(EventType::kStored, Medium::kHost, slot, j.hash, j.lora);
}

TierRef TierSet::lookup_pin(const BlockHash& h) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Medium m : {Medium::kHost, Medium::kFile}) {
    TierLevel* l = level(m);
    if (!l) continue;
    const int32_t s = l->find(h);
    if (s < 0) continue;
    l->pin(s);
    ++st(m).num_hits;
    return {m, s};
  }
  return {};
}

void TierSet::unpin(const TierRef& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (TierLevel* l = level(r.medium); l && r.slot >= 0) l->unpin(r.slot);
}

bool TierSet::load(const TierRef& r, int32_t block, const BlockHash& h) {
  std::unique_lock<std::mutex> lock(mu_);
  if (async_) return load_async(r, block, h, lock);
  TierLevel* l = level(r.medium);
  TierStats& s = st(r.medium);
  l->unpin(r.slot);
  if (l->state(r.slot) != TierLevel::State::kReady || l->hash(r.slot) != h) return false;
  const uint64_t t0 = now_ns();
  bool ok;
  if (r.medium == Medium::kHost) {
    // One pass: each plane is hashed in the block right after its copy.
    // On a mismatch the block stays unwritten (the caller drops its hash),
    // so nothing ever reads what landed there.
    const char* src = l->data(r.slot);
    SlotHash sh;
    for (int32_t p = 0; p < arena_.num_planes(); ++p)
      copy_hashed(block_plane(p, block), src + size_t(p) * plane_bytes_, plane_bytes_, sh);
    fence_streaming();
    ok = sh.digest() == l->checksum(r.slot);
    if (!ok) ++s.num_checksum_failures;
  } else {
    // Read straight into the block's planes, verified there; on a mismatch
    // the block stays unwritten, so nothing reads these bytes.
    uint64_t sum = 0;
    ok = file_io_hashed(*l, r.slot, block, false, &sum);
    if (!ok)
      ++s.num_io_errors;
    else if (sum != l->checksum(r.slot))
      ok = false, ++s.num_checksum_failures;
  }
  if (!ok) {
    remove(*l, r.slot);
    return false;
  }
  l->touch(r.slot);
  ++s.num_loaded;
  s.bytes_loaded += slot_bytes_;
  s.load_ns += now_ns() - t0;
  return true;
}

void TierSet::clear() {
  // Asynchronous: no copy may still write a slot (an offload) or read one
  // (a load) that clearing frees.
  if (async_) wait_idle();
  std::lock_guard<std::mutex> lock(mu_);
  for (Medium m : {Medium::kHost, Medium::kFile}) {
    TierLevel* l = level(m);
    if (!l) continue;
    st(m).num_removed += l->num_ready();
    l->clear();
    Event e;
    e.type = EventType::kAllCleared;
    e.medium = uint32_t(m);
    if (events_.size() < kMaxPendingEvents) events_.push_back(e);
  }
}

TierStats TierSet::stats(Medium m) const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats s = m == Medium::kHost ? host_stats_ : file_stats_;
  if (const TierLevel* l = level(m)) {
    s.num_blocks = l->num_ready();
    s.bytes = s.num_blocks * slot_bytes_;
  }
  return s;
}

void TierSet::take_events(std::vector<Event>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->swap(events_);
  events_.clear();
}

std::string TierSet::check() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string e = host_ ? host_->check() : "";
  if (e.empty() && file_) e = file_->check();
  return e;
}

bool TierSet::corrupt_for_testing(const BlockHash& h) {
  std::lock_guard<std::mutex> lock(mu_);
  if (int32_t s = host_ ? host_->find(h) : -1; s >= 0) {
    host_->data(s)[slot_bytes_ / 2] ^= 0x5a;
    return true;
  }
  if (file_) {
    if (int32_t s = file_->find(h); s >= 0) {
      char c;
      const off_t at = off_t(size_t(s) * slot_bytes_ + slot_bytes_ / 2);
      if (pread(file_->fd(), &c, 1, at) != 1) return false;
      c ^= 0x5a;
      return pwrite(file_->fd(), &c, 1, at) == 1;
    }
  }
  return false;
}

void TierSet::fail_io_for_testing(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (file_) file_->fail_io_for_testing(on);
}

}  // namespace pagedkv
