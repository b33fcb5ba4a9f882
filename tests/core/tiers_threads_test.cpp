// Offload tiers under threads (run under TSan by scripts/test-sanitizers.sh):
// four threads admit requests over eight shared prompts on a pool too small
// to keep them, so blocks are evicted (offloaded by the copy thread) and
// loaded back all the time, while the copy thread runs. Every K/V value is
// a function of its token and position, so each block a request reads is
// checked against what it must hold.
#include <atomic>
#include <thread>

#include "test_util.h"

namespace pagedkv {
namespace {

constexpr uint32_t kBs = 4, kDim = 8;

float value(int32_t token, uint64_t pos, uint32_t i) {
  return float(token % 97) * 0.5f + float(pos % 13) * 0.25f + float(i) * 0.125f + 1.0f;
}

TEST(TiersThreads, ConcurrentRequestsWithOffloadsAndLoads) {
  PoolOptions o = test::storage_options(kBs, 14, kDim);
  o.enable_events = true;
  auto pool = Pool::create(o);
  TierOptions t;
  t.host_bytes = 6 * pool->bytes_per_block();
  t.file_dir = ::testing::TempDir();
  t.file_bytes = 8 * pool->bytes_per_block();
  pool->attach_tiers(t);
  std::atomic<uint64_t> bad{0}, steps{0};
  auto worker = [&](int id) {
    for (int it = 0; it < 200; ++it) {
      const int32_t prompt = (id * 5 + it) % 8;
      std::vector<int32_t> tokens = test::iota_tokens(17, 1000 * (prompt + 1));
      tokens.back() = 7 + id;  // a private last token
      SeqId s = pool->seq_create({});
      try {
        pool->match_prefix_tiered(s, tokens.data(), tokens.size());
        const uint64_t have = pool->seq_info(s).num_tokens;
        pool->append(s, tokens.data() + have, tokens.size() - have, 0);
        // Queries start after every hit, tier hits included (docs/tiers.md):
        // the next plan loads those, and recomputing them would write into
        // blocks that other requests may already share once loaded.
        const uint32_t q = uint32_t(tokens.size() - have);
        auto b = Batch::prepare(pool, &s, &q, 1, nullptr);  // loads this request's tier hits
        std::vector<float> k(size_t(q) * kDim), v(size_t(q) * kDim);
        for (uint32_t r = 0; r < q; ++r)
          for (uint32_t i = 0; i < kDim; ++i) {
            const uint64_t pos = tokens.size() - q + r;
            k[r * kDim + i] = value(tokens[pos], pos, i);
            v[r * kDim + i] = -value(tokens[pos], pos, i);
          }
        TensorArg kt = test::rows(k, q, 1, kDim), vt = test::rows(v, q, 1, kDim);
        b->write(0, &kt, &vt, nullptr);
        // Every full block of the prompt holds its tokens' values.
        const auto table = test::table(*pool, s);
        const float* keys = static_cast<const float*>(pool->kv_tensor(0, 0).data);
        for (size_t j = 0; j < 4; ++j)
          for (uint32_t sl = 0; sl < kBs; ++sl)
            for (uint32_t i = 0; i < kDim; ++i) {
              const uint64_t pos = j * kBs + sl;
              if (keys[(size_t(table[j]) * kBs + sl) * kDim + i] != value(tokens[pos], pos, i))
                ++bad;
            }
        ++steps;
      } catch (const Error& e) {
        if (e.code() != Errc::kOutOfBlocks) ADD_FAILURE() << e.what();
      }
      pool->free(s);
    }
  };
  // Whether a request hits a tier (rather than the pool's cache, or
  // nothing) depends on how the threads interleave: about one run in two
  // thousand loads nothing. Rounds repeat (every value checked each time)
  // until loads happened, so the test always covers them.
  for (int round = 0; round < 5 && (round == 0 || pool->tier_stats(1).num_loaded == 0); ++round) {
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; ++i) ts.emplace_back(worker, i);
    for (auto& th : ts) th.join();
    pool->flush_tiers();
  }
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(steps.load(), 0u);
  EXPECT_EQ(pool->validate(), "");
  const TierStats h = pool->tier_stats(1);
  EXPECT_GT(h.num_stored, 0u);
  EXPECT_GT(h.num_loaded, 0u);
  EXPECT_EQ(h.num_checksum_failures, 0u);
  test::drain(*pool);
}

}  // namespace
}  // namespace pagedkv
