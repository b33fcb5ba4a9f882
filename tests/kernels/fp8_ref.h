// A float64 model of OCP FP8 (E4M3, E5M2) for the tests, written from the
// format definitions and independent of the library's conversions:
// format 0 = E4M3, 1 = E5M2 (the library's kFp8E4m3 / kFp8E5m2).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fp8_ref {

constexpr int kE4m3 = 0;
constexpr int kE5m2 = 1;

// The format's value of code c from its fields, in double (independent of
// the library's tables): NaN for NaN codes, +-inf for E5M2's infinities.
inline double ref_decode(int f, uint8_t c) {
  const int mbits = f == kE4m3 ? 3 : 2, bias = f == kE4m3 ? 7 : 15;
  const int e = (c & 0x7f) >> mbits, m = c & ((1 << mbits) - 1);
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  if (f == kE4m3 && (c & 0x7f) == 0x7f) return std::copysign(std::nan(""), sign);
  if (f == kE5m2 && e == 31) return m ? std::copysign(std::nan(""), sign) : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(double(m), 1 - bias - mbits);
  return sign * std::ldexp(1.0 + double(m) / (1 << mbits), e - bias);
}

inline uint8_t max_code(int f) { return f == kE4m3 ? 0x7e : 0x7b; }

// Nearest code to x by search over the finite non-negative codes; ties to
// the even code (mantissa LSB = code LSB); saturating; NaN -> 0x7f | sign.
inline uint8_t ref_encode(int f, double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return uint8_t(sign | 0x7f);
  const double ax = std::fabs(x);
  if (ax >= ref_decode(f, max_code(f))) return uint8_t(sign | max_code(f));
  // The non-negative finite values increase with the code: the nearest is
  // one of the two around ax.
  static const std::vector<double> values[2] = {[] {
                                                  std::vector<double> v;
                                                  for (int c = 0; c <= 0x7e; ++c)
                                                    v.push_back(ref_decode(kE4m3, uint8_t(c)));
                                                  return v;
                                                }(),
                                                [] {
                                                  std::vector<double> v;
                                                  for (int c = 0; c <= 0x7b; ++c)
                                                    v.push_back(ref_decode(kE5m2, uint8_t(c)));
                                                  return v;
                                                }()};
  const std::vector<double>& vals = values[f];
  const size_t hi = size_t(std::lower_bound(vals.begin(), vals.end(), ax) - vals.begin());
  if (hi == 0) return sign;
  const size_t lo = hi - 1;
  const double dl = ax - vals[lo], dh = vals[hi] - ax;
  const size_t best = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return uint8_t(sign | best);
}

}  // namespace fp8_ref
