// MLA pools (kv_layout PKV_KV_LAYOUT_MLA) end to end through libpagedkv.so:
// the latent page layout and its accounting, pkv_mla_cache_write committing
// a step like pkv_cache_write, prefix hits on latent blocks, and
// pkv_mla_attention over prefill, chunked prefill and decode steps against
// a float64 reference over the latents the test wrote (random, never zero).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

constexpr uint32_t kLayers = 2, kRank = 64, kRope = 16, kD = kRank + kRope, kHeads = 16;
constexpr uint32_t kBs = 4;
constexpr float kScale = 0.11f;

pkv_pool_options mla_options(uint32_t dtype) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 40;
  o.num_layers = kLayers;
  o.dtype = dtype;
  o.num_threads = 2;
  o.kv_layout = PKV_KV_LAYOUT_MLA;
  o.kv_lora_rank = kRank;
  o.qk_rope_head_dim = kRope;
  return o;
}

pkv_tensor tensor(std::vector<float>& buf, std::initializer_list<int64_t> shape) {
  pkv_tensor t;
  EXPECT_EQ(pkv_tensor_init(buf.data(), PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, int32_t(shape.size()),
                            shape.begin(), &t),
            PKV_OK);
  return t;
}

TEST(Mla, LayoutAndAccounting) {
  pkv_pool_options o = mla_options(PKV_DTYPE_BF16);
  o.num_layers = 61;  // DeepSeek-V3: 61 layers of 512 + 64
  o.kv_lora_rank = 512;
  o.qk_rope_head_dim = 64;
  o.block_size = 64;
  o.num_blocks = 3;
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  uint64_t bpb = 0;
  ASSERT_EQ(pkv_pool_bytes_per_block(p, &bpb), PKV_OK);
  EXPECT_EQ(bpb, 61u * 64u * 576u * 2u);  // 70,272 bytes per token
  pkv_pool_options got;
  pkv_pool_options_init(&got);
  ASSERT_EQ(pkv_pool_get_options(p, &got), PKV_OK);
  EXPECT_EQ(got.kv_layout, uint32_t(PKV_KV_LAYOUT_MLA));
  EXPECT_EQ(got.kv_lora_rank, 512u);
  EXPECT_EQ(got.qk_rope_head_dim, 64u);
  EXPECT_EQ(got.num_kv_heads, 1u);
  EXPECT_EQ(got.head_dim, 576u);
  pkv_tensor t;
  ASSERT_EQ(pkv_pool_kv_tensor(p, 60, PKV_KV_KEY, &t), PKV_OK);
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.shape[0], 3);
  EXPECT_EQ(t.shape[1], 64);
  EXPECT_EQ(t.shape[2], 576);
  EXPECT_EQ(t.strides[0], 64 * 576);
  pkv_tensor t0;
  ASSERT_EQ(pkv_pool_kv_tensor(p, 59, PKV_KV_KEY, &t0), PKV_OK);
  // One plane per layer, adjacent: no V plane between layers.
  EXPECT_EQ(static_cast<char*>(t.data) - static_cast<char*>(t0.data), 3 * 64 * 576 * 2);
  EXPECT_EQ(pkv_pool_kv_tensor(p, 0, PKV_KV_VALUE, &t), PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("no V"), std::string::npos);
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  ASSERT_EQ(pkv_pool_get_stats(p, &st), PKV_OK);
  EXPECT_EQ(st.kv_bytes_per_block, bpb);
  EXPECT_EQ(st.kv_bytes_allocated, 3 * bpb);
  pkv_pool_destroy(p);

  // The budget buys blocks of the latent size.
  o.num_blocks = 0;
  o.memory_budget_bytes = 7 * bpb + bpb / 2;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  ASSERT_EQ(pkv_pool_get_options(p, &got), PKV_OK);
  EXPECT_EQ(got.num_blocks, 7u);
  pkv_pool_destroy(p);
}

TEST(Mla, BadOptionsNameTheField) {
  struct Bad {
    void (*edit)(pkv_pool_options*);
    const char* field;
  };
  const Bad bad[] = {
      {[](pkv_pool_options* o) { o->kv_layout = 2; }, "kv_layout"},
      {[](pkv_pool_options* o) { o->kv_lora_rank = 0; }, "kv_lora_rank"},
      {[](pkv_pool_options* o) { o->kv_lora_rank = 5000; }, "kv_lora_rank"},
      {[](pkv_pool_options* o) { o->qk_rope_head_dim = 2000; }, "qk_rope_head_dim"},
      {[](pkv_pool_options* o) { o->num_kv_heads = 2; }, "num_kv_heads"},
      {[](pkv_pool_options* o) { o->head_dim = 64; }, "head_dim"},
      {[](pkv_pool_options* o) { o->dtype = PKV_DTYPE_FP8_E4M3; }, "dtype"},
      {[](pkv_pool_options* o) { o->num_layers = 0; }, "kv_layout"},
      {[](pkv_pool_options* o) { o->kv_layout = PKV_KV_LAYOUT_MHA; }, "kv_lora_rank"},
  };
  for (const Bad& b : bad) {
    pkv_pool_options o = mla_options(PKV_DTYPE_F32);
    b.edit(&o);
    pkv_pool* p = nullptr;
    EXPECT_EQ(pkv_pool_create(&o, &p), PKV_E_INVALID_ARGUMENT) << b.field;
    EXPECT_EQ(p, nullptr);
    EXPECT_NE(std::string(pkv_last_error_message()).find(std::string("opts->") + b.field),
              std::string::npos)
        << pkv_last_error_message();
  }
  // head_dim and num_kv_heads may be given when they agree.
  pkv_pool_options o = mla_options(PKV_DTYPE_F32);
  o.num_kv_heads = 1;
  o.head_dim = kD;
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(p);
}

// The model side: every token's latent row per layer, and a float64
// reference of absorbed attention over a sequence's rows.
struct Model {
  std::mt19937 rng{42};
  std::uniform_real_distribution<float> u{-1.0f, 1.0f};
  float value() {
    float x = 0;
    while (std::fabs(x) < 1e-3f) x = u(rng);
    return x;
  }
};

struct SeqRows {
  std::vector<float> rows[kLayers];  // [pos * kD]
};

void reference(const SeqRows& s, uint32_t layer, uint32_t pos, const float* ql, const float* qp,
               double* out, double* lse) {
  const std::vector<float>& r = s.rows[layer];
  std::vector<double> x(pos + 1);
  double mx = -INFINITY;
  for (uint32_t k = 0; k <= pos; ++k) {
    double d = 0;
    for (uint32_t i = 0; i < kRank; ++i) d += double(ql[i]) * r[k * kD + i];
    for (uint32_t i = 0; i < kRope; ++i) d += double(qp[i]) * r[k * kD + kRank + i];
    x[k] = double(kScale) * d;
    mx = std::max(mx, x[k]);
  }
  double sum = 0;
  for (double& v : x) sum += (v = std::exp(v - mx));
  for (uint32_t i = 0; i < kRank; ++i) out[i] = 0;
  for (uint32_t k = 0; k <= pos; ++k)
    for (uint32_t i = 0; i < kRank; ++i) out[i] += x[k] / sum * r[k * kD + i];
  *lse = mx + std::log(sum);
}

// One step: appends were made; writes every layer's latents for the query
// tokens (recording them in rows), attends, and checks every element.
void run_step(pkv_pool* pool, Model& m, const std::vector<pkv_seq_id>& seqs,
              const std::vector<uint32_t>& nq, std::vector<SeqRows*> rows,
              uint32_t layers_to_write) {
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(pool, seqs.data(), nq.data(), uint32_t(seqs.size()), nullptr, &b),
            PKV_OK)
      << pkv_last_error_message();
  pkv_batch_info info;
  pkv_batch_info_init(&info);
  ASSERT_EQ(pkv_batch_get_info(b, &info), PKV_OK);
  const int64_t n = int64_t(info.num_tokens);
  std::vector<uint32_t> len(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    pkv_seq_info si;
    pkv_seq_info_init(&si);
    ASSERT_EQ(pkv_seq_get_info(pool, seqs[s], &si), PKV_OK);
    len[s] = uint32_t(si.num_tokens);
  }
  for (uint32_t layer = 0; layer < layers_to_write; ++layer) {
    std::vector<float> kv_c(size_t(n) * kRank), k_pe(size_t(n) * kRope);
    int64_t t = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      rows[s]->rows[layer].resize(size_t(len[s]) * kD);
      for (uint32_t i = 0; i < nq[s]; ++i, ++t) {
        const uint32_t pos = len[s] - nq[s] + i;
        for (uint32_t d = 0; d < kD; ++d) {
          const float x = m.value();
          rows[s]->rows[layer][size_t(pos) * kD + d] = x;
          (d < kRank ? kv_c[size_t(t) * kRank + d] : k_pe[size_t(t) * kRope + d - kRank]) = x;
        }
      }
    }
    pkv_tensor tc = tensor(kv_c, {n, kRank}), tp = tensor(k_pe, {n, 1, kRope});
    ASSERT_EQ(pkv_mla_cache_write(b, layer, &tc, &tp, nullptr), PKV_OK) << pkv_last_error_message();

    std::vector<float> ql(size_t(n) * kHeads * kRank), qp(size_t(n) * kHeads * kRope);
    for (float& x : ql) x = m.value();
    for (float& x : qp) x = m.value();
    std::vector<float> out(size_t(n) * kHeads * kRank, NAN), lse(size_t(n) * kHeads, NAN);
    pkv_tensor tql = tensor(ql, {n, kHeads, kRank}), tqp = tensor(qp, {n, kHeads, kRope});
    pkv_tensor to = tensor(out, {n, kHeads, kRank}), tl = tensor(lse, {n, kHeads});
    pkv_attention_params ap;
    pkv_attention_params_init(&ap);
    ap.softmax_scale = kScale;
    ASSERT_EQ(pkv_mla_attention(b, layer, &tql, &tqp, &to, &tl, &ap, nullptr), PKV_OK)
        << pkv_last_error_message();
    t = 0;
    std::vector<double> ref(kRank);
    for (size_t s = 0; s < seqs.size(); ++s)
      for (uint32_t i = 0; i < nq[s]; ++i, ++t)
        for (uint32_t h = 0; h < kHeads; ++h) {
          double rl = 0;
          const size_t row = size_t(t) * kHeads + h;
          reference(*rows[s], layer, len[s] - nq[s] + i, &ql[row * kRank], &qp[row * kRope],
                    ref.data(), &rl);
          for (uint32_t d = 0; d < kRank; ++d)
            ASSERT_NEAR(out[row * kRank + d], ref[d], 2e-5 + 1e-4 * std::fabs(ref[d]))
                << "seq " << s << " query " << i << " head " << h << " dim " << d;
          ASSERT_NEAR(lse[row], rl, 1e-4 + 1e-5 * std::fabs(rl));
        }
  }
  pkv_batch_destroy(b);
}

uint64_t computed(pkv_pool* p, pkv_seq_id s) {
  pkv_seq_info si;
  pkv_seq_info_init(&si);
  EXPECT_EQ(pkv_seq_get_info(p, s, &si), PKV_OK);
  return si.num_computed_tokens;
}

TEST(Mla, StepsMatchFloat64AndCommit) {
  pkv_pool_options o = mla_options(PKV_DTYPE_F32);
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  Model m;
  std::vector<int32_t> prompt_a(10), prompt_b(7);
  for (int32_t i = 0; i < 10; ++i) prompt_a[size_t(i)] = 100 + i;
  for (int32_t i = 0; i < 7; ++i) prompt_b[size_t(i)] = 500 + i;
  pkv_seq_id a = 0, b = 0, c = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  ASSERT_EQ(pkv_seq_create(p, nullptr, &b), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, a, prompt_a.data(), 10, 0), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, b, prompt_b.data(), 4, 0), PKV_OK);
  SeqRows ra, rb, rc;
  // Step 1: prefill of a, first chunk of b. Only layer 0 written: nothing
  // counts as computed yet.
  run_step(p, m, {a, b}, {10, 4}, {&ra, &rb}, 1);
  EXPECT_EQ(computed(p, a), 0u);
  // Step 1 again, every layer: the last MLA write commits it.
  run_step(p, m, {a, b}, {10, 4}, {&ra, &rb}, kLayers);
  EXPECT_EQ(computed(p, a), 10u);
  EXPECT_EQ(computed(p, b), 4u);

  // A new request sharing a's first 8 tokens hits a's two written blocks.
  ASSERT_EQ(pkv_seq_create(p, nullptr, &c), PKV_OK);
  std::vector<int32_t> prompt_c(prompt_a.begin(), prompt_a.begin() + 8);
  prompt_c.push_back(900);
  prompt_c.push_back(901);
  uint64_t cached = 0;
  ASSERT_EQ(pkv_seq_match_prefix(p, c, prompt_c.data(), prompt_c.size(), &cached), PKV_OK);
  EXPECT_EQ(cached, 8u);
  for (uint32_t l = 0; l < kLayers; ++l)
    rc.rows[l].assign(ra.rows[l].begin(), ra.rows[l].begin() + 8 * kD);
  ASSERT_EQ(pkv_seq_append(p, c, prompt_c.data() + 8, 2, 0), PKV_OK);

  // Step 2: a decodes, b's chunked prefill continues over its cached
  // chunk, c prefills its suffix over the shared blocks.
  const int32_t tok = 7;
  ASSERT_EQ(pkv_seq_append(p, a, &tok, 1, 0), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, b, prompt_b.data() + 4, 3, 0), PKV_OK);
  run_step(p, m, {a, b, c}, {1, 3, 2}, {&ra, &rb, &rc}, kLayers);
  EXPECT_EQ(computed(p, c), 10u);
  // Step 3: decode of all three.
  for (pkv_seq_id s : {a, b, c}) ASSERT_EQ(pkv_seq_append(p, s, &tok, 1, 0), PKV_OK);
  run_step(p, m, {c, a, b}, {1, 1, 1}, {&rc, &ra, &rb}, kLayers);
  ASSERT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();

  // The stored latent of a's token 3 in layer 1 is the row written.
  int32_t table[8];
  uint64_t tlen = 0;
  ASSERT_EQ(pkv_seq_get_block_table(p, a, table, 8, &tlen), PKV_OK);
  pkv_tensor kv;
  ASSERT_EQ(pkv_pool_kv_tensor(p, 1, PKV_KV_KEY, &kv), PKV_OK);
  const float* stored = static_cast<const float*>(kv.data) + (table[0] * kBs + 3) * kD;
  for (uint32_t d = 0; d < kD; ++d) ASSERT_EQ(stored[d], ra.rows[1][3 * kD + d]);

  // Swap-out lays a block out as [layers][block_size][rank + rope].
  std::vector<float> host(kLayers * kBs * kD);
  ASSERT_EQ(pkv_pool_swap_blocks(p, table, 1, host.data(), host.size() * 4, PKV_SWAP_OUT, nullptr),
            PKV_OK)
      << pkv_last_error_message();
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t i = 0; i < kBs * kD; ++i)
      ASSERT_EQ(host[l * kBs * kD + i], ra.rows[l][i]) << "layer " << l << " element " << i;
  pkv_pool_destroy(p);
}

// Fork, then a write into the shared partial block: the copy-on-write
// copies the latent plane of every layer (one plane per layer, not K and V),
// so the child's attention over its prefix matches the parent's latents.
TEST(Mla, ForkCopiesLatentsOfEveryLayer) {
  pkv_pool_options o = mla_options(PKV_DTYPE_F32);
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  Model m;
  pkv_seq_id a = 0, b = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &a), PKV_OK);
  const int32_t toks[7] = {5, 6, 7, 8, 9, 10, 11};
  ASSERT_EQ(pkv_seq_append(p, a, toks, 6, 0), PKV_OK);  // the second block is partial
  SeqRows ra, rb;
  run_step(p, m, {a}, {6}, {&ra}, kLayers);
  ASSERT_EQ(pkv_seq_fork(p, a, &b), PKV_OK);
  rb = ra;
  ASSERT_EQ(pkv_seq_append(p, b, toks + 6, 1, 0), PKV_OK);  // copy-on-write of block 1
  ASSERT_EQ(pkv_seq_append(p, a, toks + 6, 1, 0), PKV_OK);
  run_step(p, m, {b, a}, {1, 1}, {&rb, &ra}, kLayers);
  int32_t ta[2], tb[2];
  uint64_t n = 0;
  ASSERT_EQ(pkv_seq_get_block_table(p, a, ta, 2, &n), PKV_OK);
  ASSERT_EQ(pkv_seq_get_block_table(p, b, tb, 2, &n), PKV_OK);
  EXPECT_EQ(ta[0], tb[0]);
  EXPECT_NE(ta[1], tb[1]);
  pkv_pool_stats st;
  pkv_pool_stats_init(&st);
  ASSERT_EQ(pkv_pool_get_stats(p, &st), PKV_OK);
  EXPECT_EQ(st.num_cow_copies, 1u);
  ASSERT_EQ(pkv_pool_validate(p), PKV_OK) << pkv_last_error_message();
  pkv_pool_destroy(p);
}

TEST(Mla, WrongCallsChangeNothing) {
  pkv_pool_options o = mla_options(PKV_DTYPE_F32);
  pkv_pool* p = nullptr;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  pkv_seq_id s = 0;
  ASSERT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
  const int32_t toks[3] = {1, 2, 3};
  ASSERT_EQ(pkv_seq_append(p, s, toks, 3, 0), PKV_OK);
  const uint32_t nq = 3;
  pkv_batch* b = nullptr;
  ASSERT_EQ(pkv_batch_prepare(p, &s, &nq, 1, nullptr, &b), PKV_OK);
  std::vector<float> c(3 * kRank, 0.5f), pe(3 * kRope, 0.5f), q(3 * kHeads * kRank, 0.5f),
      qp(3 * kHeads * kRope, 0.5f), out(3 * kHeads * kRank), wide(3 * kD, 0.5f);
  pkv_tensor tc = tensor(c, {3, kRank}), tp = tensor(pe, {3, kRope});
  pkv_tensor tq = tensor(q, {3, kHeads, kRank}), tqp = tensor(qp, {3, kHeads, kRope});
  pkv_tensor to = tensor(out, {3, kHeads, kRank});
  pkv_attention_params ap;
  pkv_attention_params_init(&ap);
  ap.softmax_scale = 0.1f;

  // MHA calls on an MLA pool.
  EXPECT_EQ(pkv_cache_write(b, 0, &tc, &tc, nullptr), PKV_E_INVALID_STATE);
  EXPECT_NE(std::string(pkv_last_error_message()).find("pkv_mla_cache_write"), std::string::npos);
  EXPECT_EQ(pkv_attention_forward(b, 0, &tq, &to, nullptr, nullptr, nullptr), PKV_E_INVALID_STATE);
  // Bad arguments.
  pkv_tensor twide = tensor(wide, {3, kD});
  EXPECT_EQ(pkv_mla_cache_write(b, 0, &twide, &tp, nullptr), PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("kv_c"), std::string::npos);
  EXPECT_EQ(pkv_mla_cache_write(b, 0, &tc, nullptr, nullptr), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_mla_cache_write(b, kLayers, &tc, &tp, nullptr), PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_mla_attention(b, 0, &tq, &tqp, &to, nullptr, nullptr, nullptr),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("params"), std::string::npos);
  pkv_attention_params zero = ap;
  zero.softmax_scale = 0;
  EXPECT_EQ(pkv_mla_attention(b, 0, &tq, &tqp, &to, nullptr, &zero, nullptr),
            PKV_E_INVALID_ARGUMENT);
  pkv_attention_params cap = ap;
  cap.logit_softcap = 30;
  EXPECT_EQ(pkv_mla_attention(b, 0, &tq, &tqp, &to, nullptr, &cap, nullptr), PKV_E_UNSUPPORTED);
  pkv_tensor tq_short = tensor(q, {3, kHeads, kRank - 1});
  EXPECT_EQ(pkv_mla_attention(b, 0, &tq_short, &tqp, &to, nullptr, &ap, nullptr),
            PKV_E_INVALID_ARGUMENT);
  pkv_tensor tqp_heads = tensor(qp, {3, kHeads / 2, kRope * 2});
  EXPECT_EQ(pkv_mla_attention(b, 0, &tq, &tqp_heads, &to, nullptr, &ap, nullptr),
            PKV_E_INVALID_ARGUMENT);
  EXPECT_EQ(pkv_mla_attention(b, 0, &tq, &tqp, &tq, nullptr, &ap, nullptr),
            PKV_E_INVALID_ARGUMENT);  // out overlaps q_latent
  // A 2-D kv_c whose shape and strides are huge: refused by its shape
  // (its middle stride was once computed as shape[1] * strides[1] before
  // the shape was checked: a signed overflow, UBSan's abort).
  pkv_tensor thuge = tc;
  thuge.shape[1] = int64_t(1) << 40;
  thuge.strides[0] = 1;
  thuge.strides[1] = int64_t(1) << 40;
  EXPECT_EQ(pkv_mla_cache_write(b, 0, &thuge, &tp, nullptr), PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("kv_c has shape"), std::string::npos);
  pkv_tensor tpe_huge = tp;
  tpe_huge.shape[1] = INT64_MAX;
  tpe_huge.strides[0] = 1;
  tpe_huge.strides[1] = 2;
  EXPECT_EQ(pkv_mla_cache_write(b, 0, &tc, &tpe_huge, nullptr), PKV_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pkv_last_error_message()).find("k_pe has shape"), std::string::npos);
  EXPECT_EQ(computed(p, s), 0u);  // nothing committed
  // Every layer written: committed.
  for (uint32_t l = 0; l < kLayers; ++l)
    ASSERT_EQ(pkv_mla_cache_write(b, l, &tc, &tp, nullptr), PKV_OK) << pkv_last_error_message();
  EXPECT_EQ(computed(p, s), 3u);
  pkv_batch_destroy(b);
  pkv_pool_destroy(p);

  // MLA calls on an MHA pool.
  pkv_pool_options_init(&o);
  o.num_blocks = 8;
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.head_dim = kD;
  o.dtype = PKV_DTYPE_F32;
  ASSERT_EQ(pkv_pool_create(&o, &p), PKV_OK);
  ASSERT_EQ(pkv_seq_create(p, nullptr, &s), PKV_OK);
  ASSERT_EQ(pkv_seq_append(p, s, toks, 3, 0), PKV_OK);
  ASSERT_EQ(pkv_batch_prepare(p, &s, &nq, 1, nullptr, &b), PKV_OK);
  EXPECT_EQ(pkv_mla_cache_write(b, 0, &tc, &tp, nullptr), PKV_E_INVALID_STATE);
  EXPECT_NE(std::string(pkv_last_error_message()).find("MLA pool"), std::string::npos);
  EXPECT_EQ(pkv_mla_attention(b, 0, &tq, &tqp, &to, nullptr, &ap, nullptr), PKV_E_INVALID_STATE);
  pkv_batch_destroy(b);
  pkv_pool_destroy(p);
}

}  // namespace
