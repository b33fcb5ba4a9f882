// How far one core's reads of 4 KiB slices fall below its sequential read
// bandwidth, by the order of the slices and the arithmetic done per byte:
// the memory side of CPU decode attention without the attention. A table,
// not a Google Benchmark: each row streams 256 MiB of 4 KiB slices (a bf16
// page of one KV head at head dim 128, block 16) in one of three orders,
//   random:      slices at random places (one KV head's pages);
//   runs:        runs of 8 adjacent slices (a block's 8 heads) at random
//                places, one run after the other;
//   interleaved: the same runs, 4 at a time, slice h of each before slice
//                h + 1 (a 4-page step walked head after head),
// prefetching the next slice's lines as it reads each 256 B, with F FMAs on
// each 32 B loaded (8 independent chains: F = 8 is the AVX2 FMA count of
// GQA-4 decode per cache byte), against a sequential read measured in the
// same round. Medians over the rounds; see bench/README.md ("The memory
// side of decode").
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr size_t kBytes = size_t(256) << 20, kSlice = 4096, kRun = 8, kInterleave = 4;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__attribute__((target("avx2"))) double sequential(const char* base) {
  const double t = now();
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (size_t o = 0; o < kBytes; o += 128) {
    a = _mm256_add_ps(a, _mm256_load_ps(reinterpret_cast<const float*>(base + o)));
    b = _mm256_add_ps(b, _mm256_load_ps(reinterpret_cast<const float*>(base + o + 32)));
    c = _mm256_add_ps(c, _mm256_load_ps(reinterpret_cast<const float*>(base + o + 64)));
    d = _mm256_add_ps(d, _mm256_load_ps(reinterpret_cast<const float*>(base + o + 96)));
  }
  volatile float sink = _mm256_cvtss_f32(_mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  (void)sink;
  return double(kBytes) / (now() - t) / 1e9;
}

template <int F>
__attribute__((target("avx2,fma"))) double slices(const char* base,
                                                  const std::vector<uint32_t>& order) {
  const double t = now();
  __m256 acc[8];
  for (auto& x : acc) x = _mm256_setzero_ps();
  const __m256 m = _mm256_set1_ps(1.0001f);
  const size_t n = order.size();
  for (size_t s = 0; s < n; ++s) {
    const char* p = base + size_t(order[s]) * kSlice;
    const char* next = base + size_t(order[s + 1 < n ? s + 1 : s]) * kSlice;
    for (size_t o = 0; o < kSlice; o += 256) {
      for (size_t l = 0; l < 256; l += 64) asm volatile("prefetcht0 %0" : : "m"(next[o + l]));
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) {
        // bf16 widened to f32, as the kernels do for the even elements.
        const __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + o + 32 * v)), 16));
        if constexpr (F == 0) acc[v] = _mm256_add_ps(acc[v], x);
#pragma GCC unroll 16
        for (int f = 0; f < F; ++f) acc[(v + f) & 7] = _mm256_fmadd_ps(x, m, acc[(v + f) & 7]);
      }
    }
  }
  __m256 sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm256_add_ps(sum, acc[i]);
  volatile float sink = _mm256_cvtss_f32(sum);
  (void)sink;
  return double(kBytes) / (now() - t) / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::max(1, std::atoi(argv[i + 1]));
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("stream_compute: needs AVX2 and FMA; nothing measured\n");
    return 0;
  }
  char* base = static_cast<char*>(std::aligned_alloc(size_t(1) << 21, kBytes));
  if (base == nullptr) return 1;
  madvise(base, kBytes, MADV_HUGEPAGE);  // as the KV arena
  std::memset(base, 1, kBytes);
  const size_t n = kBytes / kSlice;
  std::mt19937 rng(1);
  std::vector<uint32_t> random(n), runs(n), interleaved(n), run_ids(n / kRun);
  std::iota(random.begin(), random.end(), 0u);
  std::shuffle(random.begin(), random.end(), rng);
  std::iota(run_ids.begin(), run_ids.end(), 0u);
  std::shuffle(run_ids.begin(), run_ids.end(), rng);
  for (size_t i = 0; i < n; ++i) runs[i] = uint32_t(run_ids[i / kRun] * kRun + i % kRun);
  const size_t group = kRun * kInterleave;
  for (size_t g = 0; g < n / group; ++g)
    for (size_t h = 0; h < kRun; ++h)
      for (size_t b = 0; b < kInterleave; ++b)
        interleaved[g * group + h * kInterleave + b] = runs[g * group + b * kRun + h];

  const std::vector<uint32_t>* orders[3] = {&random, &runs, &interleaved};
  const char* names[3] = {"random", "runs of 8", "4 runs interleaved"};
  const int fs[3] = {0, 8, 14};
  std::vector<double> seq;
  std::vector<std::vector<double>> rate(9);
  for (int r = 0; r < rounds; ++r) {
    seq.push_back(sequential(base));
    for (int k = 0; k < 9; ++k) {
      const std::vector<uint32_t>& o = *orders[k % 3];
      const int f = fs[k / 3];
      rate[size_t(k)].push_back(f == 0   ? slices<0>(base, o)
                                : f == 8 ? slices<8>(base, o)
                                         : slices<14>(base, o));
    }
  }
  const double s = median(seq);
  std::printf("one core, 256 MiB of 4 KiB slices, next slice prefetched; median of %d rounds\n",
              rounds);
  std::printf("sequential read: %.2f GB/s\n\n", s);
  std::printf("%-20s %14s %10s %12s\n", "order", "FMAs per 32 B", "GB/s", "of sequential");
  for (int k = 0; k < 9; ++k) {
    const double g = median(rate[size_t(k)]);
    std::printf("%-20s %14d %10.2f %12.2f\n", names[k % 3], fs[k / 3], g, g / s);
  }
  std::free(base);
  return 0;
}
