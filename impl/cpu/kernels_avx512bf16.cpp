// AVX-512 kernels plus AVX512_BF16 (vdpbf16ps) for the q . k products of
// bf16 queries against a bf16 cache; everything else is the avx512 set,
// compiled again for this target. Only called after a runtime CPU check.
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/fp8.h"
#include "cpu/half.h"
#include "cpu/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PKV_OMIT_AVX512BF16)
#define PKV_HAVE_AVX512BF16 1
#if !defined(__clang__)
// GCC 12 warns inside its own avx512fintrin.h (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(                                                      \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#endif

namespace pagedkv {
namespace cpu {
namespace avx512bf16_isa {

#include "cpu/ops_avx512.inc"

#include "cpu/fp8_ops_avx512.inc"  // after Ops

#include "cpu/fp8_kernels.inc"  // after Fp8Ops

#define PKV_KERNELS_BF16DOT 1
#include "cpu/kernels_impl.inc"
#undef PKV_KERNELS_BF16DOT

const KernelTable& table() {
  static const KernelTable t = build_table(CpuIsa::kAvx512Bf16, "avx512bf16", 16);
  return t;
}

}  // namespace avx512bf16_isa
}  // namespace cpu
}  // namespace pagedkv

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace pagedkv {
namespace cpu {
const KernelTable* avx512bf16_table() {
#ifdef PKV_HAVE_AVX512BF16
  return &avx512bf16_isa::table();
#else
  return nullptr;
#endif
}
}  // namespace cpu
}  // namespace pagedkv
