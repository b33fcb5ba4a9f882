// Offload tiers (issue 20): the bandwidth of offloading evicted blocks to
// the host tier (copy thread: gather every layer's K/V planes of a block,
// xxh3 checksum) and of loading them back (checksum, scatter into the
// pool's planes), against a plain memcpy of the same bytes in the same run;
// then the same through the file tier below a host tier (preadv/pwritev of
// whole slots in one file; the file sits in the page cache unless the
// directory is on a device that bypasses it), and through a file tier alone
// (host_bytes 0: each block written straight from the pool's planes). The file rows also time a
// plain pwrite of the same bytes from a warm buffer into a file made as the tier makes its own, one
// slot a call (buffered: the page cache's ceiling for any file offload; O_DIRECT from an aligned
// buffer: the disk's), in the same round.
//
// Shape (default): 8 layers, 8 KV heads, head dim 128, block size 16, bf16
// (512 KiB a block), 256 blocks moved. Flags:
//   --blocks N   --reps N (best of; default 5)   --file-dir DIR (default /tmp)
// Plain program (no Google Benchmark harness): the rows compare within a run.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_clock.h"
#include "pagedkv/pagedkv.h"

namespace {

using pkv_bench::Clock;
using pkv_bench::cpu_model;
using pkv_bench::seconds_since;

void must(pkv_status s, const char* what) {
  if (s != PKV_OK) {
    std::fprintf(stderr, "%s: %s\n", what, pkv_last_error_message());
    std::exit(1);
  }
}

// Times of one round, each next to a plain memcpy of the same bytes timed
// just before it (the machine may be shared: a ratio taken across minutes
// would compare different loads).
struct Result {
  double offload_s = 0, offload_memcpy_s = 0, load_s = 0, load_memcpy_s = 0;
  double pwrite_s = 0, direct_s = 0;  // file rounds: the ceilings (direct: 0 = not supported)
};

std::vector<char>& scratch(size_t bytes, int which) {
  static std::vector<char> buf[2];
  if (buf[which].size() != bytes) buf[which].assign(bytes, char(1 + which));  // faulted in
  return buf[which];
}

double memcpy_seconds(size_t bytes) {
  std::vector<char>& src = scratch(bytes, 0);
  std::vector<char>& dst = scratch(bytes, 1);
  auto t0 = Clock::now();
  std::memcpy(dst.data(), src.data(), bytes);
  const double s = seconds_since(t0);
  src[size_t(s * 1e9) % bytes] ^= dst[bytes / 2];  // keeps the copy observable
  return s;
}

// A fresh file in dir as the file tier makes its own (mkostemp, unlinked,
// fallocate'd to bytes); -1 on failure.
int tier_like_file(const std::string& dir, size_t bytes, bool direct) {
  std::string path = dir + "/pagedkv-bench-XXXXXX";
  const int fd = mkostemp(path.data(), O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) return -1;
  unlink(path.c_str());
  if (fallocate(fd, 0, 0, off_t(bytes)) != 0 && errno != EOPNOTSUPP) {
    close(fd);
    return -1;
  }
  return fd;
}

// The same bytes written slot by slot from a warm buffer into a fresh file
// in dir, made as the file tier makes its own (mkostemp, unlinked,
// fallocate'd). direct: O_DIRECT from a page-aligned buffer; 0 when the file
// system refuses it.
double pwrite_seconds(size_t bytes, size_t slot, const std::string& dir, bool direct) {
  static char* aligned = nullptr;
  static size_t aligned_bytes = 0;
  const char* src = scratch(bytes, 0).data();
  if (direct) {
    if (aligned_bytes != bytes) {
      std::free(aligned);
      if (posix_memalign(reinterpret_cast<void**>(&aligned), 4096, bytes) != 0) return 0;
      std::memset(aligned, 3, bytes);
      aligned_bytes = bytes;
    }
    src = aligned;
  }
  const int fd = tier_like_file(dir, bytes, direct);
  if (fd < 0) return 0;
  auto t0 = Clock::now();
  for (size_t at = 0; at < bytes; at += slot) {
    if (pwrite(fd, src + at, slot, off_t(at)) != ssize_t(slot)) {
      close(fd);
      return 0;
    }
  }
  const double sec = seconds_since(t0);
  close(fd);
  return sec;
}

// One round: sequence a's blocks written (committed), freed, evicted by
// sequence b (the offloads: timed from b's append to the end of the flush),
// then a's tokens matched from the tier and loaded (the tier's load time).
Result round(uint32_t blocks, uint64_t host_bytes, const char* file_dir, uint64_t file_bytes,
             int32_t first_token) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.block_size = 16;
  o.num_blocks = blocks + 1;
  o.num_layers = 8;
  o.num_kv_heads = 8;
  o.head_dim = 128;
  o.dtype = PKV_DTYPE_BF16;
  o.hash_algo = PKV_HASH_XXH3_128;
  o.num_threads = 1;
  pkv_pool* pool = nullptr;
  must(pkv_pool_create(&o, &pool), "pkv_pool_create");
  pkv_tier_options t;
  pkv_tier_options_init(&t);
  t.host_bytes = host_bytes;
  t.file_dir = file_dir;
  t.file_bytes = file_bytes;
  must(pkv_pool_attach_tiers(pool, &t), "pkv_pool_attach_tiers");

  // Real bytes in every block (and the arena's pages faulted in), as a
  // serving pool's are.
  for (uint32_t l = 0; l < o.num_layers; ++l)
    for (uint32_t w = 0; w < 2; ++w) {
      pkv_tensor kv;
      must(pkv_pool_kv_tensor(pool, l, w, &kv), "kv_tensor");
      std::memset(kv.data, int(0x11 * (l + 1) + w), size_t(o.num_blocks) * 8 * 16 * 128 * 2);
    }
  const uint64_t n = uint64_t(blocks) * 16;
  std::vector<int32_t> ta(n + 1), tb(n);
  for (uint64_t i = 0; i <= n; ++i) ta[i] = first_token + int32_t(i);
  for (uint64_t i = 0; i < n; ++i) tb[i] = 1 << 24 | int32_t(i);
  pkv_seq_id a = 0, b = 0;
  must(pkv_seq_create(pool, nullptr, &a), "seq a");
  must(pkv_seq_append(pool, a, ta.data(), n, 0), "append a");
  const uint32_t q = uint32_t(n);
  pkv_batch* batch = nullptr;
  must(pkv_batch_prepare(pool, &a, &q, 1, nullptr, &batch), "prepare a");
  must(pkv_batch_commit(batch), "commit a");  // the bytes are whatever the arena holds
  pkv_batch_destroy(batch);
  must(pkv_seq_free(pool, a), "free a");

  Result r;
  const size_t bytes = size_t(n / 16) * 2 * 8 * 8 * 16 * 128 * 2;
  must(pkv_seq_create(pool, nullptr, &b), "seq b");
  r.offload_memcpy_s = memcpy_seconds(bytes);
  if (file_dir) {
    r.pwrite_s = pwrite_seconds(bytes, bytes / blocks, file_dir, false);
    r.direct_s = pwrite_seconds(bytes, bytes / blocks, file_dir, true);
  }
  auto t0 = Clock::now();
  must(pkv_seq_append(pool, b, tb.data(), n, 0), "append b");  // evicts every block of a
  must(pkv_pool_flush_tiers(pool), "flush");
  r.offload_s = seconds_since(t0);
  must(pkv_seq_free(pool, b), "free b");

  pkv_seq_id c = 0;
  must(pkv_seq_create(pool, nullptr, &c), "seq c");
  pkv_tier_match m;
  pkv_tier_match_init(&m);
  must(pkv_seq_match_prefix_tiered(pool, c, ta.data(), n + 1, &m), "match");
  if (m.host_tokens + m.file_tokens != n) {
    std::fprintf(stderr, "expected %llu tier hits, got %llu + %llu\n", (unsigned long long)n,
                 (unsigned long long)m.host_tokens, (unsigned long long)m.file_tokens);
    std::exit(1);
  }
  r.load_memcpy_s = memcpy_seconds(bytes);
  must(pkv_pool_flush_tiers(pool), "flush loads");  // also offloads b's evicted blocks first
  uint64_t load_ns = 0;
  for (uint32_t medium : {PKV_MEDIUM_HOST, PKV_MEDIUM_FILE}) {
    pkv_tier_stats st;
    pkv_tier_stats_init(&st);
    if (pkv_pool_get_tier_stats(pool, medium, &st) == PKV_OK) {
      load_ns += st.load_ns;
      if (st.num_checksum_failures || st.num_io_errors) {
        std::fprintf(stderr, "tier %u: failures\n", medium);
        std::exit(1);
      }
    }
  }
  r.load_s = double(load_ns) * 1e-9;
  must(pkv_pool_validate(pool), "validate");
  pkv_pool_destroy(pool);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t blocks = 256;
  int reps = 5;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--blocks")
      blocks = uint32_t(std::atoi(argv[i + 1]));
    else if (f == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (f == "--file-dir")
      dir = argv[i + 1];
  }
  const uint64_t block_bytes = 2ull * 8 * 8 * 128 * 16 * 2;
  const uint64_t bytes = block_bytes * blocks;
  // Host tier: every block fits. File tier: a one-block host tier, so every
  // offload but the last goes down to the file (a pwritev), and the loads
  // come from the file (a preadv).
  // File tier alone: host_bytes 0, every offload straight into the file.
  std::vector<Result> host, file, alone;
  for (int i = 0; i < reps; ++i) {
    host.push_back(round(blocks, 2 * bytes, nullptr, 0, 0));
    file.push_back(round(blocks, block_bytes, dir.c_str(), 2 * bytes, 0));
    alone.push_back(round(blocks, 0, dir.c_str(), 2 * bytes, 0));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto gbs = [&](double s) { return double(bytes) / s / 1e9; };
  std::printf("machine: %s, %ld CPUs online\n", cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "%u blocks of %llu KiB (8 layers, 8 KV heads, dim 128, block 16, bf16) = %.0f MiB,"
      " %d rounds; each path timed next to a memcpy of the same bytes\n\n",
      blocks, (unsigned long long)(block_bytes >> 10), double(bytes) / (1 << 20), reps);
  std::printf(
      "| path | GB/s (median) | memcpy GB/s (median) | path / memcpy (median of rounds) |\n");
  std::printf("|---|---|---|---|\n");
  // Each row: the median over rounds of (reference time / path time), the
  // reference timed in the same round.
  auto row = [&](const char* name, const std::vector<Result>& rs, auto path, auto ref) {
    std::vector<double> t, m, ratio;
    for (const Result& r : rs) {
      const double ts = path(r), ms = ref(r);
      if (ts <= 0 || ms <= 0) continue;
      t.push_back(ts);
      m.push_back(ms);
      ratio.push_back(ms / ts);
    }
    if (t.empty()) {
      std::printf("| %s | n/a | n/a | n/a |\n", name);
      return;
    }
    std::printf("| %s | %.2f | %.2f | %.2f |\n", name, gbs(median(t)), gbs(median(m)),
                median(ratio));
  };
  auto offload = [](const Result& r) { return r.offload_s; };
  auto load = [](const Result& r) { return r.load_s; };
  auto offload_memcpy = [](const Result& r) { return r.offload_memcpy_s; };
  auto load_memcpy = [](const Result& r) { return r.load_memcpy_s; };
  auto pwrite_s = [](const Result& r) { return r.pwrite_s; };
  auto direct_s = [](const Result& r) { return r.direct_s; };
  row("offload to the host tier (copy thread: copy + xxh3)", host, offload, offload_memcpy);
  row("load from the host tier (copy + xxh3 verify)", host, load, load_memcpy);
  row("offload via the host tier to the file tier (+ pwritev)", file, offload, offload_memcpy);
  row("load from the file tier (preadv + xxh3 verify)", file, load, load_memcpy);
  row("offload to a file tier alone (host_bytes 0: xxh3 + pwritev from the pool's planes)", alone,
      offload, offload_memcpy);
  row("load from a file tier alone (preadv + xxh3 verify)", alone, load, load_memcpy);
  // The ceilings were timed in both kinds of file rounds.
  std::vector<Result> files = file;
  files.insert(files.end(), alone.begin(), alone.end());
  row("ceiling: plain pwrite of the same bytes, one slot a call, warm buffer (page cache)", files,
      pwrite_s, offload_memcpy);
  row("ceiling: O_DIRECT pwrite of the same bytes, one slot a call (disk)", files, direct_s,
      offload_memcpy);
  // Against the ceiling: medians over rounds on both sides (the ceiling's
  // over every file round), since one round's pwrite varies with whatever
  // else the machine does at that moment.
  std::vector<double> ceiling;
  for (const Result& r : files)
    if (r.pwrite_s > 0) ceiling.push_back(r.pwrite_s);
  if (!ceiling.empty()) {
    std::printf(
        "\n| against the page-cache ceiling | path GB/s (median) | plain pwrite GB/s (median) | "
        "path / pwrite |\n|---|---|---|---|\n");
    for (auto [name, rs] : {std::make_pair("offload via the host tier to the file tier", &file),
                            std::make_pair("offload to a file tier alone", &alone)}) {
      std::vector<double> t;
      for (const Result& r : *rs) t.push_back(r.offload_s);
      std::printf("| %s | %.2f | %.2f | %.2f |\n", name, gbs(median(t)), gbs(median(ceiling)),
                  median(ceiling) / median(t));
    }
  }
  return 0;
}
