// The decode lane through the C ABI (step_plan_steady.cpp, Pool::DecodeMemo):
// a randomized differential test. Two pools get the same calls; `fused`
// decodes with pkv_batch_prepare_decode, `ref` with pkv_seq_append_batch
// then pkv_batch_prepare_ex. Between steps random other calls run on both
// (reads, event drains, reserves, truncates to the same length, appends of
// nothing, forks freed again, other sequences, cache resets, plans dropped
// after the next prepare, second commits, refused aborts, ...), so fused's
// steps come from the lane, from the steady path and from the general path
// in every order. Every plan array, every sequence's info, block table and
// hashes, the pool's stats and events must agree, and pkv_pool_validate
// (which checks the lane while it stands) must pass after every call.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "assert_ok.h"
#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kHeadDim = 4;

struct Config {
  uint32_t block_size;
  uint64_t num_blocks;
  uint32_t num_layers;  // 0: manager-only
  uint32_t seed;
  bool retention = false;  // retention priorities, on the pools' manual clock
  bool reader = false;     // a thread reads (and validates) fused all along
  bool mla = false;        // an MLA pool (its layers written with pkv_mla_cache_write)
};

std::vector<int32_t> array_i32(const pkv_tensor& t) {
  const int32_t* d =
      reinterpret_cast<const int32_t*>(static_cast<const char*>(t.data) + t.byte_offset);
  return std::vector<int32_t>(d, d + t.shape[0]);
}

std::vector<int64_t> array_i64(const pkv_tensor& t) {
  const int64_t* d =
      reinterpret_cast<const int64_t*>(static_cast<const char*>(t.data) + t.byte_offset);
  return std::vector<int64_t>(d, d + t.shape[0]);
}

class Differential {
 public:
  explicit Differential(const Config& c) : cfg_(c), rng_(c.seed) {
    for (int k = 0; k < 2; ++k) {
      pkv_pool_options o;
      pkv_pool_options_init(&o);
      o.block_size = c.block_size;
      o.num_blocks = c.num_blocks;
      o.enable_events = 1;
      o.hash_algo = PKV_HASH_XXH3_128;
      o.num_layers = c.num_layers;
      o.enable_retention = c.retention;
      if (c.num_layers) {
        o.num_kv_heads = 1;
        o.head_dim = kHeadDim;
        o.dtype = PKV_DTYPE_F32;
        o.num_threads = 1;
      }
      if (c.mla) {
        o.kv_layout = PKV_KV_LAYOUT_MLA;
        o.kv_lora_rank = kHeadDim;
        o.qk_rope_head_dim = 2;
        o.head_dim = 0;
      }
      EXPECT_EQ(pkv_pool_create(&o, &pool_[k]), PKV_OK) << pkv_last_error_message();
      if (c.retention) EXPECT_EQ(pkv_pool_set_clock(pool_[k], clock_), PKV_OK);
    }
    if (c.reader)
      reader_ = std::thread([this] {
        pkv_pool_stats st;
        pkv_pool_stats_init(&st);
        uint64_t counts[PKV_PRIORITY_MAX + 1], n = 0;
        while (!stop_.load()) {
          if (pkv_pool_validate(pool_[0]) != PKV_OK) {
            ADD_FAILURE() << "concurrent validate: " << pkv_last_error_message();
            return;
          }
          EXPECT_EQ(pkv_pool_get_stats(pool_[0], &st), PKV_OK);
          EXPECT_EQ(pkv_pool_get_priority_counts(pool_[0], counts, PKV_PRIORITY_MAX + 1, &n),
                    PKV_OK);
        }
      });
  }
  ~Differential() {
    stop_.store(true);
    if (reader_.joinable()) reader_.join();
    for (int k = 0; k < 2; ++k) {
      if (prev_[k]) pkv_batch_destroy(prev_[k]);
      if (side_[k]) pkv_batch_destroy(side_[k]);
      pkv_pool_destroy(pool_[k]);
    }
  }

  void run(int steps) {
    for (int i = 0; i < 4; ++i) admit();
    for (int s = 0; s < steps && !::testing::Test::HasFailure(); ++s) {
      between();
      step();
    }
  }

 private:
  uint32_t pick(uint32_t n) { return std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_); }

  void check(const char* where) {
    for (int k = 0; k < 2; ++k)
      ASSERT_EQ(pkv_pool_validate(pool_[k]), PKV_OK)
          << (k ? "ref" : "fused") << " after " << where << ", step " << step_no_ << ": "
          << pkv_last_error_message();
  }

  // Reads both pools (calls that keep the lane) and compares them.
  void compare(const char* where) {
    check(where);
    for (size_t i = 0; i < ids_[0].size(); ++i) {
      pkv_seq_info a, b;
      pkv_seq_info_init(&a);
      pkv_seq_info_init(&b);
      ASSERT_EQ(pkv_seq_get_info(pool_[0], ids_[0][i], &a), PKV_OK) << pkv_last_error_message();
      ASSERT_EQ(pkv_seq_get_info(pool_[1], ids_[1][i], &b), PKV_OK) << pkv_last_error_message();
      EXPECT_EQ(a.num_tokens, b.num_tokens) << where << " seq " << i << " step " << step_no_;
      EXPECT_EQ(a.num_computed_tokens, b.num_computed_tokens)
          << where << " seq " << i << " step " << step_no_;
      EXPECT_EQ(a.num_blocks, b.num_blocks) << where << " seq " << i << " step " << step_no_;
      EXPECT_EQ(a.num_cached_tokens, b.num_cached_tokens) << where << " seq " << i;
      std::vector<int32_t> ta(a.num_blocks + 1), tb(b.num_blocks + 1);
      uint64_t na = 0, nb = 0;
      ASSERT_EQ(pkv_seq_get_block_table(pool_[0], ids_[0][i], ta.data(), ta.size(), &na), PKV_OK);
      ASSERT_EQ(pkv_seq_get_block_table(pool_[1], ids_[1][i], tb.data(), tb.size(), &nb), PKV_OK);
      ta.resize(na);
      tb.resize(nb);
      EXPECT_EQ(ta, tb) << where << " seq " << i << " step " << step_no_;
      std::vector<pkv_block_hash> ha(a.num_blocks + 1), hb(b.num_blocks + 1);
      ASSERT_EQ(pkv_seq_get_block_hashes(pool_[0], ids_[0][i], ha.data(), ha.size(), &na), PKV_OK);
      ASSERT_EQ(pkv_seq_get_block_hashes(pool_[1], ids_[1][i], hb.data(), hb.size(), &nb), PKV_OK);
      ASSERT_EQ(na, nb) << where << " seq " << i;
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), na * sizeof(pkv_block_hash)), 0) << where;
    }
    pkv_pool_stats sa, sb;
    pkv_pool_stats_init(&sa);
    pkv_pool_stats_init(&sb);
    ASSERT_EQ(pkv_pool_get_stats(pool_[0], &sa), PKV_OK);
    ASSERT_EQ(pkv_pool_get_stats(pool_[1], &sb), PKV_OK);
    EXPECT_EQ(sa.num_free_blocks, sb.num_free_blocks) << where << " step " << step_no_;
    EXPECT_EQ(sa.num_used_blocks, sb.num_used_blocks) << where << " step " << step_no_;
    EXPECT_EQ(sa.num_cached_blocks, sb.num_cached_blocks) << where << " step " << step_no_;
    EXPECT_EQ(sa.num_tokens, sb.num_tokens) << where << " step " << step_no_;
    EXPECT_EQ(sa.num_evictions, sb.num_evictions) << where << " step " << step_no_;
    EXPECT_EQ(sa.kv_bytes_used, sb.kv_bytes_used) << where << " step " << step_no_;
    if (pick(2)) drain(where);
    check(where);
  }

  void drain(const char* where) {
    pkv_event ea[64], eb[64];
    for (;;) {
      uint64_t na = 0, nb = 0;
      ASSERT_EQ(pkv_pool_drain_events(pool_[0], ea, 64, &na), PKV_OK);
      ASSERT_EQ(pkv_pool_drain_events(pool_[1], eb, 64, &nb), PKV_OK);
      ASSERT_EQ(na, nb) << where << " step " << step_no_;
      for (uint64_t e = 0; e < na; ++e) {
        EXPECT_EQ(ea[e].seq_no, eb[e].seq_no) << where;
        EXPECT_EQ(ea[e].type, eb[e].type) << where << " step " << step_no_;
        EXPECT_EQ(ea[e].block_id, eb[e].block_id) << where << " step " << step_no_;
        EXPECT_EQ(ea[e].num_tokens, eb[e].num_tokens) << where;
        EXPECT_EQ(std::memcmp(&ea[e].block_hash, &eb[e].block_hash, sizeof(pkv_block_hash)), 0);
      }
      if (na < 64) break;
    }
  }

  // Commits whatever a plan covers (a step over what s has not computed).
  void compute_rest(int k, pkv_seq_id s) {
    pkv_seq_info i;
    pkv_seq_info_init(&i);
    ASSERT_EQ(pkv_seq_get_info(pool_[k], s, &i), PKV_OK);
    const uint32_t q = uint32_t(i.num_tokens - i.num_computed_tokens);
    if (q == 0) return;
    pkv_batch* b = nullptr;
    ASSERT_EQ(pkv_batch_prepare(pool_[k], &s, &q, 1, nullptr, &b), PKV_OK)
        << pkv_last_error_message();
    finish(k, b, q, true);
    pkv_batch_destroy(b);
  }

  // Every layer written (storage), or a commit.
  void finish(int k, pkv_batch* b, uint32_t n, bool commit) {
    if (cfg_.num_layers == 0) {
      if (commit) ASSERT_EQ(pkv_batch_commit(b), PKV_OK) << pkv_last_error_message();
      return;
    }
    std::vector<float> kv(size_t(n) * kHeadDim, 0.5f), q(size_t(n) * kHeadDim, 0.25f),
        out(size_t(n) * kHeadDim);
    const int64_t shape[3] = {int64_t(n), 1, kHeadDim};
    pkv_tensor kt, qt, ot;
    ASSERT_EQ(pkv_tensor_init(kv.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &kt), PKV_OK);
    ASSERT_EQ(pkv_tensor_init(q.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &qt), PKV_OK);
    ASSERT_EQ(pkv_tensor_init(out.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &ot), PKV_OK);
    if (cfg_.mla) {
      const int64_t c_shape[2] = {int64_t(n), kHeadDim}, pe_shape[2] = {int64_t(n), 2};
      pkv_tensor ct, pt;
      ASSERT_EQ(pkv_tensor_init(kv.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, c_shape, &ct),
                PKV_OK);
      ASSERT_EQ(pkv_tensor_init(q.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 2, pe_shape, &pt),
                PKV_OK);
      for (uint32_t l = 0; l < cfg_.num_layers; ++l)
        ASSERT_EQ(pkv_mla_cache_write(b, l, &ct, &pt, nullptr), PKV_OK) << pkv_last_error_message();
      if (commit) ASSERT_EQ(pkv_batch_commit(b), PKV_OK) << pkv_last_error_message();
      return;
    }
    for (uint32_t l = 0; l < cfg_.num_layers; ++l) {
      ASSERT_EQ(pkv_cache_write(b, l, &kt, &kt, nullptr), PKV_OK) << pkv_last_error_message();
      ASSERT_EQ(pkv_attention_forward(b, l, &qt, &ot, nullptr, nullptr, nullptr), PKV_OK)
          << pkv_last_error_message();
    }
    if (commit) ASSERT_EQ(pkv_batch_commit(b), PKV_OK) << pkv_last_error_message();
  }

  void admit() {
    const uint32_t n = 1 + pick(3 * cfg_.block_size + 2);
    std::vector<int32_t> toks(n);
    // Some prompts repeat others: prefix hits and shared full blocks.
    const uint32_t base = pick(3) == 0 ? 7 : 1000 + pick(100000);
    for (uint32_t i = 0; i < n; ++i) toks[i] = int32_t(base + i);
    // Some with lookahead slots: blocks allocated ahead of their tokens.
    const uint32_t lookahead = pick(3) == 0 ? pick(2 * cfg_.block_size + 1) : 0;
    pkv_seq_id s[2];
    pkv_status st[2];
    for (int k = 0; k < 2; ++k) {
      uint64_t cached = 0;
      st[k] = pkv_seq_admit(pool_[k], nullptr, toks.data(), n, lookahead, &s[k], &cached);
    }
    ASSERT_EQ(st[0], st[1]);
    if (st[0] != PKV_OK) return;
    for (int k = 0; k < 2; ++k) {
      compute_rest(k, s[k]);
      ids_[k].push_back(s[k]);
    }
  }

  void free_at(size_t i) {
    for (int k = 0; k < 2; ++k) {
      ASSERT_EQ(pkv_seq_free(pool_[k], ids_[k][i]), PKV_OK) << pkv_last_error_message();
      ids_[k].erase(ids_[k].begin() + long(i));
    }
  }

  // One or more calls between two steps, on both pools alike.
  void between() {
    const uint32_t what = pick(28);
    const size_t m = ids_[0].size();
    const size_t i = m ? pick(uint32_t(m)) : 0;
    pkv_seq_info info;
    pkv_seq_info_init(&info);
    if (m) ASSERT_EQ(pkv_seq_get_info(pool_[0], ids_[0][i], &info), PKV_OK);
    switch (what) {
      case 0:
        if (m) {
          const uint64_t n = info.num_tokens + pick(3 * cfg_.block_size + 1);
          for (int k = 0; k < 2; ++k) PKV_ASSERT_OK(pkv_seq_reserve(pool_[k], ids_[k][i], n));
        }
        break;
      case 1:
        if (m)
          for (int k = 0; k < 2; ++k)
            PKV_ASSERT_OK(pkv_seq_truncate(pool_[k], ids_[k][i], info.num_tokens));
        break;
      case 2:
        if (m)
          for (int k = 0; k < 2; ++k) {
            const int32_t none = 0;
            PKV_ASSERT_OK(pkv_seq_append(pool_[k], ids_[k][i], &none, 0, 0));
          }
        break;
      case 3:
        for (int k = 0; k < 2; ++k) {
          const int32_t none = 0;
          PKV_ASSERT_OK(pkv_seq_append_batch(pool_[k], ids_[k].data(), &none, 0));
        }
        break;
      case 4:
        if (m)
          for (int k = 0; k < 2; ++k) {
            pkv_seq_id child = 0;
            const pkv_status st = pkv_seq_fork(pool_[k], ids_[k][i], &child);
            if (st == PKV_OK) PKV_ASSERT_OK(pkv_seq_free(pool_[k], child));
          }
        break;
      case 5:
        for (int k = 0; k < 2; ++k) PKV_ASSERT_OK(pkv_pool_reset_prefix_cache(pool_[k]));
        break;
      case 6:
        if (m > 1) free_at(i);
        break;
      case 7:
        if (m < 10) admit();
        break;
      case 8:
        if (m && info.num_tokens > 1) {
          // Truncated, then recomputed on both.
          const uint64_t to =
              info.num_tokens - 1 - pick(uint32_t(std::min<uint64_t>(info.num_tokens - 1, 5)));
          for (int k = 0; k < 2; ++k) {
            PKV_ASSERT_OK(pkv_seq_truncate(pool_[k], ids_[k][i], to));
            compute_rest(k, ids_[k][i]);
          }
        }
        break;
      case 9: {
        // Another sequence, appended to and computed, freed at once or later.
        for (int k = 0; k < 2; ++k) {
          pkv_seq_id o = 0;
          PKV_ASSERT_OK(pkv_seq_create(pool_[k], nullptr, &o));
          const int32_t t[3] = {5, 6, 7};
          if (pkv_seq_append(pool_[k], o, t, 3, 0) == PKV_OK) compute_rest(k, o);
          PKV_ASSERT_OK(pkv_seq_free(pool_[k], o));
        }
        break;
      }
      case 10:
        if (m) {  // a fork that stays a step: the tail is shared
          for (int k = 0; k < 2; ++k) {
            pkv_seq_id child = 0;
            if (pkv_seq_fork(pool_[k], ids_[k][i], &child) == PKV_OK) forks_[k].push_back(child);
          }
        }
        break;
      case 11:
        for (int k = 0; k < 2; ++k) {
          for (pkv_seq_id c : forks_[k]) PKV_ASSERT_OK(pkv_seq_free(pool_[k], c));
          forks_[k].clear();
        }
        break;
      case 12:
        // A sequence's order in the batch changes.
        if (m > 1) {
          const size_t j = pick(uint32_t(m));
          for (int k = 0; k < 2; ++k) std::swap(ids_[k][i], ids_[k][j]);
        }
        break;
      case 13:
        drain("drain");
        break;
      case 16:
        if (cfg_.retention && m) {
          pkv_retention_range r{};
          r.token_begin = pick(uint32_t(info.num_tokens) + 1);
          r.token_end = pick(2) ? PKV_TOKEN_END : r.token_begin + 1 + pick(9);
          r.priority = pick(PKV_PRIORITY_MAX);  // never pinned
          r.duration_ns = pick(3) * 1000;
          for (int k = 0; k < 2; ++k)
            PKV_ASSERT_OK(pkv_seq_set_retention(pool_[k], ids_[k][i], &r, 1));
        }
        break;
      case 17:
        if (cfg_.retention) {
          clock_ += pick(3000);
          for (int k = 0; k < 2; ++k) PKV_ASSERT_OK(pkv_pool_set_clock(pool_[k], clock_));
        }
        break;
      case 14:
        // Another sequence's plan, left open across the next steps.
        if (!side_[0]) {
          for (int k = 0; k < 2; ++k) {
            PKV_ASSERT_OK(pkv_seq_create(pool_[k], nullptr, &other_[k]));
            const int32_t t[5] = {41, 42, 43, 44, 45};
            if (pkv_seq_append(pool_[k], other_[k], t, 5, 0) != PKV_OK) {
              PKV_ASSERT_OK(pkv_seq_free(pool_[k], other_[k]));
              continue;
            }
            const uint32_t q = 5;
            PKV_ASSERT_OK(pkv_batch_prepare(pool_[k], &other_[k], &q, 1, nullptr, &side_[k]));
          }
          ASSERT_EQ(side_[0] == nullptr, side_[1] == nullptr);
        }
        break;
      case 15:
        // ... finished (its last layer write or a commit), or dropped.
        if (side_[0]) {
          const bool drop = pick(3) == 0;
          for (int k = 0; k < 2; ++k) {
            if (!drop) finish(k, side_[k], 5, cfg_.num_layers == 0);
            pkv_batch_destroy(side_[k]);
            side_[k] = nullptr;
            PKV_ASSERT_OK(pkv_seq_free(pool_[k], other_[k]));
          }
        }
        break;
      default:
        break;  // only the reads of compare(): the lane stands
    }
    compare("between");
  }

  void step() {
    ++step_no_;
    const uint32_t m = uint32_t(ids_[0].size());
    if (m == 0) {
      admit();
      return;
    }
    std::vector<int32_t> toks(m);
    for (uint32_t i = 0; i < m; ++i)
      toks[i] = pick(4) == 0 ? int32_t(7 + i) : int32_t(step_no_ * 131 + i * 17);
    const uint32_t flags = pick(4) ? PKV_PREPARE_PERSISTENT_TABLE : 0;
    pkv_batch* b[2] = {nullptr, nullptr};
    const pkv_status sf =
        pkv_batch_prepare_decode(pool_[0], ids_[0].data(), toks.data(), m, flags, nullptr, &b[0]);
    const std::string mf = sf == PKV_OK ? "" : pkv_last_error_message();
    pkv_status sr = pkv_seq_append_batch(pool_[1], ids_[1].data(), toks.data(), m);
    if (sr == PKV_OK) {
      std::vector<uint32_t> ones(m, 1);
      sr = pkv_batch_prepare_ex(pool_[1], ids_[1].data(), ones.data(), m, flags, nullptr, &b[1]);
      EXPECT_EQ(sr, PKV_OK) << pkv_last_error_message();
    }
    ASSERT_EQ(sf, sr) << "step " << step_no_ << ": " << mf;
    if (sf != PKV_OK) {
      // Out of blocks: a sequence finishes, on both.
      EXPECT_EQ(sf, PKV_E_OUT_OF_BLOCKS) << mf;
      compare("failed step");
      free_at(pick(m));
      return;
    }
    // Fused drops its previous plan only now (double buffering).
    if (prev_[0]) {
      pkv_batch_destroy(prev_[0]);
      prev_[0] = nullptr;
    }
    compare_plans(b[0], b[1], m, flags != 0);
    // Fused: its layers written or a commit (manager-only: or a destroy,
    // which commits for ABI-1 callers); a second commit and a refused
    // abort sometimes. Ref commits.
    const uint32_t how = pick(4);
    if (cfg_.num_layers == 0 && how == 0) {
      pkv_batch_destroy(b[0]);
      b[0] = nullptr;
    } else {
      finish(0, b[0], m, cfg_.num_layers == 0 || how == 1);
      if (how == 2) {
        EXPECT_EQ(pkv_batch_commit(b[0]), PKV_OK);
        EXPECT_EQ(pkv_batch_abort(b[0]), PKV_E_INVALID_STATE);
      }
    }
    finish(1, b[1], m, true);
    pkv_batch_destroy(b[1]);
    if (b[0]) {
      if (pick(2))
        prev_[0] = b[0];
      else
        pkv_batch_destroy(b[0]);
    }
    compare("step");
    // Sequences that grew long finish.
    for (size_t i = 0; i < ids_[0].size(); ++i) {
      pkv_seq_info info;
      pkv_seq_info_init(&info);
      ASSERT_EQ(pkv_seq_get_info(pool_[0], ids_[0][i], &info), PKV_OK);
      if (info.num_tokens > 12 * cfg_.block_size + 5 && pick(3) == 0) {
        free_at(i);
        break;
      }
    }
  }

  // The plans' arrays: equal, except that a persistent table's stride
  // depends on the tables the pool kept before (fused keeps plans alive
  // longer): there each row's pages must agree and the rest be 0.
  void compare_plans(const pkv_batch* a, const pkv_batch* b, uint32_t m, bool persistent) {
    pkv_batch_info ia, ib;
    pkv_batch_info_init(&ia);
    pkv_batch_info_init(&ib);
    ASSERT_EQ(pkv_batch_get_info(a, &ia), PKV_OK);
    ASSERT_EQ(pkv_batch_get_info(b, &ib), PKV_OK);
    EXPECT_EQ(ia.num_seqs, m);
    EXPECT_EQ(ia.num_tokens, ib.num_tokens) << "step " << step_no_;
    if (!persistent) EXPECT_EQ(ia.num_pages, ib.num_pages) << "step " << step_no_;
    EXPECT_EQ(ia.max_context, ib.max_context) << "step " << step_no_;
    EXPECT_EQ(ia.max_query, ib.max_query) << "step " << step_no_;
    std::vector<int32_t> ra[6], rb[6];
    for (uint32_t w = 0; w <= PKV_PLAN_CONTEXT_LENS; ++w) {
      pkv_tensor ta, tb;
      ASSERT_EQ(pkv_batch_plan_tensor(a, w, &ta), PKV_OK);
      ASSERT_EQ(pkv_batch_plan_tensor(b, w, &tb), PKV_OK);
      if (w == PKV_PLAN_SLOT_MAPPING) {
        EXPECT_EQ(array_i64(ta), array_i64(tb)) << "step " << step_no_;
        continue;
      }
      ra[w] = array_i32(ta);
      rb[w] = array_i32(tb);
      if (!persistent || (w != PKV_PLAN_PAGE_INDPTR && w != PKV_PLAN_PAGE_INDICES))
        EXPECT_EQ(ra[w], rb[w]) << "step " << step_no_ << " array " << w;
    }
    if (!persistent) return;
    const std::vector<int32_t>&ctx = ra[PKV_PLAN_CONTEXT_LENS], &pa = ra[PKV_PLAN_PAGE_INDPTR],
          &pb = rb[PKV_PLAN_PAGE_INDPTR];
    for (uint32_t i = 0; i < m; ++i) {
      const int32_t np = (ctx[i] + int32_t(cfg_.block_size) - 1) / int32_t(cfg_.block_size);
      ASSERT_GE(pa[i + 1] - pa[i], np);
      ASSERT_GE(pb[i + 1] - pb[i], np);
      for (int32_t j = 0; j < np; ++j)
        EXPECT_EQ(ra[PKV_PLAN_PAGE_INDICES][size_t(pa[i] + j)],
                  rb[PKV_PLAN_PAGE_INDICES][size_t(pb[i] + j)])
            << "step " << step_no_ << " seq " << i << " page " << j;
      for (int32_t j = pa[i] + np; j < pa[i + 1]; ++j)
        EXPECT_EQ(ra[PKV_PLAN_PAGE_INDICES][size_t(j)], 0) << "step " << step_no_ << " seq " << i;
      for (int32_t j = pb[i] + np; j < pb[i + 1]; ++j)
        EXPECT_EQ(rb[PKV_PLAN_PAGE_INDICES][size_t(j)], 0) << "step " << step_no_ << " seq " << i;
    }
  }

  Config cfg_;
  std::mt19937 rng_;
  pkv_pool* pool_[2] = {nullptr, nullptr};
  std::vector<pkv_seq_id> ids_[2], forks_[2];
  pkv_batch* prev_[2] = {nullptr, nullptr};
  pkv_batch* side_[2] = {nullptr, nullptr};  // another sequence's open plan
  pkv_seq_id other_[2] = {0, 0};
  uint32_t step_no_ = 0;
  uint64_t clock_ = 1000000;
  std::atomic<bool> stop_{false};
  std::thread reader_;
};

TEST(CapiDecodeLane, ManagerOnlyMatchesAppendBatchThenPrepare) {
  for (uint32_t bs : {1u, 2u, 4u, 16u})
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      Differential d({bs, 12 * 12 + 2, 0, seed * 97 + bs});
      d.run(300);
      ASSERT_FALSE(::testing::Test::HasFailure()) << "block size " << bs << " seed " << seed;
    }
}

// Retention priorities (the steps' appends order the free queue by them),
// with a thread reading and validating the fused pool between and during
// every call.
TEST(CapiDecodeLane, RetentionAndAConcurrentReaderMatchAppendBatchThenPrepare) {
  for (uint32_t bs : {1u, 4u})
    for (uint32_t seed = 1; seed <= 2; ++seed) {
      Config c{bs, 8 * 12 + 2, seed == 2 ? 2u : 0u, seed * 13 + bs};
      c.retention = true;
      c.reader = true;
      Differential d(c);
      d.run(200);
      ASSERT_FALSE(::testing::Test::HasFailure()) << "block size " << bs << " seed " << seed;
    }
}

TEST(CapiDecodeLane, MlaPoolMatchesAppendBatchThenPrepare) {
  for (uint32_t bs : {1u, 4u}) {
    Config c{bs, 12 * 12 + 2, 2, 71 + bs};
    c.mla = true;
    Differential d(c);
    d.run(200);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "block size " << bs;
  }
}

TEST(CapiDecodeLane, StoragePoolMatchesAppendBatchThenPrepare) {
  for (uint32_t bs : {1u, 4u, 8u})
    for (uint32_t seed = 1; seed <= 2; ++seed) {
      Differential d({bs, 12 * 12 + 2, 2, seed * 31 + bs});
      d.run(200);
      ASSERT_FALSE(::testing::Test::HasFailure()) << "block size " << bs << " seed " << seed;
    }
}

}  // namespace
