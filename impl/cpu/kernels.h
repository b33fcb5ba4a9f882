// The per-ISA leaf kernels the attention driver (attention.cpp) and the
// conversions call through one table. Each table is built from the same
// templates (kernels_impl.inc) compiled for scalar, AVX2 or AVX-512 code.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cpu/cpu_backend.h"
#include "kernel_types.h"

namespace pagedkv {
namespace cpu {

// Software prefetch of a list of memory regions (pages read next), issued
// a few lines per tick() from inside the leaf kernels so that the loads
// overlap arithmetic. The driver sizes the step from the ticks it expects
// and issues whatever is left with flush().
constexpr int kMaxPrefetchRegions = 32;
struct Prefetcher {
  const char* region[kMaxPrefetchRegions];
  int32_t n = 0;     // regions
  int32_t cur = 0;   // region being issued
  size_t bytes = 0;  // bytes per region
  size_t off = 0;    // next byte in region cur
  size_t step = 0;   // lines per tick

  void reset(size_t region_bytes) {
    n = cur = 0;
    off = step = 0;
    bytes = region_bytes;
  }
  void add(const void* p) {
    if (n < kMaxPrefetchRegions) region[n++] = static_cast<const char*>(p);
  }
  // Spreads the lines over about `ticks` ticks.
  void plan(int64_t ticks) {
    const size_t lines = size_t(n) * ((bytes + 63) / 64);
    step = ticks > 0 ? (lines + size_t(ticks) - 1) / size_t(ticks) : lines;
  }
  // Local copies in the loop: the asm statements would otherwise make the
  // compiler reload every member per line.
  void issue(size_t lines) {
    int32_t c = cur;
    size_t o = off;
    const size_t len = bytes;
    while (lines > 0 && c < n) {
      const size_t k = std::min(lines, (len - o + 63) / 64);
      const char* p = region[c] + o;
      // Evenly spread prefetcht0 did best here: bursts, or prefetcht1 /
      // prefetchnta, or hinting only a slice's first lines to the hardware
      // prefetcher were all slower (bench_cpu_attention).
      for (size_t i = 0; i < k; ++i) fetch_l1(p + i * 64);
      lines -= k;
      o += k * 64;
      if (o >= len) {
        o = 0;
        ++c;
      }
    }
    cur = c;
    off = o;
  }
  static void fetch_l1(const char* p) {
#if defined(__x86_64__) || defined(__i386__)
    // Inline asm: GCC drops prefetch builtins in loops it deems empty.
    asm volatile("prefetcht0 %0" : : "m"(*p));
#else
    __builtin_prefetch(p, 0, 3);
#endif
  }
  void tick(size_t ticks = 1) { issue(step * ticks); }
  void flush() { issue(~size_t(0)); }
};

// Logits of R query rows (f32, R x head_dim, row stride head_dim) against
// keys [j0, j1) of one page of one KV head (cache dtype, row stride
// head_dim): logits[r * ldl + j] = q_r . k_j, then, if softcap > 0,
// softcap * tanh(logit / softcap). Entries outside [j0, j1) of the vector
// span covering them may be overwritten with garbage.
using QkFn = void (*)(const float* q, int64_t head_dim, const void* page, int32_t j0, int32_t j1,
                      float* logits, int32_t ldl, float softcap, Prefetcher* pf);

// As QkFn for a bf16 page and bf16 query rows (R x head_dim, natural
// order, unscaled): logits = scale * (q_r . k_j) (products exact in f32,
// f32 accumulation), then the soft-cap. Needs head_dim % 32 == 0.
using QkBf16Fn = void (*)(const uint16_t* q, int64_t head_dim, const void* page, int32_t j0,
                          int32_t j1, float* logits, int32_t ldl, float scale, float softcap,
                          Prefetcher* pf);

// The keys a PV step reads: n pages of bs keys, all of page i in [0, n)
// except keys before j0 of page 0 and from j1 on of page n - 1. The weight
// of key j of page i for row r is p[r * ldp + i * page_ldp + j].
struct PvPages {
  const char* const* page;
  int32_t n, j0, j1, bs, page_ldp;
};

// acc[r] = acc[r] * alpha[r] + sum over the keys of pages of weight * v.
using PvFn = void (*)(const float* p, int32_t ldp, const PvPages& pages, int64_t head_dim,
                      float* acc, const float* alpha, Prefetcher* pf);

// One online-softmax step over rows r < R, entries [a0, a1) of each row
// (masked entries hold -inf; a0, a1 multiples of the table width): m_new =
// max(m, row max); x = exp(x - m_new) in place; alpha = exp(m - m_new);
// l = l * alpha + sum x. A row that is still all -inf gets x = 0, alpha = 1.
using SoftmaxFn = void (*)(float* logits, int32_t ldl, int32_t rows, int32_t a0, int32_t a1,
                           float* m, float* l, float* alpha);

using ToF32Fn = void (*)(const void* src, float* dst, int64_t n);
using FromF32Fn = void (*)(const float* src, void* dst, int64_t n);

constexpr int kMaxTileRows = 16;
constexpr int kNumRowSizes = 5;  // R = 1, 2, 4, 8, 16
constexpr int kNumDTypes = 3;    // f32, f16, bf16
// Kernel variants by cache layout: the three dtypes, plus bf16 read in
// pairs (see KernelTable::pair_width), plus the two FP8 formats (loads
// scaled by fp8_load_factor, fp8.h), plus E4M3 widened to bf16 and read in
// pairs like bf16 (AVX-512 and AVX2: null in scalar), plus E5M2 read in
// pairs (AVX2 only: null elsewhere).
constexpr int kNumKvKinds = 8;
constexpr int kBf16Paired = 3;
constexpr int kFp8E4m3Kind = 4;
constexpr int kFp8E5m2Kind = 5;
constexpr int kFp8E4m3Paired = 6;
constexpr int kFp8E5m2Paired = 7;
constexpr bool is_paired_kind(int kind) {
  return kind == kBf16Paired || kind == kFp8E4m3Paired || kind == kFp8E5m2Paired;
}

// dst[i] = FP8 encoding (format kFp8E4m3 / kFp8E5m2 of fp8.h) of src[i] / scale.
using QuantizeFp8Fn = void (*)(const float* src, uint8_t* dst, int64_t n, float scale);

inline int dtype_index(DType t) { return t == DType::kF32 ? 0 : t == DType::kF16 ? 1 : 2; }

struct KernelTable {
  CpuIsa isa;
  const char* name;
  int32_t width;     // f32 lanes per vector; head_dim must be a multiple
  int32_t max_rows;  // largest R worth using (register budget)
  // pair_width > 0: qk/pv[.][kBf16Paired] read a bf16 page 2 * pair_width
  // values at a time, widening the even and the odd elements separately
  // (a shift and a mask, no shuffle). q and acc rows are then in paired
  // order: within each group of 2 * pair_width values, the even elements
  // first, then the odd ones. Needs head_dim % (2 * pair_width) == 0.
  int32_t pair_width;
  QkFn qk[kNumRowSizes][kNumKvKinds];
  QkBf16Fn qk_bf16[kNumRowSizes];  // null where the ISA has no bf16 dot product
  // As qk_bf16 for an FP8 page (by format), widened to bf16 first; the
  // scale argument then also carries the K scale and fp8_load_factor.
  QkBf16Fn qk_bf16_fp8[kNumRowSizes][2];
  PvFn pv[kNumRowSizes][kNumKvKinds];
  SoftmaxFn softmax;
  ToF32Fn to_f32[kNumDTypes];
  FromF32Fn from_f32[kNumDTypes];
  QuantizeFp8Fn quantize_fp8[2];  // by format
};

const KernelTable& scalar_table();
const KernelTable* avx2_table();        // nullptr when not compiled in
const KernelTable* avx512_table();      // nullptr when not compiled in
const KernelTable* avx512bf16_table();  // nullptr when not compiled in

// True if this CPU (and OS) can run isa.
bool cpu_isa_supported(CpuIsa isa);
// Whether this CPU runs bf16 q . k faster with the bf16 dot product
// (avx512bf16) than by widening to f32 (avx512): measured once per process
// on a decode tile; false where the CPU has no AVX512_BF16.
bool bf16_dot_pays();
// kAuto -> the fastest supported ISA: the widest, except avx512 rather
// than avx512bf16 where bf16_dot_pays() is false; lowered by env
// PAGEDKV_CPU_ISA=scalar|avx2|avx512, or pinned to avx512bf16 (no
// measurement) by PAGEDKV_CPU_ISA=avx512bf16. An explicit ISA the CPU
// lacks throws Error(kUnsupported).
CpuIsa resolve_cpu_isa(CpuIsa requested);
const KernelTable& kernel_table(CpuIsa resolved);

}  // namespace cpu
}  // namespace pagedkv
