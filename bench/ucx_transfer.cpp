// Transfer bandwidth of pkv_transfer_* between two processes of this
// machine, per UCX transport, against a same-run memcpy of the same bytes.
// The exporter is a fork()ed child (before any UCX initialisation) that
// prefills one long sequence, exports it and serves reads; the parent
// imports it repeatedly into its own pool.
//   bench_ucx_transfer [tokens=1024] [layers=16] [reps=7]
#include <pagedkv/pagedkv.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_clock.h"

namespace {

using pkv_bench::seconds_since;

constexpr uint32_t kHeads = 8, kDim = 128, kBlock = 16;

void ok(pkv_status s, const char* what) {
  if (s != PKV_OK) {
    std::fprintf(stderr, "%s: %s\n", what, pkv_last_error_message());
    std::exit(1);
  }
}

pkv_pool* make_pool(uint32_t layers, uint64_t blocks) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.num_layers = layers;
  o.num_kv_heads = kHeads;
  o.head_dim = kDim;
  o.block_size = kBlock;
  o.dtype = PKV_DTYPE_BF16;
  o.num_blocks = blocks;
  pkv_pool* p = nullptr;
  ok(pkv_pool_create(&o, &p), "pool");
  return p;
}

pkv_transfer_engine* make_engine(const char* tls) {
  pkv_transfer_options o;
  pkv_transfer_options_init(&o);
  o.transports = tls;
  o.timeout_ms = 120000;
  pkv_transfer_engine* e = nullptr;
  ok(pkv_transfer_engine_create(&o, &e), "engine");
  return e;
}

// Child: export, send the descriptor on fd, progress until fd_in closes.
[[noreturn]] void exporter(const char* tls, uint32_t tokens, uint32_t layers, int out, int in) {
  pkv_transfer_engine* e = make_engine(tls);
  pkv_pool* p = make_pool(layers, tokens / kBlock + 8);
  pkv_seq_id s;
  ok(pkv_seq_create(p, nullptr, &s), "seq");
  std::vector<int32_t> t(tokens);
  for (uint32_t i = 0; i < tokens; ++i) t[i] = int32_t(i * 7 + 1);
  ok(pkv_seq_append(p, s, t.data(), tokens, 0), "append");
  pkv_batch* b = nullptr;
  ok(pkv_batch_prepare(p, &s, &tokens, 1, nullptr, &b), "prepare");
  std::vector<uint16_t> kv(size_t(tokens) * kHeads * kDim);
  std::mt19937 rng(1);
  for (auto& x : kv) x = uint16_t(0x3c00 + rng() % 512);
  const int64_t shape[3] = {tokens, kHeads, kDim};
  pkv_tensor k;
  ok(pkv_tensor_init(kv.data(), PKV_DTYPE_BF16, PKV_DEVICE_CPU, 0, 3, shape, &k), "tensor");
  for (uint32_t l = 0; l < layers; ++l) ok(pkv_cache_write(b, l, &k, &k, nullptr), "write");
  pkv_batch_destroy(b);
  uint64_t id = 0, size = 0;
  ok(pkv_transfer_export(e, p, s, &id), "export");
  pkv_transfer_export_descriptor(e, id, nullptr, 0, &size);
  std::vector<uint8_t> d(size);
  ok(pkv_transfer_export_descriptor(e, id, d.data(), size, &size), "descriptor");
  const uint64_t n = size;
  if (write(out, &n, 8) != 8 || write(out, d.data(), n) != ssize_t(n)) std::_Exit(1);
  for (;;) {
    pkv_transfer_engine_progress(e);
    pollfd pfd{in, POLLIN, 0};
    if (poll(&pfd, 1, 0) > 0) break;  // the parent closed its end
  }
  std::_Exit(0);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const uint32_t tokens = argc > 1 ? uint32_t(std::atoi(argv[1])) : 1024;
  const uint32_t layers = argc > 2 ? uint32_t(std::atoi(argv[2])) : 16;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 7;
  if (!pkv_transfer_available()) {
    std::printf("built without UCX: nothing to measure\n");
    return 0;
  }
  std::printf(
      "| transport | bytes | transfer median (ms) | GB/s | memcpy GB/s (same run) | ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const char* tls : {"shm", "tcp"}) {
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(down[0]);
      close(up[1]);
      exporter(tls, tokens, layers, down[1], up[0]);
    }
    close(down[1]);
    close(up[0]);
    uint64_t n = 0;
    if (read(down[0], &n, 8) != 8) return 1;
    std::vector<uint8_t> d(n);
    for (uint64_t got = 0; got < n;) {
      const ssize_t k = read(down[0], d.data() + got, n - got);
      if (k <= 0) return 1;
      got += uint64_t(k);
    }
    pkv_transfer_engine* e = make_engine(tls);
    pkv_pool* p = make_pool(layers, tokens / kBlock + 8);
    std::vector<double> times;
    uint64_t bytes = 0;
    for (int r = 0; r < reps + 1; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      pkv_transfer* t = nullptr;
      ok(pkv_transfer_import(e, p, nullptr, d.data(), n, &t), "import");
      uint32_t state = PKV_TRANSFER_RUNNING;
      pkv_seq_id s = 0;
      while (state == PKV_TRANSFER_RUNNING) ok(pkv_transfer_poll(t, &state, &s), "poll");
      const double dt = seconds_since(t0);
      ok(pkv_transfer_bytes(t, &bytes), "bytes");
      pkv_transfer_destroy(t);
      ok(pkv_seq_free(p, s), "free");
      if (r > 0) times.push_back(dt);  // the first one warms the endpoint path
    }
    // memcpy of the same bytes, also into memory touched before.
    std::vector<char> src(bytes, 1), dst(bytes, 2);
    std::vector<double> mt;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      mt.push_back(seconds_since(t0));
      src[size_t(r) % bytes] = char(dst[size_t(r * 7) % bytes] + 1);
    }
    const double tm = median(times), mm = median(mt);
    std::printf("| %s | %llu | %.2f | %.2f | %.2f | %.2f |\n", tls, (unsigned long long)bytes,
                tm * 1e3, bytes / tm / 1e9, bytes / mm / 1e9, mm / tm);
    close(up[1]);
    close(down[0]);
    waitpid(pid, nullptr, 0);
    pkv_transfer_engine_destroy(e);
    pkv_pool_destroy(p);
  }
  return 0;
}
