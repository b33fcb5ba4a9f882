// Scalar OCP FP8 (E4M3, E5M2) <-> f32 conversions: the reference the vector
// paths (fp8_ops_*.inc) and the CUDA kernels (cuda_fp8.h, __NV_SATFINITE)
// match bit for bit.
//
// Encoding: round to nearest even; magnitudes at or above the largest
// finite value (448 / 57344), infinities included, saturate to it; NaN
// becomes 0x7f with the sign bit (a NaN in both formats). Subnormals are
// kept. Decoding is exact.
#pragma once

#include <array>
#include <cstdint>
#include <limits>

#include "cpu/half.h"

namespace pagedkv {

constexpr int kFp8E4m3 = 0;
constexpr int kFp8E5m2 = 1;

constexpr float kFp8E4m3Max = 448.0f;
constexpr float kFp8E5m2Max = 57344.0f;

// F = kFp8E4m3 or kFp8E5m2.
template <int F>
inline uint8_t f32_to_fp8(float f) {
  // Format constants: mantissa bits M, f32 exponent rebias B (127 - bias),
  // smallest normal, largest code, and the f32 value whose ulp is the
  // format's subnormal step (adding it rounds a subnormal to that step).
  constexpr int M = F == kFp8E4m3 ? 3 : 2;
  constexpr uint32_t B = F == kFp8E4m3 ? 120 : 112;
  constexpr uint32_t min_normal = F == kFp8E4m3 ? 0x3c800000u : 0x38800000u;  // 2^-6, 2^-14
  constexpr uint32_t max_bits = F == kFp8E4m3 ? 0x43e00000u : 0x47600000u;    // 448, 57344
  constexpr uint8_t max_code = F == kFp8E4m3 ? 0x7e : 0x7b;
  constexpr float magic = F == kFp8E4m3 ? 16384.0f : 128.0f;  // 2^(23 - 9), 2^(23 - 16)
  uint32_t x = float_bits(f);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return uint8_t(sign | 0x7f);
  if (x >= max_bits) return uint8_t(sign | max_code);
  if (x < min_normal) {
    return uint8_t(sign | (float_bits(bits_float(x) + magic) - float_bits(magic)));
  }
  constexpr int shift = 23 - M;
  const uint32_t r = (x + ((1u << (shift - 1)) - 1) + ((x >> shift) & 1u)) >> shift;
  return uint8_t(sign | (r - (B << M)));
}

template <int F>
constexpr float fp8_to_f32_exact(uint8_t c) {
  constexpr int M = F == kFp8E4m3 ? 3 : 2;
  constexpr int bias = F == kFp8E4m3 ? 7 : 15;
  const bool neg = (c & 0x80) != 0;
  const int e = (c & 0x7f) >> M, m = c & ((1 << M) - 1);
  float v = 0.0f;
  if (F == kFp8E4m3 && (c & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  if (F == kFp8E5m2 && e == 31) {
    if (m != 0) return std::numeric_limits<float>::quiet_NaN();
    v = std::numeric_limits<float>::infinity();
  } else if (e == 0) {
    v = float(m) / float(1 << M);
    for (int i = 1; i < bias; ++i) v *= 0.5f;
  } else {
    v = 1.0f + float(m) / float(1 << M);
    for (int i = e; i > bias; --i) v *= 2.0f;
    for (int i = e; i < bias; ++i) v *= 0.5f;
  }
  return neg ? -v : v;
}

// The 256 values of each format, times fp8_load_factor<F>(): the scalar
// kernels' fp8 loads, so that every ISA's loads agree (the vector loads
// widen E4M3 through f16, which yields value / 256).
template <int F>
constexpr float fp8_load_factor() {
  return F == kFp8E4m3 ? 1.0f / 256.0f : 1.0f;
}

template <int F>
struct Fp8Table {
  std::array<float, 256> v{};
  constexpr Fp8Table() {
    for (int c = 0; c < 256; ++c) {
      const float x = fp8_to_f32_exact<F>(uint8_t(c));
      // NaN codes are stored as they are: arithmetic that yields a NaN is
      // not a constant expression for clang.
      v[size_t(c)] = x != x ? x : x * fp8_load_factor<F>();
    }
  }
};

template <int F>
inline constexpr Fp8Table<F> kFp8Table{};

// The bf16 bits of the 128 magnitudes (code & 0x7f) of each format, times
// fp8_load_factor<F>(): every one is exact in bf16 (4 or 3 significant
// bits, exponents far inside bf16's normal range, subnormal codes
// normalised), NaN codes a quiet NaN, E5M2's infinity infinite. The AVX-512
// kernels widen FP8 to bf16 with this table (fp8_ops_avx512.inc): the sign
// is the code's top bit, so the table needs no negative half. Computed from
// the fields (no float bit casts in a C++17 constant expression).
template <int F>
struct Fp8Bf16Table {
  alignas(64) uint16_t v[128]{};
  constexpr Fp8Bf16Table() {
    constexpr int M = F == kFp8E4m3 ? 3 : 2;
    constexpr int bias = F == kFp8E4m3 ? 7 : 15;
    constexpr int shift = F == kFp8E4m3 ? 8 : 0;  // log2 of 1 / fp8_load_factor
    for (int c = 0; c < 128; ++c) {
      const int e = c >> M, m = c & ((1 << M) - 1);
      uint16_t bits = 0;
      if ((F == kFp8E4m3 && c == 0x7f) || (F == kFp8E5m2 && e == 31 && m != 0)) {
        bits = 0x7fc0;
      } else if (F == kFp8E5m2 && e == 31) {
        bits = 0x7f80;
      } else if (e > 0) {
        bits = uint16_t(((e - bias - shift + 127) << 7) | (m << (7 - M)));
      } else if (m > 0) {
        // m * 2^(1 - bias - M - shift), normalised at m's top bit t.
        int t = 0;
        while ((m >> (t + 1)) != 0) ++t;
        bits = uint16_t(((t + 1 - bias - M - shift + 127) << 7) | ((m - (1 << t)) << (7 - t)));
      }
      v[c] = bits;
    }
  }
};

template <int F>
inline constexpr Fp8Bf16Table<F> kFp8Bf16Table{};

// Loads scaled by fp8_load_factor<F>() (exact: powers of two).
template <int F>
inline float fp8_load_scaled(uint8_t c) {
  return kFp8Table<F>.v[c];
}

template <int F>
inline float fp8_to_f32(uint8_t c) {
  return fp8_load_scaled<F>(c) / fp8_load_factor<F>();
}

}  // namespace pagedkv
