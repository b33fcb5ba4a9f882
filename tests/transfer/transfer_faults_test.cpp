// pkv_transfer_import under allocation failure: the Nth heap allocation
// inside the call throws, for N = 1, 2, ... until the call runs without
// reaching N. A failed import must leave the importing pool as it was: no
// sequence (the import's own is hidden from the caller, who could never
// free it), every block free, validate clean; and the engine must import
// the same descriptor afterwards. Its own executable: the operator new
// below replaces the global one for everything linked into it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "transfer_util.h"

#include "../fault_alloc.h"

namespace {

using namespace pkv_xfer;

pkv_pool_stats stats(pkv_pool* p) {
  pkv_pool_stats s;
  pkv_pool_stats_init(&s);
  ok(pkv_pool_get_stats(p, &s), "stats");
  return s;
}

pkv_transfer_engine* engine() {
  pkv_transfer_options o;
  pkv_transfer_options_init(&o);
  o.transports = "tcp";
  o.timeout_ms = 60000;
  pkv_transfer_engine* e = nullptr;
  ok(pkv_transfer_engine_create(&o, &e), "pkv_transfer_engine_create");
  return e;
}

TEST(TransferFaults, AFailedImportLeavesThePoolAsItWas) {
  if (!pkv_transfer_available()) GTEST_SKIP() << "built without UCX";
  Layout l;
  pkv_pool* src = make_pool(l);
  pkv_pool* dst = make_pool(l);
  std::mt19937_64 rng(3);
  pkv_seq_id seq = 0;
  ok(pkv_seq_create(src, nullptr, &seq), "create");
  const std::vector<int32_t> tokens = random_tokens(rng, 100);
  prefill(src, l, seq, tokens, rng);
  pkv_transfer_engine *a = engine(), *b = engine();
  uint64_t id = 0, size = 0;
  ok(pkv_transfer_export(a, src, seq, &id), "export");
  pkv_transfer_export_descriptor(a, id, nullptr, 0, &size);
  std::vector<uint8_t> d(size);
  ok(pkv_transfer_export_descriptor(a, id, d.data(), size, &size), "descriptor");
  const pkv_pool_stats before = stats(dst);
  const std::vector<uint8_t> want = block_bytes(src, l, seq, tokens.size());
  long failures = 0;
  for (long n = 1;; ++n) {
    pkv_transfer* t = nullptr;
    g_count = 0;
    g_fail_at = n;
    const pkv_status st = pkv_transfer_import(b, dst, nullptr, d.data(), d.size(), &t);
    g_fail_at = -1;
    if (st != PKV_OK) {
      ++failures;
      EXPECT_EQ(t, nullptr) << "allocation " << n;
      const pkv_pool_stats now = stats(dst);
      ASSERT_EQ(now.num_seqs, before.num_seqs)
          << "allocation " << n << ": " << pkv_status_string(st);
      ASSERT_EQ(now.num_free_blocks, before.num_free_blocks) << "allocation " << n;
      ASSERT_EQ(pkv_pool_validate(dst), PKV_OK) << "allocation " << n;
      continue;
    }
    // The call no longer reaches allocation n: the import runs to the end.
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    uint32_t state = PKV_TRANSFER_RUNNING;
    pkv_seq_id s = 0;
    while (state == PKV_TRANSFER_RUNNING && std::chrono::steady_clock::now() < end) {
      ok(pkv_transfer_engine_progress(a), "progress");
      ok(pkv_transfer_poll(t, &state, &s), "poll");
    }
    ASSERT_EQ(state, uint32_t(PKV_TRANSFER_DONE)) << "after " << failures << " failed imports";
    EXPECT_TRUE(block_bytes(dst, l, s, tokens.size()) == want);
    pkv_transfer_destroy(t);
    ok(pkv_seq_free(dst, s), "free");
    break;
  }
  EXPECT_GT(failures, 3);
  EXPECT_EQ(stats(dst).num_free_blocks, before.num_free_blocks);
  ok(pkv_transfer_export_release(a, id), "release");
  pkv_transfer_engine_destroy(b);
  pkv_transfer_engine_destroy(a);
  pkv_pool_destroy(src);
  pkv_pool_destroy(dst);
}

}  // namespace
