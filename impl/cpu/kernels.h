// The per-ISA leaf kernels the attention driver (attention.cpp) and the
// conversions call through one table. Each table is built from the same
// templates (kernels_impl.inc) compiled for scalar, AVX2 or AVX-512 code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/cpu_backend.h"
#include "kernel_types.h"

namespace pagedkv {
namespace cpu {

// Logits of R query rows (f32, R x head_dim, row stride head_dim) against
// keys [j0, j1) of one page of one KV head (cache dtype, row stride
// head_dim): logits[r * ldl + j] = q_r . k_j, then, if softcap > 0,
// softcap * tanh(logit / softcap). Entries outside [j0, j1) of the vector
// span covering them may be overwritten with garbage.
// The pf_bytes at pf (a page read next; may be null) are prefetched, spread
// over the keys, so that those loads overlap this page's arithmetic.
using QkFn = void (*)(const float* q, int64_t head_dim, const void* page, int32_t j0, int32_t j1,
                      float* logits, int32_t ldl, float softcap, const void* pf, size_t pf_bytes);

// acc[r] = acc[r] * alpha[r] + sum_{j in [j0, j1)} p[r * ldp + j] * v_j.
// Prefetches like QkFn.
using PvFn = void (*)(const float* p, int32_t ldp, const void* page, int32_t j0, int32_t j1,
                      int64_t head_dim, float* acc, const float* alpha, const void* pf,
                      size_t pf_bytes);

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
// pairs (see KernelTable::pair_width).
constexpr int kNumKvKinds = 4;
constexpr int kBf16Paired = 3;

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
  PvFn pv[kNumRowSizes][kNumKvKinds];
  SoftmaxFn softmax;
  ToF32Fn to_f32[kNumDTypes];
  FromF32Fn from_f32[kNumDTypes];
};

const KernelTable& scalar_table();
const KernelTable* avx2_table();    // nullptr when not compiled in
const KernelTable* avx512_table();  // nullptr when not compiled in

// True if this CPU (and OS) can run isa.
bool cpu_isa_supported(CpuIsa isa);
// kAuto -> the best supported ISA, lowered by env PAGEDKV_CPU_ISA; an
// explicit ISA the CPU lacks throws Error(kUnsupported).
CpuIsa resolve_cpu_isa(CpuIsa requested);
const KernelTable& kernel_table(CpuIsa resolved);

}  // namespace cpu
}  // namespace pagedkv
