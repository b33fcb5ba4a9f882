#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include "cpu/kernels.h"
#include "error.h"

namespace pagedkv {
namespace cpu {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace {
// clang 14's __builtin_cpu_supports does not know "f16c": read CPUID.1:ECX.29.
bool has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
// AVX512_BF16 is CPUID.(7,1):EAX.5 (compilers' __builtin_cpu_supports
// disagree on its name). The OS-saved-state check is the avx512f one.
bool has_avx512bf16() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)) != 0;
}
}  // namespace
#endif

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    // The CPU first, the table second: each *_table() is compiled for its
    // ISA, and the compiler may use that ISA's instructions to build it (GCC
    // 12 builds avx512bf16's with zmm moves, SIGILL on an AVX2-only CPU).
    // __builtin_cpu_supports also checks that the OS saves the wide state.
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c() &&
             avx2_table() != nullptr;
    case CpuIsa::kAvx512:
      return cpu_isa_supported(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             avx512_table() != nullptr;
    case CpuIsa::kAvx512Bf16:
      return cpu_isa_supported(CpuIsa::kAvx512) && has_avx512bf16() &&
             avx512bf16_table() != nullptr;
#endif
    default:
      return false;
  }
}

namespace {
// The four-row, 16-key bf16 q . k of a decode tile (head dim 128, the page
// in L1), timed with the bf16 dot product and with widening and FMAs:
// nanoseconds for kCalls calls, best of kRounds alternating rounds (a
// preempted round only reads slower).
struct DotTiming {
  double dot_ns = std::numeric_limits<double>::infinity();
  double fma_ns = std::numeric_limits<double>::infinity();
};

DotTiming time_bf16_dot(const KernelTable& t) {
  constexpr int kD = 128, kKeys = 16, kRows = 4, kCalls = 32, kRounds = 7;
  alignas(64) uint16_t page[kKeys * kD];
  alignas(64) uint16_t q16[kRows * kD];
  alignas(64) float q32[kRows * kD];
  alignas(64) float logits[kRows * kKeys];
  // Finite values near 1 (no subnormals, no overflow): bf16 0x3f80 is 1.0.
  for (int i = 0; i < kKeys * kD; ++i) page[i] = uint16_t(0x3f80 + (i * 37) % 64);
  for (int i = 0; i < kRows * kD; ++i) {
    q16[i] = uint16_t(0x3f80 + (i * 11) % 64);
    q32[i] = 1.0f + float((i * 11) % 64) / 128.0f;
  }
  Prefetcher pf;  // no regions: its ticks issue nothing
  pf.reset(0);
  pf.plan(1);
  const QkBf16Fn dot = t.qk_bf16[2];
  const QkFn fma = t.qk[2][kBf16Paired];
  DotTiming r;
  using Clock = std::chrono::steady_clock;
  for (int round = 0; round < kRounds; ++round) {
    auto t0 = Clock::now();
    for (int c = 0; c < kCalls; ++c) dot(q16, kD, page, 0, kKeys, logits, kKeys, 1.0f, 0.0f, &pf);
    auto t1 = Clock::now();
    for (int c = 0; c < kCalls; ++c) fma(q32, kD, page, 0, kKeys, logits, kKeys, 0.0f, &pf);
    auto t2 = Clock::now();
    r.dot_ns = std::min(r.dot_ns, std::chrono::duration<double, std::nano>(t1 - t0).count());
    r.fma_ns = std::min(r.fma_ns, std::chrono::duration<double, std::nano>(t2 - t1).count());
  }
  return r;
}
}  // namespace

bool bf16_dot_pays() {
  // Measured once per process (about 0.1 ms). vdpbf16ps halves q . k's
  // multiply-add instructions, but its rate is the CPU's: on Zen 4 it runs
  // at the FMA rate (the dot product wins); on a 2-vCPU Intel Xeon VM
  // (AVX512_BF16 and AMX) at about a quarter of it, and bf16 decode with it
  // read K/V 25 % slower than without (bench/README.md, "The bf16 dot
  // product, measured"). The dot product is kept unless widening is clearly
  // faster, so that where the two are close the choice does not change
  // from one process to the next (their sums differ in rounding).
  static const bool pays = [] {
    if (!cpu_isa_supported(CpuIsa::kAvx512Bf16)) return false;
    const KernelTable* t = avx512bf16_table();
    if (t->qk_bf16[2] == nullptr || t->qk[2][kBf16Paired] == nullptr) return true;
    const DotTiming d = time_bf16_dot(*t);
    return !(d.fma_ns < 0.8 * d.dot_ns);
  }();
  return pays;
}

CpuIsa resolve_cpu_isa(CpuIsa requested) {
  if (requested != CpuIsa::kAuto) {
    if (!cpu_isa_supported(requested)) {
      fail(Errc::kUnsupported, "this CPU cannot run the requested kernel ISA");
    }
    return requested;
  }
  CpuIsa cap = CpuIsa::kAvx512Bf16;
  bool pinned = false;  // avx512bf16 asked for by name: no measurement
  if (const char* env = std::getenv("PAGEDKV_CPU_ISA")) {
    if (std::strcmp(env, "scalar") == 0) cap = CpuIsa::kScalar;
    if (std::strcmp(env, "avx2") == 0) cap = CpuIsa::kAvx2;
    if (std::strcmp(env, "avx512") == 0) cap = CpuIsa::kAvx512;
    pinned = std::strcmp(env, "avx512bf16") == 0;
  }
  for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    if (static_cast<int32_t>(isa) > static_cast<int32_t>(cap) || !cpu_isa_supported(isa)) continue;
    // avx512bf16 is avx512 plus the bf16 dot product: where the dot
    // product is the slower way, avx512 is the faster set.
    if (isa == CpuIsa::kAvx512Bf16 && !pinned && !bf16_dot_pays()) continue;
    return isa;
  }
  return CpuIsa::kScalar;
}

const KernelTable& kernel_table(CpuIsa resolved) {
  switch (resolved) {
    case CpuIsa::kAvx512Bf16:
      if (const KernelTable* t = avx512bf16_table()) return *t;
      break;
    case CpuIsa::kAvx512:
      if (const KernelTable* t = avx512_table()) return *t;
      break;
    case CpuIsa::kAvx2:
      if (const KernelTable* t = avx2_table()) return *t;
      break;
    default:
      break;
  }
  return scalar_table();
}

}  // namespace cpu
}  // namespace pagedkv
