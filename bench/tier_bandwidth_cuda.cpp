// Offload tiers on a CUDA pool (issue 20): the bandwidth of offloading
// evicted blocks into the pinned host tier (device -> page-locked slot, one
// cudaMemcpy2DAsync a block, then xxh3 on the copy thread) and of loading
// them back (xxh3 verify on the host, host -> device on the plan's
// stream), against a plain cudaMemcpyAsync of the same bytes between one
// device buffer and one pinned buffer in the same round. Built only with
// CUDA (bench/CMakeLists.txt); needs a GPU. No numbers are claimed here:
// run it on the device (docs/cuda.md) and commit the table.
//
// Shape (default): 8 layers, 8 KV heads, head dim 128, block size 16, bf16
// (512 KiB a block), 256 blocks moved. Flags: --blocks N  --reps N (best of;
// default 5)  --device N.
// Offload time: from the append that evicts every block to the return of
// pkv_pool_flush_tiers (every copy completed, hashed, published). Load
// time: from pkv_batch_prepare (which verifies and queues the copies) to
// the end of a stream synchronisation; the tier's own load_ns is printed
// too.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void must(pkv_status s, const char* what) {
  if (s != PKV_OK) {
    std::fprintf(stderr, "%s: %s\n", what, pkv_last_error_message());
    std::exit(1);
  }
}
void must_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Result {
  double offload_s = 0, d2h_s = 0, load_s = 0, h2d_s = 0, load_ns_s = 0;
};

// A plain copy of bytes between a device buffer and a pinned buffer on
// stream, timed on the host to the end of a stream synchronisation.
double plain_copy(void* dev, void* pinned, size_t bytes, bool to_host, cudaStream_t s) {
  auto t0 = Clock::now();
  must_cuda(to_host ? cudaMemcpyAsync(pinned, dev, bytes, cudaMemcpyDeviceToHost, s)
                    : cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync");
  must_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return since(t0);
}

Result round(uint32_t blocks, int device, cudaStream_t stream, void* dev, void* pinned) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 16;
  // a's blocks, then b takes all of them plus one; c's tier hits plus the
  // block of its last token fill the pool again.
  o.num_blocks = blocks + 2;
  o.num_layers = 8;
  o.num_kv_heads = 8;
  o.head_dim = 128;
  o.dtype = PKV_DTYPE_BF16;
  o.hash_algo = PKV_HASH_XXH3_128;
  o.device_type = PKV_DEVICE_CUDA;
  o.device_id = device;
  pkv_pool* pool = nullptr;
  must(pkv_pool_create(&o, &pool), "pkv_pool_create");
  const uint64_t block_bytes = 2ull * 8 * 8 * 128 * 16 * 2;
  pkv_tier_options t;
  pkv_tier_options_init(&t);
  t.host_bytes = block_bytes * blocks;
  must(pkv_pool_attach_tiers(pool, &t), "pkv_pool_attach_tiers");
  for (uint32_t l = 0; l < o.num_layers; ++l)
    for (uint32_t w = 0; w < 2; ++w) {
      pkv_tensor kv;
      must(pkv_pool_kv_tensor(pool, l, w, &kv), "kv_tensor");
      must_cuda(
          cudaMemset(kv.data, int(0x11 * (l + 1) + w), size_t(o.num_blocks) * 8 * 16 * 128 * 2),
          "cudaMemset");
    }
  const uint64_t n = uint64_t(blocks) * 16;
  std::vector<int32_t> ta(n + 1), tb(n + 16);
  for (uint64_t i = 0; i <= n; ++i) ta[i] = int32_t(i);
  for (uint64_t i = 0; i < n + 16; ++i) tb[i] = 1 << 24 | int32_t(i);
  pkv_seq_id a = 0, b = 0, c = 0;
  must(pkv_seq_create(pool, nullptr, &a), "seq a");
  must(pkv_seq_append(pool, a, ta.data(), n, 0), "append a");
  const uint32_t q = uint32_t(n);
  pkv_batch* batch = nullptr;
  must(pkv_batch_prepare(pool, &a, &q, 1, stream, &batch), "prepare a");
  must(pkv_batch_commit(batch), "commit a");  // the bytes are whatever the arena holds
  pkv_batch_destroy(batch);
  must(pkv_seq_free(pool, a), "free a");
  must_cuda(cudaStreamSynchronize(stream), "sync");

  Result r;
  const size_t bytes = size_t(blocks) * block_bytes;
  r.d2h_s = plain_copy(dev, pinned, bytes, true, stream);
  must(pkv_seq_create(pool, nullptr, &b), "seq b");
  auto t0 = Clock::now();
  must(pkv_seq_append(pool, b, tb.data(), tb.size(), 0), "append b");  // evicts every block of a
  must(pkv_pool_flush_tiers(pool), "flush");
  r.offload_s = since(t0);
  must(pkv_seq_free(pool, b), "free b");

  must(pkv_seq_create(pool, nullptr, &c), "seq c");
  pkv_tier_match m;
  pkv_tier_match_init(&m);
  must(pkv_seq_match_prefix_tiered(pool, c, ta.data(), n + 1, &m), "match");
  if (m.host_tokens != n) {
    std::fprintf(stderr, "expected %llu host hits, got %llu\n", (unsigned long long)n,
                 (unsigned long long)m.host_tokens);
    std::exit(1);
  }
  must(pkv_seq_append(pool, c, ta.data() + n, 1, 0), "append c");
  r.h2d_s = plain_copy(dev, pinned, bytes, false, stream);
  const uint32_t one = 1;
  t0 = Clock::now();
  must(pkv_batch_prepare(pool, &c, &one, 1, stream, &batch), "prepare c (loads)");
  must_cuda(cudaStreamSynchronize(stream), "sync loads");
  r.load_s = since(t0);
  must(pkv_batch_abort(batch), "abort c");
  pkv_batch_destroy(batch);
  must(pkv_pool_flush_tiers(pool), "flush loads");
  pkv_tier_stats st;
  pkv_tier_stats_init(&st);
  must(pkv_pool_get_tier_stats(pool, PKV_MEDIUM_HOST, &st), "stats");
  if (st.num_checksum_failures || st.num_loaded != blocks) {
    std::fprintf(stderr, "host tier: %llu loaded, %llu checksum failures\n",
                 (unsigned long long)st.num_loaded, (unsigned long long)st.num_checksum_failures);
    std::exit(1);
  }
  r.load_ns_s = double(st.load_ns) * 1e-9;
  must(pkv_pool_validate(pool), "validate");
  pkv_pool_destroy(pool);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t blocks = 256;
  int reps = 5, device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--blocks")
      blocks = uint32_t(std::atoi(argv[i + 1]));
    else if (f == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (f == "--device")
      device = std::atoi(argv[i + 1]);
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= device) {
    std::fprintf(stderr, "no CUDA device %d\n", device);
    return 2;
  }
  must_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  must_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const uint64_t block_bytes = 2ull * 8 * 8 * 128 * 16 * 2;
  const size_t bytes = size_t(blocks) * block_bytes;
  cudaStream_t stream = nullptr;
  must_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void *dev = nullptr, *pinned = nullptr;
  must_cuda(cudaMalloc(&dev, bytes), "cudaMalloc");
  must_cuda(cudaMallocHost(&pinned, bytes), "cudaMallocHost");
  must_cuda(cudaMemset(dev, 7, bytes), "cudaMemset");
  std::vector<Result> rs;
  for (int i = 0; i < reps; ++i) rs.push_back(round(blocks, device, stream, dev, pinned));
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto gbs = [&](double s) { return s > 0 ? double(bytes) / s / 1e9 : 0.0; };
  std::printf(
      "device: %s; %u blocks of %llu KiB (8 layers, 8 KV heads, dim 128, block 16, bf16) ="
      " %.0f MiB, %d rounds; each path next to a plain cudaMemcpyAsync of the same bytes"
      " (device buffer <-> pinned buffer) in the same round\n\n",
      prop.name, blocks, (unsigned long long)(block_bytes >> 10), double(bytes) / (1 << 20), reps);
  std::printf("| path | GB/s (median) | cudaMemcpyAsync GB/s (median) | path / copy (median) |\n");
  std::printf("|---|---|---|---|\n");
  auto row = [&](const char* name, auto path, auto ref) {
    std::vector<double> t, m, ratio;
    for (const Result& r : rs) {
      t.push_back(path(r));
      m.push_back(ref(r));
      ratio.push_back(ref(r) / path(r));
    }
    std::printf("| %s | %.2f | %.2f | %.2f |\n", name, gbs(median(t)), gbs(median(m)),
                median(ratio));
  };
  row(
      "offload to the pinned host tier (2D D2H per block + xxh3, append to flush)",
      [](const Result& r) { return r.offload_s; }, [](const Result& r) { return r.d2h_s; });
  row(
      "load from the pinned host tier (xxh3 verify + 2D H2D per block, prepare to sync)",
      [](const Result& r) { return r.load_s; }, [](const Result& r) { return r.h2d_s; });
  row(
      "load, as the tier's load_ns counts it", [](const Result& r) { return r.load_ns_s; },
      [](const Result& r) { return r.h2d_s; });
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaStreamDestroy(stream);
  return 0;
}
