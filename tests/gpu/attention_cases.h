// The attention test cases shared by the GPU tests and the CPU-side
// emulation tests: scenarios, their random inputs (random page permutations,
// NaN-poisoned unused slots and outputs), a runner over any Backend, and the
// element-by-element comparison with the CPU backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>

#include "gpu_test_util.h"

namespace pkvtest {

using pagedkv::AttentionArgs;
using pagedkv::Backend;
using pagedkv::KvArena;
using pagedkv::KvLayout;
using pagedkv::PlanView;
using pagedkv::Tensor3;

struct SeqSpec {
  int ctx;
  int nq;
};

struct Scenario {
  std::string name;
  int block_size;
  std::vector<SeqSpec> seqs;
  int window = 0;
  float softcap = 0.f;
  float scale = 0.f;  // 0 = 1/sqrt(D)
  bool lse = true;
  int splits = 0;  // forced KV splits on the GPU, 0 = heuristic
  // NaN K/V at keys some queries of a sequence see and others must not: the
  // last position (causally masked for the other queries) and, with a window,
  // the first key of the first query's window. The queries that see one
  // give non-finite results on both backends; every other one must match.
  bool poison = false;
  // With poison: NaN in V only, K finite. A row that sees the key then gets
  // a positive weight times NaN (the kernels' exact add-back of values they
  // zeroed for the rows that must not see them); with K NaN too the logit
  // alone makes the row NaN.
  bool poison_v_only = false;
  // NaN in the first q head of every sequence's first and last query: those
  // rows' logits are all NaN (output and LSE NaN on the CPU), which a max
  // that skips NaN must not turn into zeros, in one CTA or across splits.
  bool nan_q = false;
  // V values of magnitude [1/4, 1/2] of the dtype's largest finite value,
  // with one sign per even dimension: an unnormalised f32 sum of P V (or of
  // the splits' outputs) overflows to inf after a few keys, the output (a
  // convex combination) is finite. Not for FP8 pages (applies()).
  bool v_near_max = false;
  // Every V element exactly the dtype's largest finite value, with one sign
  // per dimension (v_sign_at_max): the output, a convex combination of equal
  // values, is exactly that value, which the normalisation's rounding (a few
  // ulps either way) must not carry to inf. f32 pages only (applies()): a
  // 16-bit output at its largest value already rounds to inf on the CPU as
  // on the GPU, and the tensor-core paths round P to 16 bits, which can put
  // such an output a rounding above the largest value (docs/cuda.md).
  bool v_at_max = false;
};

// The sign of dimension d's values in the v_at_max scenarios: both signs,
// in no simple alternation.
inline bool v_sign_at_max(int d) { return d % 3 != 1; }

// Whether a scenario runs over a cache dtype (v_near_max: not over FP8,
// whose values stay far below FLT_MAX, scale aside; v_at_max: f32 only).
inline bool applies(const Scenario& sc, DType cache) {
  if (sc.v_at_max) return cache == DType::kF32;
  return !(sc.v_near_max && pagedkv::is_fp8(cache));
}

// Everything both backends get, as host bytes.
struct Inputs {
  KvLayout layout{};
  int num_layers = 2;
  int layer = 1;  // not the first plane pair, so plane offsets are exercised
  int num_q_heads = 0;
  int64_t num_tokens = 0;
  int max_query = 0, max_context = 0;
  std::vector<int32_t> query_indptr{0}, page_indptr{0}, page_indices, last_page_len, context_lens;
  std::vector<int64_t> slot_mapping;
  std::vector<uint8_t> arena, k_new, v_new, q;
  int64_t kv_s0 = 0, q_s0 = 0;  // padded token strides (elements)
  // dtype of q, out and the new k/v rows: the cache's, or f16/bf16 over FP8.
  DType io = DType::kF32;
  // FP8 caches: KvArena::scales as the backend sees them (after the planes).
  std::vector<float> scales;
  // Magnitude of the V values (v_near_max, v_at_max), which scales the
  // output tolerance's absolute part.
  float v_mag = 1.f;
};

inline size_t arena_bytes(const Inputs& s) {
  return s.layout.layer_bytes() * 2 * size_t(s.num_layers);
}

// cache: the pool's dtype (default dt); an FP8 cache gets random per-head
// scales, prefix codes over their whole range and new rows that partly
// saturate.
inline Inputs build(const Scenario& sc, DType dt, int D, int hkv, int group, std::mt19937_64& rng,
                    DType cache = DType::kI32) {
  Inputs s;
  if (cache == DType::kI32) cache = dt;
  const bool fp8 = pagedkv::is_fp8(cache);
  s.io = dt;
  const int bs = sc.block_size;
  const size_t es = pagedkv::dtype_size(cache);
  int total_pages = 0;
  for (const SeqSpec& q : sc.seqs) total_pages += (q.ctx + bs - 1) / bs;
  const int num_blocks = total_pages + 4;  // null block + spare blocks that stay NaN
  s.layout = KvLayout{num_blocks, hkv, bs, D, cache};
  s.num_q_heads = hkv * group;
  s.arena.resize(arena_bytes(s));
  fill_nan(s.arena.data(), s.arena.size(), cache);
  if (fp8) s.scales = uniform(rng, size_t(2) * s.num_layers * hkv, 0.02f, 0.3f);
  // Stored prefix values: codes of [-1, 1] (f16/bf16/f32), or FP8 codes up
  // up to 8 (times the scales above: values of similar magnitude).
  const float lim = fp8 ? 8.f : 1.f;
  // v_near_max: x in [-1, 1] -> +-(1 + |x|) / 2 * v_mag, positive at even
  // indices (every row starts at an even one: D and the strides are even).
  // v_at_max: +-v_mag, the sign of the element's dimension (x's index modulo
  // the row stride, then D: rows of D, or tokens of kv_s0 elements).
  if ((sc.v_near_max || sc.v_at_max) && !fp8) {
    const float top = dt == DType::kF32    ? std::numeric_limits<float>::max()
                      : dt == DType::kBF16 ? 3.3895314e38f
                                           : 65504.f;
    s.v_mag = sc.v_at_max ? top : 0.5f * top;
  }
  auto v_values = [&](std::vector<float> x, size_t stride) {
    if (s.v_mag == 1.f) return x;
    for (size_t i = 0; i < x.size(); ++i) {
      if (sc.v_at_max) {
        x[i] = v_sign_at_max(int(i % stride % size_t(D))) ? s.v_mag : -s.v_mag;
        continue;
      }
      const float m = (1.f + std::fabs(x[i])) * 0.5f * s.v_mag;
      x[i] = i % 2 == 0 || x[i] >= 0.f ? m : -m;
    }
    return x;
  };

  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;

  auto put_row = [&](int which, int block, int h, int off, const std::vector<uint8_t>& row) {
    const size_t at = (size_t(2) * s.layer + which) * s.layout.layer_bytes() +
                      ((size_t(block) * hkv + h) * bs + off) * D * es;
    std::memcpy(&s.arena[at], row.data(), row.size());
  };

  for (const SeqSpec& q : sc.seqs) {
    const int pages = (q.ctx + bs - 1) / bs;
    const int first = q.ctx - q.nq;
    for (int i = 0; i < pages; ++i) {
      // The pool nulls pages wholly before the window of the step's first query.
      const bool outside = sc.window > 0 && (i + 1) * bs - 1 < first - sc.window + 1;
      s.page_indices.push_back(outside ? 0 : ids[next++]);
    }
    const int32_t* table = s.page_indices.data() + s.page_indptr.back();
    const int window_first = sc.window > 0 ? std::max(0, first - sc.window + 1) : -1;
    for (int pos = 0; pos < first; ++pos) {  // the cached prefix
      const int block = table[pos / bs];
      if (block == 0) continue;
      const bool nan = sc.poison && q.nq >= 2 && pos == window_first;
      for (int h = 0; h < hkv; ++h) {
        put_row(0, block, h, pos % bs,
                encode(nan && !sc.poison_v_only ? nan_row(D) : uniform(rng, D, -lim, lim), cache));
        put_row(1, block, h, pos % bs,
                encode(nan ? nan_row(D) : v_values(uniform(rng, D, -lim, lim), size_t(D)), cache));
      }
    }
    for (int pos = first; pos < q.ctx; ++pos) {
      s.slot_mapping.push_back(int64_t(table[pos / bs]) * bs + pos % bs);
    }
    s.page_indptr.push_back(int32_t(s.page_indices.size()));
    s.query_indptr.push_back(s.query_indptr.back() + q.nq);
    s.context_lens.push_back(q.ctx);
    s.last_page_len.push_back(q.ctx - (pages - 1) * bs);
    s.max_query = std::max(s.max_query, q.nq);
    s.max_context = std::max(s.max_context, q.ctx);
  }
  s.num_tokens = s.query_indptr.back();

  // New K/V and Q rows with padded token strides (still 16-byte aligned).
  const int pad = 8;
  s.kv_s0 = int64_t(hkv) * D + pad;
  s.q_s0 = int64_t(s.num_q_heads) * D + pad;
  std::vector<float> kn = uniform(rng, size_t(s.num_tokens * s.kv_s0), -1.f, 1.f);
  std::vector<float> vn =
      v_values(uniform(rng, size_t(s.num_tokens * s.kv_s0), -1.f, 1.f), size_t(s.kv_s0));
  if (fp8) {
    // Keys beyond the formats' range: the write saturates them (every 97th
    // to 448 x scale in E4M3, every 211th to 57344 x scale in E5M2 too), the
    // arena comparison checks the codes and the logits they give. Values
    // stay in range here: a saturated V of 57344 x scale would only measure
    // the rounding of P to q's dtype (the write test covers V saturation).
    for (size_t i = 0; i < kn.size(); i += 97) kn[i] *= 500.f;
    for (size_t i = 50; i < kn.size(); i += 211) kn[i] = kn[i] < 0 ? -1e20f : 1e20f;
  }
  s.k_new = encode(kn, dt);
  s.v_new = encode(vn, dt);
  if (sc.poison) {
    const size_t es = pagedkv::dtype_size(dt);
    const std::vector<uint8_t> nan = encode(nan_row(D), dt);
    for (size_t i = 0; i < sc.seqs.size(); ++i) {
      const SeqSpec& q = sc.seqs[i];
      if (q.nq < 2) continue;
      const int first = q.ctx - q.nq;
      const int window_first = sc.window > 0 ? std::max(0, first - sc.window + 1) : -1;
      for (int pos = first; pos < q.ctx; ++pos) {
        if (pos != q.ctx - 1 && pos != window_first) continue;
        const int64_t t = s.query_indptr[i] + (pos - first);
        for (int h = 0; h < hkv; ++h) {
          const size_t at = size_t(t * s.kv_s0 + int64_t(h) * D) * es;
          if (!sc.poison_v_only) std::memcpy(&s.k_new[at], nan.data(), nan.size());
          std::memcpy(&s.v_new[at], nan.data(), nan.size());
        }
      }
    }
  }
  // Larger queries make the softmax peaked, so masking errors cannot hide.
  std::vector<float> qf = uniform(rng, size_t(s.num_tokens * s.q_s0), -2.5f, 2.5f);
  if (sc.nan_q) {
    for (size_t i = 0; i + 1 < s.query_indptr.size(); ++i) {
      for (int64_t t : {int64_t(s.query_indptr[i]), int64_t(s.query_indptr[i + 1]) - 1}) {
        for (int d = 0; d < D; ++d) qf[size_t(t * s.q_s0 + d)] = std::nanf("");
      }
    }
  }
  s.q = encode(qf, dt);
  return s;
}

struct Outputs {
  std::vector<uint8_t> arena, out;
  std::vector<float> lse;
};

// Runs write + attend on one backend through the Backend interface only
// (allocate/upload included), and reads the results back.
inline Outputs run(Backend& b, const Inputs& s, const AttentionArgs& proto, bool want_lse) {
  const bool device = b.device_type() == 2;
  std::vector<void*> owned;
  auto put = [&](const void* host, size_t bytes) {
    void* p = b.allocate(bytes);
    owned.push_back(p);
    if (bytes > 0) b.upload(p, host, bytes, nullptr);
    return p;
  };
  auto get = [&](const void* p, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    if (device) {
      h = read_device(p, bytes);
    } else if (bytes > 0) {
      std::memcpy(h.data(), p, bytes);
    }
    return h;
  };
  const DType dt = s.io;
  const size_t es = pagedkv::dtype_size(dt);
  const int D = s.layout.head_dim;

  // FP8: the scales after the planes, in the same allocation (as the pool).
  std::vector<uint8_t> storage = s.arena;
  const size_t scales_at = KvArena::scales_offset(storage.size());
  if (!s.scales.empty()) {
    storage.resize(scales_at + s.scales.size() * sizeof(float));
    std::memcpy(&storage[scales_at], s.scales.data(), s.scales.size() * sizeof(float));
  }
  void* base = put(storage.data(), storage.size());
  KvArena arena{base, s.num_layers, s.layout,
                s.scales.empty()
                    ? nullptr
                    : reinterpret_cast<const float*>(static_cast<char*>(base) + scales_at)};
  PlanView plan{};
  plan.num_seqs = int32_t(s.context_lens.size());
  plan.num_tokens = s.num_tokens;
  plan.max_query = s.max_query;
  plan.max_context = s.max_context;
  plan.slot_mapping =
      static_cast<const int64_t*>(put(s.slot_mapping.data(), s.slot_mapping.size() * 8));
  plan.query_indptr =
      static_cast<const int32_t*>(put(s.query_indptr.data(), s.query_indptr.size() * 4));
  plan.page_indptr =
      static_cast<const int32_t*>(put(s.page_indptr.data(), s.page_indptr.size() * 4));
  plan.page_indices =
      static_cast<const int32_t*>(put(s.page_indices.data(), s.page_indices.size() * 4));
  plan.last_page_len =
      static_cast<const int32_t*>(put(s.last_page_len.data(), s.last_page_len.size() * 4));
  plan.context_lens =
      static_cast<const int32_t*>(put(s.context_lens.data(), s.context_lens.size() * 4));

  const int hkv = s.layout.num_kv_heads;
  Tensor3 k{put(s.k_new.data(), s.k_new.size()), dt, s.num_tokens, hkv, D, s.kv_s0, D};
  Tensor3 v{put(s.v_new.data(), s.v_new.size()), dt, s.num_tokens, hkv, D, s.kv_s0, D};
  Tensor3 q{put(s.q.data(), s.q.size()), dt, s.num_tokens, s.num_q_heads, D, s.q_s0, D};
  const size_t out_bytes = size_t(s.num_tokens) * s.num_q_heads * D * es;
  std::vector<uint8_t> poison(out_bytes);
  fill_nan(poison.data(), poison.size(), dt);
  Tensor3 out{put(poison.data(), poison.size()), dt, s.num_tokens, s.num_q_heads, D,
              int64_t(s.num_q_heads) * D,        D};
  AttentionArgs args = proto;
  std::vector<float> lse_poison(size_t(s.num_tokens) * s.num_q_heads, std::nanf(""));
  if (want_lse) {
    args.lse = static_cast<float*>(put(lse_poison.data(), lse_poison.size() * 4));
    args.lse_stride0 = s.num_q_heads;
  } else {
    args.lse = nullptr;
  }

  b.write(arena, s.layer, plan, k, v, nullptr);
  b.attend(arena, s.layer, plan, q, out, args, nullptr);
  b.synchronize(nullptr);

  Outputs o;
  o.arena = get(arena.base, s.arena.size());
  o.out = get(out.data, out_bytes);
  if (want_lse) {
    const std::vector<uint8_t> l = get(args.lse, lse_poison.size() * 4);
    o.lse.resize(lse_poison.size());
    std::memcpy(o.lse.data(), l.data(), l.size());
  }
  for (void* p : owned) b.deallocate(p);
  return o;
}

struct Tolerance {
  float atol, rtol;
};
inline Tolerance out_tolerance(DType t) {
  // f16/bf16 run P through the tensor cores in the cache dtype; the CPU
  // keeps P in f32. Both round the output to the dtype.
  return t == DType::kF32   ? Tolerance{1e-4f, 1e-4f}
         : t == DType::kF16 ? Tolerance{4e-3f, 4e-3f}
                            : Tolerance{2e-2f, 2e-2f};
}

inline void compare(const Inputs& s, const Outputs& gpu, const Outputs& cpu,
                    const std::string& what) {
  // The write is a byte copy: the arenas must agree bit for bit (NaN
  // poison in the slots nobody wrote included).
  const auto mismatch = std::mismatch(gpu.arena.begin(), gpu.arena.end(), cpu.arena.begin());
  EXPECT_TRUE(mismatch.first == gpu.arena.end())
      << what << ": arena differs at byte " << (mismatch.first - gpu.arena.begin());

  const DType dt = s.io;
  const size_t es = pagedkv::dtype_size(dt);
  const Tolerance tol = out_tolerance(dt);
  const int D = s.layout.head_dim;
  int64_t bad = 0;
  std::ostringstream first;
  const size_t n = gpu.out.size() / es;
  for (size_t i = 0; i < n; ++i) {
    const float g = decode_one(&gpu.out[i * es], dt);
    const float c = decode_one(&cpu.out[i * es], dt);
    // NaN only where a poisoned key is visible: then on both backends.
    const bool ok = (std::isnan(g) && std::isnan(c)) ||
                    (std::isfinite(g) && std::isfinite(c) &&
                     std::fabs(g - c) <= tol.atol * s.v_mag + tol.rtol * std::fabs(c));
    if (!ok && bad++ < 5) {
      const size_t row = i / D;
      first << " [token " << row / s.num_q_heads << " head " << row % s.num_q_heads << " d "
            << i % D << ": gpu " << g << " cpu " << c << "]";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " outputs differ;" << first.str();

  ASSERT_EQ(gpu.lse.size(), cpu.lse.size());
  int64_t bad_lse = 0;
  std::ostringstream first_lse;
  for (size_t i = 0; i < gpu.lse.size(); ++i) {
    const float g = gpu.lse[i], c = cpu.lse[i];
    // NaN (NaN logits) and -inf (no key) are different answers.
    const bool ok =
        (std::isnan(g) && std::isnan(c)) ||
        (std::isinf(g) && std::isinf(c) && (g < 0) == (c < 0)) ||
        (std::isfinite(g) && std::isfinite(c) && std::fabs(g - c) <= 1e-3f + 1e-3f * std::fabs(c));
    if (!ok && bad_lse++ < 5) {
      first_lse << " [token " << i / s.num_q_heads << " head " << i % s.num_q_heads << ": gpu " << g
                << " cpu " << c << "]";
    }
  }
  EXPECT_EQ(bad_lse, 0) << what << ": " << bad_lse << " LSE values differ;" << first_lse.str();
}

inline std::vector<Scenario> scenarios(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> ctx(1, 300);
  std::vector<Scenario> v;
  {
    Scenario s{"decode", 16, {}};
    s.lse = false;
    for (int i = 0; i < 5; ++i) s.seqs.push_back({ctx(rng), 1});
    s.seqs.push_back({1, 1});  // the first token of a sequence
    v.push_back(s);
  }
  {
    Scenario s{"prefill", 8, {}};
    std::uniform_int_distribution<int> len(1, 90);
    for (int i = 0; i < 3; ++i) {
      const int n = len(rng);
      s.seqs.push_back({n, n});
    }
    v.push_back(s);
  }
  {
    Scenario s{"chunked+decode", 32, {{150, 40}, {77, 1}, {64, 64}, {33, 17}}};
    v.push_back(s);
  }
  {
    Scenario s{"window", 16, {{200, 1}, {180, 30}, {45, 45}, {97, 1}}};
    s.window = 37;
    v.push_back(s);
  }
  {
    Scenario s{"softcap+scale", 64, {{130, 1}, {70, 20}, {5, 5}}};
    s.softcap = 2.f;
    s.scale = 0.3f;
    v.push_back(s);
  }
  {
    Scenario s{"forced-splits", 16, {{700, 1}, {333, 1}, {90, 12}, {3, 1}}};
    s.splits = 5;
    s.window = 0;
    v.push_back(s);
  }
  {
    Scenario s{"split-window-softcap", 8, {{900, 1}, {400, 3}}};
    s.splits = 7;
    s.window = 300;
    s.softcap = 5.f;
    v.push_back(s);
  }
  {
    Scenario s{"heuristic-splits", 32, {{3000, 1}}};  // few CTAs, long context
    v.push_back(s);
  }
  {
    Scenario s{"poison-prefill", 8, {{70, 70}, {45, 21}, {33, 1}}};
    s.poison = true;
    v.push_back(s);
  }
  {
    Scenario s{"poison-window-softcap", 16, {{120, 40}, {50, 50}, {80, 1}}};
    s.poison = true;
    s.window = 29;
    s.softcap = 3.f;
    v.push_back(s);
  }
  {
    Scenario s{"nan-q", 16, {{300, 1}, {1, 1}, {90, 1}}};  // decode: every warp NaN
    s.nan_q = true;
    v.push_back(s);
  }
  {
    Scenario s{"nan-q-splits-prefill", 8, {{700, 1}, {60, 30}, {20, 20}}};
    s.nan_q = true;
    s.splits = 3;
    v.push_back(s);
  }
  {
    Scenario s{"poison-v-window", 16, {{150, 70}, {40, 40}, {60, 1}}};
    s.poison = true;
    s.poison_v_only = true;
    s.window = 45;
    v.push_back(s);
  }
  // Last, so that the scenarios above draw the same inputs as before.
  {
    Scenario s{"v-near-max", 16, {{120, 1}, {70, 30}, {48, 48}, {2, 1}}};
    s.v_near_max = true;
    v.push_back(s);
  }
  {
    Scenario s{"v-near-max-splits", 8, {{400, 1}, {150, 20}}};
    s.v_near_max = true;
    s.splits = 4;
    v.push_back(s);
  }
  // Last again, for the same reason.
  {
    Scenario s{"v-at-max", 16, {{120, 1}, {70, 30}, {48, 48}, {2, 1}, {17, 17}}};
    s.v_at_max = true;
    v.push_back(s);
  }
  {
    Scenario s{"v-at-max-splits", 8, {{400, 1}, {150, 20}}};
    s.v_at_max = true;
    s.splits = 4;
    v.push_back(s);
  }
  return v;
}

}  // namespace pkvtest
