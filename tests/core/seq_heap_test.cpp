#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "seq_heap.h"

namespace pagedkv {
namespace {

struct Buffer {
  uint8_t* p;
  size_t n;
  uint8_t tag;
};

void fill(const Buffer& b) { std::memset(b.p, b.tag, b.n); }
bool intact(const Buffer& b) {
  for (size_t i = 0; i < b.n; ++i)
    if (b.p[i] != b.tag) return false;
  return true;
}

// Random sizes over every class (and past the largest), each buffer filled
// with its own byte: a buffer handed out twice, or two that overlap, show
// up as a changed byte. Half are freed and allocated again in between.
void churn(uint32_t seed, int rounds) {
  std::mt19937 rng(seed);
  std::vector<Buffer> live;
  auto make = [&] {
    const int shift = int(rng() % 20);  // 1 B .. 1 MiB
    const size_t n = 1 + rng() % (size_t(1) << shift);
    Buffer b{static_cast<uint8_t*>(seq_heap::allocate(n)), n, uint8_t(rng())};
    // Sequence slots (alignas(64)) rely on it.
    if (n <= (size_t(256) << 10)) ASSERT_EQ(reinterpret_cast<uintptr_t>(b.p) % 64, 0u) << n;
    fill(b);
    live.push_back(b);
  };
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < 64; ++i) make();
    std::shuffle(live.begin(), live.end(), rng);
    for (size_t i = live.size() / 2; i < live.size(); ++i) {
      ASSERT_TRUE(intact(live[i])) << "buffer of " << live[i].n << " bytes changed";
      seq_heap::deallocate(live[i].p, live[i].n);
    }
    live.resize(live.size() / 2);
  }
  for (const Buffer& b : live) {
    ASSERT_TRUE(intact(b)) << "buffer of " << b.n << " bytes changed";
    seq_heap::deallocate(b.p, b.n);
  }
}

TEST(SeqHeap, BuffersNeverOverlap) { churn(1, 40); }

TEST(SeqHeap, FreedBuffersAreReused) {
  if (!seq_heap::enabled()) GTEST_SKIP() << "sequence heap off (AddressSanitizer or env)";
  const seq_heap::Usage before = seq_heap::usage();
  for (int r = 0; r < 1000; ++r) {
    std::vector<void*> ps;
    for (int i = 0; i < 100; ++i) ps.push_back(seq_heap::allocate(8192));
    for (void* p : ps) seq_heap::deallocate(p, 8192);
  }
  const seq_heap::Usage after = seq_heap::usage();
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  // 100 buffers of 8 KiB at a time: at most one more slab, not 1000.
  EXPECT_LE(after.slab_bytes, before.slab_bytes + (size_t(2) << 20));
}

TEST(SeqHeap, CountsWhatIsHandedOut) {
  if (!seq_heap::enabled()) GTEST_SKIP() << "sequence heap off (AddressSanitizer or env)";
  const size_t live0 = seq_heap::usage().live_bytes;
  void* a = seq_heap::allocate(100);   // a 128 B buffer
  void* b = seq_heap::allocate(5000);  // 8 KiB
  EXPECT_EQ(seq_heap::usage().live_bytes, live0 + 128 + 8192);
  seq_heap::deallocate(a, 100);
  seq_heap::deallocate(b, 5000);
  EXPECT_EQ(seq_heap::usage().live_bytes, live0);
}

TEST(SeqHeap, SequenceVectorsGrowAndShrinkIntact) {
  SeqVec<int32_t> tokens;
  for (int32_t i = 0; i < 200000; ++i) tokens.push_back(i * 7);  // through every class
  for (int32_t i = 0; i < 200000; ++i) ASSERT_EQ(tokens[size_t(i)], i * 7);
  SeqVec<int32_t> copy = tokens;
  tokens.resize(10);
  tokens.shrink_to_fit();
  EXPECT_EQ(tokens[9], 63);
  EXPECT_EQ(copy.back(), 199999 * 7);
  copy.swap(tokens);
  EXPECT_EQ(copy.size(), 10u);
  EXPECT_EQ(tokens.size(), 200000u);
}

TEST(SeqHeap, ThreadsShareIt) {
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < 4; ++t) ts.emplace_back([t] { churn(100 + t, 20); });
  for (auto& th : ts) th.join();
}

// A child forked while another thread allocates finds the heap unlocked
// (without the fork handlers it would wait forever for a lock whose holder
// did not come along).
TEST(SeqHeap, ForkWhileAnotherThreadAllocates) {
  std::atomic<bool> stop{false};
  std::thread t([&] {
    while (!stop.load()) seq_heap::deallocate(seq_heap::allocate(4096), 4096);
  });
  for (int i = 0; i < 20; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(10);  // a deadlock ends the child by SIGALRM, and fails the test
      std::vector<void*> ps;
      for (int k = 0; k < 100; ++k) ps.push_back(seq_heap::allocate(64 << (k % 8)));
      for (int k = 0; k < 100; ++k) seq_heap::deallocate(ps[size_t(k)], 64 << (k % 8));
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << i << ": " << status;
  }
  stop = true;
  t.join();
}

TEST(SeqHeap, AnImpossibleSizeThrowsBadAlloc) {
  SeqAllocator<int32_t> alloc;
  EXPECT_THROW(alloc.allocate(size_t(-1) / 2), std::bad_alloc);
}

}  // namespace
}  // namespace pagedkv
