// The CUDA MLA kernels (cuda/mla.cuh), unchanged, run on the CPU through
// cuda/emulation.h and compared with the CPU MLA kernels (impl/cpu/mla.h,
// themselves checked against a float64 reference in
// tests/kernels/mla_test.cpp): random latents, pages in a random permutation,
// NaN in every slot no token owns, decode / prefill / chunked prefill in one
// plan, every output element and LSE checked; the write kernel bit-exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "../kernels/test_util.h"
#include "cpu/mla.h"
#include "cpu/thread_pool.h"
#include "mla_plan.h"

// The kernel header last: the emulation defines threadIdx and friends.
#define PKV_CUDA_EMULATION 1
#include "mla.cuh"

PKV_EMU_DEFINE_SWITCH

namespace {

using pagedkv::DType;
using pagedkv::KvArena;
using pagedkv::KvLayout;
using pagedkv::PlanView;
using pagedkv::Tensor3;
using pagedkv::test::Buffer;
namespace cu = pagedkv::cuda;

struct Seq {
  int32_t len, nq;
};

struct MlaCase {
  const char* name;
  int32_t bs, heads, rank, rope;
  std::vector<Seq> seqs;
  // Latents of magnitude [1/4, 1/2] of the dtype's largest value, one sign
  // per even dim (an unnormalised f32 sum of p c overflows after a few
  // keys; the output, a convex combination, is finite); q_latent 0 but for
  // dim 0, sized for logits of a few units.
  bool near_max = false;
  // Every latent element exactly the dtype's largest finite value, one sign
  // per dim (the output, a convex combination of equal values, is exactly
  // that value: the normalisation's rounding must not carry it to inf);
  // q_latent and keys as near_max.
  bool at_max = false;
};

void run_case(const MlaCase& c, DType t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto value = [&] {
    float x = 0;
    while (std::fabs(x) < 1e-3f) x = u(rng);
    return x;
  };
  const bool big = c.near_max || c.at_max;
  const float top = t == DType::kF32    ? std::numeric_limits<float>::max()
                    : t == DType::kBF16 ? 3.3895314e38f
                                        : 65504.0f;
  const float vmag = !big ? 1.0f : c.at_max ? top : 0.5f * top;
  const float scale = 0.09f;
  // Element i of a row: latent dim i < rank, else rope; q rows likewise.
  auto row_value = [&](int32_t i, bool query) {
    const float x = value();
    if (!big) return x;
    if (i >= c.rank) return 0.25f * x;
    if (query) return i == 0 ? (x < 0 ? -4.0f : 4.0f) / (scale * vmag) : 0.0f;
    if (c.at_max) return i % 3 != 1 ? vmag : -vmag;
    const float m = (1.0f + std::fabs(x)) * 0.5f * vmag;
    return i % 2 == 0 || x > 0 ? m : -m;
  };
  const int32_t D = c.rank + c.rope;
  int32_t pages_total = 0;
  int64_t n = 0;
  for (const Seq& s : c.seqs) {
    pages_total += (s.len + c.bs - 1) / c.bs;
    n += s.nq;
  }
  const int32_t nb = pages_total + 2;
  const int64_t plane_elems = int64_t(nb) * c.bs * D;
  const size_t es = pagedkv::dtype_size(t);
  Buffer cache(size_t(plane_elems) * es);
  pagedkv::test::fill_nan(cache.data(), t, plane_elems);
  std::vector<int32_t> ids(size_t(nb - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> qptr{0}, pptr{0}, pages, last, ctx;
  std::vector<int64_t> slots;
  size_t next = 0;
  for (const Seq& s : c.seqs) {
    const int32_t np = (s.len + c.bs - 1) / c.bs;
    for (int32_t i = 0; i < np; ++i) pages.push_back(ids[next++]);
    for (int32_t p = 0; p < s.len; ++p) {
      const int64_t slot = int64_t(pages[size_t(pptr.back() + p / c.bs)]) * c.bs + p % c.bs;
      if (p >= s.len - s.nq) {
        slots.push_back(slot);
      } else {
        for (int32_t d = 0; d < D; ++d)
          pagedkv::test::store(cache.data(), t, slot * D + d, row_value(d, false));
      }
    }
    qptr.push_back(qptr.back() + s.nq);
    pptr.push_back(pptr.back() + np);
    last.push_back(s.len - (np - 1) * c.bs);
    ctx.push_back(s.len);
  }
  PlanView plan{};
  plan.num_seqs = int32_t(c.seqs.size());
  plan.num_tokens = n;
  plan.slot_mapping = slots.data();
  plan.query_indptr = qptr.data();
  plan.page_indptr = pptr.data();
  plan.page_indices = pages.data();
  plan.last_page_len = last.data();
  plan.context_lens = ctx.data();
  for (const Seq& s : c.seqs) {
    plan.max_query = std::max(plan.max_query, s.nq);
    plan.max_context = std::max(plan.max_context, s.len);
  }
  // Rows of w elements, the first at element offset `first` of a row_value row.
  auto fill = [&](Buffer& b, int64_t elems, int32_t w, int32_t first, bool query) {
    b = Buffer(size_t(std::max<int64_t>(elems, 1)) * es);
    for (int64_t i = 0; i < elems; ++i)
      pagedkv::test::store(b.data(), t, i, row_value(first + int32_t(i % w), query));
  };
  Buffer kv_c, k_pe, ql, qp;
  fill(kv_c, n * c.rank, c.rank, 0, false);
  fill(k_pe, n * c.rope, std::max(c.rope, 1), c.rank, false);
  fill(ql, n * c.heads * c.rank, c.rank, 0, true);
  fill(qp, n * c.heads * c.rope, std::max(c.rope, 1), c.rank, true);

  KvArena arena{};
  arena.num_layers = 1;
  arena.planes_per_layer = 1;
  arena.layout = KvLayout{nb, 1, c.bs, D, t};
  Tensor3 c3{kv_c.data(), t, n, 1, c.rank, c.rank, c.rank};
  Tensor3 p3{k_pe.data(), t, n, 1, c.rope, c.rope, c.rope};

  // The write: the emulated kernel into one copy, the CPU kernel into another.
  Buffer emu_cache(size_t(plane_elems) * es);
  std::memcpy(emu_cache.data(), cache.data(), size_t(plane_elems) * es);
  pagedkv::ThreadPool pool(2);
  const pagedkv::cpu::MlaCache cpu_cache{cache.data(), nb, c.bs, c.rank, c.rope, t};
  pagedkv::cpu::mla_write(pool, cpu_cache, plan, c3, p3);
  arena.base = emu_cache.data();
  const cu::MlaWriteParams wp = cu::mla_write_params(arena, 0, plan, c3, p3);
  pkv_emu::launch(dim3(unsigned(n)), dim3(128), 0, [&] {
    if (es == 4) {
      cu::mla_write_kernel<uint32_t>(wp);
    } else {
      cu::mla_write_kernel<uint16_t>(wp);
    }
  });
  ASSERT_EQ(0, std::memcmp(emu_cache.data(), cache.data(), size_t(plane_elems) * es))
      << c.name << ": the emulated write differs from the CPU write";

  // Attention over the written cache.
  const int64_t n_out = n * c.heads * c.rank;
  Buffer out_cpu(size_t(n_out) * es), out_emu(size_t(n_out) * es);
  pagedkv::test::fill_nan(out_cpu.data(), t, n_out);
  pagedkv::test::fill_nan(out_emu.data(), t, n_out);
  std::vector<float> lse_cpu(size_t(n * c.heads), NAN), lse_emu(size_t(n * c.heads), NAN);
  Tensor3 q3{ql.data(), t, n, c.heads, c.rank, c.heads * c.rank, c.rank};
  Tensor3 qp3{qp.data(), t, n, c.heads, c.rope, c.heads * c.rope, c.rope};
  Tensor3 o_cpu{out_cpu.data(), t, n, c.heads, c.rank, c.heads * c.rank, c.rank};
  Tensor3 o_emu{out_emu.data(), t, n, c.heads, c.rank, c.heads * c.rank, c.rank};
  pagedkv::AttentionArgs args{};
  args.softmax_scale = scale;
  args.lse = lse_cpu.data();
  args.lse_stride0 = c.heads;
  pagedkv::cpu::mla_attend(pool, pagedkv::cpu::mla_ops_scalar(), cpu_cache, plan, q3, qp3, o_cpu,
                           args);
  args.lse = lse_emu.data();
  const cu::MlaParams ap = cu::mla_attention_params(arena, 0, plan, q3, qp3, o_emu, args);
  pkv_emu::launch(dim3(unsigned(n), unsigned(c.heads)), dim3(cu::kMlaThreads),
                  cu::mla_smem_bytes(c.rank, c.rope), [&] {
                    if (t == DType::kF32) {
                      cu::mla_attention_kernel<float>(ap);
                    } else if (t == DType::kF16) {
                      cu::mla_attention_kernel<__half>(ap);
                    } else {
                      cu::mla_attention_kernel<__nv_bfloat16>(ap);
                    }
                  });
  // Both are f32 computations of the same sums in different orders; the
  // outputs round to the cache dtype.
  const double eps = t == DType::kF32 ? 0 : t == DType::kF16 ? 1.0 / 1024 : 1.0 / 128;
  // near_max, at_max: the sums' rounding scales with the latents.
  for (int64_t i = 0; i < n_out; ++i) {
    const double a = pagedkv::test::load(out_emu.data(), t, i);
    const double b = pagedkv::test::load(out_cpu.data(), t, i);
    ASSERT_TRUE(std::isfinite(a) && std::isfinite(b))
        << c.name << " out[" << i << "]: emulated " << a << ", CPU " << b;
    ASSERT_LE(std::fabs(a - b), 2e-5 * vmag + 1e-4 * std::fabs(b) + eps * std::fabs(b))
        << c.name << " out[" << i << "]: emulated " << a << ", CPU " << b;
  }
  for (size_t i = 0; i < lse_cpu.size(); ++i)
    ASSERT_NEAR(lse_emu[i], lse_cpu[i], 1e-4 + 1e-5 * std::fabs(lse_cpu[i])) << c.name << " " << i;
}

const MlaCase kCases[] = {
    {"mixed", 4, 3, 64, 16, {{9, 1}, {7, 3}, {5, 5}}},
    {"deepseek_dims_decode", 16, 2, 512, 64, {{40, 1}, {17, 2}}},
    {"long_keys", 8, 1, 40, 8, {{70, 2}}},
    {"no_rope", 2, 2, 32, 0, {{5, 5}, {3, 1}}},
    {"latents_near_max", 8, 2, 64, 16, {{45, 1}, {30, 10}, {2, 1}}, true},
    // Last, so that the cases above keep their seeds.
    {"latents_at_max", 8, 2, 64, 16, {{45, 1}, {30, 10}, {2, 1}, {90, 3}}, false, true},
};

TEST(MlaEmulation, MatchesCpuKernels) {
  uint32_t seed = 11;
  for (const MlaCase& c : kCases)
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(c.name) + " " + pagedkv::test::dtype_name(t));
      run_case(c, t, seed++);
      if (HasFatalFailure()) return;
    }
  EXPECT_EQ(pkv_emu::state().errors, 0) << pkv_emu::state().first_error;
}

}  // namespace
