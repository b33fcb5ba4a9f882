// The transfer engine's registration of a pool's KV arena (impl/transfer/):
// it keeps the arena alive while exports of the pool may still be read,
// and gives its memory back once the pool was destroyed and no export names
// it, on the engine's next call, not only when the engine is destroyed.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <dirent.h>

#include <cstring>

#include "test_util.h"
#include "transfer/engine.h"

namespace pagedkv {
namespace {

std::shared_ptr<TransferEngine> engine_or_skip() {
  TransferOptions o;
  o.transports = "tcp";
  try {
    return TransferEngine::create(o);
  } catch (const Error& e) {
    if (e.code() == Errc::kUnsupported) return nullptr;
    throw;
  }
}

// A pool of 2 layers with one written sequence, a weak view of its arena,
// and the arena's range. The arena (4 MiB: a mapping of its own) is filled
// so that all of it is resident.
std::shared_ptr<Pool> written_pool(SeqId* seq, std::weak_ptr<void>* arena, KvArena* range,
                                   uint32_t num_threads = 1) {
  PoolOptions o = test::manager_options(4, 8192);
  o.num_layers = 2;
  o.num_kv_heads = 1;
  o.head_dim = 8;
  o.dtype = DType::kF32;
  o.num_threads = num_threads;
  auto p = Pool::create(o);
  *seq = p->seq_create({});
  const auto t = test::iota_tokens(6);
  p->append(*seq, t.data(), t.size(), 0);
  const uint32_t n = 6;
  auto b = Batch::prepare(p, seq, &n, 1, nullptr);
  for (uint32_t l = 0; l < 2; ++l) {
    std::vector<float> k(n * 8, 1.0f), v(n * 8, 2.0f);
    TensorArg kt = test::rows(k, n, 1, 8), vt = test::rows(v, n, 1, 8);
    b->write(l, &kt, &vt, nullptr);
  }
  EXPECT_TRUE(b->committed());
  const Pool::ArenaRef a = p->arena_ref();
  *arena = a.hold;
  *range = a.arena;
  std::memset(a.arena.base, 0x5a, a.arena.bytes());
  return p;
}

// Resident pages of the whole pages inside r (mincore), -1 when r is unmapped.
long resident_pages(const KvArena& r) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(r.base);
  const uintptr_t lo = (b + page - 1) / page * page, hi = (b + r.bytes()) / page * page;
  std::vector<unsigned char> v((hi - lo) / page);
  if (mincore(reinterpret_cast<void*>(lo), hi - lo, v.data()) != 0) return -1;
  long n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(TransferArena, ReleasedExportsOfADestroyedPoolLetItsArenaGo) {
  auto e = engine_or_skip();
  if (!e) GTEST_SKIP() << "built without UCX";
  // Export, release, then destroy the pool: the next call gives the memory
  // back. The engine keeps the addresses (a late reader sees zero pages,
  // transfer.Local.ReadsOfAReleasedExportOfADestroyedPoolDoNotCrashTheExporter)
  // until it is destroyed.
  SeqId s = 0;
  std::weak_ptr<void> arena;
  KvArena range;
  auto p = written_pool(&s, &arena, &range);
  const long all = resident_pages(range);
  ASSERT_GT(all, 1000);
  const uint64_t id = e->export_seq(p, s);
  e->release(id);
  p->close();  // pkv_pool_destroy
  p.reset();
  EXPECT_EQ(resident_pages(range), all) << "nothing ran on the engine yet";
  e->progress();
  EXPECT_EQ(resident_pages(range), 0) << "the engine keeps a destroyed pool's memory";
  // Destroy the pool while an export is held: the export keeps the arena
  // (a peer may still read it) until it is released.
  std::weak_ptr<void> arena2;
  KvArena range2;
  p = written_pool(&s, &arena2, &range2);
  const uint64_t id2 = e->export_seq(p, s);
  p->close();
  p.reset();
  e->progress();
  EXPECT_EQ(resident_pages(range2), all) << "an export of it is held";
  e->release(id2);
  EXPECT_EQ(resident_pages(range2), 0);
  // Something else (a plan, a tier) still holds the arena when the engine
  // lets go of it: its memory goes back at a later call, once that ends.
  std::weak_ptr<void> arena3;
  KvArena range3;
  p = written_pool(&s, &arena3, &range3);
  e->release(e->export_seq(p, s));
  std::shared_ptr<void> plan_hold = arena3.lock();
  p->close();
  p.reset();
  e->progress();
  EXPECT_EQ(resident_pages(range3), all) << "still in use";
  plan_hold.reset();
  e->progress();
  EXPECT_EQ(resident_pages(range3), 0) << "given back once its last user let go";
  EXPECT_FALSE(arena.expired() || arena2.expired() || arena3.expired())
      << "addresses stay reserved";
  e->close();
  e.reset();
  EXPECT_TRUE(arena.expired() && arena2.expired() && arena3.expired())
      << "the destroyed engine lets them go";
}

// Threads of this process (/proc/self/task).
int threads_now() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

TEST(TransferArena, ARetiredArenaKeepsNoneOfItsPoolsThreads) {
  auto e = engine_or_skip();
  if (!e) GTEST_SKIP() << "built without UCX";
  // The retired arena's hold used to own the pool's CPU backend, and with it
  // the backend's worker threads (num_threads - 1 of them), until the engine
  // was destroyed: 3 threads leaked per exported pool here.
  SeqId s = 0;
  std::weak_ptr<void> arena;
  KvArena range;
  const int before = threads_now();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 8; ++i) {
    auto p = written_pool(&s, &arena, &range, 4);  // its kernels ran: workers started
    e->release(e->export_seq(p, s));
    p->close();
    p.reset();
    e->progress();
    EXPECT_FALSE(arena.expired()) << "addresses stay reserved";
  }
  EXPECT_LE(threads_now(), before) << "destroyed pools' threads outlive them in the engine";
  e->close();
  e.reset();
}

}  // namespace
}  // namespace pagedkv
