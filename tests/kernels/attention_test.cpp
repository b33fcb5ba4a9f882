// Paged attention on the CPU backend against a float64 reference computed
// over a gathered contiguous copy of the cache. Every case: random page
// permutations out of a pool 4x larger than needed, NaN in every unused
// slot and block (and the null block), NaN-poisoned outputs, and every
// output element (and every gap between strided rows) checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "test_util.h"

namespace pagedkv {
namespace test {
namespace {

struct SeqSpec {
  int32_t ctx;  // tokens in the sequence after this step
  int32_t nq;   // queries this step (the last nq tokens)
};

struct Case {
  CpuIsa isa = CpuIsa::kScalar;
  DType dt = DType::kF32;
  int32_t head_dim = 64;
  int32_t block_size = 16;
  int32_t group = 1;  // query heads per KV head
  int32_t kv_heads = 2;
  std::vector<SeqSpec> seqs;
  int32_t window = 0;
  float softcap = 0.0f;
  float scale = 0.0f;  // 0 = 1/sqrt(head_dim)
  bool lse = false;
  int32_t threads = 2;
  int32_t min_split_keys = 512;
  uint32_t seed = 1;
  // NaN K and V at keys some queries of a prefill see and others must not:
  // the last position (causally masked for every other query) and, with a
  // window, the first key of the first query's window (outside every later
  // query's window). Queries that see one expect NaN, the rest exact values.
  bool poison_masked = false;

  std::string describe() const {
    std::ostringstream os;
    os << isa_name(isa) << " " << dtype_name(dt) << " D=" << head_dim << " bs=" << block_size
       << " G=" << group << " Hkv=" << kv_heads << " W=" << window << " cap=" << softcap
       << " scale=" << scale << " lse=" << lse << " threads=" << threads
       << " split=" << min_split_keys << " seed=" << seed << " poison=" << poison_masked
       << " seqs=";
    for (const auto& s : seqs) os << "(" << s.ctx << "," << s.nq << ")";
    return os.str();
  }
};

// Tolerances: the reference sees exactly the stored q/k/v values, so the
// error is f32 arithmetic plus the final rounding to the output dtype.
void tolerance(DType t, double* atol, double* rtol) {
  switch (t) {
    case DType::kF32:
      *atol = 2e-5, *rtol = 1e-4;
      break;
    case DType::kF16:
      *atol = 1e-4, *rtol = 2e-3;
      break;
    default:
      *atol = 1e-4, *rtol = 1e-2;
      break;
  }
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.describe());
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const int32_t D = c.head_dim, bs = c.block_size, hkv = c.kv_heads, hq = c.group * c.kv_heads;
  const int32_t ns = int32_t(c.seqs.size());
  const float scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt(float(D));

  // Plan: pages for every position, sometimes one spare (lookahead) page.
  std::vector<int32_t> qptr(ns + 1, 0), pptr(ns + 1, 0), ctx(ns), last(ns);
  std::vector<int32_t> npages(ns);
  for (int32_t s = 0; s < ns; ++s) {
    ctx[s] = c.seqs[s].ctx;
    qptr[s + 1] = qptr[s] + c.seqs[s].nq;
    npages[s] = (ctx[s] + bs - 1) / bs + int32_t(rng() % 3 == 0);
    pptr[s + 1] = pptr[s] + npages[s];
    last[s] = ctx[s] - (ctx[s] - 1) / bs * bs;
  }
  const int32_t needed = pptr[ns];
  const int32_t num_blocks = 4 * needed + 2;
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> pages(needed);
  for (int32_t i = 0; i < needed; ++i) pages[i] = ids[i];
  // Pages wholly before the window of a sequence's first query hold the
  // null block, as the pool plans them.
  if (c.window > 0) {
    for (int32_t s = 0; s < ns; ++s) {
      const int32_t first = ctx[s] - c.seqs[s].nq;
      const int32_t wlo = std::max(0, first - c.window + 1);
      for (int32_t pg = 0; (pg + 1) * bs <= wlo; ++pg) pages[pptr[s] + pg] = 0;
    }
  }

  KvArena arena;
  arena.num_layers = 2;
  arena.layout = {num_blocks, hkv, bs, D, c.dt};
  const int64_t plane_elems = int64_t(num_blocks) * hkv * bs * D;
  Buffer storage(arena.layout.layer_bytes() * 4);
  arena.base = storage.data();
  fill_nan(arena.base, c.dt, plane_elems * 4);
  const int32_t layer = 1;
  void* kp = arena.plane(layer, 0);
  void* vp = arena.plane(layer, 1);

  // Cache contents: random values at every position of a non-null page;
  // the reference keeps them gathered contiguously [seq][pos][head][dim].
  std::vector<std::vector<double>> kref(ns), vref(ns);
  auto poisoned = [&](int32_t s, int32_t pos) {
    const int32_t nq = c.seqs[s].nq, first = ctx[s] - nq;
    if (!c.poison_masked || nq < 2) return false;
    return pos == ctx[s] - 1 || (c.window > 0 && pos == std::max(0, first - c.window + 1));
  };
  for (int32_t s = 0; s < ns; ++s) {
    kref[s].assign(size_t(ctx[s]) * hkv * D, std::nan(""));
    vref[s].assign(size_t(ctx[s]) * hkv * D, std::nan(""));
    for (int32_t pos = 0; pos < ctx[s]; ++pos) {
      const int32_t block = pages[pptr[s] + pos / bs];
      if (block == 0) continue;
      for (int32_t h = 0; h < hkv; ++h) {
        const int64_t base = ((int64_t(block) * hkv + h) * bs + pos % bs) * D;
        for (int32_t d = 0; d < D; ++d) {
          const size_t r = (size_t(pos) * hkv + h) * D + d;
          const bool nan = poisoned(s, pos);
          kref[s][r] = store(kp, c.dt, base + d, nan ? std::nanf("") : unit(rng));
          vref[s][r] = store(vp, c.dt, base + d, nan ? std::nanf("") : unit(rng));
        }
      }
    }
  }

  // q and out strided with gaps between heads and tokens; out poisoned.
  const int64_t T = qptr[ns];
  const int64_t s1 = D + 8, s0 = hq * s1 + 24;
  Buffer qbuf(size_t(T * s0) * dtype_size(c.dt) + 64), obuf(size_t(T * s0) * dtype_size(c.dt) + 64);
  fill_nan(qbuf.data(), c.dt, T * s0);
  fill_nan(obuf.data(), c.dt, T * s0);
  std::vector<double> qref(size_t(T) * hq * D);
  for (int64_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < hq; ++h) {
      for (int32_t d = 0; d < D; ++d) {
        qref[(t * hq + h) * D + d] = store(qbuf.data(), c.dt, t * s0 + h * s1 + d, 2 * unit(rng));
      }
    }
  }
  const int64_t lse_stride = hq + 3;
  std::vector<float> lse(size_t(T * lse_stride), std::nanf(""));

  std::vector<int64_t> slots(T, -1);
  PlanView plan{ns,           T,           0,         0, slots.data(), qptr.data(), pptr.data(),
                pages.data(), last.data(), ctx.data()};
  for (int32_t s = 0; s < ns; ++s) {
    plan.max_query = std::max(plan.max_query, c.seqs[s].nq);
    plan.max_context = std::max(plan.max_context, ctx[s]);
  }
  Tensor3 q{qbuf.data(), c.dt, T, hq, D, s0, s1};
  Tensor3 out{obuf.data(), c.dt, T, hq, D, s0, s1};
  AttentionArgs args{scale, c.window, c.softcap, c.lse ? lse.data() : nullptr, lse_stride};

  CpuBackendOptions opts;
  opts.num_threads = c.threads;
  opts.isa = c.isa;
  opts.min_split_keys = c.min_split_keys;
  auto backend = make_cpu_backend(opts);
  backend->attend(arena, layer, plan, q, out, args, nullptr);

  double atol, rtol;
  tolerance(c.dt, &atol, &rtol);
  int failures = 0;
  auto report = [&](const std::string& what) {
    if (++failures <= 8) ADD_FAILURE() << what;
  };
  std::vector<double> logit, ref(D);
  for (int32_t s = 0; s < ns; ++s) {
    const int32_t nq = c.seqs[s].nq;
    for (int32_t i = 0; i < nq; ++i) {
      const int64_t t = qptr[s] + i;
      const int32_t p = ctx[s] - nq + i;
      const int32_t lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
      for (int32_t h = 0; h < hq; ++h) {
        const int32_t kh = h / c.group;
        const double* qv = &qref[(t * hq + h) * D];
        logit.assign(p - lo + 1, 0.0);
        double mx = -INFINITY;
        for (int32_t k = lo; k <= p; ++k) {
          const double* kv = &kref[s][(size_t(k) * hkv + kh) * D];
          double x = 0;
          for (int32_t d = 0; d < D; ++d) x += qv[d] * kv[d];
          x *= scale;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          ASSERT_TRUE(!std::isnan(x) || poisoned(s, k)) << "reference reads a NaN key: test bug";
          logit[k - lo] = x;
          mx = std::max(mx, x);
        }
        double sum = 0;
        for (double& x : logit) sum += (x = std::exp(x - mx));
        std::fill(ref.begin(), ref.end(), 0.0);
        for (int32_t k = lo; k <= p; ++k) {
          const double* vv = &vref[s][(size_t(k) * hkv + kh) * D];
          for (int32_t d = 0; d < D; ++d) ref[d] += logit[k - lo] / sum * vv[d];
        }
        for (int32_t d = 0; d < D; ++d) {
          const double got = load(obuf.data(), c.dt, t * s0 + h * s1 + d);
          const bool ok = std::isnan(ref[d])
                              ? std::isnan(got)
                              : std::fabs(got - ref[d]) <= atol + rtol * std::fabs(ref[d]);
          if (!ok) {
            report("out[seq " + std::to_string(s) + " q " + std::to_string(i) + " head " +
                   std::to_string(h) + " dim " + std::to_string(d) + "] = " + std::to_string(got) +
                   ", reference " + std::to_string(ref[d]));
          }
        }
        if (c.lse) {
          const double want = mx + std::log(sum);
          const double got = lse[size_t(t * lse_stride + h)];
          // A query that sees a NaN key gets a NaN output (above) and a
          // non-finite LSE (the kernels' running max skips NaN logits).
          const bool ok = std::isnan(want) ? !std::isfinite(got)
                                           : std::fabs(got - want) <= 1e-4 + 1e-5 * std::fabs(want);
          if (!ok) {
            report("lse[token " + std::to_string(t) + " head " + std::to_string(h) +
                   "] = " + std::to_string(got) + ", reference " + std::to_string(want));
          }
        }
      }
    }
  }
  // Nothing outside the logical out/lse elements was written.
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < s0; ++e) {
      const bool inside = e / s1 < hq && e % s1 < D;
      if (!inside && !std::isnan(load(obuf.data(), c.dt, t * s0 + e))) {
        report("out gap element " + std::to_string(t * s0 + e) + " was written");
      }
    }
    for (int64_t e = 0; e < lse_stride; ++e) {
      const bool inside = c.lse && e < hq;
      if (!inside && !std::isnan(lse[size_t(t * lse_stride + e)])) {
        report("lse element " + std::to_string(t * lse_stride + e) + " was written");
      }
    }
  }
  EXPECT_EQ(failures, 0) << failures << " mismatches";
}

// A mixed step: decode sequences (one of context 1), a whole prefill and a
// chunked prefill over a cached prefix, contexts crossing several pages
// with a partial last page.
std::vector<SeqSpec> mixed_step(int32_t bs, std::mt19937& rng) {
  auto r = [&](int32_t lo, int32_t hi) { return lo + int32_t(rng() % uint32_t(hi - lo + 1)); };
  std::vector<SeqSpec> seqs;
  seqs.push_back({r(bs + 1, 3 * bs + 5), 1});  // decode
  seqs.push_back({1, 1});                      // decode of a first token
  const int32_t pre = r(2, bs + 9);
  seqs.push_back({pre, pre});  // prefill
  const int32_t cached = r(bs, 2 * bs + 3), chunk = r(2, 13);
  seqs.push_back({cached + chunk, chunk});  // chunked prefill
  std::shuffle(seqs.begin(), seqs.end(), rng);
  return seqs;
}

struct MatrixParam {
  CpuIsa isa;
  DType dt;
  int32_t head_dim;
};

class AttentionMatrix : public ::testing::TestWithParam<MatrixParam> {};

// A matrix case: the parameter's ISA, dtype and head dim, a mixed step.
Case matrix_case(const MatrixParam& p, int32_t bs, int32_t group, uint32_t seed,
                 std::mt19937& rng) {
  Case c;
  c.isa = p.isa;
  c.dt = p.dt;
  c.head_dim = p.head_dim;
  c.block_size = bs;
  c.group = group;
  c.seed = seed;
  c.seqs = mixed_step(bs, rng);
  return c;
}

// Full cross product on small shapes: block sizes x GQA ratios x features.
TEST_P(AttentionMatrix, MixedSteps) {
  const MatrixParam p = GetParam();
  uint32_t seed = 1000 * uint32_t(p.head_dim) + 10 * uint32_t(p.dt) + uint32_t(p.isa);
  for (int32_t bs : {8, 16, 32, 64}) {
    for (int32_t group : {1, 4, 8}) {
      for (int feature = 0; feature < 4; ++feature) {
        std::mt19937 rng(++seed);
        Case c = matrix_case(p, bs, group, seed, rng);
        if (feature & 1) c.window = 1 + int32_t(rng() % uint32_t(2 * bs));
        if (feature & 2) {
          // A large scale pushes logits well into the cap's bend.
          c.scale = 0.5f;
          c.softcap = 4.0f + float(rng() % 20);
          c.lse = true;
        }
        if (feature == 0 && group == 4) c.lse = true;
        run_case(c);
        if (HasFatalFailure() || HasFailure()) return;
      }
    }
  }
}

// NaN K/V at masked keys of partially visible pages (causal diagonal,
// window start), with and without soft-cap, one and several threads, and
// tiles of one and many rows: no masked key may reach any output element.
TEST_P(AttentionMatrix, MaskedKeysNeverReachOutput) {
  const MatrixParam p = GetParam();
  uint32_t seed = 7000 * uint32_t(p.head_dim) + 10 * uint32_t(p.dt) + uint32_t(p.isa);
  for (int32_t bs : {8, 16, 32}) {
    for (int32_t group : {1, 4}) {
      for (int feature = 0; feature < 4; ++feature) {
        std::mt19937 rng(++seed);
        Case c = matrix_case(p, bs, group, seed, rng);
        c.poison_masked = true;
        c.threads = 1 + feature % 2 * 2;
        c.min_split_keys = feature % 2 == 1 ? 8 : 512;
        c.seqs.push_back({3 * bs + 5, 2 * bs + 3});  // a prefill crossing pages
        if (feature & 1) c.window = 2 + int32_t(rng() % uint32_t(2 * bs));
        if (feature & 2) {
          c.scale = 0.5f;
          c.softcap = 4.0f + float(rng() % 20);
        }
        c.lse = true;
        run_case(c);
        if (HasFatalFailure() || HasFailure()) return;
      }
    }
  }
}

std::vector<MatrixParam> matrix_params() {
  std::vector<MatrixParam> out;
  for (CpuIsa isa : supported_isas()) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int32_t d : {64, 80, 96, 128, 256}) out.push_back({isa, dt, d});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cpu, AttentionMatrix, ::testing::ValuesIn(matrix_params()),
                         [](const ::testing::TestParamInfo<MatrixParam>& info) {
                           return std::string(isa_name(info.param.isa)) + "_" +
                                  dtype_name(info.param.dt) + "_d" +
                                  std::to_string(info.param.head_dim);
                         });

class AttentionLarge : public ::testing::TestWithParam<CpuIsa> {};

// Long decode contexts with few sequences: the split-KV path and its merge.
TEST_P(AttentionLarge, SplitDecode) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    Case c;
    c.isa = GetParam();
    c.dt = dt;
    c.head_dim = 128;
    c.block_size = 16;
    c.group = 4;
    c.seqs = {{1500, 1}, {333, 1}};
    c.threads = 4;
    c.min_split_keys = 64;
    c.lse = true;
    c.seed = 77 + uint32_t(dt);
    run_case(c);
  }
}

// A long chunked prefill split along the context, with a sliding window
// leaving most of the prefix as null pages, and soft-cap.
TEST_P(AttentionLarge, SplitChunkedPrefillWindow) {
  Case c;
  c.isa = GetParam();
  c.dt = DType::kBF16;
  c.head_dim = 128;
  c.block_size = 32;
  c.group = 8;
  c.kv_heads = 1;
  c.seqs = {{1100, 40}, {700, 1}};
  c.window = 300;
  c.softcap = 30.0f;
  c.lse = true;
  c.threads = 3;
  c.min_split_keys = 32;
  c.seed = 5;
  run_case(c);
}

// A batch of long decodes and a prefill, the shape engines run, on one
// thread and on several.
TEST_P(AttentionLarge, BatchDecodeAndPrefill) {
  for (int32_t threads : {1, 3}) {
    Case c;
    c.isa = GetParam();
    c.dt = DType::kBF16;
    c.head_dim = 128;
    c.block_size = 16;
    c.group = 4;
    c.seqs = {{700, 1}, {513, 1}, {64, 1}, {900, 1}, {200, 200}, {650, 50}};
    c.threads = threads;
    c.lse = true;
    c.seed = 11 + uint32_t(threads);
    run_case(c);
  }
}

// Decode tiles of every row count (GQA groups 1 to 16) against contexts
// whose last page ends at every key offset of a 16-key page: each q.k row
// blocking (AVX2 runs 4- and 8-row tiles as 2-row passes with q in
// registers), each group of keys (16, 8, 4, 2, 1) and each store of the
// reduced sums, for every dtype, paired and not.
TEST_P(AttentionLarge, DecodeEveryTileRowsAndKeyTail) {
  uint32_t seed = 4400;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int32_t group : {1, 2, 3, 4, 8, 16}) {
      for (int32_t d : {64, 128}) {
        Case c;
        c.isa = GetParam();
        c.dt = dt;
        c.head_dim = d;
        c.block_size = 16;
        c.group = group;
        c.seed = ++seed;
        for (int32_t tail = 1; tail <= 16; ++tail) c.seqs.push_back({2 * 16 + tail, 1});
        c.seqs.push_back({21, 5});  // a prefill tile beside them
        c.threads = 1 + int32_t(seed % 2);
        c.lse = true;
        run_case(c);
        if (HasFailure()) return;
      }
    }
  }
}

// Decode tiles that take several KV heads at once (up to 8, a block's heads
// walked one after another): head counts below one group of 8 and above it
// (a group of 8 and one of 4), on one thread and on two (enough sequences that two threads
// group heads too), beside a prefill whose rows need per-head tiles, with
// windows, soft-cap and poisoned masked keys.
TEST_P(AttentionLarge, DecodeTilesOfSeveralHeads) {
  uint32_t seed = 5100;
  for (int32_t hkv : {3, 12}) {
    for (int32_t threads : {1, 2}) {
      for (DType dt : {DType::kBF16, DType::kF16}) {
        if ((hkv == 3) != (dt == DType::kF16)) continue;  // 3 heads in f16, 12 (8 + 4) in bf16
        std::mt19937 rng(++seed);
        Case c;
        c.isa = GetParam();
        c.dt = dt;
        c.head_dim = 128;
        c.block_size = 16;
        c.group = 4;
        c.kv_heads = hkv;
        for (int i = 0; i < 10; ++i) c.seqs.push_back({1 + int32_t(rng() % 300), 1});
        c.seqs.push_back({90, 9});  // 36 rows: more than one tile per head
        c.window = seed % 2 ? 0 : 20 + int32_t(rng() % 60);
        c.softcap = seed % 3 ? 0.0f : 25.0f;
        c.poison_masked = true;
        c.threads = threads;
        c.lse = true;
        c.seed = seed;
        run_case(c);
        if (HasFailure()) return;
      }
    }
  }
}

// Random shapes around the several-heads decode tiles: KV head counts
// below, at and past multiples of 8, GQA groups 1 to 32, head dims 7 to 512,
// block sizes 1 to 1024, 1 to 8 threads with a number of decode sequences
// near the 4-items-per-thread line (grouped tiles on one side, per-head
// tiles and the context split on the other), beside a prefill or chunk that
// some steps give per-head tiles.
TEST_P(AttentionLarge, DecodeTilesOfSeveralHeadsShapes) {
  std::mt19937 pick(6200 + uint32_t(GetParam()));
  auto any = [&](std::initializer_list<int32_t> v) { return *(v.begin() + pick() % v.size()); };
  // 24 steps per run, the first 12 of them under a sanitizer (29 s of CI's
  // ASan stage at 24); PKV_SHAPES_STEPS=N for more.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr int kSteps = 12;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  constexpr int kSteps = 12;
#else
  constexpr int kSteps = 24;
#endif
#else
  constexpr int kSteps = 24;
#endif
  const char* more = std::getenv("PKV_SHAPES_STEPS");
  const int steps = more ? std::max(1, std::atoi(more)) : kSteps;
  for (int iter = 0; iter < steps; ++iter) {
    Case c;
    c.isa = GetParam();
    c.dt = std::vector<DType>{DType::kF32, DType::kF16, DType::kBF16}[pick() % 3];
    c.kv_heads = any({1, 2, 3, 7, 8, 9, 16, 17, 64});
    c.group = any({1, 2, 3, 4, 5, 8, 16, 32});
    c.head_dim = any({7, 8, 16, 24, 64, 80, 128, 256, 512});
    c.block_size = any({1, 2, 5, 16, 32, 64, 1024});
    c.threads = 1 + int32_t(pick() % 8);
    c.min_split_keys = any({16, 64, 512});
    c.seed = 6200 + uint32_t(iter);
    const int32_t per_seq = (c.kv_heads + 7) / 8;
    const int32_t near = std::max<int32_t>(1, (4 * c.threads + per_seq - 1) / per_seq);
    // Just below, at or above the line, or far below (a long context split).
    const int32_t ndec =
        pick() % 4 ? std::max<int32_t>(1, near + int32_t(pick() % 3) - 1) : 1 + int32_t(pick() % 3);
    // Keep the reference (tokens x heads x keys x dims) small, and the pool
    // (run_case allocates 16 blocks per planned page: 64 bytes per element of
    // a page at f32) to a few hundred MiB: 256 MiB of context pages at most,
    // 128 MiB of last pages.
    const int64_t per_key = int64_t(c.kv_heads) * c.head_dim;
    const int64_t by_ref = 40000000 / (per_key * c.group * (ndec + 8));
    const int64_t by_mem = (int64_t(4) << 20) / (per_key * (ndec + 1));
    const int32_t max_ctx =
        int32_t(std::max<int64_t>(2, std::min({int64_t(1500), by_ref, by_mem})));
    while (c.block_size > 1 && per_key * c.block_size * 64 * (ndec + 1) > (int64_t(128) << 20)) {
      c.block_size /= 2;
    }
    for (int32_t i = 0; i < ndec; ++i) c.seqs.push_back({1 + int32_t(pick() % max_ctx), 1});
    if (pick() % 2) {
      const int32_t nq = 1 + int32_t(pick() % 6);
      c.seqs.push_back({nq + int32_t(pick() % max_ctx), nq});
    }
    std::shuffle(c.seqs.begin(), c.seqs.end(), pick);
    c.window = pick() % 3 ? 0 : 1 + int32_t(pick() % 80);
    c.softcap = pick() % 3 ? 0.0f : 20.0f;
    c.poison_masked = true;
    c.lse = true;
    run_case(c);
    if (HasFailure()) return;
  }
}

// MQA with a group larger than one tile, and head dim 256 with block 64.
TEST_P(AttentionLarge, WideGroups) {
  Case c;
  c.isa = GetParam();
  c.dt = DType::kF16;
  c.head_dim = 256;
  c.block_size = 64;
  c.group = 32;
  c.kv_heads = 1;
  c.seqs = {{300, 1}, {90, 20}};
  c.lse = true;
  c.seed = 3;
  run_case(c);
}

// The sizes a CPU pool accepts beyond the usual ones (README, "Kernels"):
// head dims that are not a multiple of the vector width (scalar kernels) or
// are, but unusual, and block sizes from 1 to 128, with masked-key poison.
TEST_P(AttentionLarge, AnyHeadDimAndBlockSize) {
  uint32_t seed = 900;
  for (int32_t d : {7, 48, 320}) {
    for (int32_t bs : {1, 17, 128}) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        std::mt19937 rng(++seed);
        Case c;
        c.isa = GetParam();
        c.dt = dt;
        c.head_dim = d;
        c.block_size = bs;
        c.group = 2;
        c.seed = seed;
        c.seqs = mixed_step(bs, rng);
        c.window = seed % 2 ? 0 : 3 + int32_t(rng() % 40);
        c.poison_masked = true;
        c.lse = true;
        run_case(c);
        if (HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, AttentionLarge, ::testing::ValuesIn(supported_isas()),
                         [](const ::testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(isa_name(info.param));
                         });

TEST(AttentionErrors, BadArgumentsThrowAndWriteNothing) {
  Case c;
  KvArena arena;
  arena.num_layers = 1;
  arena.layout = {4, 1, 8, 64, DType::kF32};
  Buffer storage(arena.layout.layer_bytes() * 2);
  arena.base = storage.data();
  std::vector<int32_t> qptr{0, 1}, pptr{0, 1}, pages{7}, last{1}, ctx{1};
  std::vector<int64_t> slots{-1};
  PlanView plan{1,           1,         1, 1, slots.data(), qptr.data(), pptr.data(), pages.data(),
                last.data(), ctx.data()};
  std::vector<float> qv(64, 1.0f), ov(64, std::nanf(""));
  Tensor3 q{qv.data(), DType::kF32, 1, 1, 64, 64, 64};
  Tensor3 out{ov.data(), DType::kF32, 1, 1, 64, 64, 64};
  AttentionArgs args{0.125f, 0, 0.0f, nullptr, 0};
  auto backend = make_cpu_backend(1);
  auto expect_invalid = [&](const PlanView& pl, const Tensor3& qq, const AttentionArgs& a) {
    try {
      backend->attend(arena, 0, pl, qq, out, a, nullptr);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidArgument);
    }
    for (float x : ov) ASSERT_TRUE(std::isnan(x));
  };
  expect_invalid(plan, q, args);  // block 7 of 4
  pages[0] = 1;
  Tensor3 q_bad = q;
  q_bad.n2 = 32;
  expect_invalid(plan, q_bad, args);
  AttentionArgs bad_scale = args;
  bad_scale.softmax_scale = 0.0f;
  expect_invalid(plan, q, bad_scale);
  ctx[0] = 0;  // a query with no key
  expect_invalid(plan, q, args);
}

}  // namespace
}  // namespace test
}  // namespace pagedkv
