// End to end through the C ABI: the same engine steps (prefill, fork with
// copy-on-write, decode, swap out) on a PKV_DEVICE_CUDA pool and on a CPU
// pool, with the same tokens and tensors; outputs, LSE and swapped bytes
// must agree. The CUDA pool runs on a non-default stream. Then the same on
// FP8 pools (E4M3, E5M2; per-head scales, replaced between steps): the
// CUDA pool's stored codes equal the CPU pool's byte for byte.
#include "pagedkv/pagedkv.h"

#include <functional>

#include "gpu_test_util.h"

namespace pkvtest {
namespace {

constexpr uint32_t kLayers = 2, kHkv = 2, kHq = 8, kD = 128, kBs = 16;

struct Engine {
  bool cuda;
  cudaStream_t stream = nullptr;
  pkv_pool* pool = nullptr;
  std::vector<pkv_seq_id> seqs;

  // FP8 pools: per-head scales (layer major), bf16 inputs in [-1, 1] stay
  // below E4M3's 448 after the division.
  static constexpr float kScales[kLayers * kHkv] = {0.004f, 0.006f, 0.01f, 0.05f};

  explicit Engine(bool on_gpu, uint32_t dtype = PKV_DTYPE_BF16) : cuda(on_gpu) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.block_size = kBs;
    o.num_blocks = 64;
    o.num_layers = kLayers;
    o.num_kv_heads = kHkv;
    o.head_dim = kD;
    o.dtype = dtype;
    if (dtype == PKV_DTYPE_FP8_E4M3 || dtype == PKV_DTYPE_FP8_E5M2) {
      o.kv_scale_granularity = PKV_KV_SCALE_PER_HEAD;
      o.num_kv_scales = kLayers * kHkv;
      o.k_scales = kScales;
      o.v_scales = kScales;
    }
    o.device_type = on_gpu ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU;
    o.device_id = 0;
    EXPECT_EQ(pkv_pool_create(&o, &pool), PKV_OK) << pkv_last_error_message();
    if (on_gpu) EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  ~Engine() {
    pkv_pool_destroy(pool);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // A tensor of the engine's device holding `bytes` (copied from host).
  struct Buf {
    std::vector<uint8_t> host;
    DevBuf dev;
    pkv_tensor t{};
  };
  std::unique_ptr<Buf> tensor(const std::vector<uint8_t>& bytes, uint32_t dtype,
                              std::vector<int64_t> shape) {
    auto b = std::make_unique<Buf>();
    b->host = bytes;
    void* data = b->host.data();
    if (cuda) {
      b->dev = DevBuf(bytes.data(), bytes.size());
      data = b->dev.get();
    }
    EXPECT_EQ(pkv_tensor_init(data, dtype, cuda ? PKV_DEVICE_CUDA : PKV_DEVICE_CPU, 0,
                              int32_t(shape.size()), shape.data(), &b->t),
              PKV_OK)
        << pkv_last_error_message();
    return b;
  }
  std::vector<uint8_t> fetch(const Buf& b) {
    if (!cuda) return b.host;
    cudaStreamSynchronize(stream);
    return b.dev.read();
  }

  // One step: the given query counts, write every layer, attend layer 1.
  void step(const std::vector<uint32_t>& counts, const std::vector<std::vector<uint8_t>>& kv,
            const std::vector<uint8_t>& q, std::vector<uint8_t>* out, std::vector<uint8_t>* lse) {
    pkv_batch* batch = nullptr;
    ASSERT_EQ(
        pkv_batch_prepare(pool, seqs.data(), counts.data(), uint32_t(seqs.size()), stream, &batch),
        PKV_OK)
        << pkv_last_error_message();
    int64_t n = 0;
    for (uint32_t c : counts) n += c;
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      auto k = tensor(kv[2 * layer], PKV_DTYPE_BF16, {n, kHkv, kD});
      auto v = tensor(kv[2 * layer + 1], PKV_DTYPE_BF16, {n, kHkv, kD});
      ASSERT_EQ(pkv_cache_write(batch, layer, &k->t, &v->t, stream), PKV_OK)
          << pkv_last_error_message();
      if (cuda) cudaStreamSynchronize(stream);  // k, v die at scope end
    }
    auto qt = tensor(q, PKV_DTYPE_BF16, {n, kHq, kD});
    std::vector<uint8_t> poison(size_t(n) * kHq * kD * 2);
    fill_nan(poison.data(), poison.size(), DType::kBF16);
    auto ot = tensor(poison, PKV_DTYPE_BF16, {n, kHq, kD});
    std::vector<uint8_t> lpoison(size_t(n) * kHq * 4, 0xff);
    auto lt = tensor(lpoison, PKV_DTYPE_F32, {n, kHq});
    pkv_attention_params params;
    pkv_attention_params_init(&params);
    params.logit_softcap = 30.f;
    ASSERT_EQ(pkv_attention_forward(batch, 1, &qt->t, &ot->t, &lt->t, &params, stream), PKV_OK)
        << pkv_last_error_message();
    *out = fetch(*ot);
    *lse = fetch(*lt);
    pkv_batch_destroy(batch);
  }
};

void engine_steps_match(uint32_t dtype) {
  Engine gpu(true, dtype), cpu(false, dtype);
  const bool fp8 = dtype == PKV_DTYPE_FP8_E4M3 || dtype == PKV_DTYPE_FP8_E5M2;
  ASSERT_NE(gpu.pool, nullptr);
  ASSERT_NE(cpu.pool, nullptr);
  std::mt19937_64 rng(21);
  std::uniform_int_distribution<int32_t> tok(0, 50000);

  auto both = [&](const std::function<void(Engine&)>& f) {
    f(gpu);
    f(cpu);
  };
  auto append = [&](size_t i, uint64_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = tok(rng);
    both([&](Engine& e) {
      ASSERT_EQ(pkv_seq_append(e.pool, e.seqs[i], t.data(), n, 0), PKV_OK)
          << pkv_last_error_message();
    });
  };
  auto random_bf16 = [&](size_t n) { return encode(uniform(rng, n, -1.f, 1.f), DType::kBF16); };
  auto run_step = [&](const std::vector<uint32_t>& counts, const char* what) {
    int64_t n = 0;
    for (uint32_t c : counts) n += c;
    std::vector<std::vector<uint8_t>> kv;
    for (uint32_t i = 0; i < 2 * kLayers; ++i) kv.push_back(random_bf16(size_t(n) * kHkv * kD));
    const std::vector<uint8_t> q = random_bf16(size_t(n) * kHq * kD);
    std::vector<uint8_t> go, gl, co, cl;
    gpu.step(counts, kv, q, &go, &gl);
    cpu.step(counts, kv, q, &co, &cl);
    ASSERT_EQ(go.size(), co.size());
    int64_t bad = 0;
    for (size_t i = 0; i < go.size(); i += 2) {
      const float g = decode_one(&go[i], DType::kBF16), c = decode_one(&co[i], DType::kBF16);
      if (!(std::isfinite(g) && std::fabs(g - c) <= 2e-2f + 2e-2f * std::fabs(c))) ++bad;
    }
    EXPECT_EQ(bad, 0) << what << ": outputs differ";
    for (size_t i = 0; i < gl.size(); i += 4) {
      float g, c;
      std::memcpy(&g, &gl[i], 4);
      std::memcpy(&c, &cl[i], 4);
      ASSERT_TRUE(std::isfinite(g) && std::fabs(g - c) <= 1e-3f + 1e-3f * std::fabs(c))
          << what << ": lse " << i / 4 << " gpu " << g << " cpu " << c;
    }
  };

  // Two prompts (one spans several blocks, one ends mid-block), prefill.
  both([&](Engine& e) {
    e.seqs.resize(2);
    for (auto& s : e.seqs) ASSERT_EQ(pkv_seq_create(e.pool, nullptr, &s), PKV_OK);
  });
  append(0, 40);
  append(1, 23);
  run_step({40, 23}, "prefill");

  // Fork the second: the shared partial block is copied on write by the
  // next prepare (a block copy on the pool's device), then decode all three.
  both([&](Engine& e) {
    pkv_seq_id child = 0;
    ASSERT_EQ(pkv_seq_fork(e.pool, e.seqs[1], &child), PKV_OK) << pkv_last_error_message();
    e.seqs.push_back(child);
  });
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < 3; ++i) append(i, 1);
    run_step({1, 1, 1}, "decode");
  }
  // A chunk of 20 more tokens for the first sequence while the others decode.
  append(0, 20);
  append(1, 1);
  append(2, 1);
  run_step({20, 1, 1}, "chunked prefill + decode");
  if (fp8) {
    // New scales (device copy updated between steps), another decode.
    const float k[kLayers * kHkv] = {0.01f, 0.003f, 0.02f, 0.008f};
    const float v[kLayers * kHkv] = {0.005f, 0.03f, 0.004f, 0.01f};
    both([&](Engine& e) {
      ASSERT_EQ(pkv_pool_set_kv_scales(e.pool, k, v, kLayers * kHkv), PKV_OK)
          << pkv_last_error_message();
    });
    for (size_t i = 0; i < 3; ++i) append(i, 1);
    run_step({1, 1, 1}, "decode after new scales");
  }

  // Swap the first sequence's blocks out: identical bytes from both pools.
  std::vector<int32_t> gblocks(16), cblocks(16);
  uint64_t gn = 0, cn = 0;
  ASSERT_EQ(pkv_seq_get_block_table(gpu.pool, gpu.seqs[0], gblocks.data(), 16, &gn), PKV_OK);
  ASSERT_EQ(pkv_seq_get_block_table(cpu.pool, cpu.seqs[0], cblocks.data(), 16, &cn), PKV_OK);
  ASSERT_EQ(gn, cn);
  uint64_t bpb = 0;
  ASSERT_EQ(pkv_pool_bytes_per_block(gpu.pool, &bpb), PKV_OK);
  const size_t bytes = size_t(bpb * gn);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, bytes), cudaSuccess);
  std::vector<uint8_t> host(bytes);
  ASSERT_EQ(
      pkv_pool_swap_blocks(gpu.pool, gblocks.data(), gn, pinned, bytes, PKV_SWAP_OUT, gpu.stream),
      PKV_OK)
      << pkv_last_error_message();
  ASSERT_EQ(
      pkv_pool_swap_blocks(cpu.pool, cblocks.data(), cn, host.data(), bytes, PKV_SWAP_OUT, nullptr),
      PKV_OK)
      << pkv_last_error_message();
  cudaStreamSynchronize(gpu.stream);
  // Only the written token rows are comparable (unwritten slots differ).
  const size_t row = kD * (fp8 ? 1 : 2), per_plane = size_t(kHkv) * kBs * row;
  const int64_t written = fp8 ? 64 : 63;  // tokens of sequence 0
  for (uint64_t b = 0; b < gn; ++b) {
    for (uint32_t plane = 0; plane < 2 * kLayers; ++plane) {
      for (uint32_t h = 0; h < kHkv; ++h) {
        for (uint32_t t = 0; t < kBs && int64_t(b * kBs + t) < written; ++t) {
          const size_t at = (b * 2 * kLayers + plane) * per_plane + (h * kBs + t) * row;
          ASSERT_EQ(0, std::memcmp(static_cast<uint8_t*>(pinned) + at, host.data() + at, row))
              << "block " << b << " plane " << plane << " head " << h << " token " << t;
        }
      }
    }
  }
  cudaFreeHost(pinned);
  EXPECT_EQ(pkv_pool_validate(gpu.pool), PKV_OK) << pkv_last_error_message();
}

TEST(CudaCapi, EngineStepsMatchCpuPool) {
  PKV_SKIP_WITHOUT_GPU();
  engine_steps_match(PKV_DTYPE_BF16);
}

TEST(CudaCapi, Fp8EngineStepsMatchCpuPool) {
  PKV_SKIP_WITHOUT_GPU();
  for (uint32_t dtype : {PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2}) {
    SCOPED_TRACE(dtype);
    engine_steps_match(dtype);
  }
}

// A new CUDA pool's KV planes are zeros, even where the allocator hands
// back memory an earlier pool filled: copy-on-write copies move unwritten
// slots too, and compute-sanitizer initcheck flagged those reads of
// undefined bytes (fixed by zeroing the arena at creation).
TEST(CudaCapi, NewArenaIsZeros) {
  PKV_SKIP_WITHOUT_GPU();
  for (int round = 0; round < 3; ++round) {
    Engine e(true);
    for (uint32_t layer = 0; layer < kLayers; ++layer)
      for (uint32_t which = 0; which < 2; ++which) {
        pkv_tensor t{};
        ASSERT_EQ(pkv_pool_kv_tensor(e.pool, layer, which, &t), PKV_OK) << pkv_last_error_message();
        size_t n = 2;  // bf16
        for (uint32_t d = 0; d < t.ndim; ++d) n *= size_t(t.shape[d]);
        std::vector<uint8_t> host(n, 0xab);
        ASSERT_EQ(cudaMemcpy(host.data(), static_cast<char*>(t.data) + t.byte_offset, n,
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
        size_t nonzero = 0;
        for (uint8_t b : host) nonzero += b != 0;
        EXPECT_EQ(nonzero, 0u) << "round " << round << " layer " << layer << " plane " << which;
        // Dirty it, so that the next round's pool may get these bytes back.
        ASSERT_EQ(cudaMemset(static_cast<char*>(t.data) + t.byte_offset, 0x5a, n), cudaSuccess);
      }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

TEST(CudaCapi, FeaturesAndDeviceCount) {
  // Runs everywhere: a CUDA build reports the feature; the count never fails.
  EXPECT_TRUE(pkv_features() & PKV_FEATURE_CUDA);
  EXPECT_GE(pkv_cuda_device_count(), 0);
  if (pkv_cuda_device_count() == 0) {
    pkv_pool_options o;
    pkv_pool_options_init(&o);
    o.num_blocks = 8;
    o.num_layers = 1;
    o.num_kv_heads = 1;
    o.head_dim = 64;
    o.device_type = PKV_DEVICE_CUDA;
    pkv_pool* pool = nullptr;
    EXPECT_NE(pkv_pool_create(&o, &pool), PKV_OK);
    EXPECT_EQ(pool, nullptr);
    EXPECT_STRNE(pkv_last_error_message(), "");
  }
}

}  // namespace
}  // namespace pkvtest
