// Helpers for the GPU tests: device buffers, dtype encoding, random data.
// Every test calls PKV_SKIP_WITHOUT_GPU() first so that the suite passes (as
// skipped) on machines without a CUDA device or driver.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/fp8.h"
#include "cpu/half.h"
#include "kernel_types.h"

#define PKV_SKIP_WITHOUT_GPU()                                               \
  do {                                                                       \
    if (pagedkv::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#define PKV_CUDA_OK(call)                                                          \
  do {                                                                             \
    const cudaError_t pkv_e_ = (call);                                             \
    ASSERT_EQ(pkv_e_, cudaSuccess) << #call << ": " << cudaGetErrorString(pkv_e_); \
  } while (0)

namespace pkvtest {

using pagedkv::DType;

inline const char* dtype_name(DType t) {
  return t == DType::kF32       ? "f32"
         : t == DType::kF16     ? "f16"
         : t == DType::kFp8E4m3 ? "e4m3"
         : t == DType::kFp8E5m2 ? "e5m2"
                                : "bf16";
}

// Encodes floats as dtype bytes (round to nearest even) and back.
inline std::vector<uint8_t> encode(const std::vector<float>& x, DType t) {
  const size_t es = pagedkv::dtype_size(t);
  std::vector<uint8_t> out(x.size() * es);
  for (size_t i = 0; i < x.size(); ++i) {
    if (t == DType::kFp8E4m3) {
      out[i] = pagedkv::f32_to_fp8<pagedkv::kFp8E4m3>(x[i]);
    } else if (t == DType::kFp8E5m2) {
      out[i] = pagedkv::f32_to_fp8<pagedkv::kFp8E5m2>(x[i]);
    } else if (t == DType::kF32) {
      std::memcpy(&out[i * 4], &x[i], 4);
    } else {
      const uint16_t h = t == DType::kF16 ? pagedkv::f32_to_f16(x[i]) : pagedkv::f32_to_bf16(x[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

inline float decode_one(const uint8_t* p, DType t) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::kF16 ? pagedkv::f16_to_f32(h) : pagedkv::bf16_to_f32(h);
}

// A quiet NaN of the dtype, repeated: poison for unused slots and outputs.
inline void fill_nan(uint8_t* p, size_t bytes, DType t) {
  const size_t es = pagedkv::dtype_size(t);
  const uint32_t f32nan = 0x7fc00000u;
  const uint16_t h = t == DType::kF16 ? 0x7e00 : 0x7fc0;
  for (size_t i = 0; i + es <= bytes; i += es) {
    if (es == 1) {
      p[i] = 0x7f;  // NaN in E4M3 and E5M2
    } else if (t == DType::kF32) {
      std::memcpy(p + i, &f32nan, 4);
    } else {
      std::memcpy(p + i, &h, 2);
    }
  }
}

inline std::vector<float> nan_row(int n) { return std::vector<float>(size_t(n), std::nanf("")); }

inline std::vector<float> uniform(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Device memory owned by a test.
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&p_, bytes == 0 ? 1 : bytes) != cudaSuccess) p_ = nullptr;
  }
  DevBuf(const void* host, size_t bytes) : DevBuf(bytes) {
    if (p_ != nullptr && bytes > 0) cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice);
  }
  ~DevBuf() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> h(bytes_);
    if (bytes_ > 0) cudaMemcpy(h.data(), p_, bytes_, cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

inline std::vector<uint8_t> read_device(const void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  if (bytes > 0) cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
  return h;
}

}  // namespace pkvtest
