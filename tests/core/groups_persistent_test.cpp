// Persistent page tables of multi-group plans (pkv_batch_prepare_ex with
// PKV_PREPARE_PERSISTENT_TABLE on a pool from pkv_pool_create_groups):
// random workloads (appends, prefix hits, forks, truncates, frees, aborts,
// plans kept alive across the next prepare, sequences in a new order each
// step, CSR plans in between) whose every persistent plan is compared,
// element by element, with the CSR table built from scratch from the
// sequences' per-group block tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kBs = 4;

pkv_kv_group_spec spec(uint32_t kind, uint32_t window = 0) {
  pkv_kv_group_spec g;
  pkv_kv_group_spec_init(&g);
  g.kind = kind;
  g.num_kv_heads = 2;
  g.head_dim = 8;
  g.sliding_window = window;
  if (kind == PKV_GROUP_MLA) g.kv_lora_rank = 16, g.rope_dim = 4;
  if (kind == PKV_GROUP_RECURRENT) g.state_bytes = 64;
  return g;
}

std::vector<int32_t> table(pkv_pool* p, pkv_seq_id s, uint32_t g) {
  uint64_t n = 0;
  pkv_seq_group_block_table(p, s, g, nullptr, 0, &n);
  std::vector<int32_t> t(n);
  EXPECT_EQ(pkv_seq_group_block_table(p, s, g, t.data(), n, &n), PKV_OK);
  return t;
}

template <typename T>
const T* array(const pkv_batch* b, uint32_t g, uint32_t which, int64_t* len) {
  pkv_tensor t;
  EXPECT_EQ(pkv_batch_plan_tensor_group(b, g, which, &t), PKV_OK) << pkv_last_error_message();
  *len = t.shape[0];
  return reinterpret_cast<const T*>(static_cast<const char*>(t.data) + t.byte_offset);
}

struct Seq {
  pkv_seq_id id;
  uint32_t family;
  uint64_t n = 0, computed = 0;
};

// Checks a plan over seqs (query counts qs) against the tables read now.
void check_plan(pkv_pool* p, const pkv_batch* b, const std::vector<uint32_t>& kinds,
                const std::vector<Seq*>& seqs, const std::vector<uint32_t>& qs, bool persistent) {
  const size_t m = seqs.size();
  for (uint32_t g = 0; g < kinds.size(); ++g) {
    const bool rec = kinds[g] == PKV_GROUP_RECURRENT;
    int64_t n_ptr, n_idx, n_last, n_slots;
    const int32_t* ptr = array<int32_t>(b, g, PKV_PLAN_PAGE_INDPTR, &n_ptr);
    const int32_t* idx = array<int32_t>(b, g, PKV_PLAN_PAGE_INDICES, &n_idx);
    const int32_t* last = array<int32_t>(b, g, PKV_PLAN_LAST_PAGE_LEN, &n_last);
    const int64_t* slots = array<int64_t>(b, g, PKV_PLAN_SLOT_MAPPING, &n_slots);
    ASSERT_EQ(n_ptr, int64_t(m + 1));
    ASSERT_EQ(n_last, int64_t(m));
    const int64_t stride = persistent ? ptr[1] : 0;
    if (persistent) {
      ASSERT_GE(stride, 1);
      ASSERT_EQ(n_idx, int64_t(m) * stride) << "group " << g;
      if (rec) EXPECT_EQ(stride, 1) << "a recurrent group's rows are one page";
    }
    int64_t row = 0;
    for (size_t i = 0; i < m; ++i) {
      const std::vector<int32_t> t = table(p, seqs[i]->id, g);
      const uint64_t n = seqs[i]->n;
      std::vector<int32_t> csr;  // from scratch
      if (rec)
        csr = {t.at(0)};
      else
        csr.assign(t.begin(), t.begin() + int64_t((n + kBs - 1) / kBs));
      if (persistent) {
        ASSERT_EQ(ptr[i], int64_t(i) * stride);
        ASSERT_LE(int64_t(csr.size()), stride);
        for (int64_t j = 0; j < stride; ++j)
          ASSERT_EQ(idx[int64_t(i) * stride + j], j < int64_t(csr.size()) ? csr[size_t(j)] : 0)
              << "group " << g << " row " << i << " page " << j;
      } else {
        ASSERT_EQ(ptr[i + 1] - ptr[i], int32_t(csr.size()));
        for (size_t j = 0; j < csr.size(); ++j) ASSERT_EQ(idx[ptr[i] + int64_t(j)], csr[j]);
      }
      if (rec) {
        ASSERT_EQ(last[i], 1);
        ASSERT_EQ(slots[i], t[0]);
        continue;
      }
      ASSERT_EQ(uint64_t(last[i]), n - (csr.size() - 1) * kBs);
      for (uint64_t pos = n - qs[i]; pos < n; ++pos, ++row)
        ASSERT_EQ(slots[row], int64_t(t[pos / kBs]) * kBs + int64_t(pos % kBs));
    }
    if (persistent && g == 0) {
      pkv_batch_info info;
      pkv_batch_info_init(&info);
      ASSERT_EQ(pkv_batch_get_info(b, &info), PKV_OK);
      EXPECT_EQ(int64_t(info.num_pages), int64_t(m) * stride);
    }
  }
}

void take_copies(pkv_pool* p, uint32_t groups) {
  for (uint32_t g = 0; g < groups; ++g) {
    std::vector<int32_t> src(256), dst(256);
    uint64_t n = 0;
    ASSERT_EQ(pkv_pool_group_take_copies(p, g, src.data(), dst.data(), 256, &n), PKV_OK);
  }
}

void run(const std::vector<pkv_kv_group_spec>& groups, uint32_t seed) {
  std::vector<uint32_t> kinds;
  bool has_rec = false;
  for (const auto& g : groups) {
    kinds.push_back(g.kind);
    has_rec = has_rec || g.kind == PKV_GROUP_RECURRENT;
  }
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 200;
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create_groups(&o, groups.data(), uint32_t(groups.size()), &p), PKV_OK)
      << pkv_last_error_message();
  const uint32_t G = uint32_t(groups.size());
  {
    // The pool's first plan: from here on only committed plans compute.
    pkv_seq_id w = 0;
    const int32_t t = 1;
    const uint32_t q = 1;
    pkv_batch* b = nullptr;
    ASSERT_EQ(pkv_seq_create(p, nullptr, &w), PKV_OK);
    ASSERT_EQ(pkv_seq_append(p, w, &t, 1, 0), PKV_OK);
    ASSERT_EQ(pkv_batch_prepare(p, &w, &q, 1, nullptr, &b), PKV_OK) << pkv_last_error_message();
    pkv_batch_destroy(b);
    ASSERT_EQ(pkv_seq_free(p, w), PKV_OK);
    take_copies(p, G);
  }
  std::mt19937 rng(seed);
  auto tok = [](uint32_t f, uint64_t pos) { return int32_t((f * 7919 + pos * 31) % 1000 + 1); };
  std::vector<Seq> seqs;
  pkv_batch* held = nullptr;  // a plan kept alive across the next prepare
  uint64_t persistent_plans = 0, elements = 0;
  for (int step = 0; step < 400; ++step) {
    const uint32_t op = rng() % 10;
    if ((op < 2 && seqs.size() < 7) || seqs.empty()) {
      Seq s;
      ASSERT_EQ(pkv_seq_create(p, nullptr, &s.id), PKV_OK);
      s.family = rng() % 2;
      std::vector<int32_t> prompt(8 + rng() % 24);
      for (size_t k = 0; k < prompt.size(); ++k) prompt[k] = tok(s.family, k);
      uint64_t cached = 0;
      ASSERT_EQ(pkv_seq_match_prefix(p, s.id, prompt.data(), prompt.size(), &cached), PKV_OK);
      s.n = s.computed = cached;
      if (pkv_seq_append(p, s.id, prompt.data() + cached, prompt.size() - cached, 0) == PKV_OK)
        s.n = prompt.size();
      seqs.push_back(s);
      continue;
    }
    Seq& s = seqs[rng() % seqs.size()];
    if (op == 2 && seqs.size() < 7) {
      Seq c = s;
      ASSERT_EQ(pkv_seq_fork(p, s.id, &c.id), PKV_OK);
      seqs.push_back(c);
    } else if (op == 3 && !has_rec && s.n > 2) {
      const uint64_t n = s.n - 1 - rng() % std::min<uint64_t>(s.n - 1, 6);
      if (pkv_seq_truncate(p, s.id, n) == PKV_OK) {
        s.n = n;
        s.computed = std::min(s.computed, n);
      }
    } else if (op == 4 && seqs.size() > 2) {
      ASSERT_EQ(pkv_seq_free(p, s.id), PKV_OK);
      seqs.erase(seqs.begin() + (&s - seqs.data()));
    } else {
      // Every sequence gets tokens (decode mostly), then a step over a
      // random subset in a random order.
      // op 5 appends only: a fork before the next step then shares a
      // state slot that the step's prepare moves to a copy.
      for (Seq& x : seqs) {
        if (rng() % 2 == 0) continue;
        const uint64_t k = rng() % 4 == 0 ? 1 + rng() % 6 : 1;
        std::vector<int32_t> t(k);
        for (uint64_t j = 0; j < k; ++j) t[j] = tok(x.family, x.n + j);
        if (pkv_seq_append(p, x.id, t.data(), k, 0) == PKV_OK) x.n += k;
      }
      if (op == 5) continue;
      std::vector<Seq*> in;
      for (Seq& x : seqs) {
        // Where to start is the pool's business (appends before its first
        // plan count as computed): the test checks tables, not that.
        pkv_seq_info info;
        pkv_seq_info_init(&info);
        ASSERT_EQ(pkv_seq_get_info(p, x.id, &info), PKV_OK);
        x.computed = info.num_computed_tokens;
        if (x.n > x.computed && rng() % 5 != 0) in.push_back(&x);
      }
      if (in.empty()) continue;
      if (rng() % 3 == 0) std::shuffle(in.begin(), in.end(), rng);
      std::vector<pkv_seq_id> ids;
      std::vector<uint32_t> qs;
      for (Seq* x : in) {
        ids.push_back(x->id);
        qs.push_back(uint32_t(x->n - x->computed));
      }
      const bool persistent = rng() % 4 != 0;
      pkv_batch* b = nullptr;
      const pkv_status st =
          pkv_batch_prepare_ex(p, ids.data(), qs.data(), uint32_t(ids.size()),
                               persistent ? PKV_PREPARE_PERSISTENT_TABLE : 0, nullptr, &b);
      // A state move found no free block; a fork child or failed append has no
      // state slot yet.
      if (st == PKV_E_OUT_OF_BLOCKS || st == PKV_E_INVALID_STATE) continue;
      ASSERT_EQ(st, PKV_OK) << pkv_last_error_message();
      take_copies(p, G);
      check_plan(p, b, kinds, in, qs, persistent);
      if (::testing::Test::HasFatalFailure()) return;
      if (persistent) ++persistent_plans;
      for (size_t i = 0; i < in.size(); ++i) elements += in[i]->n;
      const bool aborted = rng() % 8 == 0;
      if (aborted)
        ASSERT_EQ(pkv_batch_abort(b), PKV_OK);
      else
        ASSERT_EQ(pkv_batch_commit(b), PKV_OK);
      if (!aborted)
        for (Seq* x : in) x->computed = x->n;
      if (held) pkv_batch_destroy(held);
      held = nullptr;
      if (rng() % 4 == 0)
        held = b;  // the next persistent plan must not write into this one's table
      else
        pkv_batch_destroy(b);
    }
    ASSERT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  }
  if (held) pkv_batch_destroy(held);
  EXPECT_GT(persistent_plans, 50u);
  EXPECT_GT(elements, 1000u);
  pkv_pool_destroy(p);
}

TEST(GroupPersistentTable, FullWindowMla) {
  for (uint32_t seed = 1; seed <= 4; ++seed)
    run({spec(PKV_GROUP_FULL), spec(PKV_GROUP_SLIDING_WINDOW, 6), spec(PKV_GROUP_MLA)}, seed);
}

TEST(GroupPersistentTable, WindowRecurrentFull) {
  for (uint32_t seed = 1; seed <= 4; ++seed)
    run({spec(PKV_GROUP_SLIDING_WINDOW, 3), spec(PKV_GROUP_RECURRENT), spec(PKV_GROUP_FULL)}, seed);
}

TEST(GroupPersistentTable, UnknownFlagIsRefused) {
  const std::vector<pkv_kv_group_spec> groups = {spec(PKV_GROUP_FULL)};
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 8;
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create_groups(&o, groups.data(), 1, &p), PKV_OK);
  pkv_seq_id s = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
  const int32_t t[3] = {4, 5, 6};
  ASSERT_EQ(pkv_seq_append(p, s, t, 3, 0), PKV_OK);
  const uint32_t q = 3;
  pkv_batch* b = nullptr;
  EXPECT_EQ(pkv_batch_prepare_ex(p, &s, &q, 1, 0x10u, nullptr, &b), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(b, nullptr);
  pkv_pool_destroy(p);
}

}  // namespace
