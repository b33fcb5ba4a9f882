// CPU decode attention on FP8 pages against bf16 pages, same run, same
// shape and plan: an FP8 cache is half the bytes, so a decode step (which
// reads every K and V byte once) should take about half the time where the
// bf16 kernel is bandwidth-bound. Also times two ways of widening FP8 codes
// to f32 (a 256-entry table read with vpgatherdd, and the integer shift
// into an f16 plus vcvtph2ps, the method of the AVX2 kernels' loads (which
// take 16 codes as even/odd f16 words, fp8_ops_avx2.inc) and of the AVX-512
// sets' E5M2 V load; the AVX-512 sets widen E4M3 and the K of the bf16 dot
// path through a bf16 table, fp8_ops_avx512.inc), on a buffer in L2.
// --batch 1 --context 512 --threads 1 keeps K/V in L2: the per-core
// compute rate of each cache dtype, which a busy machine barely moves.
//
// Shape (default): batch 16, context 4096, 32 query / 8 KV heads, head dim
// 128, block size 16, pages in random order, q/out bf16. Flags:
//   --threads N  (default hardware concurrency)   --reps N (best of; default 5)
//   --context N  --batch N   --isa avx512bf16|avx512|avx2|scalar (default: each)
// Plain program (no Google Benchmark harness): the rows compare within a run.
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
#include <vector>

#include "backend.h"
#include "bench_clock.h"
#include "cpu/cpu_backend.h"
#include "cpu/fp8.h"
#include "cpu/half.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"

using namespace pagedkv;

namespace {

using pkv_bench::Clock;
using pkv_bench::cpu_model;
using pkv_bench::seconds_since;

struct Cache {
  DType dt;
  KvArena arena{};
  std::unique_ptr<Backend> mem;
  std::vector<float> scales;
};

// Random contents: bf16 values in [-1, 1], or their E4M3/E5M2 codes with a
// scale of 1/256 (so the codes use the format's range).
void fill(Cache& c, int threads) {
  const size_t bytes = c.arena.layout.layer_bytes() * 2;
  ThreadPool pool(threads);
  const int64_t elems = int64_t(bytes / dtype_size(c.dt));
  const int64_t chunk = 1 << 20;
  pool.parallel_for((elems + chunk - 1) / chunk, [&](int64_t k, int32_t) {
    std::mt19937 rng(static_cast<uint32_t>(k));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = k * chunk; i < std::min(elems, (k + 1) * chunk); ++i) {
      const float x = u(rng);
      if (c.dt == DType::kBF16) {
        static_cast<uint16_t*>(c.arena.base)[i] = f32_to_bf16(x);
      } else if (c.dt == DType::kFp8E4m3) {
        static_cast<uint8_t*>(c.arena.base)[i] = f32_to_fp8<kFp8E4m3>(x * 256.0f);
      } else {
        static_cast<uint8_t*>(c.arena.base)[i] = f32_to_fp8<kFp8E5m2>(x * 256.0f);
      }
    }
  });
}

// Widening 16 codes at a time, over n codes (n % 16 == 0), summed so the
// work is not dropped: a table with vpgatherdd, or the kernels' shift into
// f16 and vcvtph2ps (E4M3, with its NaN fix-up).
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) float sum_gather(const uint8_t* p,
                                                                           size_t n,
                                                                           const float* table) {
  __m512 acc = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const __m512i idx =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
    acc = _mm512_add_ps(acc, _mm512_i32gather_ps(idx, table, 4));
  }
  return _mm512_reduce_add_ps(acc);
}

__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) float sum_shift(const uint8_t* p,
                                                                          size_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    const __m256i w = _mm256_slli_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))), 8);
    __m256i h = _mm256_and_si256(_mm256_srai_epi16(w, 1), _mm256_set1_epi16(int16_t(0xbfff)));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)),
                                                  _mm256_set1_epi16(0x3f80));
    h = _mm256_or_si256(h, _mm256_maskz_mov_epi16(nan, _mm256_set1_epi16(0x7c00)));
    acc = _mm512_add_ps(acc, _mm512_cvtph_ps(h));
  }
  return _mm512_reduce_add_ps(acc);
}

void conversion_rates() {
  if (!cpu::cpu_isa_supported(CpuIsa::kAvx512)) {
    std::printf("conversion: no AVX-512 here, skipped\n\n");
    return;
  }
  const size_t n = size_t(1) << 17;  // 128 KiB: stays in L2
  std::vector<uint8_t> codes(n);
  std::mt19937 rng(3);
  for (auto& c : codes) c = uint8_t(rng() & 0xf7);  // no NaN codes
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = fp8_load_scaled<kFp8E4m3>(uint8_t(c));
  double best_g = 1e30, best_s = 1e30;
  volatile float sink = 0;
  for (int r = 0; r < 200; ++r) {
    auto t0 = Clock::now();
    sink = sink + sum_gather(codes.data(), n, table);
    best_g = std::min(best_g, seconds_since(t0));
    t0 = Clock::now();
    sink = sink + sum_shift(codes.data(), n);
    best_s = std::min(best_s, seconds_since(t0));
  }
  std::printf("E4M3 -> f32 widening, one thread, 128 KiB of codes in L2 (best of 200):\n");
  std::printf("  256-entry table + vpgatherdd: %6.2f Gcodes/s\n", n / best_g / 1e9);
  std::printf("  shift into f16 + vcvtph2ps:   %6.2f Gcodes/s (the AVX2 kernels' method)\n\n",
              n / best_s / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = int(std::thread::hardware_concurrency());
  int reps = 5, batch = 16, context = 4096;
  std::string only_isa;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") threads = std::atoi(v.c_str());
    if (a == "--reps") reps = std::atoi(v.c_str());
    if (a == "--batch") batch = std::atoi(v.c_str());
    if (a == "--context") context = std::atoi(v.c_str());
    if (a == "--isa") only_isa = v;
  }
  const int hq = 32, hkv = 8, d = 128, bs = 16;
  const int pages_per_seq = (context + bs - 1) / bs;
  const int num_blocks = batch * pages_per_seq + 1;

  std::printf("CPU decode attention: FP8 pages against bf16 pages (same run)\n");
  std::printf("machine: %s, %u hardware threads\n", cpu_model().c_str(),
              std::thread::hardware_concurrency());
  std::printf(
      "shape: batch %d, context %d, %d q / %d kv heads, head dim %d, block %d, q/out bf16, "
      "pages in random order; best of %d\n\n",
      batch, context, hq, hkv, d, bs, reps);
  conversion_rates();

  Cache caches[3];
  const DType dts[3] = {DType::kBF16, DType::kFp8E4m3, DType::kFp8E5m2};
  for (int i = 0; i < 3; ++i) {
    Cache& c = caches[i];
    c.dt = dts[i];
    c.arena.num_layers = 1;
    c.arena.layout = {num_blocks, hkv, bs, d, c.dt};
    c.mem = make_cpu_backend(threads);
    c.arena.base = c.mem->allocate(c.arena.layout.layer_bytes() * 2);
    c.scales.assign(2 * hkv, 1.0f / 256);
    if (is_fp8(c.dt)) c.arena.scales = c.scales.data();
    fill(c, threads);
  }
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
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
  std::vector<uint16_t> qbuf(size_t(batch) * hq * d), obuf(qbuf.size());
  for (size_t i = 0; i < qbuf.size(); ++i) qbuf[i] = f32_to_bf16(0.01f * float(int(i % 7) - 3));
  Tensor3 q{qbuf.data(), DType::kBF16, batch, hq, d, int64_t(hq) * d, d};
  Tensor3 out{obuf.data(), DType::kBF16, batch, hq, d, int64_t(hq) * d, d};
  AttentionArgs args{1.0f / std::sqrt(float(d)), 0, 0.0f, nullptr, 0};
  const double elems = double(batch) * context * hkv * d * 2;

  std::printf("%-10s %-7s %12s %12s %12s %9s %9s\n", "isa", "threads", "bf16 ms", "e4m3 ms",
              "e5m2 ms", "e4m3/bf16", "e5m2/bf16");
  std::printf("%-10s %-7s %12s %12s %12s\n", "", "", "(GB/s)", "(GB/s)", "(GB/s)");
  std::vector<int> thread_counts{1};
  if (threads > 1) thread_counts.push_back(threads);
  for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
    if (!cpu::cpu_isa_supported(isa)) continue;
    if (!only_isa.empty() && only_isa != cpu::kernel_table(isa).name) continue;
    for (int t : thread_counts) {
      CpuBackendOptions opts;
      opts.num_threads = t;
      opts.isa = isa;
      auto backend = make_cpu_backend(opts);
      double ms[3], gbs[3];
      for (int i = 0; i < 3; ++i) {
        const KvArena& arena = caches[i].arena;
        backend->attend(arena, 0, plan, q, out, args, nullptr);  // warm-up
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
          auto t0 = Clock::now();
          backend->attend(arena, 0, plan, q, out, args, nullptr);
          best = std::min(best, seconds_since(t0));
        }
        ms[i] = best * 1e3;
        gbs[i] = elems * double(dtype_size(dts[i])) / best / 1e9;
      }
      char b0[32], b1[32], b2[32];
      std::snprintf(b0, sizeof b0, "%.2f (%.1f)", ms[0], gbs[0]);
      std::snprintf(b1, sizeof b1, "%.2f (%.1f)", ms[1], gbs[1]);
      std::snprintf(b2, sizeof b2, "%.2f (%.1f)", ms[2], gbs[2]);
      std::printf("%-10s %-7d %12s %12s %12s %9.3f %9.3f\n", cpu::kernel_table(isa).name, t, b0, b1,
                  b2, ms[1] / ms[0], ms[2] / ms[0]);
      std::fflush(stdout);
    }
  }
  for (Cache& c : caches) c.mem->deallocate(c.arena.base);
  return 0;
}
