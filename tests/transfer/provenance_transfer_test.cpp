// KV provenance across transfers: a randomized model through the public C
// API only (the style of tests/capi/provenance_test.cpp, whose K/V encoding
// it shares: every element names its extra keys, its whole token prefix, its
// layer and K or V, so storage itself says who wrote each slot).
//
// Two or three pools of one layout, each with its own transfer engine (TCP
// in one process), driven by random operations: admits with prefix hits
// (of blocks written here or imported), appends, steps written layer by
// layer and committed or aborted (some over later operations: an export,
// fork or import between their layers), forks, truncates and frees; exports,
// imports polled to completion, cancelled or destroyed mid-way, while the
// exporter frees, truncates, forks or extends the exported sequence;
// releases of exports no running import reads; an exporting pool destroyed
// while imports of its (unreleased) exports run. After every operation:
//  - every token a sequence of any pool counts as computed holds exactly
//    the K/V its tokens and keys wrote (imported sequences: every token
//    computed, the exporter's committed K/V);
//  - pkv_pool_validate;
//  - an import ends DONE with the exporter's tokens, or FAILED with a
//    message; once every transfer ended and every export was released,
//    each pool's used blocks are exactly the blocks its sequences name.
//
// PKV_XFER_MODEL_SEEDS=n runs seeds 1..n (default 150; 20 under
// sanitizers), PKV_XFER_MODEL_SEED=s seed s alone, PKV_XFER_MODEL_STEPS=k
// operations a seed (default 300).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../capi/provenance_model.h"
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

uint64_t g_imports_done, g_import_hits;

// One TCP engine per pool index, shared by every seed: an engine destroyed
// while a peer engine's wire-up reply to it is still queued can make UCX
// 1.13 abort that peer at its next progress (ucp_request.c:684, "got REP
// message"; open, docs/reliability.md), about one seed in 150 when each
// seed made and destroyed its own engines.
pkv_transfer_engine* g_engines[3];

#ifdef PKV_SANITIZED
constexpr uint64_t kSeeds = 20;
#else
constexpr uint64_t kSeeds = 150;
#endif

struct Seq {
  pkv_seq_id id = 0;
  Key key;
  std::vector<int32_t> tokens;
  bool imported = false;
};

// A step prepared and written layer by layer over later operations (an
// export, a fork or a transfer may come between its layers).
struct Plan {
  pkv_batch* b = nullptr;
  std::vector<uint64_t> row_ident;  // per row: the identity it writes
  uint32_t next_layer = 0;
};

struct PoolState : provenance::Storage {
  pkv_pool* pool = nullptr;
  pkv_transfer_engine* eng = nullptr;
  std::vector<Seq> seqs;
  std::set<int32_t> pending_dst;  // copy-on-write destinations, filled at the next prepare
  std::map<pkv_seq_id, std::vector<int32_t>> last_table;
  std::set<int32_t> imported_blocks;  // blocks of imported sequences (for hit statistics)
  std::vector<Plan> plans;
};

struct Export {
  size_t pool = 0;
  uint64_t id = 0;
  std::vector<uint8_t> desc;
  Key key;
  std::vector<int32_t> tokens;  // the exporter's computed tokens at export
};

struct Xfer {
  pkv_transfer* t = nullptr;
  size_t pool = 0;  // the importer
  size_t exp = 0;   // index into exports
  Key key;
  std::vector<int32_t> tokens;
};

struct Model {
  std::mt19937_64 rng;
  uint32_t bs = 4;
  uint64_t nblocks = 0;
  std::vector<PoolState> pools;
  std::vector<Export> exports;  // exports[i].id 0: released
  std::vector<Xfer> xfers;
  std::vector<std::vector<int32_t>> bases;
  std::string trace;

  explicit Model(uint64_t seed) : rng(seed) {}
  ~Model() {
    for (PoolState& p : pools)
      for (Plan& pl : p.plans) pkv_batch_destroy(pl.b);
    for (Xfer& x : xfers) pkv_transfer_destroy(x.t);
    for (PoolState& p : pools) pkv_pool_destroy(p.pool);
    // The engines are the test's, shared by every seed (see g_engines).
  }
  uint64_t r(uint64_t n) { return n ? rng() % n : 0; }

  void create() {
    const uint32_t sizes[] = {1, 3, 4, 5};
    bs = sizes[r(4)];
    nblocks = 16 + r(24);
    const size_t np = 2 + r(2);
    pools.resize(np);
    for (size_t i = 0; i < np; ++i) {
      pkv_pool_options o = provenance::storage_options(bs, nblocks);
      o.hash_algo = r(2) ? PKV_HASH_XXH3_128 : PKV_HASH_SHA256_CBOR;
      ASSERT_EQ(pkv_pool_create(&o, &pools[i].pool), PKV_OK) << pkv_last_error_message();
      for (uint32_t l = 0; l < kLayers; ++l)
        for (uint32_t w = 0; w < 2; ++w)
          ASSERT_EQ(pkv_pool_kv_tensor(pools[i].pool, l, w, &pools[i].kv[l][w]), PKV_OK);
      pools[i].eng = g_engines[i];
    }
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> b(bs * (1 + r(4)) + r(bs));
      for (auto& t : b) t = int32_t(r(3));
      bases.push_back(b);
    }
    trace = "bs=" + std::to_string(bs) + " blocks=" + std::to_string(nblocks) +
            " pools=" + std::to_string(np) + "\n";
  }

  bool live(size_t p) const { return pools[p].pool != nullptr; }

  std::vector<int32_t> table(PoolState& p, pkv_seq_id id) {
    std::vector<int32_t> t(4096);
    uint64_t n = 0;
    EXPECT_EQ(pkv_seq_get_block_table(p.pool, id, t.data(), t.size(), &n), PKV_OK)
        << pkv_last_error_message();
    t.resize(n);
    return t;
  }
  pkv_seq_info info(PoolState& p, pkv_seq_id id) {
    pkv_seq_info i;
    pkv_seq_info_init(&i);
    EXPECT_EQ(pkv_seq_get_info(p.pool, id, &i), PKV_OK) << pkv_last_error_message();
    return i;
  }

  // Every computed token of every sequence holds its own K/V.
  void check_pool(size_t pi, bool settled) {
    PoolState& p = pools[pi];
    ASSERT_EQ(pkv_pool_validate(p.pool), PKV_OK) << trace << pkv_last_error_message();
    std::set<int32_t> used;
    for (Seq& s : p.seqs) {
      const pkv_seq_info in = info(p, s.id);
      ASSERT_EQ(in.num_tokens, s.tokens.size()) << trace << "pool " << pi << " seq " << s.id;
      ASSERT_LE(in.num_computed_tokens, in.num_tokens) << trace;
      const auto t = table(p, s.id);
      auto& old = p.last_table[s.id];
      for (size_t j = 0; j < old.size() && j < t.size(); ++j)
        if (old[j] != t[j]) p.pending_dst.insert(t[j]);
      old = t;
      for (int32_t b : t) used.insert(b);
      for (uint64_t pos = 0; pos < in.num_computed_tokens; ++pos) {
        const int32_t b = t[pos / bs];
        if (p.pending_dst.count(b)) continue;
        const std::string bad = p.slot_holds(b, pos % bs, provenance::ident(s.key, s.tokens, pos));
        ASSERT_EQ(bad, "") << trace << "pool " << pi << " seq " << s.id
                           << (s.imported ? " (imported)" : "") << " counts token " << pos
                           << " computed (of " << in.num_computed_tokens << "), but its " << bad;
      }
    }
    if (!settled) return;
    pkv_pool_stats st;
    pkv_pool_stats_init(&st);
    ASSERT_EQ(pkv_pool_get_stats(p.pool, &st), PKV_OK);
    ASSERT_EQ(st.num_seqs, p.seqs.size()) << trace << "pool " << pi;
    ASSERT_EQ(st.num_used_blocks, used.size()) << trace << "pool " << pi;
    ASSERT_EQ(st.num_used_blocks + st.num_free_blocks, nblocks - 1) << trace << "pool " << pi;
  }

  void check(bool settled = false) {
    for (size_t i = 0; i < pools.size(); ++i) {
      if (!live(i)) continue;
      check_pool(i, settled);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  std::vector<int32_t> prompt() {
    return provenance::random_prompt([this](uint64_t n) { return r(n); }, bases, bs);
  }

  size_t any_pool() {
    for (;;) {
      const size_t i = r(pools.size());
      if (live(i)) return i;
    }
  }

  void admit() {
    const size_t pi = any_pool();
    PoolState& p = pools[pi];
    Seq s;
    s.key = provenance::random_key([this](uint64_t n) { return r(n); });
    s.tokens = prompt();
    pkv_seq_options so;
    pkv_seq_options_init(&so);
    so.lora_id = s.key.lora;
    const std::string salt = "s" + std::to_string(s.key.salt);
    so.cache_salt = s.key.salt ? salt.c_str() : nullptr;
    uint64_t cached = 0;
    const pkv_status st =
        pkv_seq_admit(p.pool, &so, s.tokens.data(), s.tokens.size(), 0, &s.id, &cached);
    trace += "admit pool " + std::to_string(pi) + " n=" + std::to_string(s.tokens.size());
    if (st == PKV_E_OUT_OF_BLOCKS) {
      trace += " oob\n";
      return;
    }
    ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
    trace += " -> seq " + std::to_string(s.id) + " cached " + std::to_string(cached) + "\n";
    if (cached) {
      const auto t = table(p, s.id);
      for (uint64_t j = 0; j < cached / bs; ++j)
        if (p.imported_blocks.count(t[j])) {
          ++g_import_hits;
          break;
        }
    }
    p.seqs.push_back(s);
  }

  // One step over a sequence: its uncomputed tokens written layer by layer,
  // then committed by the last write, or aborted after fewer layers.
  void step() {
    const size_t pi = any_pool();
    PoolState& p = pools[pi];
    if (p.seqs.empty()) return;
    Seq& s = p.seqs[r(p.seqs.size())];
    if (r(2)) {
      std::vector<int32_t> t(1 + r(2 * bs));
      for (auto& x : t) x = int32_t(r(3));
      const pkv_status st = pkv_seq_append(p.pool, s.id, t.data(), t.size(), 0);
      if (st == PKV_OK)
        s.tokens.insert(s.tokens.end(), t.begin(), t.end());
      else
        ASSERT_EQ(st, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
    }
    const pkv_seq_info in = info(p, s.id);
    const uint32_t q = uint32_t(in.num_tokens - in.num_computed_tokens);
    if (q == 0) return;
    pkv_batch* b = nullptr;
    const pkv_status st = pkv_batch_prepare(p.pool, &s.id, &q, 1, nullptr, &b);
    if (st != PKV_OK) {
      ASSERT_EQ(st, PKV_E_OUT_OF_BLOCKS) << pkv_last_error_message();
      return;
    }
    p.pending_dst.clear();  // the prepare ran every pending copy of the pool
    if (r(3) == 0) {        // written over later operations
      Plan pl;
      pl.b = b;
      for (uint32_t row = 0; row < q; ++row)
        pl.row_ident.push_back(provenance::ident(s.key, s.tokens, in.num_computed_tokens + row));
      trace += "plan pool " + std::to_string(pi) + " seq " + std::to_string(s.id) +
               " q=" + std::to_string(q) + " kept\n";
      p.plans.push_back(std::move(pl));
      return;
    }
    const uint32_t layers = r(4) ? kLayers : uint32_t(r(kLayers));
    trace += "step pool " + std::to_string(pi) + " seq " + std::to_string(s.id) +
             " q=" + std::to_string(q) + " layers " + std::to_string(layers) + "\n";
    for (uint32_t l = 0; l < layers; ++l) {
      std::vector<float> k(q * kHeadDim), v(q * kHeadDim);
      for (uint32_t row = 0; row < q; ++row) {
        const uint64_t id = provenance::ident(s.key, s.tokens, in.num_computed_tokens + row);
        for (uint32_t d = 0; d < kHeadDim; ++d) {
          k[row * kHeadDim + d] = elem(id, l, 0, d);
          v[row * kHeadDim + d] = elem(id, l, 1, d);
        }
      }
      const int64_t shape[3] = {int64_t(q), 1, kHeadDim};
      pkv_tensor kt, vt;
      ASSERT_EQ(pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &kt), PKV_OK);
      ASSERT_EQ(pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &vt), PKV_OK);
      ASSERT_EQ(pkv_cache_write(b, l, &kt, &vt, nullptr), PKV_OK) << pkv_last_error_message();
    }
    if (layers < kLayers && r(2)) pkv_batch_abort(b);
    pkv_batch_destroy(b);
  }

  // The next layer of a kept plan (refused once the plan went stale), or
  // its abort, or its end.
  void plan_op() {
    const size_t pi = any_pool();
    PoolState& p = pools[pi];
    if (p.plans.empty()) return;
    const size_t i = r(p.plans.size());
    Plan& pl = p.plans[i];
    const int what = int(r(6));
    if (what < 4 && pl.next_layer < kLayers) {
      const uint32_t l = pl.next_layer, q = uint32_t(pl.row_ident.size());
      std::vector<float> k(q * kHeadDim), v(q * kHeadDim);
      for (uint32_t row = 0; row < q; ++row)
        for (uint32_t d = 0; d < kHeadDim; ++d) {
          k[row * kHeadDim + d] = elem(pl.row_ident[row], l, 0, d);
          v[row * kHeadDim + d] = elem(pl.row_ident[row], l, 1, d);
        }
      const int64_t shape[3] = {int64_t(q), 1, kHeadDim};
      pkv_tensor kt, vt;
      ASSERT_EQ(pkv_tensor_init(k.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &kt), PKV_OK);
      ASSERT_EQ(pkv_tensor_init(v.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3, shape, &vt), PKV_OK);
      const pkv_status st = pkv_cache_write(pl.b, l, &kt, &vt, nullptr);
      trace += "plan " + std::to_string(i) + " of pool " + std::to_string(pi) + " layer " +
               std::to_string(l) + " -> " + std::to_string(st) + "\n";
      if (st == PKV_OK) {
        ++pl.next_layer;
        return;
      }
      ASSERT_EQ(st, PKV_E_INVALID_STATE) << pkv_last_error_message();
    } else if (what == 4) {
      trace += "plan " + std::to_string(i) + " of pool " + std::to_string(pi) + " abort -> " +
               std::to_string(pkv_batch_abort(pl.b)) + "\n";
    }
    trace += "plan " + std::to_string(i) + " of pool " + std::to_string(pi) + " destroyed\n";
    pkv_batch_destroy(pl.b);
    p.plans.erase(p.plans.begin() + i);
  }

  void fork_truncate_free() {
    const size_t pi = any_pool();
    PoolState& p = pools[pi];
    if (p.seqs.empty()) return;
    const size_t i = r(p.seqs.size());
    const int what = int(r(3));
    if (what == 0) {
      Seq c = p.seqs[i];
      const pkv_status st = pkv_seq_fork(p.pool, p.seqs[i].id, &c.id);
      trace += "fork pool " + std::to_string(pi) + " seq " + std::to_string(p.seqs[i].id) + " -> " +
               std::to_string(st) + "\n";
      ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
      c.imported = false;
      p.seqs.push_back(c);
    } else if (what == 1) {
      Seq& s = p.seqs[i];
      const uint64_t n = r(s.tokens.size() + 1);
      trace += "truncate pool " + std::to_string(pi) + " seq " + std::to_string(s.id) + " to " +
               std::to_string(n) + "\n";
      ASSERT_EQ(pkv_seq_truncate(p.pool, s.id, n), PKV_OK) << pkv_last_error_message();
      s.tokens.resize(n);
    } else {
      trace += "free pool " + std::to_string(pi) + " seq " + std::to_string(p.seqs[i].id) + "\n";
      ASSERT_EQ(pkv_seq_free(p.pool, p.seqs[i].id), PKV_OK) << pkv_last_error_message();
      p.last_table.erase(p.seqs[i].id);
      p.seqs.erase(p.seqs.begin() + i);
    }
  }

  void export_op() {
    const size_t pi = any_pool();
    PoolState& p = pools[pi];
    if (p.seqs.empty()) return;
    const Seq& s = p.seqs[r(p.seqs.size())];
    const pkv_seq_info in = info(p, s.id);
    Export x;
    x.pool = pi;
    x.key = s.key;
    x.tokens.assign(s.tokens.begin(), s.tokens.begin() + in.num_computed_tokens);
    const pkv_status st = pkv_transfer_export(p.eng, p.pool, s.id, &x.id);
    trace += "export pool " + std::to_string(pi) + " seq " + std::to_string(s.id) + " (" +
             std::to_string(in.num_computed_tokens) + " computed) -> " + std::to_string(st) + "\n";
    if (in.num_computed_tokens == 0) {
      ASSERT_EQ(st, PKV_E_INVALID_STATE) << pkv_last_error_message();
      return;
    }
    ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
    p.pending_dst.clear();  // the export ran the pool's pending copies
    uint64_t size = 0;
    pkv_transfer_export_descriptor(p.eng, x.id, nullptr, 0, &size);
    x.desc.resize(size);
    ASSERT_EQ(pkv_transfer_export_descriptor(p.eng, x.id, x.desc.data(), size, &size), PKV_OK);
    exports.push_back(std::move(x));
  }

  void import_op() {
    if (exports.empty()) return;
    const size_t ei = r(exports.size());
    const Export& x = exports[ei];
    if (x.id == 0) return;
    size_t pi = any_pool();
    if (pi == x.pool && r(4)) return;  // mostly into another pool
    PoolState& p = pools[pi];
    Xfer t;
    t.pool = pi;
    t.exp = ei;
    t.key = x.key;
    t.tokens = x.tokens;
    pkv_seq_options so;
    pkv_seq_options_init(&so);
    so.lora_id = x.key.lora;
    const std::string salt = "s" + std::to_string(x.key.salt);
    so.cache_salt = x.key.salt ? salt.c_str() : nullptr;
    const pkv_status st =
        pkv_transfer_import(p.eng, p.pool, &so, x.desc.data(), x.desc.size(), &t.t);
    trace += "import export " + std::to_string(ei) + " into pool " + std::to_string(pi) + " -> " +
             std::to_string(st) + "\n";
    if (st == PKV_E_OUT_OF_BLOCKS) return;
    ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
    p.pending_dst.clear();
    xfers.push_back(t);
  }

  void progress() {
    for (PoolState& p : pools) ASSERT_EQ(pkv_transfer_engine_progress(p.eng), PKV_OK);
  }

  // Polls transfer i once; true when it ended (and was taken off).
  bool poll(size_t i) {
    Xfer& x = xfers[i];
    uint32_t state = PKV_TRANSFER_RUNNING;
    pkv_seq_id seq = 0;
    const pkv_status st = pkv_transfer_poll(x.t, &state, &seq);
    if (state == PKV_TRANSFER_RUNNING) {
      EXPECT_EQ(st, PKV_OK) << pkv_last_error_message();
      return false;
    }
    trace += "transfer " + std::to_string(i) + " (export " + std::to_string(x.exp) + " into pool " +
             std::to_string(x.pool) + ") ends " + std::to_string(state) + " " +
             (st == PKV_OK ? "" : pkv_last_error_message()) + "\n";
    if (state == PKV_TRANSFER_DONE) {
      EXPECT_EQ(st, PKV_OK);
      PoolState& p = pools[x.pool];
      Seq s;
      s.id = seq;
      s.key = x.key;
      s.tokens = x.tokens;
      s.imported = true;
      const pkv_seq_info in = info(p, seq);
      EXPECT_EQ(in.num_tokens, s.tokens.size()) << trace;
      EXPECT_EQ(in.num_computed_tokens, s.tokens.size()) << trace;
      for (int32_t b : table(p, seq)) p.imported_blocks.insert(b);
      p.seqs.push_back(s);
      ++g_imports_done;
    } else {
      EXPECT_EQ(state, uint32_t(PKV_TRANSFER_FAILED)) << trace;
      EXPECT_NE(st, PKV_OK);
      EXPECT_NE(std::string(pkv_last_error_message()), "");
    }
    pkv_transfer_destroy(x.t);
    xfers.erase(xfers.begin() + i);
    return true;
  }

  void transfer_op() {
    progress();
    if (xfers.empty()) return;
    const size_t i = r(xfers.size());
    const int what = int(r(8));
    if (what == 0) {
      trace += "cancel transfer " + std::to_string(i) + "\n";
      const pkv_status st = pkv_transfer_cancel(xfers[i].t);
      if (st == PKV_E_INVALID_STATE) {  // done already: poll takes the sequence
        poll(i);
        return;
      }
      ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
      ASSERT_EQ(pkv_transfer_cancel(xfers[i].t), PKV_OK);  // twice: a no-op
      uint32_t state = 0;
      pkv_seq_id seq = 7;
      const pkv_status ps = pkv_transfer_poll(xfers[i].t, &state, &seq);
      if (state == PKV_TRANSFER_CANCELLED) {
        EXPECT_EQ(ps, PKV_OK);
        EXPECT_EQ(seq, 0u);
      } else {
        ASSERT_EQ(state, uint32_t(PKV_TRANSFER_FAILED)) << trace;
      }
      pkv_transfer_destroy(xfers[i].t);
      xfers.erase(xfers.begin() + i);
    } else if (what == 1) {
      trace += "destroy transfer " + std::to_string(i) + "\n";
      pkv_transfer_destroy(xfers[i].t);
      xfers.erase(xfers.begin() + i);
    } else {
      poll(i);
    }
  }

  // Releases an export no running import reads (releasing one still read
  // is the documented caller error of stale reads).
  void release_op() {
    if (exports.empty()) return;
    const size_t ei = r(exports.size());
    Export& x = exports[ei];
    if (x.id == 0) return;
    for (const Xfer& t : xfers)
      if (t.exp == ei) return;
    trace += "release export " + std::to_string(ei) + "\n";
    ASSERT_EQ(pkv_transfer_export_release(pools[x.pool].eng, x.id), PKV_OK)
        << pkv_last_error_message();
    ASSERT_EQ(pkv_transfer_export_release(pools[x.pool].eng, x.id), PKV_E_NOT_FOUND);
    x.id = 0;
  }

  // The exporting pool destroyed while imports of its unreleased exports run.
  void destroy_pool() {
    size_t alive = 0;
    for (size_t i = 0; i < pools.size(); ++i) alive += live(i);
    if (alive < 3) return;
    const size_t pi = any_pool();
    for (const Xfer& t : xfers)
      if (t.pool == pi) return;  // importers stay
    trace += "destroy pool " + std::to_string(pi) + "\n";
    for (Plan& pl : pools[pi].plans) pkv_batch_destroy(pl.b);
    pools[pi].plans.clear();
    pkv_pool_destroy(pools[pi].pool);
    pools[pi].pool = nullptr;
    pools[pi].seqs.clear();
  }

  void run(uint64_t steps) {
    create();
    if (::testing::Test::HasFatalFailure()) return;
    // PKV_XFER_MODEL_TRACE=1: each operation as it runs (for a crash).
    const bool live_trace = std::getenv("PKV_XFER_MODEL_TRACE") != nullptr;
    size_t printed = 0;
    for (uint64_t k = 0; k < steps; ++k) {
      const int op = int(r(22));
      if (op < 4)
        admit();
      else if (op < 8)
        step();
      else if (op < 10)
        fork_truncate_free();
      else if (op < 12)
        export_op();
      else if (op < 14)
        import_op();
      else if (op < 18)
        transfer_op();
      else if (op < 19)
        release_op();
      else if (op >= 20)
        plan_op();
      else if (r(10) == 0)
        destroy_pool();
      if (live_trace) {
        std::fputs(trace.c_str() + printed, stderr);
        printed = trace.size();
      }
      if (::testing::Test::HasFatalFailure()) return;
      check();
      if (::testing::Test::HasFatalFailure()) return;
    }
    // Finish every transfer, release every export: nothing stays held.
    for (int spins = 0; !xfers.empty() && spins < 2000000; ++spins) {
      progress();
      if (::testing::Test::HasFatalFailure()) return;
      poll(0);
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_TRUE(xfers.empty()) << trace << "transfers never ended";
    for (PoolState& p : pools) {
      for (Plan& pl : p.plans) pkv_batch_destroy(pl.b);
      p.plans.clear();
    }
    for (Export& x : exports)
      if (x.id) {
        ASSERT_EQ(pkv_transfer_export_release(pools[x.pool].eng, x.id), PKV_OK)
            << pkv_last_error_message();
        x.id = 0;
      }
    check(true);
  }
};

uint64_t env(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : dflt;
}

TEST(TransferProvenance, ImportsHoldExactlyTheExportersCommittedKV) {
  if (!pkv_transfer_available()) GTEST_SKIP() << "built without UCX";
  const uint64_t one = env("PKV_XFER_MODEL_SEED", 0);
  const uint64_t n = one ? 1 : env("PKV_XFER_MODEL_SEEDS", kSeeds);
  const uint64_t steps = env("PKV_XFER_MODEL_STEPS", 300);
  for (auto& e : g_engines) {
    pkv_transfer_options to;
    pkv_transfer_options_init(&to);
    to.transports = "tcp";
    to.timeout_ms = 60000;
    ASSERT_EQ(pkv_transfer_engine_create(&to, &e), PKV_OK) << pkv_last_error_message();
  }
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t seed = one ? one : i + 1;
    Model m(seed);
    m.run(steps);
    ASSERT_FALSE(::testing::Test::HasFailure()) << "seed " << seed;
  }
  for (int i = 0; i < 200; ++i)
    for (auto& e : g_engines) pkv_transfer_engine_progress(e);
  for (auto& e : g_engines) pkv_transfer_engine_destroy(e);
  std::printf("imports done %llu, prefix hits on imported blocks %llu\n",
              (unsigned long long)g_imports_done, (unsigned long long)g_import_hits);
  if (n > 5) EXPECT_GT(g_imports_done, 0u);
}

}  // namespace
