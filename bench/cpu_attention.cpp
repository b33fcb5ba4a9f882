// CPU paged attention against ceilings measured in the same run.
//
// Decode reads every K and V byte of the context once per step, so its
// speed limit is the read bandwidth; the decode table reports attention
// bytes/s (K+V bytes read / wall time of one call) over a multithreaded
// vectorised sum of a buffer much larger than the LLC, per ISA and cache
// dtype, for 1 thread and all threads.
//
// Prefill (n_q = L, causal) is compute bound; the prefill table reports its
// FLOP/s (4 * D per visible (query, key) pair per query head: q.k and p.v)
// over the ISA's peak measured in the same run: a register-only FMA loop of
// the ISA's vector width (scalar: the baseline SSE2 mul + add the scalar
// kernels compile to), and for avx512bf16 the vdpbf16ps rate its q.k uses.
// The clock is measured too (a chain of dependent integer adds, one per
// cycle), so peak / clock gives the flops per cycle the core sustains.
//
// Shape (default): batch 16, context 4096, 32 query / 8 KV heads, head dim
// 128, block size 16, pages in random order. Flags:
//   --threads N   all-threads row uses N (default hardware concurrency)
//   --reps N      calls timed per row, best kept (default 5)
//   --context N   --batch N   (decode shape)
//   --dtype f32|f16|bf16|all   cache (and q/out) dtype (default all)
//   --prefill N   prefill length (one sequence; default 1024, 0 = no prefill
//                 table; the scalar rows use min(N, 256))
//   --decode 0    no decode table
//   --ordered 1   pages in address order (the cost of paging, by contrast)
//   --isa avx512bf16|avx512|avx2|scalar   only that kernel set (default: each supported)
// Plain program (no Google Benchmark harness): ratios need both numbers
// from the same run, side by side.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include <time.h>
#include <vector>

#include "backend.h"
#include "bench_clock.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

namespace {

using namespace pagedkv;
using pkv_bench::Clock;
using pkv_bench::cpu_model;
using pkv_bench::cpu_seconds;
using pkv_bench::seconds_since;

struct Rate {
  double wall = 0;  // bytes per wall second (best rep)
  double cpu = 0;   // bytes per CPU second x threads (best rep)
};

__attribute__((target("avx512f"))) double sum_avx512(const float* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

__attribute__((target("avx2"))) double sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return double(t[0]) + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

double sum_chunk(const float* p, size_t n) {
  if (__builtin_cpu_supports("avx512f")) return sum_avx512(p, n);
  if (__builtin_cpu_supports("avx2")) return sum_avx2(p, n);
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

// Best-of-reps read bandwidth (bytes/s) of a vectorised sum over buf with
// the pool's threads, each summing its own contiguous chunks.
Rate read_bandwidth(ThreadPool& pool, const float* buf, size_t n, int reps) {
  const int64_t chunks = int64_t(pool.size()) * 16;
  const size_t per = n / size_t(chunks) / 64 * 64;
  std::vector<double> partial(static_cast<size_t>(chunks));
  Rate best;
  const double bytes = double(per) * double(chunks) * sizeof(float);
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    pool.parallel_for(chunks, [&](int64_t c, int32_t) {
      partial[size_t(c)] = sum_chunk(buf + size_t(c) * per, per);
    });
    const double dt = seconds_since(t0), dc = cpu_seconds() - c0;
    volatile double sink = std::accumulate(partial.begin(), partial.end(), 0.0);
    (void)sink;
    best.wall = std::max(best.wall, bytes / dt);
    best.cpu = std::max(best.cpu, bytes / dc * pool.size());
  }
  return best;
}

// Best-of-reps rate (bytes/s) of only reading what attention reads, in its
// order: per (sequence, KV head), the K and V slices of every page, with
// the next page's slices prefetched while the current one is summed. This
// is the ceiling of a paged read (one bs x D slice per page, at random
// places), below the sequential read bandwidth.
__attribute__((target("avx512f"))) float sum_slices(const char* k, const char* v, const char* nk,
                                                    const char* nv, size_t bytes) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t o = 0; o < bytes; o += 128) {
    asm volatile("prefetcht0 %0" : : "m"(nk[o]));
    asm volatile("prefetcht0 %0" : : "m"(nk[o + 64]));
    asm volatile("prefetcht0 %0" : : "m"(nv[o]));
    asm volatile("prefetcht0 %0" : : "m"(nv[o + 64]));
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(reinterpret_cast<const float*>(k + o)));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(reinterpret_cast<const float*>(k + o + 64)));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(reinterpret_cast<const float*>(v + o)));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(reinterpret_cast<const float*>(v + o + 64)));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// The same walk with 256-bit loads, for CPUs without AVX-512 (e.g. Zen 3),
// where the avx2 kernels are the native ones.
__attribute__((target("avx2"))) float sum_slices_avx2(const char* k, const char* v, const char* nk,
                                                      const char* nv, size_t bytes) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t o = 0; o < bytes; o += 128) {
    asm volatile("prefetcht0 %0" : : "m"(nk[o]));
    asm volatile("prefetcht0 %0" : : "m"(nk[o + 64]));
    asm volatile("prefetcht0 %0" : : "m"(nv[o]));
    asm volatile("prefetcht0 %0" : : "m"(nv[o + 64]));
    const float* kf = reinterpret_cast<const float*>(k + o);
    const float* vf = reinterpret_cast<const float*>(v + o);
    a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_loadu_ps(kf), _mm256_loadu_ps(kf + 8)));
    a1 = _mm256_add_ps(a1, _mm256_add_ps(_mm256_loadu_ps(kf + 16), _mm256_loadu_ps(kf + 24)));
    a2 = _mm256_add_ps(a2, _mm256_add_ps(_mm256_loadu_ps(vf), _mm256_loadu_ps(vf + 8)));
    a3 = _mm256_add_ps(a3, _mm256_add_ps(_mm256_loadu_ps(vf + 16), _mm256_loadu_ps(vf + 24)));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

Rate paged_read(ThreadPool& pool, const KvArena& arena, const PlanView& plan, int reps) {
  const KvLayout& lay = arena.layout;
  const size_t slice = size_t(lay.block_size) * lay.head_dim * dtype_size(lay.dtype);
  const char* kp = static_cast<const char*>(arena.plane(0, 0));
  const char* vp = static_cast<const char*>(arena.plane(0, 1));
  const int64_t items = int64_t(plan.num_seqs) * lay.num_kv_heads;
  std::vector<float> partial(static_cast<size_t>(items));
  double bytes = 0;
  for (int32_t s = 0; s < plan.num_seqs; ++s) {
    bytes += double(plan.page_indptr[s + 1] - plan.page_indptr[s]) * slice * 2 * lay.num_kv_heads;
  }
  Rate best;
  using SumFn = float (*)(const char*, const char*, const char*, const char*, size_t);
  const SumFn sum = __builtin_cpu_supports("avx512f") ? sum_slices
                    : __builtin_cpu_supports("avx2")  ? sum_slices_avx2
                                                      : nullptr;
  if (sum == nullptr || slice % 128 != 0) return best;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    pool.parallel_for(items, [&](int64_t it, int32_t) {
      const int32_t s = int32_t(it / lay.num_kv_heads), h = int32_t(it % lay.num_kv_heads);
      auto off = [&](int32_t i) {
        return (size_t(plan.page_indices[i]) * lay.num_kv_heads + size_t(h)) * slice;
      };
      float acc = 0;
      const int32_t b = plan.page_indptr[s], e = plan.page_indptr[s + 1];
      for (int32_t i = b; i < e; ++i) {
        const size_t o = off(i), no = off(i + 1 < e ? i + 1 : i);
        acc += sum(kp + o, vp + o, kp + no, vp + no, slice);
      }
      partial[size_t(it)] = acc;
    });
    const double dt = seconds_since(t0), dc = cpu_seconds() - c0;
    volatile double sink = std::accumulate(partial.begin(), partial.end(), 0.0);
    (void)sink;
    best.wall = std::max(best.wall, bytes / dt);
    best.cpu = std::max(best.cpu, bytes / dc * pool.size());
  }
  return best;
}

// ---- same-run compute ceilings ----

// Core clock: a chain of dependent 64-bit multiplies, 3 cycles each on
// every x86-64 core of the last decade. (Not adds of an immediate: recent
// Intel cores fold a chain of those in the renamer, and an earlier version
// read 16.5 GHz on a 2.9 GHz Xeon.) Short runs, best kept: on a shared
// machine some runs are never preempted.
double clock_hz() {
  double best = 0;
  for (int r = 0; r < 30; ++r) {
    uint64_t x = 3;
    const int64_t iters = 40000;
    auto t0 = Clock::now();
    for (int64_t i = 0; i < iters; ++i) {
      asm volatile(".rept 100\n\timulq %0, %0\n\t.endr" : "+r"(x));
    }
    const double dt = seconds_since(t0);
    best = std::max(best, 300.0 * double(iters) / dt);
  }
  return best;
}

// Peak loops: independent multiply-add chains in fixed registers (inline
// asm, so that no compiler spills or reorders them), enough chains to cover
// the latency on every port. Accumulators grow linearly from 0: no
// denormals, no overflow.
#define PKV_R16(op)                                                                              \
  op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11) op(12) op(13) op(14) \
      op(15)
#define PKV_R12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)

// 16 zmm accumulators, zmm30 and zmm31 the (broadcast) operands.
#define PKV_ZOP(insn, i) insn " %%zmm30, %%zmm31, %%zmm" #i "\n\t"
#define PKV_ZCLR(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
#define PKV_ZMM_LOOP(name, isa, insn, a_val, b_val)                                                \
  __attribute__((target(isa))) void name(int64_t iters) {                                          \
    const float a = a_val, b = b_val;                                                              \
    asm volatile("vbroadcastss %1, %%zmm30\n\tvbroadcastss %2, %%zmm31\n\t" PKV_R16(               \
                     PKV_ZCLR) "1:\n\t" PKV_ZOP(insn, 0) PKV_ZOP(insn, 1) PKV_ZOP(insn, 2)         \
                     PKV_ZOP(insn, 3) PKV_ZOP(insn, 4) PKV_ZOP(insn, 5) PKV_ZOP(insn, 6)           \
                         PKV_ZOP(insn, 7) PKV_ZOP(insn, 8) PKV_ZOP(insn, 9) PKV_ZOP(insn, 10)      \
                             PKV_ZOP(insn, 11) PKV_ZOP(insn, 12) PKV_ZOP(insn, 13)                 \
                                 PKV_ZOP(insn, 14) PKV_ZOP(insn, 15) "dec %0\n\tjnz 1b\n\t"        \
                 : "+r"(iters)                                                                     \
                 : "m"(a), "m"(b)                                                                  \
                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                   "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm30", "xmm31", "cc");  \
  }
PKV_ZMM_LOOP(fma_loop_avx512, "avx512f", "vfmadd231ps", 1.0f, 1e-6f)
// 1.0f read as bf16 pairs is (0, 1.0): each lane adds 0 * 0 + 1 * 1.
PKV_ZMM_LOOP(dpbf16_loop, "avx512f,avx512bf16", "vdpbf16ps", 1.0f, 1.0f)
#undef PKV_ZMM_LOOP
#undef PKV_ZOP
#undef PKV_ZCLR

__attribute__((target("avx2,fma"))) void fma_loop_avx2(int64_t iters) {
#define PKV_Y(i) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define PKV_CLR(i) "vxorps %%ymm" #i ", %%ymm" #i ", %%ymm" #i "\n\t"
  const float one = 1.0f, tiny = 1e-6f;
  asm volatile("vbroadcastss %1, %%ymm14\n\tvbroadcastss %2, %%ymm15\n\t" PKV_R12(
                   PKV_CLR) "1:\n\t" PKV_R12(PKV_Y) "dec %0\n\tjnz 1b\n\t"
               : "+r"(iters)
               : "m"(one), "m"(tiny)
               : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                 "xmm10", "xmm11", "xmm14", "xmm15", "cc");
#undef PKV_Y
#undef PKV_CLR
}

// The scalar kernels are built for baseline x86-64: SSE2, no FMA. Their
// ceiling is 4-lane mul + add (what the compiler can vectorise them to).
void muladd_loop_sse2(int64_t iters) {
#define PKV_X(i) "mulps %%xmm14, %%xmm" #i "\n\taddps %%xmm15, %%xmm" #i "\n\t"
#define PKV_CLR(i) "xorps %%xmm" #i ", %%xmm" #i "\n\t"
  const float one = 1.0f, tiny = 1e-6f;
  asm volatile(
      "movss %1, %%xmm14\n\tshufps $0, %%xmm14, %%xmm14\n\tmovss %2, %%xmm15\n\t"
      "shufps $0, %%xmm15, %%xmm15\n\t" PKV_R12(PKV_CLR) "1:\n\t" PKV_R12(
          PKV_X) "dec %0\n\tjnz 1b\n\t"
      : "+r"(iters)
      : "m"(one), "m"(tiny)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm14", "xmm15", "cc");
#undef PKV_X
#undef PKV_CLR
}
#undef PKV_R16
#undef PKV_R12

struct PeakLoop {
  void (*loop)(int64_t);
  double flops_per_iter;
};
constexpr PeakLoop kAvx512Fma{fma_loop_avx512, 16 * 16 * 2};
constexpr PeakLoop kAvx512Dot{dpbf16_loop, 16 * 32 * 2};  // 32 bf16 products + adds each
constexpr PeakLoop kAvx2Fma{fma_loop_avx2, 12 * 8 * 2};
constexpr PeakLoop kSse2MulAdd{muladd_loop_sse2, 12 * 4 * 2};

// Best-of-reps flops/s of a peak loop on every thread of the pool at once
// (short runs: on a shared machine some are never preempted).
double peak_flops(ThreadPool& pool, const PeakLoop& p, int reps) {
  const int64_t iters = 100000;
  double best = 0;
  for (int r = 0; r < 10 * reps; ++r) {
    auto t0 = Clock::now();
    pool.parallel_for(pool.size(), [&](int64_t, int32_t) { p.loop(iters); });
    best =
        std::max(best, double(pool.size()) * double(iters) * p.flops_per_iter / seconds_since(t0));
  }
  return best;
}

// ---- workload set-up ----

const char* dtype_name(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16";
}

constexpr int kHq = 32, kHkv = 8, kD = 128, kBs = 16;

// A one-layer arena of `pages` blocks (plus the null block 0) filled with
// random, exactly representable values, written in parallel so that first
// touch spreads the pages over the threads' memory.
struct Arena {
  std::unique_ptr<Backend> owner;
  KvArena arena;
  Arena(int threads, int32_t pages, DType dt) : owner(make_cpu_backend(threads)) {
    arena.num_layers = 1;
    arena.layout = {pages + 1, kHkv, kBs, kD, dt};
    arena.base = owner->allocate(arena.layout.layer_bytes() * 2);
    ThreadPool fill(threads);
    const int64_t elems = int64_t(arena.layout.layer_bytes() * 2 / dtype_size(dt));
    const int64_t chunk = 1 << 20;
    fill.parallel_for((elems + chunk - 1) / chunk, [&](int64_t c, int32_t) {
      std::mt19937 rng(static_cast<uint32_t>(c));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (int64_t i = c * chunk; i < std::min(elems, (c + 1) * chunk); ++i) {
        const float x = u(rng);
        if (dt == DType::kF32) {
          static_cast<float*>(arena.base)[i] = x;
        } else {
          static_cast<uint16_t*>(arena.base)[i] =
              dt == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
        }
      }
    });
  }
  ~Arena() { owner->deallocate(arena.base); }
};

// Plan arrays of `batch` sequences of `context` tokens, the last `nq` of
// them queries, on the arena's pages 1.. (shuffled unless ordered).
struct Plan {
  std::vector<int32_t> ids, qptr, pptr, last, ctx;
  std::vector<int64_t> slots;
  PlanView view{};
  Plan(int batch, int context, int nq, bool ordered) {
    const int pages_per_seq = (context + kBs - 1) / kBs;
    ids.resize(size_t(batch) * pages_per_seq);
    std::iota(ids.begin(), ids.end(), 1);
    if (!ordered) std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
    qptr.resize(size_t(batch) + 1);
    pptr.resize(size_t(batch) + 1);
    last.assign(size_t(batch), context - (pages_per_seq - 1) * kBs);
    ctx.assign(size_t(batch), context);
    slots.assign(size_t(batch) * nq, -1);
    for (int s = 0; s <= batch; ++s) {
      qptr[size_t(s)] = s * nq;
      pptr[size_t(s)] = s * pages_per_seq;
    }
    view = PlanView{batch,       int64_t(batch) * nq, nq,         context,     slots.data(),
                    qptr.data(), pptr.data(),         ids.data(), last.data(), ctx.data()};
  }
};

// q and out of `tokens` rows; q holds small finite values.
struct Rows {
  std::vector<char> qbuf, obuf;
  Tensor3 q, out;
  Rows(int64_t tokens, DType dt) {
    const size_t es = dtype_size(dt);
    qbuf.resize(size_t(tokens) * kHq * kD * es);
    obuf.resize(qbuf.size());
    for (size_t i = 0; i < qbuf.size(); ++i) qbuf[i] = char(0x3c + (i % 3));
    q = Tensor3{qbuf.data(), dt, tokens, kHq, kD, int64_t(kHq) * kD, kD};
    out = Tensor3{obuf.data(), dt, tokens, kHq, kD, int64_t(kHq) * kD, kD};
  }
};

struct Options {
  int threads = int(std::thread::hardware_concurrency());
  int reps = 5, batch = 16, context = 4096, prefill = 1024;
  bool decode = true, ordered = false;
  std::vector<DType> dtypes{DType::kBF16, DType::kF16, DType::kF32};
  std::string only_isa;
};

std::vector<CpuIsa> isas(const Options& o) {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
    if (!cpu::cpu_isa_supported(isa)) continue;
    if (!o.only_isa.empty() && o.only_isa != cpu::kernel_table(isa).name) continue;
    out.push_back(isa);
  }
  return out;
}

std::vector<int> thread_counts(const Options& o) {
  std::vector<int> t{1};
  if (o.threads > 1) t.push_back(o.threads);
  return t;
}

// Best-of-reps wall and CPU time of backend->attend (after one warm-up).
Rate time_attend(Backend& backend, const KvArena& arena, const PlanView& plan, const Rows& rows,
                 const AttentionArgs& args, double work, int threads, int reps) {
  backend.attend(arena, 0, plan, rows.q, rows.out, args, nullptr);
  Rate best;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    backend.attend(arena, 0, plan, rows.q, rows.out, args, nullptr);
    const double dt = seconds_since(t0), dc = cpu_seconds() - c0;
    best.wall = std::max(best.wall, work / dt);
    best.cpu = std::max(best.cpu, work / dc * threads);
  }
  return best;
}

void decode_table(const Options& o) {
  const int pages_per_seq = (o.context + kBs - 1) / kBs;
  // The bandwidth buffer: 1 GiB, far beyond any LLC.
  const size_t bw_floats = size_t(1) << 28;
  float* bw = static_cast<float*>(std::aligned_alloc(64, bw_floats * sizeof(float)));
  {
    ThreadPool fill(o.threads);
    fill.parallel_for(256, [&](int64_t c, int32_t) {
      const size_t per = bw_floats / 256;
      for (size_t i = size_t(c) * per; i < size_t(c + 1) * per; ++i) bw[i] = 1.0f;
    });
  }
  std::printf(
      "== Decode: attention bytes/s vs read bandwidth (same run) ==\n"
      "shape: batch %d, context %d, %d q / %d kv heads, head dim %d, block %d, pages %s; "
      "best of %d\n",
      o.batch, o.context, kHq, kHkv, kD, kBs, o.ordered ? "in order" : "shuffled", o.reps);
  std::printf(
      "wall: per wall second; cpu: per CPU second x threads (what the run reaches with\n"
      "its cores to itself; this matters on a shared machine)\n"
      "paged: reading only the K/V page slices attention reads, in its order, with\n"
      "prefetch (the ceiling of a paged read); attn/pg: attn cpu / paged cpu\n");
  // What a pool created with the default ISA runs: the widest set, except
  // avx512 where the bf16 dot product measures slower (cpu::bf16_dot_pays).
  std::printf("a pool's default ISA here: %s\n\n",
              cpu::kernel_table(cpu::resolve_cpu_isa(CpuIsa::kAuto)).name);
  std::printf("%-10s %-5s %-7s %10s %10s %7s %10s %10s %7s %9s %10s %7s\n", "isa", "dtype",
              "threads", "read", "attn", "ratio", "read", "attn", "ratio", "ms/call", "paged",
              "attn/pg");
  std::printf("%-10s %-5s %-7s %10s %10s %7s %10s %10s %7s %9s %10s %7s\n", "", "", "", "wall GB/s",
              "wall GB/s", "wall", "cpu GB/s", "cpu GB/s", "cpu", "", "cpu GB/s", "cpu");
  const Plan plan(o.batch, o.context, 1, o.ordered);
  AttentionArgs args{1.0f / std::sqrt(float(kD)), 0, 0.0f, nullptr, 0};
  for (DType dt : o.dtypes) {
    const Arena arena(o.threads, o.batch * pages_per_seq, dt);
    const Rows rows(o.batch, dt);
    const double kv_bytes = double(o.batch) * o.context * kHkv * kD * dtype_size(dt) * 2;
    for (CpuIsa isa : isas(o)) {
      for (int t : thread_counts(o)) {
        ThreadPool pool(t);
        const Rate read = read_bandwidth(pool, bw, bw_floats, std::min(o.reps, 5));
        const Rate paged = paged_read(pool, arena.arena, plan.view, std::min(o.reps, 5));
        CpuBackendOptions opts;
        opts.num_threads = t;
        opts.isa = isa;
        auto backend = make_cpu_backend(opts);
        const Rate att = time_attend(*backend, arena.arena, plan.view, rows, args, kv_bytes, t,
                                     isa == CpuIsa::kScalar ? std::min(o.reps, 2) : o.reps);
        std::printf("%-10s %-5s %-7d %10.2f %10.2f %7.3f %10.2f %10.2f %7.3f %9.2f %10.2f %7.3f\n",
                    cpu::kernel_table(isa).name, dtype_name(dt), t, read.wall / 1e9, att.wall / 1e9,
                    att.wall / read.wall, read.cpu / 1e9, att.cpu / 1e9, att.cpu / read.cpu,
                    kv_bytes / att.wall * 1e3, paged.cpu / 1e9,
                    paged.cpu > 0 ? att.cpu / paged.cpu : 0.0);
        std::fflush(stdout);
      }
    }
  }
  std::free(bw);
}

void prefill_table(const Options& o) {
  const double hz = clock_hz();
  std::printf(
      "\n== Prefill: FLOP/s vs the ISA's peak (same run) ==\n"
      "one sequence, n_q = L (causal), %d q / %d kv heads, head dim %d, block %d; "
      "flops = 4 * D * visible (query, key) pairs * q heads; best of %d\n"
      "clock (dependent multiplies): %.2f GHz. peak: register-only loop of the ISA's widest f32\n"
      "multiply-add on one core x threads (scalar: SSE2 mul + add); avx512bf16 with bf16 q and\n"
      "cache does q.k with vdpbf16ps: its peak is the time-weighted mix of the vdpbf16ps\n"
      "rate (q.k) and the FMA rate (p.v). flops/cyc: peak per core per clock cycle.\n"
      "cpu: per CPU second x threads (the rate with the cores to itself)\n\n",
      kHq, kHkv, kD, kBs, o.reps, hz / 1e9);
  std::printf("%-10s %-5s %-7s %6s %9s %9s %9s %9s %9s %8s %8s\n", "isa", "dtype", "threads", "L",
              "attn", "attn", "ms/call", "peak", "flops/cyc", "of peak", "of peak");
  std::printf("%-10s %-5s %-7s %6s %9s %9s %9s %9s %9s %8s %8s\n", "", "", "", "", "wall GF/s",
              "cpu GF/s", "", "GF/s", "", "wall", "cpu");
  const int reps = std::min(o.reps, 3);
  for (DType dt : o.dtypes) {
    const Arena arena(o.threads, (o.prefill + kBs - 1) / kBs, dt);
    for (CpuIsa isa : isas(o)) {
      const int len = isa == CpuIsa::kScalar ? std::min(o.prefill, 256) : o.prefill;
      const Plan plan(1, len, len, false);
      const Rows rows(len, dt);
      AttentionArgs args{1.0f / std::sqrt(float(kD)), 0, 0.0f, nullptr, 0};
      const double flops = 4.0 * kD * kHq * (double(len) * (len + 1) / 2);
      // One core's peak, times the threads: the cores are alike, and on a
      // shared machine all of them are rarely unpreempted at once.
      double core_peak = 0;
      {
        ThreadPool one(1);
        if (isa == CpuIsa::kScalar) {
          core_peak = peak_flops(one, kSse2MulAdd, reps);
        } else if (isa == CpuIsa::kAvx2) {
          core_peak = peak_flops(one, kAvx2Fma, reps);
        } else {
          core_peak = peak_flops(one, kAvx512Fma, reps);
          if (isa == CpuIsa::kAvx512Bf16 && dt == DType::kBF16) {
            const double dot = peak_flops(one, kAvx512Dot, reps);
            core_peak = 2.0 / (1.0 / dot + 1.0 / core_peak);
          }
        }
      }
      for (int t : thread_counts(o)) {
        const double peak = core_peak * t;
        CpuBackendOptions opts;
        opts.num_threads = t;
        opts.isa = isa;
        auto backend = make_cpu_backend(opts);
        const Rate att = time_attend(*backend, arena.arena, plan.view, rows, args, flops, t,
                                     isa == CpuIsa::kScalar ? 1 : reps);
        std::printf("%-10s %-5s %-7d %6d %9.1f %9.1f %9.2f %9.1f %9.1f %8.3f %8.3f\n",
                    cpu::kernel_table(isa).name, dtype_name(dt), t, len, att.wall / 1e9,
                    att.cpu / 1e9, flops / att.wall * 1e3, peak / 1e9, peak / t / hz,
                    att.wall / peak, att.cpu / peak);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") o.threads = std::max(1, std::atoi(v.c_str()));
    if (a == "--reps") o.reps = std::max(1, std::atoi(v.c_str()));
    if (a == "--batch") o.batch = std::max(1, std::atoi(v.c_str()));
    if (a == "--context") o.context = std::max(1, std::atoi(v.c_str()));
    if (a == "--prefill") o.prefill = std::max(0, std::atoi(v.c_str()));
    if (a == "--decode") o.decode = v != "0";
    if (a == "--ordered") o.ordered = v == "1";
    if (a == "--isa") o.only_isa = v;
    if (a == "--dtype" && v != "all") {
      o.dtypes = {v == "f32" ? DType::kF32 : v == "f16" ? DType::kF16 : DType::kBF16};
    }
  }
  std::printf("machine: %s, %u hardware threads\n\n", cpu_model().c_str(),
              std::thread::hardware_concurrency());
  if (o.decode) decode_table(o);
  if (o.prefill > 0) prefill_table(o);
  return 0;
}
