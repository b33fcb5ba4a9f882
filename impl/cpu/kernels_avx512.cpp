// AVX-512 (F/BW/VL) + FMA + F16C kernels, compiled for that target inside a
// baseline x86-64 library and only called after a runtime CPU check.
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/fp8.h"
#include "cpu/half.h"
#include "cpu/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(PKV_OMIT_AVX512)
#define PKV_HAVE_AVX512 1
#if !defined(__clang__)
// GCC 12 warns inside its own avx512fintrin.h (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

namespace pagedkv {
namespace cpu {
namespace avx512_isa {

#include "cpu/ops_avx512.inc"

#include "cpu/fp8_ops_avx512.inc"  // after Ops

#include "cpu/fp8_kernels.inc"  // after Fp8Ops

#include "cpu/kernels_impl.inc"

const KernelTable& table() {
  static const KernelTable t = build_table(CpuIsa::kAvx512, "avx512", 16);
  return t;
}

}  // namespace avx512_isa
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
const KernelTable* avx512_table() {
#ifdef PKV_HAVE_AVX512
  return &avx512_isa::table();
#else
  return nullptr;
#endif
}
}  // namespace cpu
}  // namespace pagedkv
