// The other process of the transfer tests (transfer_test.cpp). Talks over
// stdin/stdout, one line per message.
//   peer export <transports> <num_seqs> <seed> <block_size> <min_tokens> <max_tokens> <layers>
//        <full|desc>  (desc: no KV and ATT lines, for big sequences)
//     prefills num_seqs random sequences, exports each and prints
//     "DESC i <hex>", "KV i <hex of its blocks>", then runs a decode step on
//     the original sequence (the export must not see it) and prints
//     "ATT i <hex f32>"; then "READY" and serves reads (progress) until
//     "RELEASE i" / "QUIT" (prints "BYE <validate status> <free> <free at start>").
//   peer import <transports>
//     reads "DESC <hex>", imports it into a fresh pool, prints "STARTED",
//     "FLOWING" once K/V arrived, and polls to the end ("END
//     <state> <status>"), then waits for EOF.
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "transfer_util.h"

using namespace pkv_xfer;

namespace {

uint64_t free_blocks(pkv_pool* p) {
  pkv_pool_stats s;
  pkv_pool_stats_init(&s);
  ok(pkv_pool_get_stats(p, &s), "stats");
  return s.num_free_blocks;
}

pkv_transfer_engine* make_engine(const std::string& tls) {
  pkv_transfer_options o;
  pkv_transfer_options_init(&o);
  o.transports = tls.c_str();
  o.timeout_ms = 60000;
  pkv_transfer_engine* e = nullptr;
  ok(pkv_transfer_engine_create(&o, &e), "pkv_transfer_engine_create");
  return e;
}

// A line from stdin if one is ready within ms (progressing e meanwhile).
bool read_line(pkv_transfer_engine* e, std::string* line, bool* eof) {
  pollfd pfd{0, POLLIN, 0};
  if (e) ok(pkv_transfer_engine_progress(e), "progress");
  if (poll(&pfd, 1, e ? 0 : 1000) <= 0) {
    if (e) usleep(200);
    return false;
  }
  if (!std::getline(std::cin, *line)) {
    *eof = true;
    return false;
  }
  return true;
}

int run_export(char** argv) {
  const std::string tls = argv[0];
  const int nseq = std::stoi(argv[1]);
  const uint64_t seed = std::stoull(argv[2]);
  Layout l;
  l.block_size = uint32_t(std::stoul(argv[3]));
  const size_t lo = std::stoul(argv[4]), hi = std::stoul(argv[5]);
  l.num_layers = uint32_t(std::stoul(argv[6]));
  const bool full = std::string(argv[7]) == "full";
  l.num_blocks = 64 + nseq * (hi / l.block_size + 3);
  pkv_transfer_engine* e = make_engine(tls);
  pkv_pool* p = make_pool(l);
  const uint64_t free0 = free_blocks(p);
  std::mt19937_64 rng(seed);
  std::vector<pkv_seq_id> seqs(nseq);
  std::vector<uint64_t> exports(nseq);
  for (int i = 0; i < nseq; ++i) {
    const size_t n = lo + rng() % (hi - lo + 1);
    ok(pkv_seq_create(p, nullptr, &seqs[i]), "pkv_seq_create");
    const std::vector<int32_t> tokens = random_tokens(rng, n);
    prefill(p, l, seqs[i], tokens, rng);
    ok(pkv_transfer_export(e, p, seqs[i], &exports[i]), "pkv_transfer_export");
    uint64_t size = 0;
    pkv_transfer_export_descriptor(e, exports[i], nullptr, 0, &size);
    std::vector<uint8_t> d(size);
    ok(pkv_transfer_export_descriptor(e, exports[i], d.data(), size, &size), "descriptor");
    std::cout << "DESC " << i << " " << hex(d.data(), d.size()) << "\n";
    if (!full) continue;
    std::cout << "TOK " << i << " " << hex(tokens.data(), tokens.size() * 4) << "\n";
    const auto kv = block_bytes(p, l, seqs[i], n);
    std::cout << "KV " << i << " " << hex(kv.data(), kv.size()) << "\n";
    const auto att = decode_step(p, l, seqs[i], seed * 1000 + i);
    std::cout << "ATT " << i << " " << hex(att.data(), att.size() * 4) << "\n";
  }
  std::cout << "READY" << std::endl;
  std::string line;
  bool eof = false;
  while (!eof) {
    if (!read_line(e, &line, &eof)) continue;
    if (line.rfind("RELEASE ", 0) == 0) {
      const int i = std::stoi(line.substr(8));
      ok(pkv_transfer_export_release(e, exports[i]), "release");
      std::cout << "RELEASED " << i << std::endl;
    } else if (line == "QUIT") {
      for (int i = 0; i < nseq; ++i) pkv_transfer_export_release(e, exports[i]);
      for (pkv_seq_id s : seqs) ok(pkv_seq_free(p, s), "free");
      uint64_t held = 1;
      ok(pkv_transfer_engine_num_exports(e, &held), "num_exports");
      const pkv_status v = pkv_pool_validate(p);
      std::cout << "BYE " << v << " " << free_blocks(p) << " " << free0 << " " << held << std::endl;
      break;
    }
  }
  pkv_transfer_engine_destroy(e);
  pkv_pool_destroy(p);
  return 0;
}

int run_import(char** argv) {
  pkv_transfer_engine* e = make_engine(argv[0]);
  pkv_pool* p = make_pool(Layout{});
  std::string line;
  if (!std::getline(std::cin, line) || line.rfind("DESC ", 0) != 0) return 2;
  const auto d = unhex(line.substr(5));
  pkv_transfer* t = nullptr;
  ok(pkv_transfer_import(e, p, nullptr, d.data(), d.size(), &t), "pkv_transfer_import");
  std::cout << "STARTED" << std::endl;
  uint32_t state = PKV_TRANSFER_RUNNING;
  pkv_status st = PKV_OK;
  // K/V has arrived once any byte of the fresh pool's first K plane is
  // not zero (the exporter's K/V is random): the two workers' connection
  // is then set up. Polls write it on this thread, so reading it is safe.
  pkv_tensor k{};
  ok(pkv_pool_kv_tensor(p, 0, PKV_KV_KEY, &k), "kv_tensor");
  size_t k_bytes = 2;  // bf16
  for (int d = 0; d < k.ndim; ++d) k_bytes *= size_t(k.shape[d]);
  const auto* k0 = static_cast<const unsigned char*>(k.data) + k.byte_offset;
  bool flowing = false;
  while (state == PKV_TRANSFER_RUNNING) {
    st = pkv_transfer_poll(t, &state, nullptr);
    for (size_t b = 0; !flowing && b < k_bytes; ++b) flowing = k0[b] != 0;
    if (flowing) {
      std::cout << "FLOWING" << std::endl;
      break;
    }
  }
  while (state == PKV_TRANSFER_RUNNING) st = pkv_transfer_poll(t, &state, nullptr);
  std::cout << "END " << state << " " << st << std::endl;
  while (std::getline(std::cin, line)) {
  }
  pkv_transfer_destroy(t);
  pkv_transfer_engine_destroy(e);
  pkv_pool_destroy(p);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string role = argc > 1 ? argv[1] : "";
    if (role == "export" && argc == 10) return run_export(argv + 2);
    if (role == "import" && argc == 3) return run_import(argv + 2);
    std::cerr << "usage: see the comment at the top of peer_main.cpp\n";
    return 2;
  } catch (const std::exception& ex) {
    std::cout << "ERROR " << ex.what() << std::endl;
    return 1;
  }
}
