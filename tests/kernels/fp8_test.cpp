// FP8 (E4M3, E5M2) KV storage on the CPU backend, every ISA:
// - the encoders against a brute-force float64 nearest-code search (every
//   code's value, every tie between neighbouring codes, saturation, NaN,
//   random values at every magnitude) and the loads of every code through
//   the attention kernels (V through the output, K through the LSE);
// - the quantising cache write: every byte of every slot, nothing else;
// - attention over FP8 pages (decode, prefill, chunked prefill, GQA,
//   sliding window, soft-cap, LSE, split-KV, per-head scales) against a
//   float64 reference over the dequantised codes, random page permutations,
//   NaN codes in every unused slot, every output element checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/fp8.h"
#include "error.h"
#include "fp8_ref.h"
#include "test_util.h"

namespace pagedkv {
namespace test {
namespace {

constexpr int kFormats[2] = {kFp8E4m3, kFp8E5m2};
const char* fmt_name(int f) { return f == kFp8E4m3 ? "e4m3" : "e5m2"; }
DType fmt_dtype(int f) { return f == kFp8E4m3 ? DType::kFp8E4m3 : DType::kFp8E5m2; }
using fp8_ref::max_code;
using fp8_ref::ref_decode;
using fp8_ref::ref_encode;

std::vector<const cpu::KernelTable*> tables() {
  std::vector<const cpu::KernelTable*> out;
  for (CpuIsa isa : supported_isas()) out.push_back(&cpu::kernel_table(isa));
  return out;
}

// Runs every ISA's quantize_fp8 over xs (divided by scale) and checks each
// byte against ref_encode(float(x / scale)); lengths cover the vector body
// and the scalar tail.
void check_encoder(int f, const std::vector<float>& xs, float scale, const std::string& what) {
  for (const cpu::KernelTable* t : tables()) {
    SCOPED_TRACE(std::string(t->name) + " " + fmt_name(f) + " " + what);
    std::vector<uint8_t> got(xs.size() + 1, 0xa5);
    t->quantize_fp8[f](xs.data(), got.data(), int64_t(xs.size()), scale);
    int bad = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint8_t want = ref_encode(f, double(xs[i] / scale));
      if (got[i] != want && ++bad <= 5) {
        ADD_FAILURE() << "x = " << xs[i] << " (" << std::hexfloat << xs[i] << std::defaultfloat
                      << ") / " << scale << ": code 0x" << std::hex << int(got[i])
                      << ", expected 0x" << int(want) << std::dec;
      }
    }
    EXPECT_EQ(got[xs.size()], 0xa5) << "wrote past the end";
    EXPECT_EQ(bad, 0);
  }
}

TEST(Fp8Codes, EveryCodeRoundTripsAndDecodesExactly) {
  for (int f : kFormats) {
    std::vector<float> values;
    for (int c = 0; c < 256; ++c) {
      const double v = ref_decode(f, uint8_t(c));
      const float lib =
          f == kFp8E4m3 ? fp8_to_f32<kFp8E4m3>(uint8_t(c)) : fp8_to_f32<kFp8E5m2>(uint8_t(c));
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(lib)) << fmt_name(f) << " code " << c;
      } else {
        EXPECT_EQ(double(lib), v) << fmt_name(f) << " code " << c;
      }
      values.push_back(float(v));
      // Round trip: every finite code encodes back to itself; NaN codes to
      // the NaN code of their sign; E5M2's infinities saturate.
      const uint8_t back = ref_encode(f, v);
      if (std::isnan(v)) {
        EXPECT_EQ(back, uint8_t((c & 0x80) | 0x7f));
      } else if (std::isinf(v)) {
        EXPECT_EQ(back, uint8_t((c & 0x80) | max_code(f)));
      } else {
        EXPECT_EQ(back, uint8_t(c)) << fmt_name(f) << " code " << c;
      }
    }
    check_encoder(f, values, 1.0f, "all 256 codes");
    EXPECT_EQ(ref_decode(f, max_code(f)), f == kFp8E4m3 ? 448.0 : 57344.0);
  }
}

TEST(Fp8Codes, TiesRoundToEvenAndNeighboursToNearest) {
  for (int f : kFormats) {
    std::vector<float> xs;
    for (int c = 0; c < max_code(f); ++c) {
      const double a = ref_decode(f, uint8_t(c)), b = ref_decode(f, uint8_t(c + 1));
      const float mid = float((a + b) / 2);  // exact in f32
      ASSERT_EQ(double(mid), (a + b) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
        xs.push_back(x);
        xs.push_back(-x);
      }
      // The even code of each tie, checked here too (not only against the
      // reference): ties go to the code with a zero LSB.
      const uint8_t tie = f == kFp8E4m3 ? f32_to_fp8<kFp8E4m3>(mid) : f32_to_fp8<kFp8E5m2>(mid);
      EXPECT_EQ(tie & 1, 0) << fmt_name(f) << " tie between codes " << c << " and " << c + 1;
    }
    check_encoder(f, xs, 1.0f, "ties");
  }
}

TEST(Fp8Codes, SaturatesNaNAndRandomMagnitudes) {
  std::mt19937 rng(5);
  for (int f : kFormats) {
    const float mx = f == kFp8E4m3 ? kFp8E4m3Max : kFp8E5m2Max;
    std::vector<float> xs = {mx,
                             std::nextafter(mx, INFINITY),
                             mx * 1.0625f,
                             mx * 1.2f,
                             1e30f,
                             INFINITY,
                             -INFINITY,
                             std::nanf(""),
                             -std::nanf(""),
                             std::numeric_limits<float>::denorm_min(),
                             -std::numeric_limits<float>::min()};
    // Random values over every binade from well below the smallest
    // subnormal to well above the maximum; never 0.
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> ex(-30, 20);
    for (int i = 0; i < 20000; ++i) {
      const float x = std::ldexp(mant(rng), ex(rng));
      xs.push_back(rng() & 1 ? -x : x);
    }
    check_encoder(f, xs, 1.0f, "saturation, NaN, random");
    check_encoder(f, xs, 0.37f, "random / 0.37");
    check_encoder(f, xs, 1000.0f, "random / 1000");
    for (const cpu::KernelTable* t : tables()) {
      uint8_t b[2];
      const float nan_inf[2] = {std::nanf(""), INFINITY};
      t->quantize_fp8[f](nan_inf, b, 2, 1.0f);
      EXPECT_TRUE(std::isnan(ref_decode(f, b[0]))) << t->name;
      EXPECT_EQ(ref_decode(f, b[1]), double(mx)) << t->name;
    }
  }
}

// The bf16 table the AVX-512 kernels widen FP8 through (fp8.h): every code,
// with its sign bit put on the magnitude's entry, is the code's value times
// fp8_load_factor exactly, NaN codes NaN; no entry is a bf16 subnormal
// (vdpbf16ps would read it as 0).
TEST(Fp8Codes, Bf16TableHoldsEveryCodeExactly) {
  for (int f : kFormats) {
    const uint16_t* t = f == kFp8E4m3 ? kFp8Bf16Table<kFp8E4m3>.v : kFp8Bf16Table<kFp8E5m2>.v;
    const double factor = f == kFp8E4m3 ? double(fp8_load_factor<kFp8E4m3>()) : 1.0;
    for (int c = 0; c < 256; ++c) {
      const uint16_t bits = uint16_t(t[c & 0x7f] | ((c & 0x80) << 8));
      const double want = ref_decode(f, uint8_t(c)) * factor;
      const float got = bf16_to_f32(bits);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << fmt_name(f) << " code " << c;
      } else {
        EXPECT_EQ(double(got), want) << fmt_name(f) << " code " << c;
        EXPECT_TRUE(got == 0.0f || std::isinf(got) || (bits & 0x7f80) != 0)
            << fmt_name(f) << " code " << c << ": bf16 subnormal";
      }
    }
  }
}

// One layer, one KV head, one key holding every finite code of the format
// (K) and every code (V), read by each ISA's attention: out = v * v_scale
// exactly for every query head; the K codes come back through the LSE of
// one-hot queries, lse[h] = softmax_scale * k_scale * k[h], exactly.
// bf16 q takes the bf16 dot-product path where the ISA has one (K widened to
// bf16), f32 q the f32 one. Paired loads widen even and odd elements by
// different instructions, so the codes are laid out at offsets rot = 0 and
// 1 (each code at an even and at an odd element), and 5 (another lane).
TEST(Fp8Loads, EveryCodeThroughTheAttentionKernels) {
  for (CpuIsa isa : supported_isas()) {
    for (int f : kFormats) {
      for (DType qdt : {DType::kF32, DType::kBF16}) {
        for (int32_t rot : {0, 1, 5}) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + fmt_name(f) + " q " + dtype_name(qdt) +
                       " rot " + std::to_string(rot));
          const int32_t D = 256, bs = 4, blocks = 3, hq = 16;
          KvArena arena;
          arena.num_layers = 1;
          arena.layout = {blocks, 1, bs, D, fmt_dtype(f)};
          Buffer storage(arena.layout.layer_bytes() * 2);
          arena.base = storage.data();
          std::memset(arena.base, 0x7f, arena.layout.layer_bytes() * 2);  // NaN everywhere else
          const float scales[2] = {0.5f, 4.0f};
          arena.scales = scales;
          const int32_t block = 2;
          uint8_t* k = static_cast<uint8_t*>(arena.plane(0, 0)) + size_t(block) * bs * D;
          uint8_t* v = static_cast<uint8_t*>(arena.plane(0, 1)) + size_t(block) * bs * D;
          for (int32_t d = 0; d < D; ++d) {
            const uint8_t c = uint8_t(d + rot);
            v[d] = c;
            k[d] = std::isfinite(ref_decode(f, c)) ? c : uint8_t(0x01);
          }
          // Query head h is one-hot at dim (h * 16 + j) for pass j.
          for (int32_t j = 0; j < 16; ++j) {
            Buffer q(size_t(hq) * D * 4);
            for (int32_t i = 0; i < hq * D; ++i) store(q.data(), qdt, i, 0.0f);
            std::vector<float> out(size_t(hq) * D, std::nanf(""));
            std::vector<float> lse(hq, std::nanf(""));
            for (int32_t h = 0; h < hq; ++h) store(q.data(), qdt, h * D + h * 16 + j, 1.0f);
            std::vector<int64_t> slots(1, -1);
            std::vector<int32_t> qptr = {0, 1}, pptr = {0, 1}, pages = {block}, last = {1},
                                 ctx = {1};
            PlanView plan{
                1,           1,         1, 1, slots.data(), qptr.data(), pptr.data(), pages.data(),
                last.data(), ctx.data()};
            Tensor3 qt{q.data(), qdt, 1, hq, D, hq * D, D};
            Tensor3 ot{out.data(), DType::kF32, 1, hq, D, hq * D, D};
            AttentionArgs args{1.0f, 0, 0.0f, lse.data(), hq};
            CpuBackendOptions o;
            o.isa = isa;
            o.num_threads = 1;
            make_cpu_backend(o)->attend(arena, 0, plan, qt, ot, args, nullptr);
            for (int32_t h = 0; h < hq; ++h) {
              const int32_t d = h * 16 + j;
              EXPECT_EQ(double(lse[h]), 0.5 * ref_decode(f, k[d])) << "K code " << d;
              for (int32_t e = 0; e < D; ++e) {
                const double want = 4.0 * ref_decode(f, v[e]);
                const float got = out[size_t(h) * D + e];
                if (std::isnan(want)) {
                  EXPECT_TRUE(std::isnan(got)) << "V code " << e;
                } else {
                  EXPECT_EQ(double(got), want) << "V code " << e;
                }
              }
            }
          }
          // A NaN K code reaches every output of the query (as NaN K/V does in
          // the other dtypes): NaN is never read as a number. Two keys of
          // finite codes, then the same with one NaN code (either sign, at
          // an odd or an even element, per rot) in the second key.
          for (bool nan : {false, true}) {
            std::memset(k, 0x30, size_t(2) * D);
            std::memset(v, 0x30, size_t(2) * D);
            if (nan) k[D + 7 + rot] = rot == 1 ? 0xff : 0x7f;
            Buffer q(size_t(D) * 4);
            for (int32_t i = 0; i < D; ++i) store(q.data(), qdt, i, 0.25f);
            std::vector<float> out(size_t(D), 0.0f);
            std::vector<int64_t> slots(1, -1);
            std::vector<int32_t> qptr = {0, 1}, pptr = {0, 1}, pages = {block}, last = {2},
                                 ctx = {2};
            PlanView plan{
                1,           1,         1, 2, slots.data(), qptr.data(), pptr.data(), pages.data(),
                last.data(), ctx.data()};
            Tensor3 qt{q.data(), qdt, 1, 1, D, D, D};
            Tensor3 ot{out.data(), DType::kF32, 1, 1, D, D, D};
            AttentionArgs args{1.0f, 0, 0.0f, nullptr, 0};
            CpuBackendOptions o;
            o.isa = isa;
            make_cpu_backend(o)->attend(arena, 0, plan, qt, ot, args, nullptr);
            for (int32_t e = 0; e < D; ++e) {
              if (nan) {
                EXPECT_TRUE(std::isnan(out[size_t(e)])) << e;
              } else {
                EXPECT_EQ(double(out[size_t(e)]), 4.0 * ref_decode(f, 0x30)) << e;
              }
            }
          }
        }
      }
    }
  }
}

// The quantising write: k and v in f32, f16 or bf16 (different dtypes for
// k and v), per-head scales, values at several magnitudes (some beyond the
// format's range), padding slots, enough tokens for the threaded path.
TEST(Fp8Write, EveryByteOfEverySlotAndNothingElse) {
  std::mt19937 rng(11);
  for (CpuIsa isa : supported_isas()) {
    for (int f : kFormats) {
      for (DType kdt : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (double mag : {1e-3, 1.0, 300.0, 3e4, 1e5}) {
          const DType vdt = kdt == DType::kF32 ? DType::kBF16 : DType::kF32;
          const int32_t heads = 3, bs = 16, blocks = 24, layers = 2, layer = 1;
          const int32_t D = rng() % 2 ? 64 : 72;  // 72: a scalar tail on every ISA
          SCOPED_TRACE(std::string(isa_name(isa)) + " " + fmt_name(f) + " k " + dtype_name(kdt) +
                       " v " + dtype_name(vdt) + " mag " + std::to_string(mag) +
                       " D=" + std::to_string(D));
          KvArena arena;
          arena.num_layers = layers;
          arena.layout = {blocks, heads, bs, D, fmt_dtype(f)};
          const size_t bytes = arena.layout.layer_bytes() * 2 * layers;
          Buffer storage(bytes);
          arena.base = storage.data();
          auto* base = static_cast<uint8_t*>(arena.base);
          for (size_t i = 0; i < bytes; ++i) base[i] = uint8_t(rng());
          const std::vector<uint8_t> before(base, base + bytes);
          std::vector<float> scales(size_t(2) * layers * heads);
          for (float& s : scales) s = float(mag / 100.0 * (0.5 + (rng() % 1000) / 1000.0));
          arena.scales = scales.data();

          const int64_t T = 200;
          std::vector<int64_t> all(size_t(blocks) * bs);
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), rng);
          std::vector<int64_t> slots(all.begin(), all.begin() + T);
          for (int64_t t = 0; t < T; t += 7) slots[size_t(t)] = -1;
          const int64_t s1 = D + 4, s0 = heads * s1 + 8;
          Buffer kb(size_t(T * s0) * 4), vb(size_t(T * s0) * 4);
          std::uniform_real_distribution<double> u(0.1, 1.0);
          std::vector<double> kx(size_t(T) * heads * D), vx(kx.size());
          for (int64_t t = 0; t < T; ++t) {
            for (int32_t h = 0; h < heads; ++h) {
              for (int32_t d = 0; d < D; ++d) {
                const size_t r = (size_t(t) * heads + h) * D + d;
                const float a = float((rng() & 1 ? -mag : mag) * u(rng));
                const float b = float((rng() & 1 ? -mag : mag) * u(rng));
                kx[r] = store(kb.data(), kdt, t * s0 + h * s1 + d, a);
                vx[r] = store(vb.data(), vdt, t * s0 + h * s1 + d, b);
              }
            }
          }
          PlanView plan{};
          plan.num_tokens = T;
          plan.slot_mapping = slots.data();
          Tensor3 k{kb.data(), kdt, T, heads, D, s0, s1};
          Tensor3 v{vb.data(), vdt, T, heads, D, s0, s1};
          CpuBackendOptions o;
          o.isa = isa;
          o.num_threads = 2;
          make_cpu_backend(o)->write(arena, layer, plan, k, v, nullptr);

          std::vector<uint8_t> want = before;
          for (int64_t t = 0; t < T; ++t) {
            const int64_t slot = slots[size_t(t)];
            if (slot < 0) continue;
            for (int w = 0; w < 2; ++w) {
              const size_t plane = arena.layout.layer_bytes() * (2 * layer + w);
              for (int32_t h = 0; h < heads; ++h) {
                const float s = scales[size_t(2 * layer + w) * heads + h];
                for (int32_t d = 0; d < D; ++d) {
                  const double x = (w == 0 ? kx : vx)[(size_t(t) * heads + h) * D + d];
                  const size_t at =
                      plane + size_t(((slot / bs) * heads + h) * bs + slot % bs) * D + d;
                  want[at] = ref_encode(f, double(float(x) / s));
                }
              }
            }
          }
          size_t bad = 0;
          for (size_t i = 0; i < bytes; ++i) {
            if (base[i] != want[i] && ++bad <= 5) {
              ADD_FAILURE() << "byte " << i << " = 0x" << std::hex << int(base[i])
                            << ", expected 0x" << int(want[i]) << std::dec;
            }
          }
          ASSERT_EQ(bad, 0u);
        }
      }
    }
  }
}

TEST(Fp8Write, RejectsNonFloatInputAndChangesNothing) {
  KvArena arena;
  arena.num_layers = 1;
  arena.layout = {4, 1, 4, 16, DType::kFp8E4m3};
  Buffer storage(arena.layout.layer_bytes() * 2);
  arena.base = storage.data();
  std::memset(arena.base, 0x3c, arena.layout.layer_bytes() * 2);
  const float scales[2] = {1.0f, 1.0f};
  arena.scales = scales;
  std::vector<int32_t> ints(16, 1);
  std::vector<float> fl(16, 1.0f);
  std::vector<int64_t> slots = {5};
  PlanView plan{};
  plan.num_tokens = 1;
  plan.slot_mapping = slots.data();
  Tensor3 bad{ints.data(), DType::kI32, 1, 1, 16, 16, 16};
  Tensor3 good{fl.data(), DType::kF32, 1, 1, 16, 16, 16};
  auto be = make_cpu_backend(1);
  EXPECT_THROW(be->write(arena, 0, plan, bad, good, nullptr), Error);
  slots[0] = 16;  // one past the last slot
  EXPECT_THROW(be->write(arena, 0, plan, good, good, nullptr), Error);
  const auto* b = static_cast<const uint8_t*>(arena.base);
  for (size_t i = 0; i < arena.layout.layer_bytes() * 2; ++i) ASSERT_EQ(b[i], 0x3c) << i;
}

// ---------------------------------------------------------------- attention

struct SeqSpec {
  int32_t ctx, nq;
};

struct Case {
  CpuIsa isa = CpuIsa::kScalar;
  int fmt = kFp8E4m3;
  DType qdt = DType::kF32;
  int32_t head_dim = 64, block_size = 16, group = 1, kv_heads = 2;
  std::vector<SeqSpec> seqs;
  int32_t window = 0;
  float softcap = 0.0f, scale = 0.0f;
  bool lse = false;
  int32_t threads = 2, min_split_keys = 512;
  double mag = 1.0;  // magnitude of the stored values (code * scale)
  uint32_t seed = 1;

  std::string describe() const {
    std::ostringstream os;
    os << isa_name(isa) << " " << fmt_name(fmt) << " q " << dtype_name(qdt) << " D=" << head_dim
       << " bs=" << block_size << " G=" << group << " Hkv=" << kv_heads << " W=" << window
       << " cap=" << softcap << " scale=" << scale << " lse=" << lse << " threads=" << threads
       << " split=" << min_split_keys << " mag=" << mag << " seed=" << seed << " seqs=";
    for (const auto& s : seqs) os << "(" << s.ctx << "," << s.nq << ")";
    return os.str();
  }
};

void run_case(const Case& c) {
  SCOPED_TRACE(c.describe());
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const int32_t D = c.head_dim, bs = c.block_size, hkv = c.kv_heads, hq = c.group * hkv;
  const int32_t ns = int32_t(c.seqs.size());
  const float scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt(float(D));
  std::vector<int32_t> qptr(ns + 1, 0), pptr(ns + 1, 0), ctx(ns), last(ns);
  for (int32_t s = 0; s < ns; ++s) {
    ctx[s] = c.seqs[s].ctx;
    qptr[s + 1] = qptr[s] + c.seqs[s].nq;
    pptr[s + 1] = pptr[s] + (ctx[s] + bs - 1) / bs;
    last[s] = ctx[s] - (ctx[s] - 1) / bs * bs;
  }
  const int32_t needed = pptr[ns], num_blocks = 3 * needed + 2;
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> pages(ids.begin(), ids.begin() + needed);
  if (c.window > 0) {
    for (int32_t s = 0; s < ns; ++s) {
      const int32_t wlo = std::max(0, ctx[s] - c.seqs[s].nq - c.window + 1);
      for (int32_t pg = 0; (pg + 1) * bs <= wlo; ++pg) pages[pptr[s] + pg] = 0;
    }
  }
  KvArena arena;
  arena.num_layers = 2;
  arena.layout = {num_blocks, hkv, bs, D, fmt_dtype(c.fmt)};
  Buffer storage(arena.layout.layer_bytes() * 4);
  arena.base = storage.data();
  std::memset(arena.base, 0x7f, arena.layout.layer_bytes() * 4);  // NaN codes
  // Per-head scales spread over a factor 4, chosen so the values use the
  // format's upper range: code magnitudes up to ~max / 2.
  const double fmax = c.fmt == kFp8E4m3 ? 448.0 : 57344.0;
  std::vector<float> scales(size_t(4) * hkv);
  for (float& s : scales) s = float(c.mag / (fmax / 2) * (0.5 + 1.5 * (rng() % 1000) / 1000.0));
  arena.scales = scales.data();
  const int32_t layer = 1;
  auto* kp = static_cast<uint8_t*>(arena.plane(layer, 0));
  auto* vp = static_cast<uint8_t*>(arena.plane(layer, 1));
  std::vector<std::vector<double>> kref(ns), vref(ns);
  for (int32_t s = 0; s < ns; ++s) {
    kref[s].assign(size_t(ctx[s]) * hkv * D, std::nan(""));
    vref[s].assign(size_t(ctx[s]) * hkv * D, std::nan(""));
    for (int32_t pos = 0; pos < ctx[s]; ++pos) {
      const int32_t block = pages[pptr[s] + pos / bs];
      if (block == 0) continue;
      for (int32_t h = 0; h < hkv; ++h) {
        const int64_t at = ((int64_t(block) * hkv + h) * bs + pos % bs) * D;
        const float ks = scales[size_t(2 * layer) * hkv + h];
        const float vs = scales[size_t(2 * layer + 1) * hkv + h];
        for (int32_t d = 0; d < D; ++d) {
          // Never zero: |x| in [0.05, 1] * mag, encoded as the write does.
          float a = unit(rng), b = unit(rng);
          a = std::copysign(0.05f + 0.95f * std::fabs(a), a);
          b = std::copysign(0.05f + 0.95f * std::fabs(b), b);
          kp[at + d] = ref_encode(c.fmt, double(float(a * c.mag) / ks));
          vp[at + d] = ref_encode(c.fmt, double(float(b * c.mag) / vs));
          const size_t r = (size_t(pos) * hkv + h) * D + d;
          kref[s][r] = ref_decode(c.fmt, kp[at + d]) * ks;
          vref[s][r] = ref_decode(c.fmt, vp[at + d]) * vs;
        }
      }
    }
  }
  const int64_t T = qptr[ns];
  const int64_t s1 = D + 8, s0 = hq * s1 + 24;
  const size_t qes = dtype_size(c.qdt);
  Buffer qbuf(size_t(T * s0) * qes + 64), obuf(size_t(T * s0) * qes + 64);
  fill_nan(qbuf.data(), c.qdt, T * s0);
  fill_nan(obuf.data(), c.qdt, T * s0);
  // q scaled so that the logits stay O(1) whatever mag is.
  std::vector<double> qref(size_t(T) * hq * D);
  for (int64_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < hq; ++h)
      for (int32_t d = 0; d < D; ++d)
        qref[(t * hq + h) * D + d] =
            store(qbuf.data(), c.qdt, t * s0 + h * s1 + d, float(2 * unit(rng) / c.mag));
  const int64_t lse_stride = hq + 3;
  std::vector<float> lse(size_t(T * lse_stride), std::nanf(""));
  std::vector<int64_t> slots(T, -1);
  PlanView plan{ns,           T,           0,         0, slots.data(), qptr.data(), pptr.data(),
                pages.data(), last.data(), ctx.data()};
  for (int32_t s = 0; s < ns; ++s) {
    plan.max_query = std::max(plan.max_query, c.seqs[s].nq);
    plan.max_context = std::max(plan.max_context, ctx[s]);
  }
  Tensor3 q{qbuf.data(), c.qdt, T, hq, D, s0, s1};
  Tensor3 out{obuf.data(), c.qdt, T, hq, D, s0, s1};
  AttentionArgs args{scale, c.window, c.softcap, c.lse ? lse.data() : nullptr, lse_stride};
  CpuBackendOptions opts;
  opts.num_threads = c.threads;
  opts.isa = c.isa;
  opts.min_split_keys = c.min_split_keys;
  make_cpu_backend(opts)->attend(arena, layer, plan, q, out, args, nullptr);

  // Against the dequantised codes the only error is f32 arithmetic (and the
  // output's rounding): the f32 path's tolerances, relative to mag.
  const double atol = (c.qdt == DType::kF32 ? 3e-5 : 2e-4) * c.mag;
  const double rtol = c.qdt == DType::kF32 ? 1e-4 : c.qdt == DType::kF16 ? 2e-3 : 1e-2;
  int failures = 0;
  auto report = [&](const std::string& what) {
    if (++failures <= 8) ADD_FAILURE() << what;
  };
  std::vector<double> logit, ref(D);
  for (int32_t s = 0; s < ns; ++s) {
    const int32_t nq = c.seqs[s].nq;
    for (int32_t i = 0; i < nq; ++i) {
      const int64_t t = qptr[s] + i;
      const int32_t p = ctx[s] - nq + i, lo = c.window > 0 ? std::max(0, p - c.window + 1) : 0;
      for (int32_t h = 0; h < hq; ++h) {
        const int32_t kh = h / c.group;
        logit.assign(size_t(p - lo + 1), 0.0);
        double mx = -INFINITY;
        for (int32_t k = lo; k <= p; ++k) {
          double x = 0;
          for (int32_t d = 0; d < D; ++d)
            x += qref[(t * hq + h) * D + d] * kref[s][(size_t(k) * hkv + kh) * D + d];
          x *= scale;
          if (c.softcap > 0) x = c.softcap * std::tanh(x / c.softcap);
          ASSERT_FALSE(std::isnan(x)) << "reference reads an unwritten key: test bug";
          logit[size_t(k - lo)] = x;
          mx = std::max(mx, x);
        }
        double sum = 0;
        for (double& x : logit) sum += (x = std::exp(x - mx));
        std::fill(ref.begin(), ref.end(), 0.0);
        for (int32_t k = lo; k <= p; ++k)
          for (int32_t d = 0; d < D; ++d)
            ref[d] += logit[size_t(k - lo)] / sum * vref[s][(size_t(k) * hkv + kh) * D + d];
        for (int32_t d = 0; d < D; ++d) {
          const double got = load(obuf.data(), c.qdt, t * s0 + h * s1 + d);
          if (!(std::fabs(got - ref[d]) <= atol + rtol * std::fabs(ref[d]))) {
            report("out[seq " + std::to_string(s) + " q " + std::to_string(i) + " head " +
                   std::to_string(h) + " dim " + std::to_string(d) + "] = " + std::to_string(got) +
                   ", reference " + std::to_string(ref[d]));
          }
        }
        if (c.lse) {
          const double want = mx + std::log(sum), got = lse[size_t(t * lse_stride + h)];
          if (!(std::fabs(got - want) <= 1e-4 + 1e-5 * std::fabs(want)))
            report("lse[" + std::to_string(t) + ", " + std::to_string(h) +
                   "] = " + std::to_string(got) + ", reference " + std::to_string(want));
        }
      }
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < s0; ++e) {
      const bool inside = e / s1 < hq && e % s1 < D;
      if (!inside && !std::isnan(load(obuf.data(), c.qdt, t * s0 + e)))
        report("out gap element " + std::to_string(t * s0 + e) + " was written");
    }
  }
  EXPECT_EQ(failures, 0) << failures << " mismatches";
}

std::vector<SeqSpec> mixed_step(int32_t bs, std::mt19937& rng) {
  auto r = [&](int32_t lo, int32_t hi) { return lo + int32_t(rng() % uint32_t(hi - lo + 1)); };
  std::vector<SeqSpec> seqs;
  seqs.push_back({r(bs + 1, 3 * bs + 5), 1});  // decode
  seqs.push_back({1, 1});                      // the first token
  const int32_t pre = r(2, bs + 9);
  seqs.push_back({pre, pre});  // prefill
  const int32_t cached = r(bs, 2 * bs + 3), chunk = r(2, 13);
  seqs.push_back({cached + chunk, chunk});  // chunked prefill
  std::shuffle(seqs.begin(), seqs.end(), rng);
  return seqs;
}

struct Param {
  CpuIsa isa;
  int fmt;
};

class Fp8Attention : public ::testing::TestWithParam<Param> {};

// Decode tiles of several KV heads (attention.cpp takes up to 8 at once):
// each head's K and V scales must go with its own rows.
TEST_P(Fp8Attention, DecodeTilesOfSeveralHeads) {
  uint32_t seed = 7000 + 100 * uint32_t(GetParam().isa) + uint32_t(GetParam().fmt);
  for (int32_t hkv : {5, 11}) {
    for (int32_t threads : {1, 2}) {
      if ((hkv == 5) != (threads == 1)) continue;  // 5 heads on 1 thread, 11 (8 + 3) on 2
      std::mt19937 rng(++seed);
      Case c;
      c.isa = GetParam().isa;
      c.fmt = GetParam().fmt;
      c.head_dim = 128;
      c.block_size = 16;
      c.group = 4;
      c.kv_heads = hkv;
      for (int i = 0; i < 9; ++i) c.seqs.push_back({1 + int32_t(rng() % 200), 1});
      c.threads = threads;
      c.qdt = threads == 1 ? DType::kBF16 : DType::kF32;
      c.lse = true;
      c.seed = seed;
      run_case(c);
      if (HasFailure()) return;
    }
  }
}

TEST_P(Fp8Attention, MixedStepsEveryOption) {
  uint32_t seed = 100 * uint32_t(GetParam().isa) + uint32_t(GetParam().fmt);
  for (int32_t d : {64, 80, 128}) {
    for (int32_t bs : {8, 16, 32}) {
      for (int feature = 0; feature < 4; ++feature) {
        std::mt19937 rng(++seed);
        Case c;
        c.isa = GetParam().isa;
        c.fmt = GetParam().fmt;
        c.head_dim = d;
        c.block_size = bs;
        c.group = feature < 2 ? 1 + int32_t(rng() % 2) * 3 : 8;
        c.kv_heads = 1 + int32_t(rng() % 2);
        c.seqs = mixed_step(bs, rng);
        c.seed = seed;
        c.mag = std::pow(10.0, double(int32_t(rng() % 7) - 3));  // 1e-3 .. 1e3
        if (feature & 1) c.window = 1 + int32_t(rng() % uint32_t(2 * bs));
        if (feature & 2) {
          c.scale = 0.5f;
          c.softcap = 4.0f + float(rng() % 20);
          c.lse = true;
        }
        if (feature == 0) c.lse = true;
        c.qdt = feature == 3 ? DType::kBF16 : feature == 1 ? DType::kF16 : DType::kF32;
        run_case(c);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(Fp8Attention, SplitKvAndOddHeadDim) {
  Case c;
  c.isa = GetParam().isa;
  c.fmt = GetParam().fmt;
  c.seqs = {{900, 1}, {333, 1}};
  c.threads = 3;
  c.min_split_keys = 64;
  c.lse = true;
  c.group = 4;
  run_case(c);
  // Decode as engines run it: bf16 q (the bf16 dot product where the ISA
  // has one), head dim 128, GQA 4 and 16 (row tiles of 4 and 16).
  c.qdt = DType::kBF16;
  c.head_dim = 128;
  c.seqs = {{700, 1}, {257, 1}, {64, 1}};
  for (int32_t g : {4, 16}) {
    c.group = g;
    c.mag = g == 4 ? 0.01 : 100.0;
    run_case(c);
  }
  c.qdt = DType::kF32;
  c.group = 4;
  c.mag = 1.0;
  c.head_dim = 36;  // not a multiple of any vector width: the scalar kernels
  c.seqs = {{40, 40}, {70, 9}};
  c.window = 17;
  run_case(c);
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (CpuIsa isa : supported_isas())
    for (int f : kFormats) out.push_back({isa, f});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cpu, Fp8Attention, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(isa_name(info.param.isa)) + "_" +
                                  fmt_name(info.param.fmt);
                         });

}  // namespace
}  // namespace test
}  // namespace pagedkv
