// CPU MLA decode (absorbed, impl/cpu/mla.h) against ceilings measured in
// the same run: the read bandwidth of a multithreaded vectorised sum over a
// buffer far beyond the LLC (as bench_cpu_attention's decode table), and the
// FLOP rate the kernel reaches.
//
// Absorbed MLA decode reads each latent row (R + P elements) once per step
// and per head block, and does 2 * (R + P) + 2 * R flops per (head, key):
// with DeepSeek-V3's 128 heads that is ~128 flops per bf16 byte, so unlike
// MHA decode it is compute bound on a CPU; the table shows both ratios.
//
// Shape (default): batch 8, context 4096, rank 512 + rope 64, bf16, block 64,
// pages in random order; heads 16 and 128. Flags: --threads N, --reps N,
// --context N, --batch N, --isa scalar|avx2|avx512 (default: each supported).
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <time.h>

#include "bench_clock.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"
#include "cpu/kernels.h"
#include "cpu/mla.h"
#include "cpu/thread_pool.h"

namespace {

using namespace pagedkv;
using pkv_bench::Clock;
using pkv_bench::cpu_seconds;
using pkv_bench::seconds_since;

constexpr int32_t kRank = 512, kRope = 64, kD = kRank + kRope, kBs = 64;

struct Rate {
  double wall = 0, cpu = 0;  // per wall second; per CPU second x threads
};

// A sum the compiler cannot drop, vectorised by -O3 for the target the
// runtime check picks.
__attribute__((target("avx2"))) float sum_floats_avx2(const float* p, size_t n) {
  __m256 a = _mm256_setzero_ps(), b = a;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    a = _mm256_add_ps(a, _mm256_load_ps(p + i));
    b = _mm256_add_ps(b, _mm256_load_ps(p + i + 8));
  }
  float t[8];
  _mm256_storeu_ps(t, _mm256_add_ps(a, b));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

// Best-of-reps bytes/s of every thread summing its own contiguous chunks.
Rate read_ceiling(ThreadPool& pool, const float* buf, size_t n, int reps) {
  const int64_t chunks = int64_t(pool.size()) * 16;
  const size_t per = n / size_t(chunks) / 64 * 64;
  std::vector<float> partial(static_cast<size_t>(chunks));
  Rate best;
  const double bytes = double(per) * double(chunks) * sizeof(float);
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    pool.parallel_for(chunks, [&](int64_t c, int32_t) {
      partial[size_t(c)] = sum_floats_avx2(buf + size_t(c) * per, per);
    });
    const double dt = seconds_since(t0), dc = cpu_seconds() - c0;
    volatile float sink = std::accumulate(partial.begin(), partial.end(), 0.0f);
    (void)sink;
    best.wall = std::max(best.wall, bytes / dt);
    best.cpu = std::max(best.cpu, bytes / dc * pool.size());
  }
  return best;
}

struct Options {
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  int reps = 3, context = 4096, batch = 8;
  std::string isa;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") o.threads = std::atoi(v.c_str());
    if (k == "--reps") o.reps = std::atoi(v.c_str());
    if (k == "--context") o.context = std::atoi(v.c_str());
    if (k == "--batch") o.batch = std::atoi(v.c_str());
    if (k == "--isa") o.isa = v;
  }
  if (!__builtin_cpu_supports("avx2")) {
    std::printf("bench_cpu_mla needs AVX2 for its read ceiling\n");
    return 0;
  }
  const int pages_per_seq = (o.context + kBs - 1) / kBs;
  const int num_blocks = o.batch * pages_per_seq + 1;
  // The latent plane, bf16, random values; pages in random order.
  std::vector<uint16_t> plane(size_t(num_blocks) * kBs * kD);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint16_t& x : plane) x = f32_to_bf16(u(rng));
  std::vector<int32_t> ids(size_t(num_blocks - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> qptr(size_t(o.batch) + 1), pptr(size_t(o.batch) + 1), last(size_t(o.batch)),
      ctx(size_t(o.batch), o.context);
  std::vector<int64_t> slots(size_t(o.batch));
  for (int s = 0; s <= o.batch; ++s) {
    qptr[size_t(s)] = s;
    pptr[size_t(s)] = s * pages_per_seq;
  }
  for (int s = 0; s < o.batch; ++s) {
    last[size_t(s)] = o.context - (pages_per_seq - 1) * kBs;
    slots[size_t(s)] =
        int64_t(ids[size_t((s + 1) * pages_per_seq - 1)]) * kBs + last[size_t(s)] - 1;
  }
  PlanView plan{o.batch,     o.batch,     1,          o.context,   slots.data(),
                qptr.data(), pptr.data(), ids.data(), last.data(), ctx.data()};
  const cpu::MlaCache cache{plane.data(), num_blocks, kBs, kRank, kRope, DType::kBF16};

  const size_t bw_floats = size_t(1) << 27;  // 512 MiB
  float* bw = static_cast<float*>(std::aligned_alloc(64, bw_floats * sizeof(float)));
  std::fill(bw, bw + bw_floats, 1.0f);

  std::printf(
      "== MLA decode (absorbed): latent bytes/s vs read bandwidth, same run ==\n"
      "batch %d, context %d, rank %d + rope %d, bf16, block %d, pages shuffled, threads %d, "
      "best of %d\n\n",
      o.batch, o.context, kRank, kRope, kBs, o.threads, o.reps);
  std::printf(
      "wall: per wall second; cpu: per CPU second x threads (what the run reaches with its\n"
      "cores to itself; this matters on a shared machine)\n\n");
  std::printf("%-7s %6s %9s %9s %7s %9s %9s %7s %9s %9s\n", "isa", "heads", "read", "mla", "ratio",
              "read", "mla", "ratio", "GFLOP/s", "ms/call");
  std::printf("%-7s %6s %9s %9s %7s %9s %9s %7s %9s %9s\n", "", "", "wall GB/s", "wall GB/s",
              "wall", "cpu GB/s", "cpu GB/s", "cpu", "cpu", "wall");
  ThreadPool pool(o.threads);
  const Rate read = read_ceiling(pool, bw, bw_floats, o.reps);
  struct IsaRow {
    const char* name;
    CpuIsa isa;
  };
  const IsaRow isas[] = {
      {"scalar", CpuIsa::kScalar}, {"avx2", CpuIsa::kAvx2}, {"avx512", CpuIsa::kAvx512}};
  for (int heads : {16, 128}) {
    std::vector<uint16_t> ql(size_t(o.batch) * heads * kRank), qp(size_t(o.batch) * heads * kRope),
        out(size_t(o.batch) * heads * kRank);
    for (uint16_t& x : ql) x = f32_to_bf16(u(rng));
    for (uint16_t& x : qp) x = f32_to_bf16(u(rng));
    const Tensor3 q3{ql.data(), DType::kBF16, o.batch, heads, kRank, heads * kRank, kRank};
    const Tensor3 p3{qp.data(), DType::kBF16, o.batch, heads, kRope, heads * kRope, kRope};
    const Tensor3 o3{out.data(), DType::kBF16, o.batch, heads, kRank, heads * kRank, kRank};
    AttentionArgs args{0.0722f, 0, 0.0f, nullptr, 0};
    const double bytes = double(o.batch) * o.context * kD * 2;
    const double flops = double(o.batch) * heads * o.context * (2.0 * kD + 2.0 * kRank);
    for (const IsaRow& row : isas) {
      if (!o.isa.empty() && o.isa != row.name) continue;
      if (!cpu::cpu_isa_supported(row.isa)) continue;
      const cpu::MlaOps& ops = cpu::mla_ops(row.isa);
      double best = 1e30, best_cpu = 1e30;
      const int reps = row.isa == CpuIsa::kScalar ? 1 : o.reps;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        const double c0 = cpu_seconds();
        cpu::mla_attend(pool, ops, cache, plan, q3, p3, o3, args);
        best = std::min(best, seconds_since(t0));
        best_cpu = std::min(best_cpu, (cpu_seconds() - c0) / pool.size());
      }
      std::printf("%-7s %6d %9.2f %9.2f %7.3f %9.2f %9.2f %7.3f %9.1f %9.2f\n", row.name, heads,
                  read.wall / 1e9, bytes / best / 1e9, bytes / best / read.wall, read.cpu / 1e9,
                  bytes / best_cpu / 1e9, bytes / best_cpu / read.cpu, flops / best_cpu / 1e9,
                  best * 1e3);
      std::fflush(stdout);
    }
  }
  std::free(bw);
  return 0;
}
