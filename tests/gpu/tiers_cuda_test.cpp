// Offload tiers on a CUDA pool (issue 20; impl/tier/tier_set_async.cpp):
// random K/V written by the kernels on a non-default stream, evicted by
// allocation pressure (the evicting sequence's own writes follow at once on
// the same stream, so a copy not ordered before them would offload the
// wrong bytes), offloaded into the pinned host tier (and the file tier),
// matched by a tiered lookup, loaded by the next plan on its stream, and
// read back: every byte of every block equal to what was written, and
// attention over the loaded blocks equal to attention before the eviction,
// for every KV dtype. A corrupted slot is a counted miss and the plan
// refuses (kInvalidState); stats count bytes and load time; pools destroyed
// with copies in flight (offloads issued, loads queued) do not crash
// (compute-sanitizer memcheck over this file checks the memory).
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "kv_pool.h"
#include "step_plan.h"

namespace pkvtest {
namespace {

using pagedkv::Batch;
using pagedkv::BlockHash;
using pagedkv::Errc;
using pagedkv::Error;
using pagedkv::Pool;
using pagedkv::PoolOptions;
using pagedkv::SeqId;
using pagedkv::TensorArg;
using pagedkv::TieredMatch;
using pagedkv::TierOptions;
using pagedkv::TierStats;

// GQA group 4, as the other GPU tests use.
constexpr uint32_t kBs = 16, kLayers = 2, kHkv = 2, kHq = 8, kD = 128;
constexpr uint32_t kPromptBlocks = 4, kPrompt = kPromptBlocks * kBs + 1;  // 4 full blocks + 1
constexpr uint64_t kNumBlocks = 7;  // 6 usable: a second prompt evicts every block of the first

using pagedkv::is_fp8;
// What the kernels take as K/V/Q for a pool of dtype t (FP8 pools: bf16).
DType act(DType t) { return is_fp8(t) ? DType::kBF16 : t; }

std::vector<int32_t> tokens_from(int32_t first, uint32_t n) {
  std::vector<int32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = first + int32_t(i) * 7;
  return t;
}

// Device memory with a tensor descriptor [n, heads, dim] over it.
struct DevRows {
  DevBuf buf;
  TensorArg t;
  DevRows(const std::vector<uint8_t>& host, DType dt, int64_t n, int64_t heads, int64_t dim)
      : buf(host.data(), host.size()) {
    t.data = buf.get();
    t.dtype = uint32_t(dt);
    t.device_type = pagedkv::kDeviceCuda;
    t.device_id = 0;
    t.ndim = 3;
    t.shape[0] = n;
    t.shape[1] = heads;
    t.shape[2] = dim;
  }
};

struct Env {
  DType dtype;
  std::shared_ptr<Pool> pool;
  cudaStream_t stream = nullptr;
  std::mt19937_64 rng{7};

  Env(DType dt, uint64_t host_blocks, uint64_t file_blocks) : dtype(dt) {
    PoolOptions o;
    o.block_size = kBs;
    o.num_blocks = kNumBlocks;
    o.num_layers = kLayers;
    o.num_kv_heads = kHkv;
    o.head_dim = kD;
    o.dtype = dt;
    o.device_type = pagedkv::kDeviceCuda;
    o.device_id = 0;
    if (is_fp8(dt)) {  // per-tensor scales that keep [-1, 1] inputs in range
      o.kv_scale_granularity = 0;
      o.k_scales = {0.01f, 0.02f};
      o.v_scales = {0.03f, 0.005f};
    }
    pool = Pool::create(o);
    TierOptions t;
    t.host_bytes = host_blocks * pool->bytes_per_block();
    if (file_blocks) {
      t.file_dir = ::testing::TempDir();
      t.file_bytes = file_blocks * pool->bytes_per_block();
    }
    pool->attach_tiers(t);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  }
  ~Env() {
    pool.reset();
    if (stream) cudaStreamDestroy(stream);
  }

  std::vector<uint8_t> random_rows(size_t elems) {
    return encode(uniform(rng, elems, -1.f, 1.f), act(dtype));
  }
  size_t plane_bytes() const { return size_t(kBs) * kHkv * kD * pagedkv::dtype_size(dtype); }
  // Every plane of block b, read from the device after the stream's work.
  std::vector<uint8_t> block_bytes(int32_t b) {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<uint8_t> out;
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t w = 0; w < 2; ++w) {
        const char* base = static_cast<const char*>(pool->kv_tensor(l, w).data);
        const auto part = read_device(base + size_t(b) * plane_bytes(), plane_bytes());
        out.insert(out.end(), part.begin(), part.end());
      }
    return out;
  }
  std::vector<int32_t> table(SeqId s) {
    std::vector<int32_t> t(64);
    t.resize(pool->block_table(s, t.data(), t.size()));
    return t;
  }
  // A prompt written whole by one step (K/V per layer returned).
  SeqId prefill(const std::vector<int32_t>& tokens, std::vector<std::vector<uint8_t>>* kv) {
    SeqId s = pool->seq_create({});
    pool->append(s, tokens.data(), tokens.size(), 0);
    const uint32_t n = uint32_t(tokens.size());
    auto b = Batch::prepare(pool, &s, &n, 1, stream);
    for (uint32_t l = 0; l < kLayers; ++l) {
      std::vector<uint8_t> k = random_rows(size_t(n) * kHkv * kD),
                           v = random_rows(size_t(n) * kHkv * kD);
      DevRows kt(k, act(dtype), n, kHkv, kD), vt(v, act(dtype), n, kHkv, kD);
      b->write(l, &kt.t, &vt.t, stream);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // kt, vt go at scope end
      if (kv) {
        kv->push_back(k);
        kv->push_back(v);
      }
    }
    EXPECT_TRUE(b->committed());
    return s;
  }
  // Attention of q (one row) over s's tokens, every layer; when last_kv is
  // given, the plan first writes the last token's K/V from it (rows of the
  // prompt's K/V per layer).
  std::vector<std::vector<uint8_t>> attend_last(SeqId s, const std::vector<uint8_t>& q,
                                                const std::vector<std::vector<uint8_t>>* last_kv) {
    const uint32_t one = 1;
    auto b = Batch::prepare(pool, &s, &one, 1, stream);
    std::vector<std::vector<uint8_t>> outs;
    const size_t es = pagedkv::dtype_size(act(dtype)), row = size_t(kHkv) * kD * es;
    for (uint32_t l = 0; l < kLayers; ++l) {
      if (last_kv) {
        const auto& k = (*last_kv)[2 * l];
        const auto& v = (*last_kv)[2 * l + 1];
        std::vector<uint8_t> kr(k.end() - row, k.end()), vr(v.end() - row, v.end());
        DevRows kt(kr, act(dtype), 1, kHkv, kD), vt(vr, act(dtype), 1, kHkv, kD);
        b->write(l, &kt.t, &vt.t, stream);
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      }
      std::vector<uint8_t> poison(size_t(kHq) * kD * es);
      fill_nan(poison.data(), poison.size(), act(dtype));
      DevRows qt(q, act(dtype), 1, kHq, kD), ot(poison, act(dtype), 1, kHq, kD);
      b->attend(l, &qt.t, &ot.t, nullptr, pagedkv::AttentionParams{}, stream);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      outs.push_back(ot.buf.read());
    }
    if (!last_kv) b->abort();
    return outs;
  }
};

// Prompt a written, its blocks' bytes and attention recorded, then freed
// and evicted by prompt b (written right away on the same stream).
struct Offloaded {
  std::vector<int32_t> tokens = tokens_from(100, kPrompt);
  std::vector<std::vector<uint8_t>> kv, ref_out, blocks;
  std::vector<uint8_t> q;
  std::vector<BlockHash> hashes;
};

Offloaded offload_prompt(Env& e) {
  Offloaded f;
  Pool& p = *e.pool;
  SeqId a = e.prefill(f.tokens, &f.kv);
  f.q = e.random_rows(size_t(kHq) * kD);
  f.ref_out = e.attend_last(a, f.q, nullptr);
  for (int32_t blk : e.table(a)) f.blocks.push_back(e.block_bytes(blk));
  f.blocks.resize(kPromptBlocks);  // the full blocks
  f.hashes.resize(8);
  f.hashes.resize(p.block_hashes(a, f.hashes.data(), f.hashes.size()));
  p.free(a);
  // Prompt b takes every usable block: a's four are evicted (offloads
  // queued), and b's plan writes into them next on the same stream.
  SeqId b = e.prefill(tokens_from(90000, (kNumBlocks - 1) * kBs), nullptr);
  p.free(b);
  p.flush_tiers();  // the offloads are in their tier
  EXPECT_EQ(p.validate(), "");
  return f;
}

void expect_loaded(Env& e, Offloaded& f, uint64_t want_host, uint64_t want_file) {
  Pool& p = *e.pool;
  SeqId c = p.seq_create({});
  const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), f.tokens.size());
  EXPECT_EQ(m.device, 0u);
  EXPECT_EQ(m.host, want_host * kBs);
  EXPECT_EQ(m.file, want_file * kBs);
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, 0u);
  p.append(c, f.tokens.data() + kPromptBlocks * kBs, 1, 0);
  // The plan loads the hits on its stream, writes the last token, attends.
  const auto out = e.attend_last(c, f.q, &f.kv);
  for (uint32_t l = 0; l < kLayers; ++l)
    ASSERT_EQ(out[l], f.ref_out[l]) << dtype_name(e.dtype) << " layer " << l;
  const auto tab = e.table(c);
  for (uint32_t j = 0; j < kPromptBlocks; ++j)
    ASSERT_EQ(e.block_bytes(tab[j]), f.blocks[j]) << dtype_name(e.dtype) << " block " << j;
  EXPECT_EQ(p.seq_info(c).num_computed_tokens, uint64_t(kPrompt));
  p.flush_tiers();  // the loads' events completed: load_ns counted
  EXPECT_EQ(p.validate(), "");
  // Loaded blocks are written blocks: a device hit now.
  p.free(c);
  SeqId d = p.seq_create({});
  EXPECT_EQ(p.match_prefix(d, f.tokens.data(), f.tokens.size()), uint64_t(kPromptBlocks * kBs));
  p.free(d);
}

class CudaTiers : public ::testing::TestWithParam<DType> {};

TEST_P(CudaTiers, HostTierRoundTripByteExactAndAttentionMatches) {
  PKV_SKIP_WITHOUT_GPU();
  Env e(GetParam(), 4, 0);
  Offloaded f = offload_prompt(e);
  TierStats s = e.pool->tier_stats(1);
  EXPECT_EQ(s.num_stored, uint64_t(kPromptBlocks));
  EXPECT_EQ(s.num_blocks, uint64_t(kPromptBlocks));
  EXPECT_EQ(s.bytes_stored, kPromptBlocks * e.pool->bytes_per_block());
  expect_loaded(e, f, kPromptBlocks, 0);
  s = e.pool->tier_stats(1);
  EXPECT_EQ(s.num_hits, uint64_t(kPromptBlocks));
  EXPECT_EQ(s.num_loaded, uint64_t(kPromptBlocks));
  EXPECT_EQ(s.bytes_loaded, kPromptBlocks * e.pool->bytes_per_block());
  EXPECT_GT(s.load_ns, 0u);
  EXPECT_EQ(s.num_checksum_failures, 0u);
}

TEST_P(CudaTiers, HostAndFileTiersRoundTripByteExact) {
  PKV_SKIP_WITHOUT_GPU();
  Env e(GetParam(), 2, 4);  // two host slots: the two oldest blocks go down to the file
  Offloaded f = offload_prompt(e);
  EXPECT_EQ(e.pool->tier_stats(2).num_stored, 2u);
  expect_loaded(e, f, 2, 2);
  EXPECT_EQ(e.pool->tier_stats(2).num_loaded, 2u);
  EXPECT_GT(e.pool->tier_stats(2).load_ns, 0u);
}

TEST_P(CudaTiers, FileTierAloneRoundTripByteExact) {
  PKV_SKIP_WITHOUT_GPU();
  Env e(GetParam(), 0, 4);
  Offloaded f = offload_prompt(e);
  EXPECT_EQ(e.pool->tier_stats(2).num_stored, uint64_t(kPromptBlocks));
  expect_loaded(e, f, 0, kPromptBlocks);
}

TEST_P(CudaTiers, CorruptedSlotIsAMissAndThePlanRefuses) {
  PKV_SKIP_WITHOUT_GPU();
  for (const bool in_file : {false, true}) {
    Env e(GetParam(), in_file ? 0 : 4, in_file ? 4 : 0);
    Offloaded f = offload_prompt(e);
    Pool& p = *e.pool;
    ASSERT_TRUE(p.tiers_for_testing()->corrupt_for_testing(f.hashes[1]));
    SeqId c = p.seq_create({});
    const TieredMatch m = p.match_prefix_tiered(c, f.tokens.data(), f.tokens.size());
    EXPECT_EQ(m.host + m.file, uint64_t(kPromptBlocks * kBs));  // the lookup does not verify
    const uint32_t q = 1;
    p.append(c, f.tokens.data() + kPromptBlocks * kBs, 1, 0);
    try {
      Batch::prepare(e.pool, &c, &q, 1, e.stream);
      ADD_FAILURE() << "the plan read a block whose load failed";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Errc::kInvalidState) << err.what();
    }
    p.flush_tiers();
    const TierStats s = p.tier_stats(in_file ? 2 : 1);
    EXPECT_EQ(s.num_checksum_failures, 1u);
    EXPECT_EQ(s.num_loaded, uint64_t(kPromptBlocks - 1));
    // The other blocks loaded; block 1 must be computed again.
    EXPECT_EQ(p.seq_info(c).num_computed_tokens, uint64_t(kBs));
    EXPECT_EQ(p.validate(), "");
  }
}

// Copies in flight when the pool goes: offloads issued (not flushed), or
// loads queued on the stream (not synchronised).
TEST_P(CudaTiers, DestroyWithCopiesInFlight) {
  PKV_SKIP_WITHOUT_GPU();
  {
    Env e(GetParam(), 4, 2);
    SeqId a = e.prefill(tokens_from(100, kPrompt), nullptr);
    e.pool->free(a);
    SeqId b = e.pool->seq_create({});
    const auto t2 = tokens_from(90000, (kNumBlocks - 1) * kBs);
    e.pool->append(b, t2.data(), t2.size(), 0);  // evicts: offloads queued
    e.pool->close();                             // pkv_pool_destroy
  }
  {
    Env e(GetParam(), 4, 0);
    Offloaded f = offload_prompt(e);
    SeqId c = e.pool->seq_create({});
    e.pool->match_prefix_tiered(c, f.tokens.data(), f.tokens.size());
    e.pool->append(c, f.tokens.data() + kPromptBlocks * kBs, 1, 0);
    const uint32_t q = 1;
    auto batch = Batch::prepare(e.pool, &c, &q, 1, e.stream);  // loads queued on the stream
    e.pool->close();
    batch.reset();
  }
}

// A plan looks at earlier loads' events (cudaEventQuery) without waiting;
// "not ready" must not stay behind as the thread's last CUDA error, where
// the next kernel launch's check (cudaGetLastError) would report it as a
// failed launch.
TEST_P(CudaTiers, PendingLoadsLeaveNoCudaErrorBehind) {
  PKV_SKIP_WITHOUT_GPU();
  Env e(GetParam(), 4, 0);
  Offloaded f = offload_prompt(e);
  Pool& p = *e.pool;
  SeqId c = p.seq_create({});
  p.match_prefix_tiered(c, f.tokens.data(), f.tokens.size());
  p.append(c, f.tokens.data() + kPromptBlocks * kBs, 1, 0);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  // The stream is held up on the host: the loads the plan queues behind
  // this are still pending when the next call on the pool looks at them.
  ASSERT_EQ(
      cudaLaunchHostFunc(
          e.stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
          nullptr),
      cudaSuccess);
  const uint32_t q = 1;
  auto batch = Batch::prepare(e.pool, &c, &q, 1, e.stream);  // loads queued
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  p.copy_blocks(nullptr, nullptr, 0, e.stream);  // settles: the loads' event is not ready
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  batch->abort();
  p.flush_tiers();
  EXPECT_EQ(p.tier_stats(1).num_loaded, uint64_t(kPromptBlocks));
  EXPECT_EQ(p.validate(), "");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaTiers,
                         ::testing::Values(DType::kBF16, DType::kF16, DType::kF32, DType::kFp8E4m3,
                                           DType::kFp8E5m2),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

}  // namespace
}  // namespace pkvtest
