// The CPU backend: host memory, a thread pool owned by the backend, and the
// reference kernels (impl/cpu/attention.h documents their semantics).
#pragma once

#include <cstdint>
#include <memory>

#include "backend.h"

namespace pagedkv {

// Which vector code the CPU kernels run. kAuto picks the fastest the CPU
// supports (cpu::resolve_cpu_isa; env PAGEDKV_CPU_ISA=scalar|avx2|avx512
// lowers it, =avx512bf16 pins that one); tests pin each supported one so
// the portable scalar path is always exercised. kAvx512Bf16 is kAvx512
// plus vdpbf16ps for bf16 q . k, which kAuto takes only where it measures
// faster (cpu::bf16_dot_pays).
enum class CpuIsa : int32_t { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3, kAvx512Bf16 = 4 };

struct CpuBackendOptions {
  int32_t num_threads = 0;  // 0 = hardware concurrency
  CpuIsa isa = CpuIsa::kAuto;
  // Attention splits a (sequence, KV head) item along the context only when
  // there are too few items for the threads; a split covers at least this
  // many keys. Tests lower it to force the split-and-merge path.
  int32_t min_split_keys = 512;
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

}  // namespace pagedkv
