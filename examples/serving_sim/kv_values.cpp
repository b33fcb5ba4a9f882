#include "kv_values.h"

#include <cmath>
#include <cstring>

#include "pagedkv/pagedkv.h"
#include "rng.h"

namespace sim {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);                 // round to nearest even
}

uint16_t to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7FFFFFFFu;
  if (au >= 0x7F800000u) return uint16_t(sign | 0x7C00u | (au > 0x7F800000u ? 0x200u : 0u));
  if (au >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds to inf
  if (au < 0x38800000u) {                                  // f16 subnormal or zero
    const float scaled = bits_float(au) * 16777216.0f;     // * 2^24: units of 2^-24
    return uint16_t(sign | uint16_t(std::nearbyint(scaled)));
  }
  uint32_t m = au + 0xFFFu + ((au >> 13) & 1u);  // round mantissa to 10 bits, nearest even
  return uint16_t(sign | (((m >> 13) - (112u << 10)) & 0x7FFFu));
}

float from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {
    const float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7F800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

}  // namespace

void store_element(void* buf, uint32_t dtype, uint64_t i, float value) {
  switch (dtype) {
    case PKV_DTYPE_F32:
      static_cast<float*>(buf)[i] = value;
      break;
    case PKV_DTYPE_BF16:
      static_cast<uint16_t*>(buf)[i] = to_bf16(value);
      break;
    default:
      static_cast<uint16_t*>(buf)[i] = to_f16(value);
      break;
  }
}

float load_element(const void* buf, uint32_t dtype, uint64_t i) {
  switch (dtype) {
    case PKV_DTYPE_F32:
      return static_cast<const float*>(buf)[i];
    case PKV_DTYPE_BF16:
      return bits_float(uint32_t(static_cast<const uint16_t*>(buf)[i]) << 16);
    default:
      return from_f16(static_cast<const uint16_t*>(buf)[i]);
  }
}

void kv_head_values(uint64_t context_hash, uint32_t layer, uint32_t kind, uint32_t head,
                    uint32_t head_dim, float* out) {
  uint64_t state =
      context_hash ^ mix64((uint64_t(layer) << 20) ^ (uint64_t(kind) << 16) ^ head ^ 0xC0FFEEull);
  uint64_t bits = 0;
  for (uint32_t d = 0; d < head_dim; ++d) {
    if (d % 8 == 0) {
      state += 0x9E3779B97F4A7C15ull;
      bits = mix64(state);
    }
    out[d] = float(int32_t(bits & 0xFF) - 128) * (1.0f / 128.0f);
    bits >>= 8;
  }
}

void random_queries(uint64_t* state, void* buf, uint32_t dtype, uint64_t first, uint64_t n) {
  uint64_t bits = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      *state += 0x9E3779B97F4A7C15ull;
      bits = mix64(*state);
    }
    store_element(buf, dtype, first + i, float(int32_t(bits & 0xFF) - 128) * (1.0f / 32.0f));
    bits >>= 8;
  }
}

}  // namespace sim
