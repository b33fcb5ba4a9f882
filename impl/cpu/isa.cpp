#include <cstdlib>
#include <cstring>
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

CpuIsa resolve_cpu_isa(CpuIsa requested) {
  if (requested != CpuIsa::kAuto) {
    if (!cpu_isa_supported(requested)) {
      fail(Errc::kUnsupported, "this CPU cannot run the requested kernel ISA");
    }
    return requested;
  }
  CpuIsa cap = CpuIsa::kAvx512Bf16;
  if (const char* env = std::getenv("PAGEDKV_CPU_ISA")) {
    if (std::strcmp(env, "scalar") == 0) cap = CpuIsa::kScalar;
    if (std::strcmp(env, "avx2") == 0) cap = CpuIsa::kAvx2;
    if (std::strcmp(env, "avx512") == 0) cap = CpuIsa::kAvx512;
  }
  for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    if (static_cast<int32_t>(isa) <= static_cast<int32_t>(cap) && cpu_isa_supported(isa))
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
