// The offload tiers' asynchronous path (impl/tier/tier_set_async.cpp, what
// CUDA pools use) on the CPU, against a fake backend whose streams are
// worker threads running queued operations in order and whose events are
// generation counters: the same ordering rules as CUDA streams and events,
// with every copy delayed, so that a missing order shows as wrong bytes.
//   - an offload's copy runs after the writes queued before the eviction on
//     the stream the pool last planned on (the fence), and the next writer
//     on that stream runs after the copy (flush makes it wait on the tail);
//   - a loaded host slot stays pinned until its copy to the device ran;
//   - file tier (alone, and below a host tier) through pinned staging;
//   - checksum corruption turns a hit into a counted miss;
//   - destroying the tiers with copies in flight waits for them.
// Named *threads* so that the TSan run (scripts/test-sanitizers.sh) runs it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "backend.h"
#include "tier/tier_set.h"

namespace pagedkv {
namespace {

using Clock = std::chrono::steady_clock;

// A stream: one worker thread running operations in the order queued.
class FakeStream {
 public:
  FakeStream() : worker_([this] { run(); }) {}
  ~FakeStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(op));
      ++queued_;
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return ran_ == queued_; });
  }
  size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return size_t(queued_ - ran_);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop_ and nothing left
      std::function<void()> op = std::move(q_.front());
      q_.pop_front();
      lock.unlock();
      op();
      lock.lock();
      ++ran_;
      done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> q_;
  uint64_t queued_ = 0, ran_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

struct FakeEvent {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  Clock::time_point at{};
};

// Every operation on a stream is what CUDA would queue: copies (delayed by
// copy_delay, so that an unordered reader or writer overtakes them), event
// records, waits on events.
class FakeAsyncBackend final : public Backend {
 public:
  // Read when a copy is queued (by the copy thread too), as its duration.
  std::atomic<int64_t> copy_delay_us{2000};
  void set_delay(int64_t us) { copy_delay_us = us; }
  std::atomic<int64_t> live_pinned{0};
  std::atomic<int64_t> to_host{0}, from_host{0};
  std::atomic<bool> destroyed_busy_stream{false};
  // bind_thread: how often, and calls from a thread other than the one that
  // made the backend (the tiers' copy thread) before it bound (CUDA: with
  // whatever device that thread had current).
  const std::thread::id owner = std::this_thread::get_id();
  std::atomic<int64_t> binds{0}, unbound_calls{0};
  static bool& bound() {
    thread_local bool b = false;
    return b;
  }
  void note_call() {
    if (std::this_thread::get_id() != owner && !bound()) ++unbound_calls;
  }
  void bind_thread() override {
    bound() = true;
    ++binds;
  }

  // A handle that names the calling thread's own stream, as
  // cudaStreamPerThread does.
  static inline void* const kPerThread = reinterpret_cast<void*>(uintptr_t(2));
  FakeStream& stream(void* s) {
    if (s == kPerThread) {
      std::lock_guard<std::mutex> lock(per_thread_mu_);
      auto& fs = per_thread_[std::this_thread::get_id()];
      if (!fs) fs = std::make_unique<FakeStream>();
      return *fs;
    }
    return s ? *static_cast<FakeStream*>(s) : default_;
  }

  int32_t device_type() const override { return 2; }
  int32_t device_id() const override { return 0; }
  void* allocate(size_t bytes) override { return std::calloc(1, bytes); }
  void deallocate(void* p) noexcept override { std::free(p); }
  void upload(void*, const void*, size_t, void*) override { unsupported(); }
  void write(const KvArena&, int32_t, const PlanView&, const Tensor3&, const Tensor3&,
             void*) override {
    unsupported();
  }
  void attend(const KvArena&, int32_t, const PlanView&, const Tensor3&, const Tensor3&,
              const AttentionArgs&, void*) override {
    unsupported();
  }
  void copy_blocks(const KvArena&, const int32_t*, const int32_t*, int64_t, void*) override {
    unsupported();
  }
  void swap(const KvArena&, const int32_t*, int64_t, void*, bool, void*) override { unsupported(); }
  void synchronize(void* s) override { stream(s).drain(); }

  bool async_host_copies() const override { return true; }
  void* host_alloc_pinned(size_t bytes) override {
    ++live_pinned;
    return Backend::host_alloc_pinned(bytes);
  }
  void host_free_pinned(void* p) noexcept override {
    if (p) --live_pinned;
    Backend::host_free_pinned(p);
  }
  void* stream_create() override {
    note_call();
    return new FakeStream;
  }
  void stream_destroy(void* s) noexcept override {
    auto* fs = static_cast<FakeStream*>(s);
    if (fs->pending() != 0) destroyed_busy_stream = true;
    delete fs;
  }
  void* event_create(bool) override {
    note_call();
    return new FakeEvent;
  }
  // As with CUDA, an event may go while a stream still has its record or
  // a wait on it queued: kept until the backend goes (after its streams).
  void event_destroy(void* e) noexcept override {
    std::lock_guard<std::mutex> lock(graveyard_mu_);
    graveyard_.emplace_back(static_cast<FakeEvent*>(e));
  }
  void event_record(void* e, void* s) override {
    note_call();
    auto* ev = static_cast<FakeEvent*>(e);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(ev->mu);
      gen = ++ev->recorded;
    }
    stream(s).push([ev, gen] {
      std::lock_guard<std::mutex> lock(ev->mu);
      if (ev->completed < gen) ev->completed = gen;
      ev->at = Clock::now();
      ev->cv.notify_all();
    });
  }
  void stream_wait_event(void* s, void* e) override {
    note_call();
    auto* ev = static_cast<FakeEvent*>(e);
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(ev->mu);
      gen = ev->recorded;  // the record as of now, as cudaStreamWaitEvent
    }
    stream(s).push([ev, gen] {
      std::unique_lock<std::mutex> lock(ev->mu);
      ev->cv.wait(lock, [&] { return ev->completed >= gen; });
    });
  }
  bool event_query(void* e) override {
    note_call();
    auto* ev = static_cast<FakeEvent*>(e);
    std::lock_guard<std::mutex> lock(ev->mu);
    return ev->completed >= ev->recorded;
  }
  void event_synchronize(void* e) override {
    note_call();
    auto* ev = static_cast<FakeEvent*>(e);
    std::unique_lock<std::mutex> lock(ev->mu);
    const uint64_t gen = ev->recorded;
    ev->cv.wait(lock, [&] { return ev->completed >= gen; });
  }
  uint64_t event_elapsed_ns(void* a, void* b) override {
    auto* s = static_cast<FakeEvent*>(a);
    auto* e = static_cast<FakeEvent*>(b);
    std::lock_guard<std::mutex> l1(s->mu);
    std::lock_guard<std::mutex> l2(e->mu);
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(e->at - s->at).count());
  }
  void copy_block_to_host_async(const KvArena& arena, int32_t block, void* host, void* s) override {
    note_call();
    ++to_host;
    const auto d = std::chrono::microseconds(copy_delay_us.load());
    stream(s).push([arena, block, host, d] { copy(arena, block, host, true, d); });
  }
  void copy_block_from_host_async(const KvArena& arena, int32_t block, const void* host,
                                  void* s) override {
    ++from_host;
    const auto d = std::chrono::microseconds(copy_delay_us.load());
    stream(s).push(
        [arena, block, host, d] { copy(arena, block, const_cast<void*>(host), false, d); });
  }

 private:
  [[noreturn]] static void unsupported() { fail(Errc::kUnsupported, "fake backend"); }
  static void copy(const KvArena& a, int32_t block, void* host, bool to,
                   std::chrono::microseconds delay) {
    std::this_thread::sleep_for(delay);
    const size_t bb = a.layout.block_bytes();
    for (int32_t p = 0; p < a.num_planes(); ++p) {
      char* d = static_cast<char*>(a.plane_at(p)) + size_t(block) * bb;
      char* h = static_cast<char*>(host) + size_t(p) * bb;
      if (to)
        std::memcpy(h, d, bb);
      else
        std::memcpy(d, h, bb);
    }
  }
  std::mutex graveyard_mu_;
  std::vector<std::unique_ptr<FakeEvent>> graveyard_;  // destroyed after default_
  FakeStream default_;
  std::mutex per_thread_mu_;
  std::map<std::thread::id, std::unique_ptr<FakeStream>> per_thread_;  // before graveyard_ goes
};

constexpr int32_t kBlocks = 8, kLayers = 2, kHeads = 2, kBs = 4, kDim = 8;

BlockHash key(uint8_t b) {
  BlockHash h;
  h.size = 32;
  h.bytes[0] = b;
  h.bytes[31] = uint8_t(b * 7 + 1);
  return h;
}

// A pool's storage in host memory, and what a kernel writing a whole block
// would do, queued on a stream.
struct Storage {
  std::vector<char> mem;
  KvArena arena{};
  std::shared_ptr<void> hold{std::make_shared<int>(0)};
  std::mt19937_64 rng{12345};

  Storage() {
    arena.num_layers = kLayers;
    arena.layout = KvLayout{kBlocks, kHeads, kBs, kDim, DType::kF32};
    arena.scales = nullptr;
    mem.assign(arena.bytes(), 0);
    arena.base = mem.data();
  }
  size_t block_bytes() const { return arena.layout.block_bytes(); }
  size_t slot_bytes() const { return block_bytes() * size_t(arena.num_planes()); }
  // Random bytes, never all zero, as one block's slot [planes][block bytes].
  std::vector<char> pattern() {
    std::vector<char> p(slot_bytes());
    for (char& c : p) c = char(rng() | 1);
    return p;
  }
  std::vector<char> read(int32_t block) const {
    std::vector<char> out(slot_bytes());
    for (int32_t p = 0; p < arena.num_planes(); ++p)
      std::memcpy(out.data() + size_t(p) * block_bytes(),
                  static_cast<const char*>(arena.plane_at(p)) + size_t(block) * block_bytes(),
                  block_bytes());
    return out;
  }
  // A "kernel" on stream s: after delay, writes bytes into the block.
  void write_on(FakeAsyncBackend& be, void* s, int32_t block, std::vector<char> bytes,
                std::chrono::microseconds delay) {
    be.stream(s).push([this, block, bytes = std::move(bytes), delay] {
      std::this_thread::sleep_for(delay);
      for (int32_t p = 0; p < arena.num_planes(); ++p)
        std::memcpy(static_cast<char*>(arena.plane_at(p)) + size_t(block) * block_bytes(),
                    bytes.data() + size_t(p) * block_bytes(), block_bytes());
    });
  }
};

TierOptions host_opts(const Storage& st, uint64_t slots) {
  TierOptions o;
  o.host_bytes = slots * st.slot_bytes();
  return o;
}

// Loads key h into block `block` on stream s as a plan does (flush first).
bool load_on(TierSet& ts, void* s, const BlockHash& h, int32_t block) {
  ts.flush(s);
  const TierRef r = ts.lookup_pin(h);
  if (r.slot < 0) return false;
  ts.begin_loads(s);
  const bool ok = ts.load(r, block, h);
  ts.end_loads();
  return ok;
}

TEST(TiersAsync, OffloadOrderedAfterLastWriteAndBeforeNextWrite) {
  auto be = std::make_shared<FakeAsyncBackend>();
  Storage st;
  void* plan = be->stream_create();
  for (int round = 0; round < 3; ++round) {
    const uint8_t k = uint8_t(10 + round);
    const int32_t b = 3;
    auto ts = std::make_unique<TierSet>(host_opts(st, 4), st.arena, st.hold, kBs, kBlocks, be);
    ASSERT_TRUE(ts->async());
    ts->flush(plan);  // a prepare on this stream
    const std::vector<char> p = st.pattern(), q = st.pattern();
    // The plan's write of block b is still queued (slow) when the block is
    // evicted: the offload must copy what it writes, not what was there.
    st.write_on(*be, plan, b, p, std::chrono::microseconds(4000));
    ts->enqueue(b, key(k), 0);
    // The next prepare, then its write into the same block (fast): it must
    // not overtake the offload's copy.
    ts->flush(plan);
    st.write_on(*be, plan, b, q, std::chrono::microseconds(0));
    ts->wait_idle();
    be->synchronize(plan);
    EXPECT_EQ(st.read(b), q);
    const TierStats s = ts->stats(Medium::kHost);
    EXPECT_EQ(s.num_stored, 1u);
    EXPECT_EQ(s.bytes_stored, st.slot_bytes());
    // Loaded back into another block: exactly p.
    ASSERT_TRUE(load_on(*ts, plan, key(k), 5));
    ts->wait_idle();
    be->synchronize(plan);
    EXPECT_EQ(st.read(5), p) << "round " << round;
    const TierStats s2 = ts->stats(Medium::kHost);
    EXPECT_EQ(s2.num_loaded, 1u);
    EXPECT_EQ(s2.bytes_loaded, st.slot_bytes());
    EXPECT_GT(s2.load_ns, 0u);
    EXPECT_EQ(ts->check(), "");
  }
  be->stream_destroy(plan);
  EXPECT_EQ(be->live_pinned.load(), 0);
  EXPECT_FALSE(be->destroyed_busy_stream.load());
}

TEST(TiersAsync, NotInTheTierUntilTheCopyCompleted) {
  auto be = std::make_shared<FakeAsyncBackend>();
  be->set_delay(30000);
  Storage st;
  void* plan = be->stream_create();
  TierSet ts(host_opts(st, 2), st.arena, st.hold, kBs, kBlocks, be);
  ts.flush(plan);
  st.write_on(*be, plan, 1, st.pattern(), std::chrono::microseconds(0));
  ts.enqueue(1, key(1), 0);
  ts.flush(plan);  // issued, not complete: the copy takes 30 ms
  EXPECT_EQ(ts.lookup_pin(key(1)).slot, -1);
  EXPECT_EQ(ts.stats(Medium::kHost).num_blocks, 0u);
  ts.wait_idle();
  const TierRef r = ts.lookup_pin(key(1));
  EXPECT_GE(r.slot, 0);
  ts.unpin(r);
  be->stream_destroy(plan);
}

TEST(TiersAsync, LoadedSlotStaysPinnedUntilItsCopyRan) {
  auto be = std::make_shared<FakeAsyncBackend>();
  Storage st;
  void* plan = be->stream_create();
  void* other = be->stream_create();
  TierSet ts(host_opts(st, 1), st.arena, st.hold, kBs, kBlocks, be);  // one slot
  ts.flush(plan);
  const std::vector<char> a = st.pattern(), b = st.pattern();
  st.write_on(*be, plan, 1, a, std::chrono::microseconds(0));
  st.write_on(*be, plan, 2, b, std::chrono::microseconds(0));
  ts.enqueue(1, key(1), 0);
  ts.wait_idle();
  // The load's copy is queued on a stream the offloads are not ordered
  // after, and is slow: only the pin keeps the next offload (block 2, into
  // the only slot) from overwriting the slot before the copy read it.
  ts.flush(plan);
  const TierRef r = ts.lookup_pin(key(1));
  ASSERT_GE(r.slot, 0);
  be->set_delay(20000);
  ts.begin_loads(other);
  ASSERT_TRUE(ts.load(r, 6, key(1)));
  ts.end_loads();
  be->set_delay(0);
  ts.enqueue(2, key(2), 0);
  ts.flush(plan);
  ts.wait_idle();
  be->synchronize(other);
  EXPECT_EQ(st.read(6), a);
  // Whether block 2 got the slot after the load completed or was dropped
  // while the slot was pinned, the counts add up.
  const TierStats s = ts.stats(Medium::kHost);
  EXPECT_EQ(s.num_stored + s.num_dropped, 2u);
  EXPECT_EQ(ts.check(), "");
  be->stream_destroy(plan);
  be->stream_destroy(other);
}

TEST(TiersAsync, FileTierAloneAndBelowHostThroughStaging) {
  for (const bool with_host : {false, true}) {
    auto be = std::make_shared<FakeAsyncBackend>();
    be->set_delay(300);
    Storage st;
    void* plan = be->stream_create();
    TierOptions o;
    o.host_bytes = with_host ? st.slot_bytes() : 0;  // one host slot: the rest goes down
    o.file_dir = ::testing::TempDir();
    o.file_bytes = 8 * st.slot_bytes();
    {
      TierSet ts(o, st.arena, st.hold, kBs, kBlocks, be);
      ts.flush(plan);
      std::vector<std::vector<char>> pats;
      for (int32_t b = 0; b < 6; ++b) {
        pats.push_back(st.pattern());
        st.write_on(*be, plan, b, pats.back(), std::chrono::microseconds(0));
        ts.enqueue(b, key(uint8_t(b)), 0);
      }
      ts.flush(plan);
      ts.wait_idle();
      const TierStats fs = ts.stats(Medium::kFile);
      EXPECT_EQ(fs.num_stored, with_host ? 5u : 6u);
      // Six loads at once (more than the staging buffers): all byte-exact.
      ts.flush(plan);
      ts.begin_loads(plan);
      for (int32_t b = 0; b < 6; ++b) {
        const TierRef r = ts.lookup_pin(key(uint8_t(b)));
        ASSERT_GE(r.slot, 0) << b;
        ASSERT_TRUE(ts.load(r, b == 0 ? 7 : 6 - b + 0, key(uint8_t(b)))) << b;
      }
      ts.end_loads();
      ts.wait_idle();
      be->synchronize(plan);
      // Block ids loaded into: 7, 5, 4, 3, 2, 1 (each once).
      for (int32_t b = 0; b < 6; ++b) EXPECT_EQ(st.read(b == 0 ? 7 : 6 - b), pats[size_t(b)]) << b;
      EXPECT_EQ(ts.stats(Medium::kFile).num_loaded, with_host ? 5u : 6u);
      EXPECT_GT(ts.stats(Medium::kFile).load_ns, 0u);
      // A corrupted entry is a counted miss, and leaves the tier.
      ASSERT_TRUE(ts.corrupt_for_testing(key(3)));
      EXPECT_FALSE(load_on(ts, plan, key(3), 0));
      const Medium m =
          ts.stats(Medium::kFile).num_checksum_failures ? Medium::kFile : Medium::kHost;
      EXPECT_EQ(ts.stats(m).num_checksum_failures, 1u);
      EXPECT_EQ(ts.lookup_pin(key(3)).slot, -1);
      EXPECT_EQ(ts.check(), "");
    }
    be->stream_destroy(plan);
    EXPECT_EQ(be->live_pinned.load(), 0);
  }
}

TEST(TiersAsync, HostChecksumMismatchIsAMissNothingCopied) {
  auto be = std::make_shared<FakeAsyncBackend>();
  Storage st;
  void* plan = be->stream_create();
  TierSet ts(host_opts(st, 2), st.arena, st.hold, kBs, kBlocks, be);
  ts.flush(plan);
  st.write_on(*be, plan, 1, st.pattern(), std::chrono::microseconds(0));
  ts.enqueue(1, key(1), 0);
  ts.wait_idle();
  const std::vector<char> before = st.read(4);
  ASSERT_TRUE(ts.corrupt_for_testing(key(1)));
  const int64_t copies = be->from_host.load();
  EXPECT_FALSE(load_on(ts, plan, key(1), 4));
  ts.wait_idle();
  be->synchronize(plan);
  EXPECT_EQ(be->from_host.load(), copies);  // verified before any copy was queued
  EXPECT_EQ(st.read(4), before);
  EXPECT_EQ(ts.stats(Medium::kHost).num_checksum_failures, 1u);
  EXPECT_EQ(ts.stats(Medium::kHost).num_blocks, 0u);
  be->stream_destroy(plan);
}

TEST(TiersAsync, DestroyWithCopiesInFlightWaitsForThem) {
  auto be = std::make_shared<FakeAsyncBackend>();
  be->set_delay(5000);
  Storage st;
  void* plan = be->stream_create();
  {
    TierSet ts(host_opts(st, 4), st.arena, st.hold, kBs, kBlocks, be);
    ts.flush(plan);
    for (int32_t b = 0; b < 4; ++b) ts.enqueue(b, key(uint8_t(b)), 0);
    ts.flush(plan);  // issued: four 5 ms copies in flight
    // A load in flight too.
  }  // the destructor waits; the tier stream is idle when destroyed
  EXPECT_FALSE(be->destroyed_busy_stream.load());
  EXPECT_EQ(be->live_pinned.load(), 0);
  {
    TierSet ts(host_opts(st, 4), st.arena, st.hold, kBs, kBlocks, be);
    ts.flush(plan);
    ts.enqueue(0, key(0), 0);
    ts.wait_idle();
    ASSERT_TRUE(load_on(ts, plan, key(0), 6));  // a 5 ms copy on plan, slot pinned
  }
  be->synchronize(plan);
  EXPECT_EQ(be->live_pinned.load(), 0);
  be->stream_destroy(plan);
}

// The copy thread selects the pool's device once, before its first backend
// call (CUDA: otherwise its first DeviceGuard would switch back to device 0
// after each call, creating that device's context on a multi-GPU host).
TEST(TiersAsync, CopyThreadBindsTheDeviceBeforeItsFirstCall) {
  auto be = std::make_shared<FakeAsyncBackend>();
  Storage st;
  void* plan = be->stream_create();
  {
    TierSet ts(host_opts(st, 2), st.arena, st.hold, kBs, kBlocks, be);
    ts.flush(plan);
    for (int32_t b = 0; b < 4; ++b) ts.enqueue(b, key(uint8_t(40 + b)), 0);  // beyond 2 slots
    ts.flush(plan);
    ts.wait_idle();
    EXPECT_EQ(ts.stats(Medium::kHost).num_stored, 4u);
  }
  EXPECT_EQ(be->binds.load(), 1);
  EXPECT_EQ(be->unbound_calls.load(), 0);
  be->synchronize(plan);
  be->stream_destroy(plan);
}

// A stream handle that means "the calling thread's stream"
// (cudaStreamPerThread): the fence must be recorded on the evicting
// thread's stream, not on the copy thread's own one, which holds nothing.
TEST(TiersAsync, FenceFollowsThePerThreadStreamOfTheEvictingThread) {
  auto be = std::make_shared<FakeAsyncBackend>();
  Storage st;
  void* const pt = FakeAsyncBackend::kPerThread;
  TierSet ts(host_opts(st, 4), st.arena, st.hold, kBs, kBlocks, be);
  ts.flush(pt);
  const std::vector<char> p = st.pattern(), q = st.pattern();
  st.write_on(*be, pt, 3, p, std::chrono::microseconds(5000));  // slow, still queued
  ts.enqueue(3, key(50), 0);
  ts.flush(pt);
  st.write_on(*be, pt, 3, q, std::chrono::microseconds(0));
  ts.wait_idle();
  be->synchronize(pt);
  EXPECT_EQ(st.read(3), q);
  ASSERT_TRUE(load_on(ts, pt, key(50), 5));
  ts.wait_idle();
  be->synchronize(pt);
  EXPECT_EQ(st.read(5), p) << "the offload did not wait for the block's last write";
}

TEST(TiersAsync, NewStreamIsOrderedAfterThePrevious) {
  auto be = std::make_shared<FakeAsyncBackend>();
  Storage st;
  void* s1 = be->stream_create();
  void* s2 = be->stream_create();
  TierSet ts(host_opts(st, 2), st.arena, st.hold, kBs, kBlocks, be);
  ts.flush(s1);
  const std::vector<char> p = st.pattern(), q = st.pattern();
  st.write_on(*be, s1, 2, p, std::chrono::microseconds(5000));  // slow, on the old stream
  ts.flush(s2);  // the pool now plans on s2: its work follows s1's
  st.write_on(*be, s2, 2, q, std::chrono::microseconds(0));
  be->synchronize(s2);
  EXPECT_EQ(st.read(2), q);
  be->synchronize(s1);
  EXPECT_EQ(st.read(2), q);
  be->stream_destroy(s1);
  be->stream_destroy(s2);
}

}  // namespace
}  // namespace pagedkv
