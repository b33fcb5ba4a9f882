// CUDA cache write and paged attention against the CPU backend (the
// reference semantics, impl/cpu/attention.h) on the same random inputs:
// dtypes x head dims x GQA groups, and per combination decode, prefill,
// chunked prefill mixed with decode, sliding window (with null pages),
// soft-cap with a custom scale, LSE, block sizes 8..64, forced or
// heuristic split-KV, V near the dtype's largest value (f32/bf16: an
// unnormalised f32 P V or split merge would overflow) and at it (the
// normalisation must not round the result past it to inf). Pages are a random
// permutation of the pool's blocks; unused slots, the null block and the
// outputs are NaN-poisoned; every output element and every arena byte is
// compared.
#include "attention_cases.h"
#include "launch.h"

namespace pkvtest {
namespace {

using Param = std::tuple<DType, int, int>;  // dtype, head dim, GQA group

class AttentionMatrix : public ::testing::TestWithParam<Param> {};

// Every scenario on the GPU and the CPU backend, compared (cache: the
// pool's dtype, FP8 when it differs from q's).
void scenarios_match(DType dt, int D, int group, std::mt19937_64& rng, DType cache) {
  auto gpu = pagedkv::make_cuda_backend(0);
  auto cpu = pagedkv::make_cpu_backend(0);
  for (const Scenario& sc : scenarios(rng)) {
    if (!applies(sc, cache)) continue;
    SCOPED_TRACE(sc.name);
    const Inputs s = build(sc, dt, D, 2, group, rng, cache);
    AttentionArgs args{};
    args.softmax_scale = sc.scale > 0.f ? sc.scale : 1.f / std::sqrt(float(D));
    args.sliding_window = sc.window;
    args.logit_softcap = sc.softcap;
    pagedkv::cuda::set_forced_splits(sc.splits);
    const Outputs g = run(*gpu, s, args, sc.lse);
    pagedkv::cuda::set_forced_splits(0);
    const Outputs c = run(*cpu, s, args, sc.lse);
    compare(s, g, c, sc.name);
  }
}

TEST_P(AttentionMatrix, MatchesCpuBackend) {
  PKV_SKIP_WITHOUT_GPU();
  const DType dt = std::get<0>(GetParam());
  const int D = std::get<1>(GetParam());
  const int group = std::get<2>(GetParam());
  std::mt19937_64 rng(uint64_t(D) * 1000003u + uint64_t(group) * 101u + uint64_t(dt));
  scenarios_match(dt, D, group, rng, dt);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::ostringstream o;
  o << dtype_name(std::get<0>(info.param)) << "_D" << std::get<1>(info.param) << "_G"
    << std::get<2>(info.param);
  return o.str();
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, AttentionMatrix,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(64, 80, 96, 128, 256), ::testing::Values(1, 4, 8)),
    param_name);

// FP8 pages (E4M3, E5M2) read with f16 and bf16 queries: the quantising
// write must store the CPU backend's codes byte for byte (saturation
// included), and attention over them match the CPU's FP8 kernels, every
// scenario, every head dim.
using Fp8Param = std::tuple<DType, DType, int, int>;  // cache, q dtype, head dim, group

class Fp8AttentionMatrix : public ::testing::TestWithParam<Fp8Param> {};

TEST_P(Fp8AttentionMatrix, MatchesCpuBackend) {
  PKV_SKIP_WITHOUT_GPU();
  const DType cache = std::get<0>(GetParam());
  const DType dt = std::get<1>(GetParam());
  const int D = std::get<2>(GetParam());
  const int group = std::get<3>(GetParam());
  std::mt19937_64 rng(uint64_t(D) * 7u + uint64_t(group) * 1009u + uint64_t(cache) * 13u +
                      uint64_t(dt));
  scenarios_match(dt, D, group, rng, cache);
}

INSTANTIATE_TEST_SUITE_P(Cuda, Fp8AttentionMatrix,
                         ::testing::Combine(::testing::Values(DType::kFp8E4m3, DType::kFp8E5m2),
                                            ::testing::Values(DType::kF16, DType::kBF16),
                                            ::testing::Values(64, 80, 96, 128, 256),
                                            ::testing::Values(1, 8)),
                         [](const ::testing::TestParamInfo<Fp8Param>& info) {
                           std::ostringstream o;
                           o << dtype_name(std::get<0>(info.param)) << "_"
                             << dtype_name(std::get<1>(info.param)) << "_D"
                             << std::get<2>(info.param) << "_G" << std::get<3>(info.param);
                           return o.str();
                         });

// MQA with a group larger than one CTA's 16 decode rows, and G = 1 prefill
// on many heads: tiles that split a group across CTAs.
TEST(AttentionShapes, WideGroupsAndManyHeads) {
  PKV_SKIP_WITHOUT_GPU();
  auto gpu = pagedkv::make_cuda_backend(0);
  auto cpu = pagedkv::make_cpu_backend(0);
  std::mt19937_64 rng(7);
  for (const auto& shape :
       {std::make_tuple(1, 24, DType::kBF16), std::make_tuple(1, 40, DType::kF16),
        std::make_tuple(8, 1, DType::kF32)}) {
    const int hkv = std::get<0>(shape), group = std::get<1>(shape);
    const DType dt = std::get<2>(shape);
    Scenario sc{"shape", 16, {{260, 1}, {50, 9}, {31, 31}}};
    SCOPED_TRACE(std::to_string(hkv) + "x" + std::to_string(group));
    const Inputs s = build(sc, dt, 128, hkv, group, rng);
    AttentionArgs args{};
    args.softmax_scale = 1.f / std::sqrt(128.f);
    const Outputs g = run(*gpu, s, args, true);
    const Outputs c = run(*cpu, s, args, true);
    compare(s, g, c, "shape");
  }
}

}  // namespace
}  // namespace pkvtest
