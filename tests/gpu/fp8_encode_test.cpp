// The CPU FP8 encoder and decoder (impl/cpu/fp8.h) against CUDA's own
// conversions (cuda_fp8.h, __NV_SATFINITE), run on the host: the encodings
// the CUDA kernels will store are the CPU backend's, bit for bit. All 256
// codes, every tie between neighbouring codes and 2^20 random floats of
// every binade (NaN: both sides give a NaN code).
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "cpu/fp8.h"

namespace {

using pagedkv::bits_float;
using pagedkv::f32_to_fp8;
using pagedkv::fp8_to_f32;
using pagedkv::kFp8E4m3;
using pagedkv::kFp8E5m2;

template <int F>
uint8_t cuda_encode(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, F == kFp8E4m3 ? __NV_E4M3 : __NV_E5M2);
}

template <int F>
float cuda_decode(uint8_t c) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(c, F == kFp8E4m3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));
}

template <int F>
bool is_nan_code(uint8_t c) {
  return std::isnan(fp8_to_f32<F>(c));
}

template <int F>
void check_format() {
  for (int c = 0; c < 256; ++c) {
    const float a = fp8_to_f32<F>(uint8_t(c)), b = cuda_decode<F>(uint8_t(c));
    EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << "code " << c;
  }
  std::mt19937 rng(F + 1);
  long bad = 0;
  auto check = [&](float x) {
    const uint8_t mine = f32_to_fp8<F>(x), theirs = cuda_encode<F>(x);
    const bool ok = std::isnan(x) ? is_nan_code<F>(mine) && is_nan_code<F>(theirs) : mine == theirs;
    if (!ok && ++bad <= 5)
      ADD_FAILURE() << std::hexfloat << x << ": " << int(mine) << " vs " << int(theirs);
  };
  for (int c = 0; c < 255; ++c) {
    const float a = fp8_to_f32<F>(uint8_t(c)), b = fp8_to_f32<F>(uint8_t(c + 1));
    if (!std::isfinite(a) || !std::isfinite(b) || (c & 0x7f) == 0x7f) continue;
    const float mid = (a + b) / 2;
    for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) check(x);
  }
  for (float x : {INFINITY, -INFINITY, NAN, 1e38f, -1e-38f}) check(x);
  for (int i = 0; i < (1 << 20); ++i) check(bits_float(rng()));
  EXPECT_EQ(bad, 0);
}

TEST(Fp8Encoding, MatchesCudaSatfinite) {
  check_format<kFp8E4m3>();
  check_format<kFp8E5m2>();
}

}  // namespace
