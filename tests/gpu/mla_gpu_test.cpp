// MLA pools on a CUDA device through the C ABI (label gpu; skips without a
// device): the same steps (prefill, chunked prefill, decode) on a CUDA MLA
// pool and a CPU MLA pool with the same bf16 latents and queries; the
// stored latent planes agree byte for byte and the outputs and LSE agree
// within bf16 rounding. Runs in scripts/gpu-check.sh with the rest of
// test_gpu.
#include "pagedkv/pagedkv.h"

#include <random>

#include "gpu_test_util.h"

namespace pkvtest {
namespace {

constexpr uint32_t kLayers = 2, kRank = 512, kRope = 64, kHeads = 16, kBs = 16;

pkv_pool* mla_pool(bool cuda) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = kBs;
  o.num_blocks = 32;
  o.num_layers = kLayers;
  o.dtype = PKV_DTYPE_BF16;
  o.kv_layout = PKV_KV_LAYOUT_MLA;
  o.kv_lora_rank = kRank;
  o.qk_rope_head_dim = kRope;
  o.device_type = cuda ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU;
  pkv_pool* p = nullptr;
  EXPECT_EQ(pkv_pool_create(&o, &p), PKV_OK) << pkv_last_error_message();
  return p;
}

std::vector<uint16_t> bf16_values(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) {
    float f = 0;
    while (std::fabs(f) < 1e-3f) f = u(rng);
    x = pagedkv::f32_to_bf16(f);
  }
  return v;
}

TEST(CudaMla, MatchesCpuPool) {
  PKV_SKIP_WITHOUT_GPU();
  pkv_pool* pools[2] = {mla_pool(false), mla_pool(true)};
  ASSERT_NE(pools[0], nullptr);
  ASSERT_NE(pools[1], nullptr);
  std::mt19937 rng(5);
  pkv_seq_id seqs[2][2];
  std::vector<int32_t> toks(40);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(i + 3);
  for (int p = 0; p < 2; ++p)
    for (int s = 0; s < 2; ++s) ASSERT_EQ(pkv_seq_create(pools[p], nullptr, &seqs[p][s]), PKV_OK);
  // Steps: (appends of seq 0, of seq 1) and their query counts.
  const uint32_t steps[3][2] = {{33, 10}, {1, 7}, {1, 1}};
  for (const auto& st : steps) {
    const uint32_t n = st[0] + st[1];
    std::vector<std::vector<uint16_t>> data;
    for (uint32_t l = 0; l < kLayers; ++l) {
      data.push_back(bf16_values(rng, size_t(n) * kRank));
      data.push_back(bf16_values(rng, size_t(n) * kRope));
      data.push_back(bf16_values(rng, size_t(n) * kHeads * kRank));
      data.push_back(bf16_values(rng, size_t(n) * kHeads * kRope));
    }
    std::vector<uint16_t> outs[2];
    std::vector<float> lses[2];
    for (int p = 0; p < 2; ++p) {
      const bool cuda = p == 1;
      for (int s = 0; s < 2; ++s)
        ASSERT_EQ(pkv_seq_append(pools[p], seqs[p][s], toks.data(), st[s], 0), PKV_OK);
      pkv_batch* b = nullptr;
      ASSERT_EQ(pkv_batch_prepare(pools[p], seqs[p], st, 2, nullptr, &b), PKV_OK)
          << pkv_last_error_message();
      for (uint32_t l = 0; l < kLayers; ++l) {
        const std::vector<uint16_t>* d = &data[l * 4];
        std::vector<DevBuf> dev;
        auto tensor = [&](const std::vector<uint16_t>& h, std::vector<int64_t> shape,
                          void* host_out) {
          void* ptr = host_out;
          if (cuda) {
            dev.emplace_back(h.data(), h.size() * 2);
            ptr = dev.back().get();
          }
          pkv_tensor t;
          EXPECT_EQ(pkv_tensor_init(ptr, PKV_DTYPE_BF16, cuda ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU, 0,
                                    int32_t(shape.size()), shape.data(), &t),
                    PKV_OK);
          return t;
        };
        std::vector<uint16_t> c = d[0], pe = d[1], ql = d[2], qp = d[3];
        std::vector<uint16_t> out(size_t(n) * kHeads * kRank);
        std::vector<float> lse(size_t(n) * kHeads);
        pkv_tensor tc = tensor(c, {n, kRank}, c.data()), tp = tensor(pe, {n, kRope}, pe.data());
        pkv_tensor tql = tensor(ql, {n, kHeads, kRank}, ql.data());
        pkv_tensor tqp = tensor(qp, {n, kHeads, kRope}, qp.data());
        pkv_tensor to = tensor(out, {n, kHeads, kRank}, out.data());
        DevBuf lse_dev;
        pkv_tensor tl;
        const int64_t lshape[2] = {n, kHeads};
        if (cuda) lse_dev = DevBuf(lse.size() * 4);
        ASSERT_EQ(pkv_tensor_init(cuda ? lse_dev.get() : lse.data(), PKV_DTYPE_F32,
                                  cuda ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU, 0, 2, lshape, &tl),
                  PKV_OK);
        ASSERT_EQ(pkv_mla_cache_write(b, l, &tc, &tp, nullptr), PKV_OK) << pkv_last_error_message();
        pkv_attention_params ap;
        pkv_attention_params_init(&ap);
        ap.softmax_scale = 0.0722f;
        ASSERT_EQ(pkv_mla_attention(b, l, &tql, &tqp, &to, &tl, &ap, nullptr), PKV_OK)
            << pkv_last_error_message();
        if (cuda) {
          PKV_CUDA_OK(cudaDeviceSynchronize());
          const std::vector<uint8_t> o = dev.back().read();
          std::memcpy(out.data(), o.data(), o.size());
          const std::vector<uint8_t> lb = lse_dev.read();
          std::memcpy(lse.data(), lb.data(), lb.size());
        }
        outs[p].insert(outs[p].end(), out.begin(), out.end());
        lses[p].insert(lses[p].end(), lse.begin(), lse.end());
      }
      pkv_batch_destroy(b);
    }
    for (size_t i = 0; i < outs[0].size(); ++i) {
      const float a = pagedkv::bf16_to_f32(outs[1][i]), e = pagedkv::bf16_to_f32(outs[0][i]);
      ASSERT_LE(std::fabs(a - e), 1e-3f + 1.0f / 128 * std::fabs(e)) << "out[" << i << "]";
    }
    for (size_t i = 0; i < lses[0].size(); ++i)
      ASSERT_NEAR(lses[1][i], lses[0][i], 1e-3f + 1e-5f * std::fabs(lses[0][i])) << "lse " << i;
  }
  // The latent planes: byte for byte.
  for (uint32_t l = 0; l < kLayers; ++l) {
    pkv_tensor a, g;
    ASSERT_EQ(pkv_pool_kv_tensor(pools[0], l, PKV_KV_KEY, &a), PKV_OK);
    ASSERT_EQ(pkv_pool_kv_tensor(pools[1], l, PKV_KV_KEY, &g), PKV_OK);
    int32_t ta[8], tg[8];
    uint64_t na = 0, ng = 0;
    ASSERT_EQ(pkv_seq_get_block_table(pools[0], seqs[0][0], ta, 8, &na), PKV_OK);
    ASSERT_EQ(pkv_seq_get_block_table(pools[1], seqs[1][0], tg, 8, &ng), PKV_OK);
    ASSERT_EQ(na, ng);
    const size_t row = size_t(kBs) * (kRank + kRope) * 2;
    for (uint64_t i = 0; i < na; ++i) {
      std::vector<uint8_t> h(row);
      PKV_CUDA_OK(cudaMemcpy(h.data(), static_cast<char*>(g.data) + size_t(tg[i]) * row, row,
                             cudaMemcpyDeviceToHost));
      const size_t used = i + 1 < na ? row : size_t(35 - i * kBs) * (kRank + kRope) * 2;
      ASSERT_EQ(0, std::memcmp(h.data(), static_cast<char*>(a.data) + size_t(ta[i]) * row, used))
          << "layer " << l << " block " << i;
    }
  }
  pkv_pool_destroy(pools[0]);
  pkv_pool_destroy(pools[1]);
}

}  // namespace
}  // namespace pkvtest
