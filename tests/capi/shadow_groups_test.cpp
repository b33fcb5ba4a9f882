// The shadow-pool check of shadow_test.cpp on multi-group pools
// (pagedkv/groups.h: "all or nothing"): two pools alike take the same
// workload, one also failing calls; every read must agree after each.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "assert_ok.h"
#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kBlock = 4, kGroups = 3;

pkv_pool* make_pool(uint32_t num_blocks) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBlock;
  o.num_blocks = num_blocks;
  o.hash_algo = PKV_HASH_XXH3_128;
  pkv_kv_group_spec g[kGroups];
  for (auto& s : g) pkv_kv_group_spec_init(&s);
  g[0].kind = PKV_GROUP_FULL;
  g[0].num_kv_heads = 1;
  g[0].head_dim = 8;
  g[1].kind = PKV_GROUP_SLIDING_WINDOW;
  g[1].num_kv_heads = 1;
  g[1].head_dim = 8;
  g[1].sliding_window = 5;
  g[2].kind = PKV_GROUP_RECURRENT;
  g[2].state_bytes = 64;
  g[2].flags = PKV_GROUP_SNAPSHOT_EVERY_BLOCK;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create_groups(&o, g, kGroups, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

std::string observe(pkv_pool* p, const std::vector<pkv_seq_id>& ids, bool take) {
  std::string s;
  auto put = [&](const void* d, size_t n) { s.append(static_cast<const char*>(d), n); };
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  EXPECT_EQ(pkv_pool_get_stats(p, &st), PKV_OK);
  put(&st, sizeof st);
  for (uint32_t g = 0; g < kGroups; ++g) {
    pkv_group_stats gs;
    pkv_group_stats_init(&gs);
    EXPECT_EQ(pkv_pool_group_stats(p, g, &gs), PKV_OK);
    put(&gs, sizeof gs);
    if (take) {
      int32_t src[64], dst[64];
      uint64_t n = 0;
      EXPECT_EQ(pkv_pool_group_take_copies(p, g, src, dst, 64, &n), PKV_OK);
      put(src, n * 4);
      put(dst, n * 4);
    }
  }
  for (pkv_seq_id id : ids) {
    pkv_seq_info info;
    pkv_seq_info_init(&info);
    const pkv_status rc = pkv_seq_get_info(p, id, &info);
    put(&rc, sizeof rc);
    if (rc != PKV_OK) continue;
    put(&info, sizeof info);
    for (uint32_t g = 0; g < kGroups; ++g) {
      int32_t t[256];
      uint64_t n = 0;
      EXPECT_EQ(pkv_seq_group_block_table(p, id, g, t, 256, &n), PKV_OK);
      put(t, n * 4);
    }
  }
  EXPECT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  return s;
}

size_t first_diff(const std::string& x, const std::string& y) {
  size_t i = 0;
  while (i < x.size() && i < y.size() && x[i] == y[i]) ++i;
  return i;
}

TEST(ShadowGroups, FailuresChangeNothing) {
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    std::mt19937 rng(seed);
    pkv_pool* a = make_pool(24);
    pkv_pool* b = make_pool(24);
    ASSERT_TRUE(a && b);
    std::vector<pkv_seq_id> ia, ib;
    pkv_seq_id stale = 0, gone = 0;
    pkv_seq_create(a, nullptr, &gone);
    pkv_seq_free(a, gone);
    pkv_seq_create(b, nullptr, &stale);
    pkv_seq_free(b, stale);
    std::vector<int32_t> base(kBlock * 4);
    for (auto& x : base) x = int32_t(rng() % 5);
    for (uint32_t k = 0; k < 300; ++k) {
      const uint32_t r = rng() % 100;
      const size_t i = ia.empty() ? 0 : rng() % ia.size();
      const bool have = !ia.empty() && ia[i] != 0;
      std::string op;
      auto both = [&](auto f) {
        const pkv_status ra = f(a, ia), rb = f(b, ib);
        EXPECT_EQ(ra, rb) << op;
        return ra;
      };
      if (r < 15 || ia.empty()) {
        op = "create+match+append";
        std::vector<int32_t> t(base.begin(), base.begin() + 1 + rng() % base.size());
        pkv_seq_id sa = 0, sb = 0;
        ASSERT_EQ(pkv_seq_create(a, nullptr, &sa), PKV_OK);
        ASSERT_EQ(pkv_seq_create(b, nullptr, &sb), PKV_OK);
        uint64_t ca = 0, cb = 0;
        ASSERT_EQ(pkv_seq_match_prefix(a, sa, t.data(), t.size(), &ca), PKV_OK);
        ASSERT_EQ(pkv_seq_match_prefix(b, sb, t.data(), t.size(), &cb), PKV_OK);
        ASSERT_EQ(ca, cb);
        ia.push_back(sa);
        ib.push_back(sb);
        const size_t j = ia.size() - 1;
        both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) {
          return pkv_seq_append(p, ids[j], t.data() + ca, t.size() - ca, 0);
        });
      } else if (r < 35 && have) {
        op = "append";
        std::vector<int32_t> t(1 + rng() % kBlock);
        for (auto& x : t) x = int32_t(rng() % 5);
        both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) {
          return pkv_seq_append(p, ids[i], t.data(), t.size(), 0);
        });
      } else if (r < 60) {
        op = "step";
        const bool abort = rng() % 4 == 0;
        both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) {
          std::vector<pkv_seq_id> seqs;
          std::vector<uint32_t> q;
          for (pkv_seq_id id : ids) {
            pkv_seq_info info;
            pkv_seq_info_init(&info);
            if (!id || pkv_seq_get_info(p, id, &info) != PKV_OK) continue;
            if (info.num_tokens == info.num_computed_tokens) continue;
            seqs.push_back(id);
            q.push_back(uint32_t(info.num_tokens - info.num_computed_tokens));
          }
          pkv_batch* batch = nullptr;
          pkv_status rc =
              pkv_batch_prepare_ex(p, seqs.data(), q.data(), uint32_t(seqs.size()),
                                   rng() % 2 ? PKV_PREPARE_PERSISTENT_TABLE : 0, nullptr, &batch);
          if (rc != PKV_OK) return rc;
          rc = abort ? pkv_batch_abort(batch) : pkv_batch_commit(batch);
          pkv_batch_destroy(batch);
          return rc;
        });
      } else if (r < 72 && have) {
        op = "free";
        both([&](pkv_pool* p, std::vector<pkv_seq_id>& ids) { return pkv_seq_free(p, ids[i]); });
        ia[i] = ib[i] = 0;
      } else if (r < 80 && have) {
        op = "fork";
        pkv_seq_id ca = 0, cb = 0;
        const pkv_status ra = pkv_seq_fork(a, ia[i], &ca), rb = pkv_seq_fork(b, ib[i], &cb);
        ASSERT_EQ(ra, rb);
        if (ra == PKV_OK) ia.push_back(ca), ib.push_back(cb);
      } else if (r < 85) {
        op = "take copies";
        observe(a, ia, true);
        observe(b, ib, true);
      }
      ASSERT_FALSE(testing::Test::HasFailure()) << "seed " << seed << " step " << k << " " << op;
      const std::string before = observe(b, ib, false);
      ASSERT_TRUE(before == observe(a, ia, false))
          << "seed " << seed << " step " << k << " " << op << " byte "
          << first_diff(before, observe(a, ia, false));
      // Failing calls on b.
      const uint32_t f = rng() % 7;
      std::vector<int32_t> big(kBlock * 30, 1);
      pkv_status rc = PKV_OK;
      std::string what;
      if (f == 0 && have) {
        what = "append too many";
        rc = pkv_seq_append(b, ib[i], big.data(), big.size(), 0);
      } else if (f == 1 && have) {
        pkv_seq_info info;
        pkv_seq_info_init(&info);
        pkv_seq_get_info(b, ib[i], &info);
        if (info.num_tokens > 0) {
          what = "truncate recurrent";
          rc = pkv_seq_truncate(b, ib[i], info.num_tokens - 1);
        }
      } else if (f == 2) {
        std::vector<pkv_seq_id> seqs;
        std::vector<uint32_t> q;
        for (pkv_seq_id id : ib)
          if (id) seqs.push_back(id), q.push_back(1);
        seqs.push_back(stale);
        q.push_back(1);
        pkv_batch* batch = nullptr;
        what = "prepare stale";
        rc = pkv_batch_prepare(b, seqs.data(), q.data(), uint32_t(seqs.size()), nullptr, &batch);
        if (rc == PKV_OK) pkv_batch_destroy(batch);
      } else if (f == 3) {
        std::vector<pkv_seq_id> seqs;
        std::vector<uint32_t> q;
        for (pkv_seq_id id : ib)
          if (id) seqs.push_back(id), q.push_back(1);
        if (!seqs.empty()) {
          seqs.push_back(seqs[0]);
          q.push_back(1);
          pkv_batch* batch = nullptr;
          what = "prepare dup";
          rc = pkv_batch_prepare(b, seqs.data(), q.data(), uint32_t(seqs.size()), nullptr, &batch);
          if (rc == PKV_OK) pkv_batch_destroy(batch);
        }
      } else if (f == 4) {
        int32_t src[1], dst[1];
        uint64_t n = 0;
        for (uint32_t g = 0; g < kGroups; ++g) {
          rc = pkv_pool_group_take_copies(b, g, src, dst, 0, &n);
          if (rc == PKV_OK && n == 0) continue;
          what = "take_copies capacity 0";
          break;
        }
      } else if (f == 5) {
        what = "fork stale";
        pkv_seq_id c = 0;
        rc = pkv_seq_fork(b, stale, &c);
      } else if (f == 6 && have) {
        // A plan whose queries recompute tokens a recurrent state holds.
        pkv_seq_info info;
        pkv_seq_info_init(&info);
        pkv_seq_get_info(b, ib[i], &info);
        if (info.num_computed_tokens > 0 && info.num_tokens > 0) {
          uint32_t q = uint32_t(info.num_tokens - info.num_computed_tokens + 1);
          if (q > info.num_tokens) q = uint32_t(info.num_tokens);
          if (q < info.num_tokens) {
            pkv_batch* batch = nullptr;
            what = "prepare recompute";
            rc = pkv_batch_prepare(b, &ib[i], &q, 1, nullptr, &batch);
            if (rc == PKV_OK) pkv_batch_destroy(batch), what = "";
          }
        }
      }
      if (what.empty()) continue;
      ASSERT_NE(rc, PKV_OK) << "'" << what << "' succeeded";
      const std::string after = observe(b, ib, false);
      const std::string after_a = observe(a, ia, false);
      ASSERT_TRUE(after == after_a) << "seed " << seed << " step " << k << ": failing call '"
                                    << what << "' (" << rc << ": " << pkv_last_error_message()
                                    << ") changed the pool at byte " << first_diff(after, after_a);
    }
    pkv_pool_destroy(a);
    pkv_pool_destroy(b);
  }
}

}  // namespace
