// Transfers under threads (run under TSan by scripts/test-sanitizers.sh:
// the target's name contains "threads"): one thread exports and mutates the
// exported sequences (steps, forks, truncates, frees, releases), one
// imports, polls, cancels and destroys transfers, one drives both engines'
// progress, and one admits and steps on the importing pool (prefix hits on
// imported blocks). Every import that completed holds exactly the K/V its
// exporter's committed steps wrote (the provenance encoding of
// tests/capi/provenance_storage.h), and both pools validate.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../capi/provenance_storage.h"
#include "../reliability/sanitizers.h"
#include "pagedkv/pagedkv.h"
#include "pagedkv/transfer.h"

namespace {

using provenance::elem;
using provenance::ident;
using provenance::Key;
using provenance::kHeadDim;
using provenance::kLayers;

constexpr uint32_t kBs = 4;

pkv_pool* make_pool() {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 96;
  o.num_layers = kLayers;
  o.num_kv_heads = 1;
  o.head_dim = kHeadDim;
  o.dtype = PKV_DTYPE_F32;
  o.num_threads = 1;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

// Appends t to seq and writes its uncomputed tokens' K/V (every layer).
bool step(pkv_pool* p, pkv_seq_id seq, std::vector<int32_t>* tokens,
          const std::vector<int32_t>& t) {
  if (!t.empty()) {
    if (pkv_seq_append(p, seq, t.data(), t.size(), 0) != PKV_OK) return false;
    tokens->insert(tokens->end(), t.begin(), t.end());
  }
  pkv_seq_info in;
  pkv_seq_info_init(&in);
  if (pkv_seq_get_info(p, seq, &in) != PKV_OK) return false;
  const uint32_t q = uint32_t(in.num_tokens - in.num_computed_tokens);
  if (q == 0) return true;
  pkv_batch* b = nullptr;
  if (pkv_batch_prepare(p, &seq, &q, 1, nullptr, &b) != PKV_OK) return false;
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<float> k(q * kHeadDim), v(q * kHeadDim);
    for (uint32_t row = 0; row < q; ++row) {
      const uint64_t id = ident(Key{}, *tokens, in.num_computed_tokens + row);
      for (uint32_t d = 0; d < kHeadDim; ++d) {
        k[row * kHeadDim + d] = elem(id, l, 0, d);
        v[row * kHeadDim + d] = elem(id, l, 1, d);
      }
    }
    const int64_t shape[3] = {int64_t(q), 1, kHeadDim};
    pkv_tensor kt, vt;
    pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &kt);
    pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &vt);
    if (pkv_cache_write(b, l, &kt, &vt, nullptr) != PKV_OK) break;
  }
  pkv_batch_destroy(b);
  return true;
}

struct Desc {
  uint64_t id = 0;
  std::vector<uint8_t> bytes;
  std::vector<int32_t> tokens;
};

TEST(TransferThreads, ImportsUnderConcurrentMutationHoldTheExportersKV) {
  // UCX's memory events (libucm's madvise hook, entered by every new
  // thread's start) segfault under TSan's interceptors; the transfers do not
  // need them (host memory, registered explicitly). Set before UCX loads.
  setenv("UCX_MEM_EVENTS", "no", 0);
  if (!pkv_transfer_available()) GTEST_SKIP() << "built without UCX";
#ifdef PKV_SANITIZED
  const int kRounds = 60;
#else
  const int kRounds = 300;
#endif
  pkv_pool *src = make_pool(), *dst = make_pool();
  pkv_transfer_options to;
  pkv_transfer_options_init(&to);
  to.transports = "tcp";
  pkv_transfer_engine *a = nullptr, *b = nullptr;
  ASSERT_EQ(pkv_transfer_engine_create(&to, &a), PKV_OK);
  ASSERT_EQ(pkv_transfer_engine_create(&to, &b), PKV_OK);
  provenance::Storage st;  // dst's K/V planes
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t w = 0; w < 2; ++w) ASSERT_EQ(pkv_pool_kv_tensor(dst, l, w, &st.kv[l][w]), PKV_OK);
  std::mutex mu;  // descs, done
  std::vector<Desc> descs;
  struct Done {
    pkv_seq_id seq;
    std::vector<int32_t> tokens;
  };
  std::vector<Done> done;
  std::atomic<bool> stop{false}, importer_done{false};
  std::atomic<int> exported{0}, imported{0};

  std::thread exporter([&] {
    std::mt19937_64 rng(1);
    struct S {
      pkv_seq_id id;
      std::vector<int32_t> tokens;
    };
    std::vector<S> seqs;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int round = 0;
         (round < kRounds || imported < kRounds / 10) && std::chrono::steady_clock::now() < end;
         ++round) {
      std::this_thread::yield();
      const int op = int(rng() % 6);
      if (op == 0 || seqs.empty()) {
        S s;
        if (pkv_seq_create(src, nullptr, &s.id) != PKV_OK) continue;
        std::vector<int32_t> t(1 + rng() % 12);
        for (auto& x : t) x = int32_t(rng() % 3);
        if (!step(src, s.id, &s.tokens, t)) {
          pkv_seq_free(src, s.id);
          continue;
        }
        seqs.push_back(s);
      } else if (op == 1) {
        S& s = seqs[rng() % seqs.size()];
        std::vector<int32_t> t(1 + rng() % 6);
        for (auto& x : t) x = int32_t(rng() % 3);
        step(src, s.id, &s.tokens, t);
      } else if (op == 2) {
        S& s = seqs[rng() % seqs.size()];
        pkv_seq_info in;
        pkv_seq_info_init(&in);
        ASSERT_EQ(pkv_seq_get_info(src, s.id, &in), PKV_OK);
        Desc d;
        d.tokens.assign(s.tokens.begin(), s.tokens.begin() + in.num_computed_tokens);
        if (pkv_transfer_export(a, src, s.id, &d.id) != PKV_OK) continue;
        uint64_t size = 0;
        pkv_transfer_export_descriptor(a, d.id, nullptr, 0, &size);
        d.bytes.resize(size);
        ASSERT_EQ(pkv_transfer_export_descriptor(a, d.id, d.bytes.data(), size, &size), PKV_OK);
        std::lock_guard<std::mutex> l(mu);
        descs.push_back(std::move(d));
        ++exported;
      } else if (op == 3) {
        const size_t i = rng() % seqs.size();
        const uint64_t n = rng() % (seqs[i].tokens.size() + 1);
        ASSERT_EQ(pkv_seq_truncate(src, seqs[i].id, n), PKV_OK);
        seqs[i].tokens.resize(n);
      } else if (op == 4) {
        const size_t i = rng() % seqs.size();
        S c = seqs[i];
        if (pkv_seq_fork(src, seqs[i].id, &c.id) == PKV_OK) seqs.push_back(c);
      } else {
        const size_t i = rng() % seqs.size();
        ASSERT_EQ(pkv_seq_free(src, seqs[i].id), PKV_OK);
        seqs.erase(seqs.begin() + long(i));
      }
    }
    for (S& s : seqs) pkv_seq_free(src, s.id);
  });

  std::thread progress([&] {
    while (!importer_done) {  // TCP: the importer's last reads need a's progress
      ASSERT_EQ(pkv_transfer_engine_progress(a), PKV_OK);
      ASSERT_EQ(pkv_transfer_engine_progress(b), PKV_OK);
      std::this_thread::yield();
    }
  });

  std::thread importer([&] {
    std::mt19937_64 rng(2);
    struct T {
      pkv_transfer* t;
      std::vector<int32_t> tokens;
    };
    std::vector<T> ts;
    auto poll_all = [&] {
      for (size_t i = 0; i < ts.size();) {
        uint32_t state = 0;
        pkv_seq_id s = 0;
        const pkv_status st = pkv_transfer_poll(ts[i].t, &state, &s);
        if (state == PKV_TRANSFER_RUNNING) {
          ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
          ++i;
          continue;
        }
        ASSERT_EQ(state, uint32_t(PKV_TRANSFER_DONE)) << pkv_last_error_message();
        {
          std::lock_guard<std::mutex> l(mu);
          done.push_back({s, ts[i].tokens});
        }
        ++imported;
        pkv_transfer_destroy(ts[i].t);
        ts.erase(ts.begin() + long(i));
      }
    };
    while (!stop || !ts.empty()) {
      Desc d;
      {
        std::lock_guard<std::mutex> l(mu);
        if (!descs.empty() && !stop) {
          const size_t i = rng() % descs.size();
          d.bytes = descs[i].bytes;
          d.tokens = descs[i].tokens;
        }
      }
      if (!d.bytes.empty()) {
        pkv_transfer* t = nullptr;
        const pkv_status st =
            pkv_transfer_import(b, dst, nullptr, d.bytes.data(), d.bytes.size(), &t);
        if (st == PKV_OK) {
          const int what = int(rng() % 6);
          if (what == 0) {
            ASSERT_EQ(pkv_transfer_cancel(t), PKV_OK) << pkv_last_error_message();
            ASSERT_EQ(pkv_transfer_cancel(t), PKV_OK);
            pkv_transfer_destroy(t);
          } else if (what == 1) {
            pkv_transfer_destroy(t);
          } else {
            ts.push_back({t, d.tokens});
          }
        } else {
          ASSERT_EQ(st, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
        }
      }
      poll_all();
      if (::testing::Test::HasFatalFailure()) return;
      std::lock_guard<std::mutex> l(mu);
      if (done.size() > 12) {  // free some imports (their blocks stay cached)
        pkv_seq_free(dst, done.front().seq);
        done.erase(done.begin());
      }
    }
  });

  // The importing pool's own traffic: prompts that hit imported blocks.
  std::thread user([&] {
    std::mt19937_64 rng(3);
    while (!stop) {
      std::vector<int32_t> t(1 + rng() % 12);
      for (auto& x : t) x = int32_t(rng() % 3);
      pkv_seq_id s = 0;
      uint64_t cached = 0;
      if (pkv_seq_admit(dst, nullptr, t.data(), t.size(), 0, &s, &cached) != PKV_OK) continue;
      // A hit (often on imported blocks) holds the K/V of its tokens.
      std::vector<int32_t> table(64);
      uint64_t n = 0;
      ASSERT_EQ(pkv_seq_get_block_table(dst, s, table.data(), table.size(), &n), PKV_OK);
      for (size_t pos = 0; pos < cached; ++pos)
        ASSERT_EQ(st.slot_holds(table[pos / kBs], pos % kBs, ident(Key{}, t, pos)), "")
            << "a prefix hit's token " << pos;
      std::vector<int32_t> tokens = t;  // admitted: only the uncomputed tokens are written
      step(dst, s, &tokens, {});
      pkv_seq_free(dst, s);
    }
  });

  exporter.join();
  stop = true;
  importer.join();
  importer_done = true;
  user.join();
  progress.join();
  for (Desc& d : descs) ASSERT_EQ(pkv_transfer_export_release(a, d.id), PKV_OK);

  // Every completed import still held holds its exporter's K/V.
  for (const Done& d : done) {
    std::vector<int32_t> table(256);
    uint64_t n = 0;
    ASSERT_EQ(pkv_seq_get_block_table(dst, d.seq, table.data(), table.size(), &n), PKV_OK);
    for (size_t pos = 0; pos < d.tokens.size(); ++pos)
      ASSERT_EQ(st.slot_holds(table[pos / kBs], pos % kBs, ident(Key{}, d.tokens, pos)), "")
          << "an imported sequence's token " << pos;
    pkv_seq_free(dst, d.seq);
  }
  EXPECT_EQ(pkv_pool_validate(src), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(pkv_pool_validate(dst), PKV_OK) << pkv_last_error_message();
  pkv_transfer_engine_destroy(b);
  pkv_transfer_engine_destroy(a);
  pkv_pool_destroy(src);
  pkv_pool_destroy(dst);
  std::printf("exported %d, imported %d\n", exported.load(), imported.load());
  EXPECT_GT(imported.load(), 0);
}

}  // namespace
