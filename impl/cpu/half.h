// Scalar f16 / bf16 <-> f32 conversions, bit-exact with the vector paths
// (F16C / AVX-512): round-to-nearest-even on the way down, overflow to inf,
// f16 subnormals kept, NaN kept as a quiet NaN (sign and the payload bits
// that fit are preserved, as vcvtps2ph does).
#pragma once

#include <cstdint>
#include <cstring>

namespace pagedkv {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_f32(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    return bits_float(sign | float_bits(float(mant) * 5.9604644775390625e-8f));
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to (or is) inf
  if (x < 0x38800000u) {
    // Below 2^-14 the result is subnormal: adding 0.5 lines the f16
    // mantissa up with the low bits of an f32 and lets the FPU round (RNE).
    uint32_t r = float_bits(bits_float(x) + 0.5f) - 0x3f000000u;
    return uint16_t(sign | r);
  }
  uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // rebias the exponent (127 -> 15) and round
  return uint16_t(sign | (x >> 13));
}

}  // namespace pagedkv
