// Helpers for the kernel tests: dtype-aware host buffers, NaN poison, and
// random values that are exactly representable in the dtype under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/half.h"
#include "cpu/kernels.h"
#include "kernel_types.h"

namespace pagedkv {
namespace test {

inline const char* dtype_name(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16";
}
inline const char* isa_name(CpuIsa isa) {
  return isa == CpuIsa::kScalar   ? "scalar"
         : isa == CpuIsa::kAvx2   ? "avx2"
         : isa == CpuIsa::kAvx512 ? "avx512"
                                  : "avx512bf16";
}

inline std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (cpu::cpu_isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// Reads element i of a buffer of dtype t as double (exact).
inline double load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

// Stores x rounded to t; returns the value actually stored.
inline double store(void* p, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(p)[i] = x;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(x);
      break;
    default:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(x);
      break;
  }
  return load(p, t, i);
}

// Fills n elements with a NaN bit pattern of dtype t.
inline void fill_nan(void* p, DType t, int64_t n) {
  if (t == DType::kF32) {
    float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(p)[i] = nan;
  } else {
    const uint16_t nan = t == DType::kF16 ? 0x7e00 : 0x7fc0;
    for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(p)[i] = nan;
  }
}

// A 64-byte aligned, owned byte buffer.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes) : bytes_(bytes), data_((bytes + 63) / 64 * 64 / 4 + 16) {}
  void* data() { return data_.data(); }
  const void* data() const { return data_.data(); }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
  std::vector<float> data_;  // float storage: aligned enough for every dtype here
};

}  // namespace test
}  // namespace pagedkv
