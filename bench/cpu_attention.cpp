// CPU decode attention against the memory-read ceiling measured in the same
// run. Decode reads every K and V byte of the context once per step, so its
// speed limit is the read bandwidth; the table reports attention bytes/s
// (K+V bytes read / wall time of one call) over a multithreaded vectorised
// sum of a buffer much larger than the LLC, for 1 thread and all threads.
//
// Shape (default): batch 16, context 4096, 32 query / 8 KV heads, head dim
// 128, bf16, block size 16, pages in random order. Flags:
//   --threads N   all-threads row uses N (default hardware concurrency)
//   --reps N      calls timed per row, best kept (default 5)
//   --context N   --batch N   --dtype f32|f16|bf16
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
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include <time.h>
#include <vector>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu/half.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

namespace {

using namespace pagedkv;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of every thread of the process: on a shared machine, the
// rate per CPU-second times the thread count is what the run would reach
// with its cores to itself.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

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
  if (!__builtin_cpu_supports("avx512f") || slice % 128 != 0) return best;
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
        acc += sum_slices(kp + o, vp + o, kp + no, vp + no, slice);
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

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

}  // namespace

int main(int argc, char** argv) {
  int threads = int(std::thread::hardware_concurrency());
  int reps = 5, batch = 16, context = 4096;
  DType dt = DType::kBF16;
  bool ordered = false;
  std::string only_isa;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") threads = std::atoi(v.c_str());
    if (a == "--reps") reps = std::atoi(v.c_str());
    if (a == "--batch") batch = std::atoi(v.c_str());
    if (a == "--context") context = std::atoi(v.c_str());
    if (a == "--ordered") ordered = v == "1";
    if (a == "--isa") only_isa = v;
    if (a == "--dtype") dt = v == "f32" ? DType::kF32 : v == "f16" ? DType::kF16 : DType::kBF16;
  }
  const int hq = 32, hkv = 8, d = 128, bs = 16;
  const int pages_per_seq = (context + bs - 1) / bs;
  const int num_blocks = batch * pages_per_seq + 1;

  KvArena arena;
  arena.num_layers = 1;
  arena.layout = {num_blocks, hkv, bs, d, dt};
  auto setup = make_cpu_backend(threads);
  arena.base = setup->allocate(arena.layout.layer_bytes() * 2);
  {
    // Random (exactly representable) contents, written in parallel so
    // first touch spreads the pages over the threads' memory.
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
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  if (!ordered) std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  std::vector<int32_t> qptr(batch + 1), pptr(batch + 1), last(batch), ctx(batch);
  std::vector<int64_t> slots(batch, -1);
  for (int s = 0; s <= batch; ++s) {
    qptr[s] = s;
    pptr[s] = s * pages_per_seq;
  }
  for (int s = 0; s < batch; ++s) {
    ctx[s] = context;
    last[s] = context - (pages_per_seq - 1) * bs;
  }
  PlanView plan{batch,       batch,       1,          context,     slots.data(),
                qptr.data(), pptr.data(), ids.data(), last.data(), ctx.data()};
  const size_t es = dtype_size(dt);
  std::vector<char> qbuf(size_t(batch) * hq * d * es), obuf(qbuf.size());
  for (size_t i = 0; i < qbuf.size(); ++i) qbuf[i] = char(0x3c + (i % 3));  // small finite values
  Tensor3 q{qbuf.data(), dt, batch, hq, d, int64_t(hq) * d, d};
  Tensor3 out{obuf.data(), dt, batch, hq, d, int64_t(hq) * d, d};
  AttentionArgs args{1.0f / std::sqrt(float(d)), 0, 0.0f, nullptr, 0};
  const double kv_bytes = double(batch) * context * hkv * d * es * 2;

  // The bandwidth buffer: 1 GiB, far beyond any LLC.
  const size_t bw_floats = size_t(1) << 28;
  float* bw = static_cast<float*>(std::aligned_alloc(64, bw_floats * sizeof(float)));
  {
    ThreadPool fill(threads);
    fill.parallel_for(256, [&](int64_t c, int32_t) {
      const size_t per = bw_floats / 256;
      for (size_t i = size_t(c) * per; i < size_t(c + 1) * per; ++i) bw[i] = 1.0f;
    });
  }

  std::printf("CPU decode attention vs memory read bandwidth (same run)\n");
  std::printf("machine: %s, %u hardware threads\n", cpu_model().c_str(),
              std::thread::hardware_concurrency());
  std::printf(
      "shape: batch %d, context %d, %d q / %d kv heads, head dim %d, %s, block %d; "
      "K+V read per call %.1f MiB; best of %d\n\n",
      batch, context, hq, hkv, d,
      dt == DType::kF32   ? "f32"
      : dt == DType::kF16 ? "f16"
                          : "bf16",
      bs, kv_bytes / (1 << 20), reps);
  std::printf(
      "wall: per wall second; cpu: per CPU second x threads (what the run reaches with\n"
      "its cores to itself; this matters on a shared machine)\n"
      "paged: reading only the K/V page slices attention reads, in its order, with\n"
      "prefetch (the ceiling of a paged read); attn/pg: attn cpu / paged cpu\n\n");
  std::printf("%-10s %-7s %10s %10s %7s %10s %10s %7s %9s %10s %7s\n", "isa", "threads", "read",
              "attn", "ratio", "read", "attn", "ratio", "ms/call", "paged", "attn/pg");
  std::printf("%-10s %-7s %10s %10s %7s %10s %10s %7s %9s %10s %7s\n", "", "", "wall GB/s",
              "wall GB/s", "wall", "cpu GB/s", "cpu GB/s", "cpu", "", "cpu GB/s", "cpu");

  std::vector<int> thread_counts{1};
  if (threads > 1) thread_counts.push_back(threads);
  for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
    if (!cpu::cpu_isa_supported(isa)) continue;
    if (!only_isa.empty() && only_isa != cpu::kernel_table(isa).name) continue;
    for (int t : thread_counts) {
      ThreadPool pool(t);
      const Rate read = read_bandwidth(pool, bw, bw_floats, std::min(reps, 5));
      const Rate paged = paged_read(pool, arena, plan, std::min(reps, 5));
      CpuBackendOptions opts;
      opts.num_threads = t;
      opts.isa = isa;
      auto backend = make_cpu_backend(opts);
      backend->attend(arena, 0, plan, q, out, args, nullptr);  // warm-up
      double best = 1e30;
      Rate att;
      for (int r = 0; r < reps; ++r) {
        auto t0 = Clock::now();
        const double c0 = cpu_seconds();
        backend->attend(arena, 0, plan, q, out, args, nullptr);
        const double dt = seconds_since(t0), dc = cpu_seconds() - c0;
        best = std::min(best, dt);
        att.wall = std::max(att.wall, kv_bytes / dt);
        att.cpu = std::max(att.cpu, kv_bytes / dc * t);
      }
      std::printf("%-10s %-7d %10.2f %10.2f %7.3f %10.2f %10.2f %7.3f %9.2f %10.2f %7.3f\n",
                  cpu::kernel_table(isa).name, t, read.wall / 1e9, att.wall / 1e9,
                  att.wall / read.wall, read.cpu / 1e9, att.cpu / 1e9, att.cpu / read.cpu,
                  best * 1e3, paged.cpu / 1e9, paged.cpu > 0 ? att.cpu / paged.cpu : 0.0);
      std::fflush(stdout);
    }
  }
  std::free(bw);
  setup->deallocate(arena.base);
  return 0;
}
