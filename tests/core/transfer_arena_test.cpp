// The transfer engine's registration of a pool's KV arena (impl/transfer/):
// it keeps the arena alive while exports of the pool may still be read,
// and lets it go once the pool was destroyed and no export names it, on
// the engine's next call, not only when the engine is destroyed.
#include <gtest/gtest.h>

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

// A pool of 2 layers with one written sequence, and a weak view of its arena.
std::shared_ptr<Pool> written_pool(SeqId* seq, std::weak_ptr<void>* arena) {
  PoolOptions o = test::manager_options(4, 8);
  o.num_layers = 2;
  o.num_kv_heads = 1;
  o.head_dim = 8;
  o.dtype = DType::kF32;
  o.num_threads = 1;
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
  *arena = p->arena_ref().hold;
  return p;
}

TEST(TransferArena, ReleasedExportsOfADestroyedPoolLetItsArenaGo) {
  auto e = engine_or_skip();
  if (!e) GTEST_SKIP() << "built without UCX";
  // Export, release, then destroy the pool: the next call lets go.
  SeqId s = 0;
  std::weak_ptr<void> arena;
  auto p = written_pool(&s, &arena);
  const uint64_t id = e->export_seq(p, s);
  e->release(id);
  p->close();  // pkv_pool_destroy
  p.reset();
  EXPECT_FALSE(arena.expired()) << "nothing ran on the engine yet";
  e->progress();
  EXPECT_TRUE(arena.expired()) << "the engine keeps a destroyed pool's arena";
  // Destroy the pool while an export is held: the export keeps the arena
  // (a peer may still read it) until it is released.
  p = written_pool(&s, &arena);
  const uint64_t id2 = e->export_seq(p, s);
  p->close();
  p.reset();
  e->progress();
  EXPECT_FALSE(arena.expired()) << "an export of it is held";
  e->release(id2);
  EXPECT_TRUE(arena.expired());
  e->close();
}

}  // namespace
}  // namespace pagedkv
