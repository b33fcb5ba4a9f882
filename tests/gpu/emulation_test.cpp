// The CUDA kernels, unchanged, run on the CPU through cuda/emulation.h and
// compared with the CPU backend: the tile/split/merge logic, page lookups,
// masks, online softmax, the WMMA data flow (with PTX alignment and ldm
// rules checked), the write/copy/swap kernels and the host-side planner
// (cuda/plan.h) are exercised on every machine, GPU or not. What emulation
// cannot show — real concurrency, cp.async/WMMA hardware behaviour, speed —
// is left to the gpu-labelled tests and compute-sanitizer on a GPU.
#include <cstdlib>
#include <type_traits>

#include "attention_cases.h"
#include "plan.h"

// The kernel headers last: the emulation defines threadIdx and friends.
#define PKV_CUDA_EMULATION 1
#include "attention.cuh"
#include "kv_move.cuh"

PKV_EMU_DEFINE_SWITCH

namespace pkvtest {
namespace {

namespace cu = pagedkv::cuda;
using pagedkv::Backend;
using pagedkv::KvArena;

template <typename T, int D, int ROWS, typename S>
void emu_rows(const cu::AttnParams& p, const cu::AttnLaunch& l) {
  constexpr int KT = cu::kv_tile<T, D>();
  using L = cu::AttnSmem<T, D, ROWS, KT, cu::IsFp8<S>::value>;
  const dim3 grid(unsigned(l.num_seqs) * unsigned(p.tiles_per_seq), unsigned(p.num_kv_heads),
                  unsigned(p.num_splits));
  pkv_emu::launch(grid, dim3(cu::kAttnThreads), L::kBytes,
                  [&] { cu::paged_attention_kernel<T, D, ROWS, KT, S>(p); });
  if (p.num_splits > 1) {
    const int64_t rows = p.num_tokens * p.num_q_heads;
    pkv_emu::launch(dim3(unsigned((rows + 3) / 4)), dim3(128), 0,
                    [&] { cu::merge_splits_kernel<T, S>(p, D); });
  }
}

// The (q dtype, head dim, page dtype) kernels that EmulatedAttention's cases
// run: only these are compiled for the host (28 of the 70 instantiations; the
// file was 50 s of CI's build). A new case outside them fails, naming it.
template <typename T, int D, typename S>
constexpr bool emu_compiled() {
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  constexpr bool h = std::is_same<T, __half>::value;
  if (std::is_same<S, cu::Fp8E4m3>::value) return (bf && D == 128) || (h && (D == 64 || D == 256));
  if (std::is_same<S, cu::Fp8E5m2>::value) return (bf && D == 80) || (h && D == 128);
  if (bf) return D == 128 || D == 256 || D == 96;
  if (h) return D == 80 || D == 64 || (D == 256 && std::is_same<S, T>::value);
  return D == 96 || D == 256 || D == 64;  // f32
}

// f16/bf16 pages: the mma.sync kernel (cuda/attention_mma.cuh), both tiles.
template <typename T, int D, bool kDecode>
void emu_mma(const cu::AttnParams& p, const cu::AttnLaunch& l) {
  const dim3 grid(unsigned(l.num_seqs) * unsigned(p.tiles_per_seq), unsigned(p.num_kv_heads),
                  unsigned(p.num_splits));
  pkv_emu::launch(grid, dim3(cu::kMmaThreads), cu::MmaSmem<T, D, kDecode>::kBytes,
                  [&] { cu::paged_attention_mma_kernel<T, D, kDecode>(p); });
  if (p.num_splits > 1) {
    const int64_t rows = p.num_tokens * p.num_q_heads;
    pkv_emu::launch(dim3(unsigned((rows + 3) / 4)), dim3(128), 0,
                    [&] { cu::merge_splits_kernel<T, T>(p, D); });
  }
}

template <typename T, int D, typename S>
void emu_dim(const cu::AttnParams& p, const cu::AttnLaunch& l) {
  if constexpr (emu_compiled<T, D, S>()) {
    if constexpr (cu::uses_mma_kernel<T, S>()) {
      if (l.generic) {  // head dim 256 where the mma tiles do not fit
        l.large_tile ? emu_rows<T, D, cu::large_rows(2, D), S>(p, l)
                     : emu_rows<T, D, cu::kSmallRows, S>(p, l);
      } else {
        l.large_tile ? emu_mma<T, D, false>(p, l) : emu_mma<T, D, true>(p, l);
      }
    } else if (l.large_tile) {
      emu_rows<T, D, cu::large_rows(int(sizeof(T)), D), S>(p, l);
    } else {
      emu_rows<T, D, cu::kSmallRows, S>(p, l);
    }
  } else {
    FAIL() << "head dim " << D << " with this q/page dtype is not compiled into the emulation "
           << "test: add it to emu_compiled()";
  }
}

template <typename T, typename S = T>
void emu_attention(const cu::AttnParams& p, const cu::AttnLaunch& l) {
  switch (l.head_dim) {
    case 64:
      return emu_dim<T, 64, S>(p, l);
    case 80:
      return emu_dim<T, 80, S>(p, l);
    case 96:
      return emu_dim<T, 96, S>(p, l);
    case 128:
      return emu_dim<T, 128, S>(p, l);
    case 256:
      return emu_dim<T, 256, S>(p, l);
    default:
      FAIL() << "head dim " << l.head_dim;
  }
}

// The CUDA backend's planning and kernels over host memory.
class EmuBackend final : public Backend {
 public:
  int32_t device_type() const override { return 1; }  // host memory: read back by memcpy
  int32_t device_id() const override { return 0; }
  void* allocate(size_t bytes) override {
    return std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  }
  void deallocate(void* p) noexcept override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes, void*) override {
    std::memcpy(dst, src, bytes);
  }
  void write(const KvArena& arena, int32_t layer, const pagedkv::PlanView& plan,
             const pagedkv::Tensor3& k, const pagedkv::Tensor3& v, void*) override {
    const cu::WriteParams p = cu::plan_write(arena, layer, plan, k, v);
    const dim3 grid(unsigned(std::min<int64_t>(p.num_tokens, 1 << 16)));
    pkv_emu::launch(grid, dim3(128), 0, [&] {
      if (p.fp8 == int32_t(pagedkv::DType::kFp8E4m3))
        return cu::write_kv_fp8_kernel<cu::Fp8E4m3>(p);
      if (p.fp8 == int32_t(pagedkv::DType::kFp8E5m2))
        return cu::write_kv_fp8_kernel<cu::Fp8E5m2>(p);
      switch (p.unit) {
        case 16:
          cu::write_kv_kernel<16>(p);
          break;
        case 8:
          cu::write_kv_kernel<8>(p);
          break;
        case 4:
          cu::write_kv_kernel<4>(p);
          break;
        default:
          cu::write_kv_kernel<2>(p);
          break;
      }
    });
    if (p.fp8 == 0) units_seen |= p.unit;
  }
  void attend(const KvArena& arena, int32_t layer, const pagedkv::PlanView& plan,
              const pagedkv::Tensor3& q, const pagedkv::Tensor3& out,
              const pagedkv::AttentionArgs& args, void*) override {
    cu::AttnPlan ap =
        cu::plan_attention(arena, layer, plan, q, out, args, /*sm_count=*/132, max_smem);
    last_generic = ap.launch.generic;
    last_smem = ap.smem_bytes;
    std::vector<float> scratch(ap.scratch_bytes / sizeof(float) + 1);
    cu::attach_scratch(ap, scratch.data());
    last_splits = ap.params.num_splits;
    last_large = ap.launch.large_tile;
    const bool bf = q.dtype == pagedkv::DType::kBF16;
    switch (arena.layout.dtype) {
      case pagedkv::DType::kFp8E4m3:
        bf ? emu_attention<__nv_bfloat16, cu::Fp8E4m3>(ap.params, ap.launch)
           : emu_attention<__half, cu::Fp8E4m3>(ap.params, ap.launch);
        break;
      case pagedkv::DType::kFp8E5m2:
        bf ? emu_attention<__nv_bfloat16, cu::Fp8E5m2>(ap.params, ap.launch)
           : emu_attention<__half, cu::Fp8E5m2>(ap.params, ap.launch);
        break;
      case pagedkv::DType::kF32:
        emu_attention<float>(ap.params, ap.launch);
        break;
      case pagedkv::DType::kF16:
        emu_attention<__half>(ap.params, ap.launch);
        break;
      default:
        emu_attention<__nv_bfloat16>(ap.params, ap.launch);
        break;
    }
  }
  void copy_blocks(const KvArena& arena, const int32_t* src, const int32_t* dst, int64_t n,
                   void*) override {
    std::vector<int32_t> pairs(size_t(2 * n));
    for (int64_t i = 0; i < n; ++i) {
      pairs[2 * i] = src[i];
      pairs[2 * i + 1] = dst[i];
    }
    const int64_t plane = int64_t(arena.layout.layer_bytes()),
                  block = int64_t(arena.layout.block_bytes());
    const int32_t planes = arena.num_planes();
    pkv_emu::launch(cu::move_grid(n, planes, grid_y_cap), dim3(128), 0, [&] {
      cu::copy_blocks_kernel(static_cast<char*>(arena.base), planes, plane, block, pairs.data());
    });
  }
  void swap(const KvArena& arena, const int32_t* blocks, int64_t n, void* host, bool to_host,
            void*) override {
    const int32_t planes = arena.num_planes();
    const int64_t plane = int64_t(arena.layout.layer_bytes()),
                  block = int64_t(arena.layout.block_bytes());
    std::vector<char> buf(size_t(n * planes * block));
    if (!to_host) std::memcpy(buf.data(), host, buf.size());
    pkv_emu::launch(cu::move_grid(n, planes, grid_y_cap), dim3(128), 0, [&] {
      cu::gather_blocks_kernel(static_cast<char*>(arena.base), planes, plane, block, blocks,
                               buf.data(), to_host);
    });
    if (to_host) std::memcpy(host, buf.data(), buf.size());
  }
  void synchronize(void*) override {}

  size_t max_smem = SIZE_MAX;  // the device's opt-in shared memory per block
  // gridDim.y of the copy and swap kernels at most (the device's 65535;
  // smaller in tests, so that the kernels loop over planes as they do on a
  // pool of 32768+ layers).
  int64_t grid_y_cap = cu::kMaxGridY;
  int last_splits = 0;
  bool last_large = false;
  bool last_generic = false;
  size_t last_smem = 0;
  int units_seen = 0;
};

struct EmuCase {
  DType dt;  // q, out, new k/v
  int head_dim;
  int group;
  DType cache = DType::kI32;   // the pool's dtype; kI32 = dt
  size_t max_smem = SIZE_MAX;  // the device's shared memory per block
};

class EmulatedAttention : public ::testing::TestWithParam<EmuCase> {};

// A cut of the GPU matrix small enough for seconds on one core: every dtype
// and head dim appears, both tile sizes, GQA 1/4/8, and each scenario kind.
TEST_P(EmulatedAttention, KernelsMatchCpuBackend) {
  const EmuCase c = GetParam();
  EmuBackend emu;
  emu.max_smem = c.max_smem;
  auto cpu = pagedkv::make_cpu_backend(1);
  std::mt19937_64 rng(uint64_t(c.head_dim) * 7919u + uint64_t(c.group) * 31u + uint64_t(c.dt) +
                      uint64_t(c.cache) * 131u);
  std::vector<Scenario> all = scenarios(rng);
  // Shorter contexts than on the GPU: emulated threads are slow.
  std::vector<Scenario> cut;
  for (Scenario s : all) {
    for (SeqSpec& q : s.seqs)
      q.ctx = std::min(q.ctx, 260), q.nq = std::min(q.nq, std::min(q.ctx, 40));
    // 1 sequence x 2 KV heads over 700 keys: the heuristic must split.
    if (s.name == "heuristic-splits") s.seqs = {{700, 1}};
    cut.push_back(s);
  }
  for (const Scenario& sc : cut) {
    if (!applies(sc, c.cache == DType::kI32 ? c.dt : c.cache)) continue;
    SCOPED_TRACE(sc.name);
    const Inputs s = build(sc, c.dt, c.head_dim, 2, c.group, rng, c.cache);
    pagedkv::AttentionArgs args{};
    args.softmax_scale = sc.scale > 0.f ? sc.scale : 1.f / std::sqrt(float(c.head_dim));
    args.sliding_window = sc.window;
    args.logit_softcap = sc.softcap;
    cu::set_forced_splits(sc.splits);
    pkv_emu::state().errors = 0;
    const Outputs g = run(emu, s, args, sc.lse);
    cu::set_forced_splits(0);
    EXPECT_EQ(pkv_emu::state().errors, 0) << pkv_emu::state().first_error;
    if (sc.splits > 0) EXPECT_EQ(emu.last_splits, sc.splits);
    if (sc.name == "heuristic-splits") EXPECT_GT(emu.last_splits, 1);
    // On a 99 KB part the decode tile fits; the head-dim-256 prefill tile
    // fits neither kernel, and the backend refuses it (PKV_E_UNSUPPORTED).
    if (c.max_smem == SIZE_MAX || !emu.last_large) {
      EXPECT_LE(emu.last_smem, c.max_smem) << "the chosen tile fits the device";
    }
    // Head dim 256 of f16/bf16 on a 99 KB part takes the generic kernel.
    EXPECT_EQ(emu.last_generic, c.max_smem < 110 * 1024 && c.head_dim == 256 &&
                                    c.cache == DType::kI32 && c.dt != DType::kF32);
    const Outputs r = run(*cpu, s, args, sc.lse);
    compare(s, g, r, sc.name);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Emu, EmulatedAttention,
    ::testing::Values(
        EmuCase{DType::kBF16, 128, 8}, EmuCase{DType::kBF16, 256, 4}, EmuCase{DType::kF16, 80, 1},
        EmuCase{DType::kF16, 64, 4}, EmuCase{DType::kF32, 96, 8}, EmuCase{DType::kF32, 256, 1},
        EmuCase{DType::kF32, 64, 4}, EmuCase{DType::kBF16, 96, 1}, EmuCase{DType::kF16, 64, 24},
        // FP8 pages, widened to f16/bf16 tiles: both formats,
        // both query dtypes, both tile sizes, per-head scales.
        EmuCase{DType::kBF16, 128, 8, DType::kFp8E4m3},
        EmuCase{DType::kF16, 64, 4, DType::kFp8E4m3}, EmuCase{DType::kF16, 256, 1, DType::kFp8E4m3},
        EmuCase{DType::kBF16, 80, 4, DType::kFp8E5m2},
        EmuCase{DType::kF16, 128, 8, DType::kFp8E5m2},
        // An sm_86/sm_89 part (99 KB per block): head dim 256 falls back
        // to the generic kernel, which must fit.
        EmuCase{DType::kF16, 256, 4, DType::kI32, 99 * 1024}),
    [](const ::testing::TestParamInfo<EmuCase>& i) {
      const std::string cache =
          i.param.cache == DType::kI32 ? "" : std::string("_") + dtype_name(i.param.cache);
      return std::string(dtype_name(i.param.dt)) + "_D" + std::to_string(i.param.head_dim) + "_G" +
             std::to_string(i.param.group) + cache +
             (i.param.max_smem == SIZE_MAX
                  ? ""
                  : "_smem" + std::to_string(i.param.max_smem >> 10) + "k");
    });

TEST(EmulatedKernels, WriteCopySwapMatchCpuBackend) {
  EmuBackend emu;
  emu.grid_y_cap = 3;  // 4 planes: CTAs of blockIdx.y 0 also move plane 3
  auto cpu = pagedkv::make_cpu_backend(1);
  std::mt19937_64 rng(5);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int pad : {0, 4, 2, 1}) {
      if (dt == DType::kF32 && pad == 1) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " pad " + std::to_string(pad));
      const int hkv = 2, D = 64, bs = 8, nb = 20, layers = 2;
      const pagedkv::KvLayout lay{nb, hkv, bs, D, dt};
      const size_t bytes = lay.layer_bytes() * 2 * layers;
      std::vector<uint8_t> init(bytes);
      for (uint8_t& x : init) x = uint8_t(rng());
      KvArena a{emu.allocate(bytes), layers, lay}, b{cpu->allocate(bytes), layers, lay};
      std::memcpy(a.base, init.data(), bytes);
      std::memcpy(b.base, init.data(), bytes);
      // write: every other token padding, slots in shuffled blocks
      std::vector<int32_t> ids(nb - 1);
      std::iota(ids.begin(), ids.end(), 1);
      std::shuffle(ids.begin(), ids.end(), rng);
      const int64_t T = 23, s0 = int64_t(hkv) * D + pad;
      std::vector<int64_t> slots(T);
      for (int64_t t = 0; t < T; ++t) slots[t] = t % 4 == 1 ? -1 : int64_t(ids[t % 9]) * bs + t / 9;
      const auto k = encode(uniform(rng, size_t(T * s0), -1.f, 1.f), dt);
      const auto v = encode(uniform(rng, size_t(T * s0), -1.f, 1.f), dt);
      pagedkv::PlanView plan{};
      plan.num_tokens = T;
      plan.slot_mapping = slots.data();
      auto t3 = [&](const std::vector<uint8_t>& x) {
        return pagedkv::Tensor3{const_cast<uint8_t*>(x.data()), dt, T, hkv, D, s0, D};
      };
      emu.write(a, 1, plan, t3(k), t3(v), nullptr);
      cpu->write(b, 1, plan, t3(k), t3(v), nullptr);
      ASSERT_EQ(0, std::memcmp(a.base, b.base, bytes)) << "write";
      // copy: disjoint sources and destinations
      std::vector<int32_t> src(ids.begin(), ids.begin() + 6),
          dst(ids.begin() + 10, ids.begin() + 16);
      emu.copy_blocks(a, src.data(), dst.data(), 6, nullptr);
      cpu->copy_blocks(b, src.data(), dst.data(), 6, nullptr);
      ASSERT_EQ(0, std::memcmp(a.base, b.base, bytes)) << "copy";
      // swap out, then in to other blocks
      const size_t host_bytes = 5 * lay.block_bytes() * 2 * layers;
      std::vector<uint8_t> ha(host_bytes), hb(host_bytes);
      emu.swap(a, ids.data() + 1, 5, ha.data(), true, nullptr);
      cpu->swap(b, ids.data() + 1, 5, hb.data(), true, nullptr);
      ASSERT_EQ(ha, hb) << "swap out";
      emu.swap(a, ids.data() + 12, 5, ha.data(), false, nullptr);
      cpu->swap(b, ids.data() + 12, 5, hb.data(), false, nullptr);
      ASSERT_EQ(0, std::memcmp(a.base, b.base, bytes)) << "swap in";
      emu.deallocate(a.base);
      cpu->deallocate(b.base);
    }
  }
  EXPECT_EQ(emu.units_seen, 16 | 8 | 4 | 2) << "every access width was exercised";
  EXPECT_EQ(pkv_emu::state().errors, 0) << pkv_emu::state().first_error;
}

// The quantising write of FP8 pools: every stored code equals the CPU
// backend's (x / per-head scale, RNE, saturating, NaN kept) for f32, f16 and
// bf16 inputs, padded strides and values beyond the formats' range; copy and
// swap move the codes unchanged.
TEST(EmulatedKernels, Fp8WriteCopySwapMatchCpuBackend) {
  EmuBackend emu;
  emu.grid_y_cap = 3;
  auto cpu = pagedkv::make_cpu_backend(1);
  std::mt19937_64 rng(11);
  for (DType fmt : {DType::kFp8E4m3, DType::kFp8E5m2}) {
    for (DType in : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(dtype_name(fmt)) + " from " + dtype_name(in));
      const int hkv = 3, D = 64, bs = 16, nb = 12, layers = 2;
      const pagedkv::KvLayout lay{nb, hkv, bs, D, fmt};
      const size_t planes = lay.layer_bytes() * 2 * layers;
      const size_t at = KvArena::scales_offset(planes);
      const size_t bytes = at + sizeof(float) * 2 * layers * hkv;
      std::vector<uint8_t> init(bytes);
      for (uint8_t& x : init) x = uint8_t(rng());
      const std::vector<float> scales = uniform(rng, size_t(2) * layers * hkv, 0.01f, 4.f);
      std::memcpy(&init[at], scales.data(), scales.size() * sizeof(float));
      void* ea = emu.allocate(bytes);
      void* eb = cpu->allocate(bytes);
      std::memcpy(ea, init.data(), bytes);
      std::memcpy(eb, init.data(), bytes);
      KvArena a{ea, layers, lay, reinterpret_cast<const float*>(static_cast<char*>(ea) + at)};
      KvArena b{eb, layers, lay, reinterpret_cast<const float*>(static_cast<char*>(eb) + at)};
      std::vector<int32_t> ids(nb - 1);
      std::iota(ids.begin(), ids.end(), 1);
      std::shuffle(ids.begin(), ids.end(), rng);
      const int64_t T = 37, s0 = int64_t(hkv) * D + 8;
      std::vector<int64_t> slots(T);
      for (int64_t t = 0; t < T; ++t) slots[t] = t % 5 == 3 ? -1 : int64_t(ids[t % 7]) * bs + t / 7;
      // Magnitudes from 1e-6 (subnormal codes) to 1e6 (saturation), a few
      // NaN and infinities.
      auto values = [&] {
        std::vector<float> x = uniform(rng, size_t(T * s0), -1.f, 1.f);
        std::uniform_real_distribution<float> ex(-6.f, 6.f);
        for (float& f : x) f *= std::pow(10.f, ex(rng));
        for (size_t i = 5; i < x.size(); i += 101) x[i] = std::nanf("");
        for (size_t i = 9; i < x.size(); i += 103) x[i] = i % 2 ? INFINITY : -INFINITY;
        return encode(x, in);
      };
      const auto k = values(), v = values();
      pagedkv::PlanView plan{};
      plan.num_tokens = T;
      plan.slot_mapping = slots.data();
      auto t3 = [&](const std::vector<uint8_t>& x) {
        return pagedkv::Tensor3{const_cast<uint8_t*>(x.data()), in, T, hkv, D, s0, D};
      };
      emu.write(a, 1, plan, t3(k), t3(v), nullptr);
      cpu->write(b, 1, plan, t3(k), t3(v), nullptr);
      ASSERT_EQ(0, std::memcmp(ea, eb, bytes)) << "write";
      ASSERT_NE(0, std::memcmp(ea, init.data(), bytes)) << "the write stored codes";
      std::vector<int32_t> src(ids.begin(), ids.begin() + 4),
          dst(ids.begin() + 6, ids.begin() + 10);
      emu.copy_blocks(a, src.data(), dst.data(), 4, nullptr);
      cpu->copy_blocks(b, src.data(), dst.data(), 4, nullptr);
      ASSERT_EQ(0, std::memcmp(ea, eb, bytes)) << "copy";
      const size_t host_bytes = 3 * lay.block_bytes() * 2 * layers;
      std::vector<uint8_t> ha(host_bytes), hb(host_bytes);
      emu.swap(a, ids.data() + 1, 3, ha.data(), true, nullptr);
      cpu->swap(b, ids.data() + 1, 3, hb.data(), true, nullptr);
      ASSERT_EQ(ha, hb) << "swap out";
      emu.swap(a, ids.data() + 7, 3, ha.data(), false, nullptr);
      cpu->swap(b, ids.data() + 7, 3, hb.data(), false, nullptr);
      ASSERT_EQ(0, std::memcmp(ea, eb, bytes)) << "swap in";
      emu.deallocate(ea);
      cpu->deallocate(eb);
    }
  }
  EXPECT_EQ(pkv_emu::state().errors, 0) << pkv_emu::state().first_error;
}

// A step whose sequences times the row tiles of its longest query exceed
// gridDim.x's 2^31 - 1 is refused by the planner (the launch computes the
// grid in 32 bits: past 2^32 it wrapped and left most outputs unwritten).
TEST(EmulatedKernels, PlannerRefusesMoreCtasThanTheGridHolds) {
  const pagedkv::KvLayout lay{64, 1, 16, 128, pagedkv::DType::kBF16};
  uint8_t byte = 0;  // never read: planning only
  KvArena arena{&byte, 1, lay};
  pagedkv::AttentionArgs args{0.1f, 0, 0.f, nullptr, 0};
  auto plan_for = [&](int32_t num_seqs, int32_t max_query) {
    pagedkv::PlanView plan{};
    plan.num_seqs = num_seqs;
    plan.num_tokens = int64_t(num_seqs) - 1 + max_query;
    plan.max_query = max_query;
    plan.max_context = max_query;
    const pagedkv::Tensor3 t{&byte, pagedkv::DType::kBF16, plan.num_tokens, 64, 128, 64 * 128, 128};
    return cu::plan_attention(arena, 0, plan, t, t, args, /*sm_count=*/132);
  };
  // 2^20 sequences, one of them a 2^16-token chunk, 64 q heads per KV head:
  // 2^22 rows of that query per KV head, 2^20 x tiles CTAs.
  try {
    plan_for(1 << 20, 1 << 16);
    FAIL() << "planned a grid past 2^31 - 1 blocks";
  } catch (const pagedkv::Error& e) {
    EXPECT_EQ(e.code(), pagedkv::Errc::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("split the step"), std::string::npos) << e.what();
  }
  // An ordinary step still plans, with the tile count it launches.
  const cu::AttnPlan ok = plan_for(1024, 64);
  EXPECT_GT(ok.params.tiles_per_seq, 0);
  EXPECT_LE(int64_t(1024) * ok.params.tiles_per_seq, int64_t(INT32_MAX));
}

}  // namespace
}  // namespace pkvtest
