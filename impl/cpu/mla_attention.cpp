// MLA cache write and absorbed attention on the CPU (semantics: mla.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cpu/attention.h"
#include "cpu/half.h"
#include "cpu/kernels.h"
#include "cpu/mla.h"
#include "cpu/overflow.h"
#include "error.h"

namespace pagedkv {
namespace cpu {
namespace {

constexpr int32_t kQueryTile = 8;  // queries of one sequence per item
constexpr int32_t kHeadBlock = 16;
constexpr int32_t kKeyChunk = 32;  // keys widened and scored at once

float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

void store_f32(void* p, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = x;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(x);
      break;
    default:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(x);
      break;
  }
}

// Per-thread buffers, sized for the largest item.
struct Scratch {
  std::vector<float> q, keys, s, acc, m, l, alpha;
};

struct Item {
  int32_t seq, q0, nq, h0, nh;
};

}  // namespace

const MlaOps& mla_ops(CpuIsa resolved) {
  if (resolved == CpuIsa::kAvx512 || resolved == CpuIsa::kAvx512Bf16) {
    if (const MlaOps* o = mla_ops_avx512()) return *o;
  }
  if (resolved != CpuIsa::kScalar) {
    if (const MlaOps* o = mla_ops_avx2()) return *o;
  }
  return mla_ops_scalar();
}

void mla_write(ThreadPool& pool, const MlaCache& cache, const PlanView& plan, const Tensor3& kv_c,
               const Tensor3& k_pe) {
  const int64_t num_slots = int64_t(cache.num_blocks) * cache.block_size;
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    const int64_t slot = plan.slot_mapping[t];
    if (slot < -1 || slot >= num_slots)
      fail(Errc::kInvalidArgument, "MLA cache write: slot_mapping[" + std::to_string(t) +
                                       "] = " + std::to_string(slot) + " is out of range");
  }
  const size_t es = dtype_size(cache.dtype);
  const int64_t d = int64_t(cache.rank) + cache.rope;
  char* base = static_cast<char*>(cache.base);
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = plan.slot_mapping[t];
      if (slot < 0) continue;
      char* dst = base + slot * d * int64_t(es);
      std::memcpy(dst, static_cast<const char*>(kv_c.data) + t * kv_c.s0 * int64_t(es),
                  size_t(cache.rank) * es);
      if (cache.rope > 0)
        std::memcpy(dst + size_t(cache.rank) * es,
                    static_cast<const char*>(k_pe.data) + t * k_pe.s0 * int64_t(es),
                    size_t(cache.rope) * es);
    }
  };
  constexpr int64_t kChunk = 256;
  const int64_t chunks = (plan.num_tokens + kChunk - 1) / kChunk;
  if (chunks < 2) return rows(0, plan.num_tokens);
  pool.parallel_for(chunks, [&](int64_t c, int32_t) {
    rows(c * kChunk, std::min(plan.num_tokens, (c + 1) * kChunk));
  });
}

void mla_attend(ThreadPool& pool, const MlaOps& ops, const MlaCache& cache, const PlanView& plan,
                const Tensor3& q_latent, const Tensor3& q_pe, const Tensor3& out,
                const AttentionArgs& args) {
  const int32_t R = cache.rank, P = cache.rope, D = R + P;
  const int32_t H = int32_t(q_latent.n1);
  const int32_t bs = cache.block_size;
  const DType T = cache.dtype;
  const size_t es = dtype_size(T);
  // Pages are checked before anything is read: a plan only names blocks of
  // this cache, but the kernel does not take that on trust.
  for (int32_t s = 0; s < plan.num_seqs; ++s) {
    for (int32_t i = plan.page_indptr[s]; i < plan.page_indptr[s + 1]; ++i)
      if (plan.page_indices[i] < 0 || plan.page_indices[i] >= cache.num_blocks)
        fail(Errc::kInvalidArgument,
             "MLA attention: page_indices[" + std::to_string(i) + "] is not a block of the cache");
  }
  std::vector<Item> items;
  for (int32_t s = 0; s < plan.num_seqs; ++s) {
    const int32_t nq = plan.query_indptr[s + 1] - plan.query_indptr[s];
    for (int32_t q0 = 0; q0 < nq; q0 += kQueryTile)
      for (int32_t h0 = 0; h0 < H; h0 += kHeadBlock)
        items.push_back({s, q0, std::min(kQueryTile, nq - q0), h0, std::min(kHeadBlock, H - h0)});
  }
  const int32_t max_rows = kQueryTile * std::min(kHeadBlock, H);
  std::vector<Scratch> scratch(size_t(pool.size()));
  const float scale = args.softmax_scale;
  const float ninf = -std::numeric_limits<float>::infinity();
  const KernelTable& table = kernel_table(ops.isa);
  const SoftmaxFn softmax = table.softmax;
  const int32_t width = table.width;
  if (kKeyChunk % width != 0) fail(Errc::kInternal, "MLA attention: key chunk vs vector width");

  auto run = [&](int64_t it, int32_t worker) {
    const Item& item = items[size_t(it)];
    Scratch& sc = scratch[size_t(worker)];
    if (sc.q.empty()) {
      sc.q.resize(size_t(max_rows) * D);
      sc.keys.resize(size_t(kKeyChunk) * D);
      sc.s.resize(size_t(max_rows) * kKeyChunk);
      sc.acc.resize(size_t(max_rows) * R);
      sc.m.resize(size_t(max_rows));
      sc.l.resize(size_t(max_rows));
      sc.alpha.resize(size_t(max_rows));
    }
    const int32_t L = plan.context_lens[item.seq];
    const int32_t nq_seq = plan.query_indptr[item.seq + 1] - plan.query_indptr[item.seq];
    const int64_t row0 = plan.query_indptr[item.seq] + item.q0;
    const int32_t p0 = L - nq_seq + item.q0;  // position of the tile's first query
    const int32_t rows = item.nq * item.nh;   // row r: query r / nh, head h0 + r % nh
    // Scaled queries [q_latent | q_pe] in f32, one row of D per (query, head).
    for (int32_t r = 0; r < rows; ++r) {
      const int64_t t = row0 + r / item.nh, h = item.h0 + r % item.nh;
      float* qr = sc.q.data() + int64_t(r) * D;
      const int64_t ol = t * q_latent.s0 + h * q_latent.s1;
      for (int32_t i = 0; i < R; ++i) qr[i] = scale * load_f32(q_latent.data, T, ol + i);
      const int64_t op = t * q_pe.s0 + h * q_pe.s1;
      for (int32_t i = 0; i < P; ++i) qr[R + i] = scale * load_f32(q_pe.data, T, op + i);
    }
    std::fill(sc.acc.begin(), sc.acc.begin() + int64_t(rows) * R, 0.0f);
    std::fill(sc.m.begin(), sc.m.begin() + rows, ninf);
    std::fill(sc.l.begin(), sc.l.begin() + rows, 0.0f);
    const int32_t last_key = p0 + item.nq - 1;  // keys [0, last_key] are visible to someone
    // f32 and bf16 latents reach FLT_MAX: the unnormalised sum of p c over
    // n keys (weights up to 1 each) can then overflow although the output
    // (a convex combination) is finite. Weights times 2^-e with 2^e >= 2n
    // (n = last_key + 1, the most keys a row of the item sees) keep it
    // below max|c|; the power of two is exact (short of underflow), so the
    // result is that of unscaled weights, and the end multiplies 2^e back.
    // f16 latents stay far below the limit.
    float p_scale = 1.0f, p_unscale = 1.0f;
    if ((T == DType::kF32 || T == DType::kBF16) && last_key > 0) {
      const int e = overflow_exponent(int64_t(last_key) + 1);
      p_scale = std::ldexp(1.0f, -e);
      p_unscale = std::ldexp(1.0f, e);
    }
    const int32_t* pages = plan.page_indices + plan.page_indptr[item.seq];
    for (int32_t k0 = 0, nk = 0; k0 <= last_key; k0 += nk) {
      // A chunk never crosses a page end (the next page is elsewhere).
      const int32_t page_end = (k0 / bs + 1) * bs;
      nk = std::min({kKeyChunk, last_key + 1 - k0, page_end - k0});
      const char* src = static_cast<const char*>(cache.base) +
                        (int64_t(pages[k0 / bs]) * bs + k0 % bs) * D * int64_t(es);
      const float* keys;
      if (T == DType::kF32) {
        keys = reinterpret_cast<const float*>(src);
      } else {
        ops.widen(src, T, sc.keys.data(), int64_t(nk) * D);
        keys = sc.keys.data();
      }
      ops.scores(sc.q.data(), rows, keys, nk, D, sc.s.data(), kKeyChunk);
      // Keys after a row's query, and the chunk's tail up to the softmax
      // step's vector width, weigh nothing (-inf -> 0).
      const int32_t span = (nk + width - 1) / width * width;
      for (int32_t r = 0; r < rows; ++r) {
        float* sr = sc.s.data() + int64_t(r) * kKeyChunk;
        const int32_t p = p0 + r / item.nh;
        const int32_t visible = std::max(0, std::min(nk, p + 1 - k0));
        std::fill(sr + visible, sr + span, ninf);
      }
      softmax(sc.s.data(), kKeyChunk, rows, 0, span, sc.m.data(), sc.l.data(), sc.alpha.data());
      if (p_scale != 1.0f) {  // l keeps the unscaled weights (LSE)
        for (int32_t r = 0; r < rows; ++r) {
          float* sr = sc.s.data() + int64_t(r) * kKeyChunk;
          for (int32_t j = 0; j < nk; ++j) sr[j] *= p_scale;
        }
      }
      // Each query's rows take only the keys that query sees: a later key
      // weighs 0, but 0 * c is NaN when its latent holds NaN or Inf (a later
      // token's garbage), which must not reach an earlier query (causal).
      for (int32_t qi = 0; qi < item.nq; ++qi) {
        const int32_t visible = std::max(0, std::min(nk, p0 + qi + 1 - k0));
        const int64_t r = int64_t(qi) * item.nh;
        ops.accumulate(sc.s.data() + r * kKeyChunk, item.nh, kKeyChunk, keys, visible, D, R,
                       sc.alpha.data() + r, sc.acc.data() + r * R);
      }
    }
    for (int32_t r = 0; r < rows; ++r) {
      const int64_t t = row0 + r / item.nh, h = item.h0 + r % item.nh;
      const float inv = 1.0f / sc.l[r] * p_unscale;
      const float* a = sc.acc.data() + int64_t(r) * R;
      const int64_t o = t * out.s0 + h * out.s1;
      // A convex combination of finite latents is at most FLT_MAX: a * inv
      // rounds a few ulps either side of it for latents at FLT_MAX, and
      // past it would be inf. A finite a stays finite (an infinite one not).
      for (int32_t i = 0; i < R; ++i) store_f32(out.data, T, o + i, normalised(a[i], inv));
      if (args.lse) args.lse[t * args.lse_stride0 + h] = sc.m[r] + std::log(sc.l[r]);
    }
  };
  if (items.size() == 1) {
    run(0, 0);
    return;
  }
  pool.parallel_for(int64_t(items.size()), [&](int64_t i, int32_t w) { run(i, w); });
}

}  // namespace cpu
}  // namespace pagedkv
