// A randomised differential of the CUDA paged attention kernels and their
// host-side planner (cuda/plan.h), run on the CPU through cuda/emulation.h,
// against an independent float64 reference written here (not the CPU
// backend's kernels). Each iteration draws a shape the planner accepts: any
// supported head dim and cache dtype (FP8 with per-head scales under f16 and
// bf16 queries), odd and large block sizes, GQA groups 1..16 and MQA,
// batches mixing decode rows, short multi-token queries and long prefill
// chunks, contexts past the split-KV thresholds (heuristic over a random SM
// count, or forced splits), sliding windows of 1, of the block size and past
// the context, soft-cap, softmax scales, LSE with a padded stride, random page
// permutations with pages shared between sequences, null pages before the
// window and NaN in every slot no query may read. Every output element and
// LSE value is compared with tolerances derived from the dtypes (the logits'
// f32 rounding bound, P rounded to the tile dtype, the output's rounding).
// The planner's refusals are checked to be clean errors.
//
// Default: PKV_EMU_RANDOM_ITERS iterations (40) from PKV_EMU_RANDOM_SEED (1),
// contexts up to PKV_EMU_RANDOM_MAX_CTX (2400) keys; set them for longer runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "plan.h"

// The kernel headers last: the emulation defines threadIdx and friends.
#define PKV_CUDA_EMULATION 1
#include "attention.cuh"

PKV_EMU_DEFINE_SWITCH

namespace pkvtest {
namespace {

namespace cu = pagedkv::cuda;
using pagedkv::AttentionArgs;
using pagedkv::KvArena;
using pagedkv::KvLayout;
using pagedkv::PlanView;
using pagedkv::Tensor3;

long env_long(const char* name, long dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : dflt;
}

// ------------------------------------------------------------ kernels

// Dynamic shared memory of the instantiation the launch ran (compared with
// the planner's smem_bytes).
size_t g_kernel_smem = 0;

template <typename T, int D, int ROWS, typename S>
void emu_rows(const cu::AttnParams& p, const cu::AttnLaunch& l) {
  constexpr int KT = cu::kv_tile<T, D>();
  using L = cu::AttnSmem<T, D, ROWS, KT, cu::IsFp8<S>::value>;
  g_kernel_smem = L::kBytes;
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

template <typename T, int D, bool kDecode>
void emu_mma(const cu::AttnParams& p, const cu::AttnLaunch& l) {
  g_kernel_smem = cu::MmaSmem<T, D, kDecode>::kBytes;
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

// The same dispatch as cuda/attention.cuh's launch_attention_dim.
template <typename T, int D, typename S>
void emu_dim(const cu::AttnParams& p, const cu::AttnLaunch& l) {
  if constexpr (cu::uses_mma_kernel<T, S>()) {
    if constexpr (D == 256) {
      if (l.generic) {
        return l.large_tile ? emu_rows<T, D, cu::large_rows(2, D), S>(p, l)
                            : emu_rows<T, D, cu::kSmallRows, S>(p, l);
      }
    }
    return l.large_tile ? emu_mma<T, D, false>(p, l) : emu_mma<T, D, true>(p, l);
  } else {
    constexpr int kLarge = cu::large_rows(int(sizeof(T)), D);
    return l.large_tile ? emu_rows<T, D, kLarge, S>(p, l) : emu_rows<T, D, cu::kSmallRows, S>(p, l);
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

void dispatch(DType cache, DType io, const cu::AttnParams& p, const cu::AttnLaunch& l) {
  const bool bf = io == DType::kBF16;
  switch (cache) {
    case DType::kFp8E4m3:
      return bf ? emu_attention<__nv_bfloat16, cu::Fp8E4m3>(p, l)
                : emu_attention<__half, cu::Fp8E4m3>(p, l);
    case DType::kFp8E5m2:
      return bf ? emu_attention<__nv_bfloat16, cu::Fp8E5m2>(p, l)
                : emu_attention<__half, cu::Fp8E5m2>(p, l);
    case DType::kF32:
      return emu_attention<float>(p, l);
    case DType::kF16:
      return emu_attention<__half>(p, l);
    default:
      return emu_attention<__nv_bfloat16>(p, l);
  }
}

// ------------------------------------------------------------ values

double decode_elt(const uint8_t* p, DType t) {
  if (t == DType::kFp8E4m3) return pagedkv::fp8_to_f32<pagedkv::kFp8E4m3>(*p);
  if (t == DType::kFp8E5m2) return pagedkv::fp8_to_f32<pagedkv::kFp8E5m2>(*p);
  return decode_one(p, t);
}

// Unit roundoff of a dtype's rounding (to nearest).
double unit_roundoff(DType t) {
  return t == DType::kF32 ? 0x1p-24 : t == DType::kF16 ? 0x1p-11 : 0x1p-8;
}

// A value of magnitude in [mag/8, mag], random sign, never zero after
// rounding to t (mag within t's normal range).
float nonzero(std::mt19937_64& rng, float mag) {
  std::uniform_real_distribution<float> u(0.125f, 1.f);
  const float x = u(rng) * mag;
  return rng() & 1 ? x : -x;
}

// ------------------------------------------------------------ one case

// The longest context drawn (PKV_EMU_RANDOM_MAX_CTX; up to 64 splits of 256
// keys need 16384).
int g_max_ctx = 2400;

struct Case {
  DType cache = DType::kBF16, io = DType::kBF16;
  int D = 128, hkv = 1, group = 1, bs = 16;
  std::vector<int> ctx, nq;
  int shared_pages = 0;  // pages every sequence shares with sequence 0
  int window = 0;
  float softcap = 0.f, scale = 0.f;
  bool lse = false;
  int lse_pad = 0;
  int splits = 0;  // forced, 0 = heuristic
  int sm_count = 132;
  size_t max_smem = SIZE_MAX;
  float qmag = 1.f, kmag = 1.f, vmag = 1.f;
  int64_t q_pad = 0, q_head_pad = 0, o_pad = 0;
  // Per sequence: a position among its queries whose new V (and K, with
  // poison_k) is NaN, or -1. The rows that see it are NaN (LSE too when K
  // is); every other row must be exact: a partly visible tile zeroes the
  // value for the rows that must not see it and adds it back for the rest.
  std::vector<int> poison;
  bool poison_k = false;

  std::string describe() const {
    std::ostringstream s;
    s << dtype_name(cache) << "/" << dtype_name(io) << " D" << D << " hkv" << hkv << " G" << group
      << " bs" << bs << " seqs";
    for (size_t i = 0; i < ctx.size(); ++i) s << " " << nq[i] << "/" << ctx[i];
    if (!poison.empty() && *std::max_element(poison.begin(), poison.end()) >= 0) {
      s << " poison" << (poison_k ? "KV" : "V");
      for (int x : poison) s << " " << x;
    }
    s << " shared" << shared_pages << " W" << window << " cap" << softcap << " scale" << scale
      << (lse ? " lse" : "") << " splits" << splits << " sms" << sm_count << " smem"
      << (max_smem == SIZE_MAX ? -1 : int64_t(max_smem)) << " mag q" << qmag << " k" << kmag << " v"
      << vmag;
    return s.str();
  }
};

Case draw(std::mt19937_64& rng) {
  auto pick = [&](auto... v) {
    const std::vector<std::common_type_t<decltype(v)...>> xs{v...};
    return xs[rng() % xs.size()];
  };
  auto between = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Case c;
  c.cache = pick(DType::kF32, DType::kF16, DType::kBF16, DType::kBF16, DType::kF16, DType::kFp8E4m3,
                 DType::kFp8E5m2);
  c.io = pagedkv::is_fp8(c.cache) ? pick(DType::kF16, DType::kBF16) : c.cache;
  c.D = pick(64, 80, 96, 128, 256);
  c.bs = pick(1, 2, 3, 5, 7, 8, 13, 16, 16, 31, 32, 64, 100, 128, 256, 512, 1024);
  c.group = between(1, 16);
  c.hkv = pick(1, 1, 2, 3, 4);
  if (rng() % 8 == 0) c.hkv = 1, c.group = pick(24, 32);  // MQA, wider than a CTA
  const int nseq = between(1, 5);
  // Shapes: decode, a few queries (speculative / short chunks), long
  // prefill chunks; one long context in some cases (split-KV).
  const bool long_ctx = rng() % 3 == 0;
  // Some batches whose every query group fits the decode tile (16 rows):
  // decode, and speculative / short chunks of several positions.
  const bool decode_tile = rng() % 3 == 0;
  if (decode_tile && c.group > 8) c.group = between(1, 8);
  for (int i = 0; i < nseq; ++i) {
    const int kind = between(0, 3);
    int ctx = between(1, 300);
    if (long_ctx && i == 0) ctx = between(600, g_max_ctx);
    int n = 1;
    if (kind == 1) n = between(2, 16);
    if (kind == 2) n = between(17, 160);
    if (kind == 3) n = ctx;  // a whole prefill
    if (decode_tile) n = between(1, std::max(1, 16 / c.group));
    n = std::min({n, ctx, 200});
    c.ctx.push_back(ctx);
    c.nq.push_back(n);
  }
  // Work bound (emulated threads are slow): rows x keys x D.
  auto work = [&] {
    double w = 0;
    for (size_t i = 0; i < c.ctx.size(); ++i)
      w += double(c.nq[i]) * c.group * c.hkv * (c.ctx[i] + 64) * c.D;
    return w;
  };
  while (work() > 6e7 * std::max(1.0, g_max_ctx / 2400.0)) {
    for (size_t i = 0; i < c.ctx.size(); ++i) {
      c.nq[i] = std::max(1, c.nq[i] / 2);
      if (c.nq[i] == 1) c.ctx[i] = std::max(1, c.ctx[i] * 3 / 4);
    }
  }
  int min_prefix = INT32_MAX;
  for (size_t i = 0; i < c.ctx.size(); ++i) min_prefix = std::min(min_prefix, c.ctx[i] - c.nq[i]);
  if (nseq > 1 && rng() % 2 == 0) c.shared_pages = between(0, min_prefix / c.bs);
  switch (between(0, 6)) {
    case 0:
      c.window = 1;
      break;
    case 1:
      c.window = c.bs;
      break;
    case 2:
      c.window = between(2, 400);
      break;
    case 3:
      c.window = 100000;
      break;
    default:
      c.window = 0;
  }
  if (rng() % 3 == 0) c.softcap = pick(0.5f, 2.f, 5.f, 30.f, 50.f);
  c.scale = rng() % 2 ? 1.f / std::sqrt(float(c.D)) : pick(0.01f, 0.1f, 0.3f, 1.f, 2.5f);
  c.lse = rng() % 2 == 0;
  c.lse_pad = between(0, 3);
  c.splits = rng() % 3 == 0 ? between(2, 9) : 0;
  c.sm_count = pick(1, 4, 16, 132, 1000);
  // An sm_86/sm_89 part (99 KB per block), often at head dim 256 where the
  // f16/bf16 tiles fall back to the generic kernel.
  if (rng() % (c.D == 256 ? 3 : 6) == 0) c.max_smem = 99 * 1024;
  // Magnitudes: ordinary, or large (the logits' scale kept sane by the
  // softmax scale, V near the dtype's range).
  const bool big = rng() % 3 == 0;
  if (pagedkv::is_fp8(c.cache)) {
    c.qmag = big ? 100.f : 2.f;
    if (big) c.scale = 1e-3f;
  } else if (big) {
    const float top = c.cache == DType::kF16 ? 3e4f : 1e30f;
    c.qmag = c.cache == DType::kF16 ? 200.f : 1e4f;
    c.kmag = c.qmag;
    c.vmag = top;
    c.scale = 1.f / (c.qmag * c.kmag * std::sqrt(float(c.D)));
  } else {
    c.qmag = 2.5f;
  }
  const bool poison = rng() % 4 == 0;
  c.poison_k = rng() % 2 == 0;
  for (size_t i = 0; i < c.ctx.size(); ++i) {
    c.poison.push_back(poison ? c.ctx[i] - between(1, c.nq[i]) : -1);
  }
  c.q_pad = between(0, 5);
  c.q_head_pad = between(0, 1) * 3;
  c.o_pad = between(0, 4);
  return c;
}

struct Built {
  KvLayout layout{};
  int layers = 2, layer = 1;
  std::vector<uint8_t> arena;  // planes, then (FP8) scales
  std::vector<float> scales;   // [layer][K/V][hkv]
  std::vector<int32_t> query_indptr{0}, page_indptr{0}, page_indices, last_page_len, context_lens;
  std::vector<int64_t> slot_mapping;
  std::vector<uint8_t> q;
  int64_t q_s0 = 0, q_s1 = 0, o_s0 = 0;
  int64_t num_tokens = 0;
  int max_query = 0, max_context = 0;
};

Built build(const Case& c, std::mt19937_64& rng) {
  Built b;
  const int nseq = int(c.ctx.size());
  std::vector<int> pages(nseq);
  int own = 0;  // sequence 0 may have nulled a page another one shares: no saving
  for (int i = 0; i < nseq; ++i) {
    pages[i] = (c.ctx[i] + c.bs - 1) / c.bs;
    own += pages[i];
  }
  const int num_blocks = own + 3;  // the null block and spares (NaN)
  b.layout = KvLayout{num_blocks, c.hkv, c.bs, c.D, c.cache};
  const size_t es = pagedkv::dtype_size(c.cache);
  const size_t planes = b.layout.layer_bytes() * 2 * size_t(b.layers);
  const size_t scales_at = KvArena::scales_offset(planes);
  b.arena.resize(pagedkv::is_fp8(c.cache) ? scales_at + sizeof(float) * 2 * b.layers * c.hkv
                                          : planes);
  fill_nan(b.arena.data(), planes, c.cache);
  if (pagedkv::is_fp8(c.cache)) {
    b.scales = uniform(rng, size_t(2) * b.layers * c.hkv, 0.01f, 4.f);
    std::memcpy(&b.arena[scales_at], b.scales.data(), b.scales.size() * sizeof(float));
  }
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  std::vector<char> filled(size_t(num_blocks) * c.bs, 0);
  auto random_row = [&](float mag) {
    std::vector<uint8_t> row(size_t(c.D) * es);
    for (int d = 0; d < c.D; ++d) {
      if (c.cache == DType::kFp8E4m3 || c.cache == DType::kFp8E5m2) {
        uint8_t code;
        do {
          code = uint8_t(rng());
        } while ((code & 0x7f) == 0 || (c.cache == DType::kFp8E4m3 && (code & 0x7f) == 0x7f) ||
                 (c.cache == DType::kFp8E5m2 && (code & 0x7f) >= 0x7c));
        row[d] = code;
      } else {
        const std::vector<uint8_t> e = encode({nonzero(rng, mag)}, c.cache);
        std::memcpy(&row[d * es], e.data(), es);
      }
    }
    return row;
  };
  for (int i = 0; i < nseq; ++i) {
    const int first = c.ctx[i] - c.nq[i];
    for (int pg = 0; pg < pages[i]; ++pg) {
      // The pool nulls pages wholly before the window of the step's first query.
      const bool outside = c.window > 0 && (pg + 1) * c.bs - 1 < first - c.window + 1;
      int32_t id;
      if (i > 0 && pg < c.shared_pages && b.page_indices[size_t(pg)] != 0) {
        id = b.page_indices[size_t(pg)];  // sequence 0's page
        if (outside) id = 0;
      } else {
        id = ids[next++];
        if (outside) id = 0;
      }
      b.page_indices.push_back(id);
    }
    const int32_t* table = b.page_indices.data() + b.page_indptr.back();
    for (int pos = 0; pos < c.ctx[i]; ++pos) {
      const int block = table[pos / c.bs];
      if (block == 0) continue;
      char& f = filled[size_t(block) * c.bs + pos % c.bs];
      if (f) continue;  // a shared page, written by sequence 0
      f = 1;
      for (int which = 0; which < 2; ++which) {
        for (int h = 0; h < c.hkv; ++h) {
          const size_t at = (size_t(2) * b.layer + which) * b.layout.layer_bytes() +
                            ((size_t(block) * c.hkv + h) * c.bs + pos % c.bs) * c.D * es;
          std::vector<uint8_t> row = random_row(which == 0 ? c.kmag : c.vmag);
          if (pos == c.poison[size_t(i)] && (which == 1 || c.poison_k))
            fill_nan(row.data(), row.size(), c.cache);
          std::memcpy(&b.arena[at], row.data(), row.size());
        }
      }
    }
    for (int pos = first; pos < c.ctx[i]; ++pos) {
      b.slot_mapping.push_back(int64_t(table[pos / c.bs]) * c.bs + pos % c.bs);
    }
    b.page_indptr.push_back(int32_t(b.page_indices.size()));
    b.query_indptr.push_back(b.query_indptr.back() + c.nq[i]);
    b.context_lens.push_back(c.ctx[i]);
    b.last_page_len.push_back(c.ctx[i] - (pages[i] - 1) * c.bs);
    b.max_query = std::max(b.max_query, c.nq[i]);
    b.max_context = std::max(b.max_context, c.ctx[i]);
  }
  b.num_tokens = b.query_indptr.back();
  const int hq = c.hkv * c.group;
  const size_t qes = pagedkv::dtype_size(c.io);
  b.q_s1 = c.D + c.q_head_pad;
  b.q_s0 = hq * b.q_s1 + c.q_pad;
  b.o_s0 = int64_t(hq) * c.D + c.o_pad;
  b.q.assign(size_t(b.num_tokens * b.q_s0) * qes, 0);
  fill_nan(b.q.data(), b.q.size(), c.io);  // padding: never read
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    for (int h = 0; h < hq; ++h) {
      for (int d = 0; d < c.D; ++d) {
        const std::vector<uint8_t> e = encode({nonzero(rng, c.qmag)}, c.io);
        std::memcpy(&b.q[size_t(t * b.q_s0 + h * b.q_s1 + d) * qes], e.data(), qes);
      }
    }
  }
  return b;
}

struct Result {
  std::vector<uint8_t> out;
  std::vector<float> lse;
  int splits = 0;
  bool large = false, generic = false;
  size_t plan_smem = 0;
};

Result run(const Case& c, const Built& b) {
  Result r;
  const int hq = c.hkv * c.group;
  const size_t qes = pagedkv::dtype_size(c.io);
  std::vector<uint8_t> arena = b.arena;  // the kernels must not write it
  const size_t planes = b.layout.layer_bytes() * 2 * size_t(b.layers);
  KvArena a{arena.data(), b.layers, b.layout,
            b.scales.empty()
                ? nullptr
                : reinterpret_cast<const float*>(arena.data() + KvArena::scales_offset(planes))};
  PlanView plan{};
  plan.num_seqs = int32_t(b.context_lens.size());
  plan.num_tokens = b.num_tokens;
  plan.max_query = b.max_query;
  plan.max_context = b.max_context;
  plan.slot_mapping = b.slot_mapping.data();
  plan.query_indptr = b.query_indptr.data();
  plan.page_indptr = b.page_indptr.data();
  plan.page_indices = b.page_indices.data();
  plan.last_page_len = b.last_page_len.data();
  plan.context_lens = b.context_lens.data();
  Tensor3 q{const_cast<uint8_t*>(b.q.data()), c.io, b.num_tokens, hq, c.D, b.q_s0, b.q_s1};
  r.out.resize(size_t(b.num_tokens * b.o_s0) * qes);
  fill_nan(r.out.data(), r.out.size(), c.io);
  Tensor3 out{r.out.data(), c.io, b.num_tokens, hq, c.D, b.o_s0, c.D};
  AttentionArgs args{};
  args.softmax_scale = c.scale;
  args.sliding_window = c.window;
  args.logit_softcap = c.softcap;
  const int64_t lse_s0 = hq + c.lse_pad;
  r.lse.assign(size_t(b.num_tokens * lse_s0), std::nanf(""));
  if (c.lse) {
    args.lse = r.lse.data();
    args.lse_stride0 = lse_s0;
  }
  cu::set_forced_splits(c.splits);
  cu::AttnPlan ap = cu::plan_attention(a, b.layer, plan, q, out, args, c.sm_count, c.max_smem);
  cu::set_forced_splits(0);
  r.splits = ap.params.num_splits;
  r.large = ap.launch.large_tile;
  r.generic = ap.launch.generic;
  r.plan_smem = ap.smem_bytes;
  std::vector<float> scratch(ap.scratch_bytes / sizeof(float) + 1, std::nanf(""));
  cu::attach_scratch(ap, scratch.data());
  pkv_emu::state().errors = 0;
  g_kernel_smem = 0;
  dispatch(c.cache, c.io, ap.params, ap.launch);
  EXPECT_EQ(pkv_emu::state().errors, 0) << pkv_emu::state().first_error;
  EXPECT_EQ(0, std::memcmp(arena.data(), b.arena.data(), arena.size())) << "the arena was written";
  return r;
}

// The float64 reference and the comparison; returns the number of bad values.
int64_t check(const Case& c, const Built& b, const Result& r, std::string& first) {
  const int hq = c.hkv * c.group;
  const size_t es = pagedkv::dtype_size(c.cache), qes = pagedkv::dtype_size(c.io);
  const bool fp8 = pagedkv::is_fp8(c.cache);
  // The tile dtype P is rounded to (the generic f32 kernel keeps f32).
  const double u_p = c.io == DType::kF32 ? 0.0 : unit_roundoff(c.io);
  const double u_out = unit_roundoff(c.io);
  const double sub_out = c.io == DType::kF16 ? 0x1p-25 : 0.0;  // f16 subnormal spacing / 2
  const size_t plane = b.layout.layer_bytes();
  // Where rounding to the output dtype overflows (half an ulp past the
  // largest finite value).
  const double top = c.io == DType::kF32   ? 0x1.ffffffp127
                     : c.io == DType::kF16 ? 65520.0
                                           : 0x1.ffp127;
  int64_t bad = 0;
  std::ostringstream msg;
  std::vector<double> x, acc(size_t(c.D));
  std::vector<double> qd(size_t(c.D));
  for (size_t s = 0; s + 1 < b.query_indptr.size(); ++s) {
    const int L = b.context_lens[s];
    const int nq = b.query_indptr[s + 1] - b.query_indptr[s];
    const int32_t* table = b.page_indices.data() + b.page_indptr[s];
    for (int i = 0; i < nq; ++i) {
      const int64_t t = b.query_indptr[s] + i;
      const int p = L - nq + i;
      const int lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / c.group;
        const double ks = fp8 ? b.scales[size_t((2 * b.layer + 0) * c.hkv + kvh)] : 1.0;
        const double vs = fp8 ? b.scales[size_t((2 * b.layer + 1) * c.hkv + kvh)] : 1.0;
        for (int d = 0; d < c.D; ++d)
          qd[d] = decode_elt(&b.q[size_t(t * b.q_s0 + h * b.q_s1 + d) * qes], c.io);
        x.assign(size_t(p - lo + 1), 0.0);
        double dx = 0.0;  // bound of the f32 logits' error
        for (int k = lo; k <= p; ++k) {
          const int block = table[k / c.bs];
          const size_t at = (size_t(2) * b.layer) * plane +
                            ((size_t(block) * c.hkv + kvh) * c.bs + k % c.bs) * c.D * es;
          double dot = 0.0, mag = 0.0;
          for (int d = 0; d < c.D; ++d) {
            const double kv = decode_elt(&b.arena[at + d * es], c.cache) * ks;
            dot += qd[d] * kv;
            mag += std::fabs(qd[d] * kv);
          }
          double y = c.scale * dot;
          const double ymag = std::fabs(c.scale) * mag;
          double e = ymag * (c.D + 4) * 0x1p-24;
          if (c.softcap > 0.f) {
            y = c.softcap * std::tanh(y / c.softcap);
            e += 8 * 0x1p-24 * c.softcap;
          }
          e += 4 * 0x1p-24 * std::fabs(y);
          dx = std::max(dx, e);
          x[size_t(k - lo)] = y;
        }
        const int pp = c.poison[s];
        if (pp >= lo && pp <= p) {  // this row sees the NaN key: NaN on every backend
          for (int d = 0; d < c.D; ++d) {
            const float g =
                decode_one(&r.out[size_t(t * b.o_s0 + int64_t(h) * c.D + d) * qes], c.io);
            if (!std::isnan(g) && bad++ < 4) {
              msg << " [seq " << s << " token " << t << " (pos " << p << ") head " << h << " d "
                  << d << ": got " << g << " want NaN (sees the NaN key at " << pp << ")]";
            }
          }
          if (c.lse && c.poison_k && !std::isnan(r.lse[size_t(t * (hq + c.lse_pad) + h)]) &&
              bad++ < 4)
            msg << " [LSE token " << t << " head " << h << ": want NaN (NaN key at " << pp << ")]";
          if (c.poison_k) continue;
        }
        const double m = *std::max_element(x.begin(), x.end());
        double l = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        double vmax = 0.0;
        for (int k = lo; k <= p; ++k) {
          const double wk = std::exp(x[size_t(k - lo)] - m);
          l += wk;
          const int block = table[k / c.bs];
          const size_t at = (size_t(2) * b.layer + 1) * plane +
                            ((size_t(block) * c.hkv + kvh) * c.bs + k % c.bs) * c.D * es;
          for (int d = 0; d < c.D; ++d) {
            const double v = decode_elt(&b.arena[at + d * es], c.cache) * vs;
            acc[d] += wk * v;
            vmax = std::max(vmax, std::fabs(v));
          }
        }
        const double n = p - lo + 1;
        const double lse = m + std::log(l);
        // Weights perturbed by e^(+-dx) each: the output moves by at most
        // expm1(2 dx) times twice the largest |v|; P rounded to the tile
        // dtype (relative u_p, plus f16's subnormal spacing); f32 sums over
        // n keys; the output's rounding.
        const double tol_v = vmax * (2 * std::expm1(2 * dx) + 2 * u_p + 4 * n * 0x1p-24 +
                                     (c.io == DType::kF16 ? n * 0x1p-24 : 0.0) + 1e-6);
        for (int d = 0; d < c.D && !(pp >= lo && pp <= p); ++d) {
          const double ref = acc[d] / l;
          const float g = decode_one(&r.out[size_t(t * b.o_s0 + int64_t(h) * c.D + d) * qes], c.io);
          const double tol = tol_v + 2 * u_out * std::fabs(ref) + sub_out;
          // Past the output dtype's range (f16 outputs of FP8 values
          // times a scale), rounding to +-inf is the right answer.
          const bool ok = std::fabs(double(g) - ref) <= tol ||
                          (std::isinf(g) && (g > 0) == (ref > 0) && std::fabs(ref) + tol >= top);
          if (!ok) {
            if (bad++ < 4) {
              msg << " [seq " << s << " token " << t << " (pos " << p << ") head " << h << " d "
                  << d << ": got " << g << " want " << ref << " tol " << tol << "]";
            }
          }
        }
        if (c.lse) {
          const float g = r.lse[size_t(t * (hq + c.lse_pad) + h)];
          const double tol = dx + 4 * n * 0x1p-24 + 1e-6 * std::fabs(lse) + 1e-6;
          if (!(std::fabs(double(g) - lse) <= tol)) {
            if (bad++ < 4) {
              msg << " [LSE seq " << s << " token " << t << " (pos " << p << ") head " << h
                  << ": got " << g << " want " << lse << " tol " << tol << "]";
            }
          }
        }
      }
    }
  }
  // Nothing outside the output rows was written: padding stays NaN.
  for (int64_t t = 0; t < b.num_tokens; ++t) {
    for (int64_t e = int64_t(hq) * c.D; e < b.o_s0; ++e) {
      const float g = decode_one(&r.out[size_t(t * b.o_s0 + e) * qes], c.io);
      if (!std::isnan(g) && bad++ < 4) msg << " [output padding written at token " << t << "]";
    }
    for (int e = hq; e < hq + c.lse_pad; ++e) {
      if (!std::isnan(r.lse[size_t(t * (hq + c.lse_pad) + e)]) && bad++ < 4)
        msg << " [LSE padding written at token " << t << "]";
    }
  }
  first = msg.str();
  return bad;
}

TEST(EmulatedAttentionRandom, MatchesFloat64Reference) {
  const uint64_t seed = uint64_t(env_long("PKV_EMU_RANDOM_SEED", 1));
  const long iters = env_long("PKV_EMU_RANDOM_ITERS", 40);
  g_max_ctx = int(std::max(600L, env_long("PKV_EMU_RANDOM_MAX_CTX", 2400)));
  int failures = 0;
  int saw_splits = 0, saw_large = 0, saw_small = 0, saw_generic = 0, refused = 0, max_splits = 0;
  for (long it = 0; it < iters && failures < 5; ++it) {
    std::mt19937_64 rng(seed * 1000003u + uint64_t(it));
    const Case c = draw(rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + " iteration " + std::to_string(it) + ": " +
                 c.describe());
    const Built b = build(c, rng);
    Result r;
    try {
      r = run(c, b);
    } catch (const pagedkv::Error& e) {
      // Only the head-dim-256 prefill tile on a 99 KB part may be refused
      // (by the backend, on its shared memory); the planner takes the rest.
      ADD_FAILURE() << "refused: " << e.what();
      ++failures;
      continue;
    }
    // f16/bf16 head dim 256 on a 99 KB part takes the generic kernel.
    EXPECT_EQ(r.generic, c.max_smem < 110 * 1024 && c.D == 256 && !pagedkv::is_fp8(c.cache) &&
                             c.io != DType::kF32);
    // A tile that does not fit the device is refused by the backend
    // (PKV_E_UNSUPPORTED, on smem_bytes; docs/cuda.md: large tiles on 99 KB
    // parts); the decode tile always fits.
    if (!r.large) EXPECT_LE(r.plan_smem, c.max_smem) << "the decode tile fits the device";
    if (r.plan_smem > c.max_smem) ++refused;
    if (r.plan_smem != g_kernel_smem) {
      ADD_FAILURE() << "planner's smem " << r.plan_smem << " != the kernel's " << g_kernel_smem;
    }
    if (c.splits > 0) EXPECT_EQ(r.splits, std::min(c.splits, 64));
    saw_splits += r.splits > 1;
    max_splits = std::max(max_splits, r.splits);
    saw_large += r.large;
    saw_small += !r.large;
    saw_generic += r.generic;
    std::string first;
    const int64_t bad = check(c, b, r, first);
    if (bad > 0) {
      ++failures;
      ADD_FAILURE() << bad << " values differ from the float64 reference;" << first;
    }
  }
  std::printf(
      "[random] %ld iterations: %d split (up to %d), %d prefill tile, %d decode tile, %d generic, "
      "%d too "
      "large for the device's shared memory\n",
      iters, saw_splits, max_splits, saw_large, saw_small, saw_generic, refused);
}

// On a part with 99 KB of shared memory per block (sm_86, sm_89), every
// dtype's decode tile fits (docs/cuda.md: only prefill tiles may not), for
// every head dim, the f32 head-dim-256 one included.
TEST(EmulatedAttentionRandom, DecodeTileFitsA99KbPart) {
  uint8_t byte = 0;  // never read: planning only
  float scales[4] = {1.f, 1.f, 1.f, 1.f};
  const size_t k99 = 99 * 1024;
  for (DType cache : {DType::kF32, DType::kF16, DType::kBF16, DType::kFp8E4m3, DType::kFp8E5m2}) {
    const DType io = pagedkv::is_fp8(cache) ? DType::kBF16 : cache;
    for (int D : {64, 80, 96, 128, 256}) {
      const KvLayout lay{8, 1, 16, D, cache};
      KvArena arena{&byte, 1, lay, pagedkv::is_fp8(cache) ? scales : nullptr};
      PlanView plan{};
      plan.num_seqs = 1;
      plan.num_tokens = 1;
      plan.max_query = 1;
      plan.max_context = 100;
      const Tensor3 q{&byte, io, 1, 8, D, 8 * D, D};
      const AttentionArgs args{0.1f, 0, 0.f, nullptr, 0};
      const cu::AttnPlan ap = cu::plan_attention(arena, 0, plan, q, q, args, 132, k99);
      EXPECT_FALSE(ap.launch.large_tile);
      EXPECT_LE(ap.smem_bytes, k99) << dtype_name(cache) << " D" << D;
    }
  }
}

// What the planner refuses, it refuses with the right code and a message
// naming the argument; nothing it refuses reaches a kernel.
TEST(EmulatedAttentionRandom, PlannerRefusesCleanly) {
  uint8_t byte = 0;  // never read: planning only
  float scales[16] = {1.f};
  auto expect_refused = [&](DType cache, int D, int hkv, DType q_dt, DType out_dt, int64_t hq,
                            int64_t q_d, int64_t tokens, bool with_scales, pagedkv::Errc code,
                            const std::string& needle) {
    const KvLayout lay{8, hkv, 16, D, cache};
    KvArena arena{&byte, 1, lay, with_scales ? scales : nullptr};
    PlanView plan{};
    plan.num_seqs = 1;
    plan.num_tokens = 4;
    plan.max_query = 4;
    plan.max_context = 4;
    const Tensor3 q{&byte, q_dt, tokens, hq, q_d, hq * q_d, q_d};
    const Tensor3 out{&byte, out_dt, 4, hq, D, hq * D, D};
    const AttentionArgs args{0.1f, 0, 0.f, nullptr, 0};
    SCOPED_TRACE(std::string(dtype_name(cache)) + " D" + std::to_string(D) + ": " + needle);
    try {
      cu::plan_attention(arena, 0, plan, q, out, args, 132);
      ADD_FAILURE() << "planned";
    } catch (const pagedkv::Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  using pagedkv::Errc;
  for (int D : {8, 32, 48, 112, 160, 192, 512}) {
    expect_refused(DType::kBF16, D, 2, DType::kBF16, DType::kBF16, 4, D, 4, false,
                   Errc::kUnsupported, "head_dim " + std::to_string(D));
  }
  expect_refused(DType::kI32, 64, 2, DType::kI32, DType::kI32, 4, 64, 4, false, Errc::kUnsupported,
                 "cache dtype");
  for (DType fp8 : {DType::kFp8E4m3, DType::kFp8E5m2}) {
    expect_refused(fp8, 128, 2, DType::kF32, DType::kF32, 4, 128, 4, true, Errc::kUnsupported,
                   "fp8");
    expect_refused(fp8, 128, 2, DType::kF16, DType::kBF16, 4, 128, 4, true, Errc::kUnsupported,
                   "fp8");
    expect_refused(fp8, 128, 2, DType::kBF16, DType::kBF16, 4, 128, 4, false,
                   Errc::kInvalidArgument, "scales");
  }
  expect_refused(DType::kBF16, 128, 2, DType::kF16, DType::kF16, 4, 128, 4, false,
                 Errc::kInvalidArgument, "dtype");
  expect_refused(DType::kF32, 128, 2, DType::kF32, DType::kF16, 4, 128, 4, false,
                 Errc::kInvalidArgument, "dtype");
  expect_refused(DType::kF16, 128, 2, DType::kF16, DType::kF16, 4, 64, 4, false,
                 Errc::kInvalidArgument, "shape");
  expect_refused(DType::kF16, 128, 2, DType::kF16, DType::kF16, 4, 128, 5, false,
                 Errc::kInvalidArgument, "shape");
  expect_refused(DType::kF16, 128, 2, DType::kF16, DType::kF16, 3, 128, 4, false,
                 Errc::kInvalidArgument, "not a multiple of num_kv_heads 2");
}

}  // namespace
}  // namespace pkvtest
