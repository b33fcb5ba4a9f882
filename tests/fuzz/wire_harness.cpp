// The transfer-descriptor harness (fuzz_wire, replay target wire_replay,
// seeds in corpus_wire/): the bytes pkv_transfer_import accepts from a peer.
//
// On its first input it builds four exporter pools (f32 block 4, bf16 two
// layers block 16 XXH3, f16 block 1, fp8 per-head scales), writes random K/V
// for a sequence in each, and exports it with pkv_transfer_export (a UCX
// engine over TCP loopback, in this process); without UCX it encodes the same
// descriptors with TransferDescriptor::encode. Four importer pools have the
// same layouts, so an input that pairs seed i with importer j != i is a
// layout mismatch.
//
// An input: [seed] [importer] [flags] then mutations. Structural mutations
// act on a model of the descriptor (fields and length-prefixed arrays):
// set a field to an interesting value (0, 1, -1, 2^31, 2^32, 2^40, 2^63...),
// set an array's length prefix without changing its bytes, grow or shrink an
// array consistently (tokens vs blocks vs hashes counts), set one element.
// Raw mutations act on the encoded bytes: overwrite, truncate, insert, flip.
// Flag bit 0 recomputes the trailing XXH3 checksum afterwards (else the
// fuzzer mostly meets the checksum); bit 1 takes the bytes after the header
// as the whole descriptor (raw mode, for libFuzzer's own mutations).
//
// Oracles: TransferDescriptor::decode (the decoder pkv_transfer_import runs
// first) either throws kInvalidArgument or returns a descriptor whose
// re-encoding is exactly the input bytes and which holds every invariant the
// decoder claims (tokens, ceil(tokens / block_size) blocks each inside the
// arena, no more hashes than full blocks and each a digest of at most 32
// bytes, consistent geometry, non-empty blobs). check_importable accepts only
// the importer's exact layout, and the import (default options, no LoRA
// adapter) a descriptor with no adapter's lora_id. pkv_transfer_import then
// returns the same status as decode + these checks, and a refused import leaves the pool
// as it was (free blocks, sequences, validate). When UCX is here and the
// descriptor's exporter-side addresses (worker, rkey, arena base and extent:
// what it cannot check, pagedkv/transfer.h) are the live export's, the
// import runs to completion and the new sequence must hold the descriptor's
// tokens with the K/V of the exporter's blocks it names, byte for byte;
// freeing it returns the pool to where it was.
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "error.h"
#include "ops_harness.h"
#include "pagedkv/pagedkv.h"
#include "transfer/descriptor.h"

namespace pkv_fuzz {
namespace {

Counters g_counters;
struct WireCounters {
  uint64_t refused_decode = 0, refused_layout = 0, imports_started = 0, imports_done = 0,
           imports_failed = 0, bytes_compared = 0, checksum_fixed = 0;
} g_wire;

[[noreturn]] void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "fuzz_wire: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::abort();
}

void ok(pkv_status s, const char* what) {
  if (s != PKV_OK) die("%s: %s %s", what, pkv_status_string(s), pkv_last_error_message());
}

struct Layout {
  uint32_t layers, heads, dim, block, dtype, hash;
  bool fp8_per_head;
  uint32_t tokens;  // the exported sequence's length
};
const Layout kLayouts[] = {
    {1, 1, 8, 4, PKV_DTYPE_F32, PKV_HASH_SHA256_CBOR, false, 10},
    {2, 2, 16, 16, PKV_DTYPE_BF16, PKV_HASH_XXH3_128, false, 40},
    {1, 2, 8, 1, PKV_DTYPE_F16, PKV_HASH_SHA256_CBOR, false, 5},
    {2, 2, 8, 4, PKV_DTYPE_FP8_E4M3, PKV_HASH_SHA256_CBOR, true, 9},
};
constexpr int kNum = 4;
constexpr uint64_t kPoolBlocks = 48;

pkv_pool* make_pool(const Layout& l) {
  pkv_pool_options o;
  pkv_pool_options_init(&o);
  o.num_layers = l.layers;
  o.num_kv_heads = l.heads;
  o.head_dim = l.dim;
  o.block_size = l.block;
  o.dtype = l.dtype;
  o.hash_algo = l.hash;
  o.num_blocks = kPoolBlocks;
  o.num_threads = 1;
  if (l.fp8_per_head) o.kv_scale_granularity = PKV_KV_SCALE_PER_HEAD;
  pkv_pool* p = nullptr;
  ok(pkv_pool_create(&o, &p), "pkv_pool_create");
  if (l.dtype == PKV_DTYPE_FP8_E4M3) {
    const uint64_t n = l.fp8_per_head ? uint64_t(l.layers) * l.heads : l.layers;
    std::vector<float> k(n), v(n);
    for (uint64_t i = 0; i < n; ++i) k[i] = 0.25f * float(i + 1), v[i] = 0.5f * float(i + 1);
    ok(pkv_pool_set_kv_scales(p, k.data(), v.data(), n), "pkv_pool_set_kv_scales");
  }
  return p;
}

pkv_tensor tensor3(void* data, uint32_t dtype, int64_t a, int64_t b, int64_t c) {
  const int64_t shape[3] = {a, b, c};
  pkv_tensor t;
  ok(pkv_tensor_init(data, dtype, PKV_DEVICE_CPU, 0, 3, shape, &t), "pkv_tensor_init");
  return t;
}

// A sequence of l.tokens tokens whose K/V (random bytes, every layer) a
// committed step wrote.
pkv_seq_id prefill(pkv_pool* p, const Layout& l, std::mt19937_64& rng, std::vector<int32_t>& toks) {
  pkv_seq_id s = 0;
  ok(pkv_seq_create(p, nullptr, &s), "pkv_seq_create");
  toks.resize(l.tokens);
  for (auto& t : toks) t = int32_t(rng() % 50000);
  ok(pkv_seq_append(p, s, toks.data(), toks.size(), 0), "pkv_seq_append");
  const uint32_t q = l.tokens;
  pkv_batch* b = nullptr;
  ok(pkv_batch_prepare(p, &s, &q, 1, nullptr, &b), "pkv_batch_prepare");
  // FP8 pools take f32 K/V (quantized with the pool's scales); the others
  // their own dtype, here random finite values in [-2, 2).
  const uint32_t in = l.dtype == PKV_DTYPE_FP8_E4M3 ? PKV_DTYPE_F32 : l.dtype;
  const size_t n = size_t(q) * l.heads * l.dim;
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  auto values = [&] {
    std::vector<uint8_t> out(n * pkv_dtype_size(in));
    for (size_t i = 0; i < n; ++i) {
      const float f = u(rng);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      if (in == PKV_DTYPE_F32) {
        std::memcpy(&out[4 * i], &b, 4);
      } else {  // bf16: the top half; f16: 1.0 plus a small mantissa
        const uint16_t h =
            in == PKV_DTYPE_BF16 ? uint16_t(b >> 16) : uint16_t(0x3c00 | (b & 0x3ff));
        std::memcpy(&out[2 * i], &h, 2);
      }
    }
    return out;
  };
  for (uint32_t layer = 0; layer < l.layers; ++layer) {
    std::vector<uint8_t> k = values(), v = values();
    pkv_tensor tk = tensor3(k.data(), in, q, l.heads, l.dim);
    pkv_tensor tv = tensor3(v.data(), in, q, l.heads, l.dim);
    ok(pkv_cache_write(b, layer, &tk, &tv, nullptr), "pkv_cache_write");
  }
  pkv_batch_destroy(b);
  return s;
}

// Block b's bytes of every plane (layer by layer, K then V).
std::vector<uint8_t> block_bytes(pkv_pool* p, const Layout& l, int32_t b) {
  const size_t bb = size_t(l.heads) * l.block * l.dim * pkv_dtype_size(l.dtype);
  std::vector<uint8_t> out;
  for (uint32_t layer = 0; layer < l.layers; ++layer)
    for (uint32_t w = 0; w < 2; ++w) {
      pkv_tensor t;
      ok(pkv_pool_kv_tensor(p, layer, w, &t), "pkv_pool_kv_tensor");
      const uint8_t* base = static_cast<const uint8_t*>(t.data) + t.byte_offset;
      out.insert(out.end(), base + size_t(b) * bb, base + size_t(b + 1) * bb);
    }
  return out;
}

struct World {
  pkv_transfer_engine *exporter = nullptr, *importer = nullptr;
  pkv_pool* src[kNum] = {};
  pkv_pool* dst[kNum] = {};
  std::vector<uint8_t> desc[kNum];
  pagedkv::TransferDescriptor decoded[kNum];
};

pkv_transfer_engine* engine() {
  pkv_transfer_options o;
  pkv_transfer_options_init(&o);
  o.transports = "tcp";
  o.timeout_ms = 10000;
  pkv_transfer_engine* e = nullptr;
  if (pkv_transfer_engine_create(&o, &e) != PKV_OK) return nullptr;
  return e;
}

void print_totals() {
  std::fprintf(stderr,
               "pkv_fuzz wire totals: %llu inputs, %llu mutations, %llu checksums recomputed, "
               "%llu refused by decode, %llu refused by layout, %llu imports started, %llu done "
               "(%llu bytes compared), %llu failed\n",
               (unsigned long long)g_counters.inputs, (unsigned long long)g_counters.ops,
               (unsigned long long)g_wire.checksum_fixed, (unsigned long long)g_wire.refused_decode,
               (unsigned long long)g_wire.refused_layout,
               (unsigned long long)g_wire.imports_started, (unsigned long long)g_wire.imports_done,
               (unsigned long long)g_wire.bytes_compared,
               (unsigned long long)g_wire.imports_failed);
}

World& world() {
  static World* w = [] {
    World* w = new World;
    std::atexit(print_totals);
    std::mt19937_64 rng(12345);
    if (pkv_transfer_available()) {
      w->exporter = engine();
      w->importer = engine();
      if (!w->exporter || !w->importer)
        die("UCX is available but no tcp engine: %s", pkv_last_error_message());
    }
    for (int i = 0; i < kNum; ++i) {
      w->src[i] = make_pool(kLayouts[i]);
      w->dst[i] = make_pool(kLayouts[i]);
      std::vector<int32_t> toks;
      const pkv_seq_id s = prefill(w->src[i], kLayouts[i], rng, toks);
      if (w->exporter) {
        uint64_t id = 0, n = 0;
        ok(pkv_transfer_export(w->exporter, w->src[i], s, &id), "pkv_transfer_export");
        pkv_transfer_export_descriptor(w->exporter, id, nullptr, 0, &n);
        w->desc[i].resize(n);
        ok(pkv_transfer_export_descriptor(w->exporter, id, w->desc[i].data(), n, &n),
           "pkv_transfer_export_descriptor");
      } else {
        // No UCX: the same fields, encoded by the library's own encoder.
        pagedkv::TransferDescriptor d;
        const Layout& l = kLayouts[i];
        d.num_layers = l.layers, d.num_kv_heads = l.heads, d.block_size = l.block;
        d.head_dim = l.dim, d.dtype = l.dtype, d.hash_algo = l.hash;
        d.kv_scale_granularity = l.fp8_per_head ? PKV_KV_SCALE_PER_HEAD : 0;
        if (l.dtype == PKV_DTYPE_FP8_E4M3) {
          std::vector<float> k(64), v(64);
          uint64_t n = 0;
          ok(pkv_pool_get_kv_scales(w->src[i], k.data(), v.data(), 64, &n), "scales");
          d.k_scales.assign(k.begin(), k.begin() + n);
          d.v_scales.assign(v.begin(), v.begin() + n);
        }
        d.block_bytes = uint64_t(l.heads) * l.block * l.dim * pkv_dtype_size(l.dtype);
        d.arena_blocks = kPoolBlocks;
        d.plane_bytes = d.block_bytes * kPoolBlocks;
        d.remote_base = 0x7f0000000000ull;
        d.export_id = 1;
        std::vector<int32_t> table(64);
        uint64_t len = 0;
        ok(pkv_seq_get_block_table(w->src[i], s, table.data(), 64, &len), "block table");
        d.blocks.assign(table.begin(), table.begin() + len);
        d.tokens = toks;
        d.hashes.resize(l.tokens / l.block);
        for (auto& h : d.hashes) {
          h.size = l.hash == PKV_HASH_SHA256_CBOR ? 32 : 16;
          for (uint8_t j = 0; j < h.size; ++j) h.bytes[j] = uint8_t(rng());
        }
        d.worker_address = "not-a-worker";
        d.rkey = "not-an-rkey";
        w->desc[i] = d.encode();
      }
      w->decoded[i] = pagedkv::TransferDescriptor::decode(w->desc[i].data(), w->desc[i].size());
    }
    return w;
  }();
  return *w;
}

// The descriptor as fields and length-prefixed arrays, parsed here (not by
// the library's decoder) from a seed.
struct Model {
  uint32_t head[9];  // magic, version, layers, heads, block, dim, dtype, device, granularity
  uint64_t u64[6];   // remote_base, plane_bytes, block_bytes, arena_blocks, export_id, lora_id
  uint32_t hash_algo;
  std::vector<uint8_t> arr[7];  // k_scales, v_scales, tokens, blocks, hashes, worker, rkey
  uint64_t len[7];              // their length prefixes
};
constexpr size_t kElem[7] = {4, 4, 4, 4, 33, 1, 1};

Model parse(const std::vector<uint8_t>& b) {
  Model m;
  size_t at = 0;
  auto take = [&](void* out, size_t n) {
    std::memcpy(out, b.data() + at, n);
    at += n;
  };
  auto arr = [&](int i) {
    take(&m.len[i], 8);
    m.arr[i].assign(b.begin() + long(at), b.begin() + long(at + m.len[i]));
    at += m.len[i];
  };
  for (auto& h : m.head) take(&h, 4);
  arr(0);
  arr(1);
  for (auto& v : m.u64) take(&v, 8);
  take(&m.hash_algo, 4);
  for (int i = 2; i < 7; ++i) arr(i);
  return m;
}

std::vector<uint8_t> serialize(const Model& m) {
  std::vector<uint8_t> o;
  auto put = [&](const void* p, size_t n) {
    const uint8_t* c = static_cast<const uint8_t*>(p);
    o.insert(o.end(), c, c + n);
  };
  auto arr = [&](int i) {
    put(&m.len[i], 8);
    put(m.arr[i].data(), m.arr[i].size());
  };
  for (auto h : m.head) put(&h, 4);
  arr(0);
  arr(1);
  for (auto v : m.u64) put(&v, 8);
  put(&m.hash_algo, 4);
  for (int i = 2; i < 7; ++i) arr(i);
  return o;  // no checksum yet
}

const uint64_t kInteresting[] = {
    0,          1,          2,          3,     4,          15,         16,         17,
    0x7f,       0x80,       0xff,       0x100, 0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ull,
    1ull << 40, 1ull << 62, 1ull << 63, ~0ull, ~0ull - 7,  48,         47,         0x7ffffffffull};

class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool empty() const { return at_ >= n_; }
  uint8_t u8() { return at_ < n_ ? p_[at_++] : 0; }
  uint16_t u16() { return uint16_t(u8() | (u8() << 8)); }
  uint64_t value() {  // an interesting value, or a small one, or eight raw bytes
    const uint8_t k = u8();
    if (k < 160) return kInteresting[k % (sizeof kInteresting / sizeof *kInteresting)];
    if (k < 240) return u8();
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(u8()) << (8 * i);
    return v;
  }

 private:
  const uint8_t* p_;
  size_t n_, at_ = 0;
};

void structural(Model& m, Bytes& in) {
  const uint8_t op = in.u8() % 6;
  switch (op) {
    case 0: {  // a head field
      m.head[in.u8() % 9] = uint32_t(in.value());
      break;
    }
    case 1: {  // a u64 field or hash_algo
      const uint8_t f = in.u8() % 7;
      if (f == 6)
        m.hash_algo = uint32_t(in.value());
      else
        m.u64[f] = in.value();
      break;
    }
    case 2: {  // a length prefix alone
      m.len[in.u8() % 7] = in.value();
      break;
    }
    case 3: {  // grow or shrink an array consistently
      const int a = in.u8() % 7;
      const uint8_t k = in.u8();
      const size_t elems = m.arr[a].size() / kElem[a];
      if (k & 0x80) {
        const size_t drop = std::min<size_t>(elems, (k & 0x7f) % 64 + 1);
        m.arr[a].resize((elems - drop) * kElem[a]);
      } else {
        const size_t add = size_t(k) * (k < 64 ? 1 : 8);  // up to ~1000 elements
        const size_t from = m.arr[a].size();
        m.arr[a].resize(from + add * kElem[a]);
        for (size_t i = from; i < m.arr[a].size(); ++i)
          m.arr[a][i] = from >= kElem[a] ? m.arr[a][i % from] : uint8_t(i);
      }
      m.len[a] = m.arr[a].size();
      break;
    }
    case 4: {  // one element of an array
      const int a = in.u8() % 7;
      const size_t elems = m.arr[a].size() / kElem[a];
      const uint16_t i = in.u16();
      const uint64_t v = in.value();
      if (elems == 0) break;
      uint8_t* e = m.arr[a].data() + (i % elems) * kElem[a];
      std::memcpy(e, &v, std::min<size_t>(kElem[a], 8));  // a hash: its size byte first
      break;
    }
    case 5: {  // swap two elements of an array
      const int a = in.u8() % 7;
      const size_t elems = m.arr[a].size() / kElem[a];
      const uint16_t i = in.u16(), j = in.u16();
      if (elems < 2) break;
      std::swap_ranges(m.arr[a].begin() + long((i % elems) * kElem[a]),
                       m.arr[a].begin() + long((i % elems + 1) * kElem[a]),
                       m.arr[a].begin() + long((j % elems) * kElem[a]));
      break;
    }
  }
}

void raw(std::vector<uint8_t>& b, Bytes& in) {
  const uint8_t op = in.u8() % 5;
  const size_t at = b.empty() ? 0 : in.u16() % (b.size() + 1);
  switch (op) {
    case 0:
      if (at < b.size()) b[at] = in.u8();
      break;
    case 1:
      if (at < b.size()) b[at] ^= uint8_t(1u << (in.u8() % 8));
      break;
    case 2:
      b.resize(at);
      break;
    case 3: {
      const uint8_t n = in.u8() % 16 + 1;
      std::vector<uint8_t> ins(n);
      for (auto& x : ins) x = in.u8();
      b.insert(b.begin() + long(at), ins.begin(), ins.end());
      break;
    }
    case 4: {  // an 8-byte value at a byte offset (a length prefix, an address)
      const uint64_t v = in.value();
      if (at + 8 <= b.size()) std::memcpy(b.data() + at, &v, 8);
      break;
    }
  }
}

void fix_checksum(std::vector<uint8_t>& b) {
  if (b.size() < 16) return;
  const uint64_t sum = XXH3_64bits(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &sum, 8);
}

// The invariants decode() promises of what it accepts.
void check_accepted(const pagedkv::TransferDescriptor& d, const std::vector<uint8_t>& bytes) {
  if (d.encode() != bytes) die("decode accepted bytes its re-encoding differs from");
  if (d.tokens.empty() || d.block_size == 0 || d.num_layers == 0)
    die("accepted: no tokens, block_size 0 or num_layers 0");
  if (d.blocks.size() != (d.tokens.size() + d.block_size - 1) / d.block_size)
    die("accepted: %zu blocks for %zu tokens of block_size %u", d.blocks.size(), d.tokens.size(),
        d.block_size);
  if (d.hashes.size() > d.tokens.size() / d.block_size) die("accepted: more hashes than blocks");
  // A BlockHash holds at most 32 digest bytes, zero past its size (0 = none).
  for (const auto& h : d.hashes) {
    if (h.size > h.bytes.size())
      die("accepted: a block hash of %u bytes (a digest holds at most %zu)", unsigned(h.size),
          h.bytes.size());
    for (size_t i = h.size; i < h.bytes.size(); ++i)
      if (h.bytes[i])
        die("accepted: a block hash of %u bytes with nonzero bytes past them", unsigned(h.size));
  }
  if (d.block_bytes == 0 || d.arena_blocks == 0 || d.plane_bytes != d.block_bytes * d.arena_blocks)
    die("accepted: inconsistent arena geometry");
  for (int32_t b : d.blocks)
    if (b <= 0 || uint64_t(b) >= d.arena_blocks) die("accepted: block %d outside the arena", b);
  if (d.worker_address.empty() || d.rkey.empty()) die("accepted: empty worker address or rkey");
}

pkv_pool_stats stats(pkv_pool* p) {
  pkv_pool_stats s;
  pkv_pool_stats_init(&s);
  ok(pkv_pool_get_stats(p, &s), "pkv_pool_get_stats");
  return s;
}

void same_pool(pkv_pool* p, const pkv_pool_stats& before, const char* when) {
  const pkv_pool_stats now = stats(p);
  if (now.num_free_blocks != before.num_free_blocks || now.num_seqs != before.num_seqs)
    die("%s: free blocks %llu -> %llu, sequences %llu -> %llu", when,
        (unsigned long long)before.num_free_blocks, (unsigned long long)now.num_free_blocks,
        (unsigned long long)before.num_seqs, (unsigned long long)now.num_seqs);
  if (pkv_pool_validate(p) != PKV_OK) die("%s: validate: %s", when, pkv_last_error_message());
}

void run_import(World& w, int into, const std::vector<uint8_t>& bytes,
                const pagedkv::TransferDescriptor* d, pkv_status expect) {
  pkv_pool* dst = w.dst[into];
  const pkv_pool_stats before = stats(dst);
  pkv_transfer* t = nullptr;
  const pkv_status st =
      pkv_transfer_import(w.importer, dst, nullptr, bytes.data(), bytes.size(), &t);
  if (expect != PKV_OK) {
    if (st != expect)
      die("pkv_transfer_import: %s (%s), decode + check_importable said %s", pkv_status_string(st),
          pkv_last_error_message(), pkv_status_string(expect));
    if (t) die("a refused import returned a transfer");
    same_pool(dst, before, "refused import");
    return;
  }
  if (st == PKV_E_OUT_OF_BLOCKS) {  // the only refusal left: all or nothing
    if (uint64_t(d->blocks.size()) <= before.num_free_blocks) die("OUT_OF_BLOCKS with room");
    same_pool(dst, before, "import out of blocks");
    return;
  }
  if (st != PKV_OK || !t)
    die("pkv_transfer_import: %s (%s) on a descriptor decode accepted", pkv_status_string(st),
        pkv_last_error_message());
  ++g_wire.imports_started;
  uint32_t state = PKV_TRANSFER_RUNNING;
  pkv_seq_id seq = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  pkv_status ps = PKV_OK;
  while (state == PKV_TRANSFER_RUNNING && std::chrono::steady_clock::now() < end) {
    ok(pkv_transfer_engine_progress(w.exporter), "progress");
    ps = pkv_transfer_poll(t, &state, &seq);
  }
  if (state == PKV_TRANSFER_RUNNING) die("an import did not finish in 8 s");
  if (state != PKV_TRANSFER_DONE) {
    // Reads of blocks inside the exporter's registered arena cannot fail.
    die("an import of the live export's arena failed: %s %s", pkv_status_string(ps),
        pkv_last_error_message());
  }
  ++g_wire.imports_done;
  // As many tokens as the descriptor, all computed, and the K/V of the
  // exporter's blocks it names.
  const Layout& l = kLayouts[into];
  pkv_seq_info info;
  pkv_seq_info_init(&info);
  ok(pkv_seq_get_info(dst, seq, &info), "pkv_seq_get_info");
  if (info.num_tokens != d->tokens.size() || info.num_computed_tokens != d->tokens.size())
    die("imported sequence: %llu tokens, %llu computed; the descriptor holds %zu",
        (unsigned long long)info.num_tokens, (unsigned long long)info.num_computed_tokens,
        d->tokens.size());
  std::vector<int32_t> table(d->blocks.size() + 1);
  uint64_t n = 0;
  ok(pkv_seq_get_block_table(dst, seq, table.data(), table.size(), &n), "table");
  if (n != d->blocks.size()) die("imported table of %llu blocks", (unsigned long long)n);
  for (size_t j = 0; j < d->blocks.size(); ++j) {
    const auto got = block_bytes(dst, l, table[j]),
               want = block_bytes(w.src[into], l, d->blocks[j]);
    if (got != want)
      die("imported block %zu holds other bytes than exporter block %d", j, d->blocks[j]);
    g_wire.bytes_compared += got.size();
  }
  pkv_transfer_destroy(t);
  ok(pkv_seq_free(dst, seq), "pkv_seq_free");
  // Its full blocks stay cached (free, evictable): reset so the pool is as before.
  ok(pkv_pool_reset_prefix_cache(dst), "reset");
  same_pool(dst, before, "after the import's sequence was freed");
}

}  // namespace

void run_one(const uint8_t* data, size_t size) {
  World& w = world();
  ++g_counters.inputs;
  Bytes in(data, size);
  const int seed = in.u8() % kNum, into = in.u8() % kNum;
  const uint8_t flags = in.u8();
  std::vector<uint8_t> bytes;
  if (flags & 2) {  // raw: the rest is the descriptor
    bytes.assign(data + std::min<size_t>(size, 3), data + size);
  } else {
    Model m = parse(std::vector<uint8_t>(w.desc[seed].begin(), w.desc[seed].end() - 8));
    const uint8_t nstruct = in.u8() % 8, nraw = in.u8() % 4;
    for (int i = 0; i < nstruct && !in.empty(); ++i, ++g_counters.ops) structural(m, in);
    bytes = serialize(m);
    bytes.resize(bytes.size() + 8);
    fix_checksum(bytes);
    for (int i = 0; i < nraw && !in.empty(); ++i, ++g_counters.ops) raw(bytes, in);
  }
  if (flags & 1) {
    fix_checksum(bytes);
    ++g_wire.checksum_fixed;
  }

  pkv_status expect = PKV_OK;
  pagedkv::TransferDescriptor d;
  bool decoded = false;
  try {
    d = pagedkv::TransferDescriptor::decode(bytes.data(), bytes.size());
    decoded = true;
  } catch (const pagedkv::Error& e) {
    if (e.code() != pagedkv::Errc::kInvalidArgument) die("decode threw %s", e.what());
    if (std::strncmp(e.what(), "descriptor", 10) != 0) die("decode's message: %s", e.what());
    expect = PKV_E_INVALID_ARGUMENT;
    ++g_wire.refused_decode;
  }
  if (decoded) {
    check_accepted(d, bytes);
    // What pkv_transfer_import checks next (check_importable): the importer's
    // exact layout, by this harness's own comparison with its pool's export.
    const pagedkv::TransferDescriptor& mine = w.decoded[into];
    const bool fp8 = mine.dtype == PKV_DTYPE_FP8_E4M3;
    if (d.num_layers != mine.num_layers || d.num_kv_heads != mine.num_kv_heads ||
        d.block_size != mine.block_size || d.head_dim != mine.head_dim || d.dtype != mine.dtype ||
        d.block_bytes != mine.block_bytes ||
        (fp8 && (d.kv_scale_granularity != mine.kv_scale_granularity ||
                 d.k_scales != mine.k_scales || d.v_scales != mine.v_scales))) {
      expect = PKV_E_INVALID_ARGUMENT;
      ++g_wire.refused_layout;
    } else if (d.lora_id != 0) {
      // This harness imports with default options (no adapter): the K/V of
      // an adapter's sequence are refused, not cached as the base model's.
      expect = PKV_E_INVALID_ARGUMENT;
      ++g_wire.refused_layout;
    }
  }
  if (!w.importer) return;
  if (expect == PKV_OK) {
    // Only what the importer cannot check may not be fuzzed into a real
    // import: the exporter's addresses (transfer.h's trusted-peer caveat).
    const pagedkv::TransferDescriptor& live = w.decoded[into];
    if (d.worker_address != live.worker_address || d.rkey != live.rkey ||
        d.remote_base != live.remote_base || d.plane_bytes != live.plane_bytes ||
        d.arena_blocks != live.arena_blocks)
      return;
  }
  run_import(w, into, bytes, decoded ? &d : nullptr, expect);
}

const Counters& counters() { return g_counters; }

}  // namespace pkv_fuzz
