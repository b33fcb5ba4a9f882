// Portable MLA leaf kernels (mla_ops.inc over plain floats).
#include "cpu/half.h"
#include "cpu/mla.h"

namespace pagedkv {
namespace cpu {
namespace mla_scalar {

struct Ops {
  using V = float;
  static constexpr int32_t W = 1;
  static V zero() { return 0.0f; }
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V x) { *p = x; }
  static V mul(V a, V b) { return a * b; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float hsum(V a) { return a; }
};

void widen_impl(const void* src, DType dtype, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  }
}

constexpr CpuIsa kIsa = CpuIsa::kScalar;

#include "cpu/mla_ops.inc"

}  // namespace mla_scalar

const MlaOps& mla_ops_scalar() { return mla_scalar::kOps; }

}  // namespace cpu
}  // namespace pagedkv
