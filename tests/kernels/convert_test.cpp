// f16 / bf16 <-> f32 conversions: the scalar converters against independent
// references (the compiler's _Float16, and a float64 nearest-even search for
// bf16), and every vector path bit-exact with the scalar one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/half.h"
#include "cpu/kernels.h"
#include "test_util.h"

namespace pagedkv {
namespace test {
namespace {

// Interesting f32 inputs: every boundary of the f16 and bf16 ranges, ties,
// subnormals, infinities, NaNs, plus random bit patterns.
std::vector<float> probe_values() {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                0xffc00001, 0x7f800001, 0x7fbfffff, 0x00000001, 0x807fffff,
                                0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x7f7fffff,
                                0x38800000, 0x387fffff, 0x33800000, 0x33000000, 0x33000001,
                                0x3f808000, 0x3f818000, 0x3f807fff, 0x3f800001, 0x7f7f8000};
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) bits.push_back(rng());
  // Values in and around the f16 range, where most of its rounding happens.
  for (int i = 0; i < 200000; ++i) bits.push_back(0x30000000u + rng() % 0x18000000u);
  std::vector<float> out;
  for (uint32_t b : bits) out.push_back(bits_float(b));
  return out;
}

uint16_t bf16_reference(float f) {
  if (std::isnan(f)) return uint16_t((float_bits(f) >> 16) | 0x40);
  const uint32_t x = float_bits(f);
  const uint16_t lo = uint16_t(x >> 16), hi = uint16_t(lo + 1);
  const double dl = std::fabs(double(bf16_to_f32(lo)) - double(f));
  // Past the largest finite bf16 the next step up is 2^128 (inf).
  const double hv = (hi & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128) : double(bf16_to_f32(hi));
  const double dh = std::fabs(std::copysign(hv, double(f)) - double(f));
  if ((x & 0xffff) == 0) return lo;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

// The compiler's _Float16 is the reference (GCC 12 has it on x86-64;
// clang has it there from 15).
#if defined(__FLT16_MANT_DIG__)
TEST(Convert, ScalarF16MatchesCompiler) {
  for (float f : probe_values()) {
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    const uint16_t got = f32_to_f16(f);
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x7e00, 0x7e00) << std::hex << float_bits(f);  // quiet NaN
      ASSERT_EQ(got & 0x8000, want & 0x8000);
    } else {
      ASSERT_EQ(got, want) << std::hex << float_bits(f);
    }
  }
  for (uint32_t u = 0; u < 65536; ++u) {
    _Float16 h;
    const uint16_t b = uint16_t(u);
    std::memcpy(&h, &b, 2);
    const float want = static_cast<float>(h), got = f16_to_f32(b);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(float_bits(got), float_bits(want)) << u;
      ASSERT_EQ(f32_to_f16(got), b);  // exact round trip
    }
  }
}
#endif

TEST(Convert, ScalarBf16MatchesNearestEven) {
  for (float f : probe_values()) ASSERT_EQ(f32_to_bf16(f), bf16_reference(f)) << float_bits(f);
  for (uint32_t u = 0; u < 65536; ++u) {
    const float f = bf16_to_f32(uint16_t(u));
    if (!std::isnan(f)) ASSERT_EQ(f32_to_bf16(f), u);
  }
}

TEST(Convert, VectorPathsMatchScalarBitForBit) {
  const std::vector<float> values = probe_values();
  std::vector<uint16_t> all(65536);
  for (uint32_t u = 0; u < 65536; ++u) all[u] = uint16_t(u);
  for (CpuIsa isa : supported_isas()) {
    SCOPED_TRACE(isa_name(isa));
    const cpu::KernelTable& t = cpu::kernel_table(isa);
    // Odd lengths exercise the tails.
    for (int64_t n : {int64_t(values.size()), int64_t(values.size()) - 7}) {
      std::vector<uint16_t> h(n), b(n);
      t.from_f32[1](values.data(), h.data(), n);
      t.from_f32[2](values.data(), b.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(h[i], f32_to_f16(values[i])) << i;
        ASSERT_EQ(b[i], f32_to_bf16(values[i])) << i;
      }
    }
    for (int64_t n : {int64_t(65536), int64_t(65531)}) {
      std::vector<float> fh(n), fb(n);
      t.to_f32[1](all.data(), fh.data(), n);
      t.to_f32[2](all.data(), fb.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(float_bits(fh[i]), float_bits(f16_to_f32(all[i]))) << i;
        ASSERT_EQ(float_bits(fb[i]), float_bits(bf16_to_f32(all[i]))) << i;
      }
    }
  }
}

}  // namespace
}  // namespace test
}  // namespace pagedkv
