// Portable scalar kernels: the baseline every CPU runs, and the path the
// tests always exercise next to the vector ones.
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/fp8.h"
#include "cpu/half.h"
#include "cpu/kernels.h"

namespace pagedkv {
namespace cpu {
namespace scalar_isa {

struct Ops {
  using V = float;
  static constexpr int W = 1;
  static constexpr int kAcc = 4;
  static constexpr int kQkRows = 16;
  static constexpr int kRegs = 16;    // vector registers
  static constexpr int kReduceN = 0;  // no reduce_rows
  static constexpr bool kPairBf16 = false;
  static void load_bf16_pair(const uint16_t*, V*, V*) {}
  template <int KU>
  static void reduce_rows(const V*, float*, int32_t) {}
  static V zero() { return 0.0f; }
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V max(V a, V b) { return b > a ? b : a; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float hsum(V v) { return v; }
  static float hmax(V v) { return v; }
  static V load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static V load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static void store_f16(uint16_t* p, V v) { *p = f32_to_f16(v); }
  static void store_bf16(uint16_t* p, V v) { *p = f32_to_bf16(v); }
  static V exp(V x) { return std::exp(x); }
  static V tanh(V x) { return std::tanh(x); }
};

#include "cpu/fp8_ops_scalar.inc"  // after Ops

#include "cpu/fp8_kernels.inc"  // after Fp8Ops

#include "cpu/kernels_impl.inc"

}  // namespace scalar_isa

const KernelTable& scalar_table() {
  static const KernelTable table = scalar_isa::build_table(CpuIsa::kScalar, "scalar", 8);
  return table;
}

}  // namespace cpu
}  // namespace pagedkv
