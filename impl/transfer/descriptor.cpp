#include "transfer/descriptor.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "error.h"

namespace pagedkv {
namespace {

class Writer {
 public:
  template <class T>
  void put(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, &v, sizeof v);  // x86-64 and aarch64: little-endian
  }
  void bytes(const void* p, size_t n) {
    put<uint64_t>(n);
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  Reader(const uint8_t* p, uint64_t n) : p_(p), n_(n) {}
  template <class T>
  T get(const char* what) {
    T v;
    need(sizeof v, what);
    std::memcpy(&v, p_ + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  // A length-prefixed array of count elements of elem bytes, at most max.
  const uint8_t* array(size_t elem, uint64_t max, uint64_t* count, const char* what) {
    const uint64_t n = get<uint64_t>(what);
    if (n % elem != 0 || n / elem > max)
      fail(Errc::kInvalidArgument, std::string("descriptor: ") + what + " has a bad length (" +
                                       std::to_string(n) + " bytes)");
    need(n, what);
    const uint8_t* r = p_ + at_;
    at_ += n;
    *count = n / elem;
    return r;
  }
  bool done() const { return at_ == n_; }

 private:
  void need(uint64_t k, const char* what) {
    if (k > n_ - at_) fail(Errc::kInvalidArgument, std::string("descriptor: truncated at ") + what);
  }
  const uint8_t* p_;
  uint64_t n_, at_ = 0;
};

// A length-prefixed array of trivially copyable T, at most max elements.
template <class T>
std::vector<T> read_vec(Reader& r, uint64_t max, const char* what) {
  uint64_t n;
  const uint8_t* p = r.array(sizeof(T), max, &n, what);
  std::vector<T> v(n);
  if (n) std::memcpy(v.data(), p, n * sizeof(T));
  return v;
}

constexpr uint64_t kMaxTokens = uint64_t(INT32_MAX), kMaxBlob = 1u << 20, kMaxScales = 1u << 20;

}  // namespace

std::vector<uint8_t> TransferDescriptor::encode() const {
  Writer w;
  w.put(kMagic);
  w.put(kVersion);
  for (uint32_t v : {num_layers, num_kv_heads, block_size, head_dim, dtype}) w.put(v);
  w.put(device_type);
  w.put(kv_scale_granularity);
  w.bytes(k_scales.data(), k_scales.size() * sizeof(float));
  w.bytes(v_scales.data(), v_scales.size() * sizeof(float));
  for (uint64_t v : {remote_base, plane_bytes, block_bytes, arena_blocks, export_id, lora_id})
    w.put(v);
  w.put(hash_algo);
  w.bytes(tokens.data(), tokens.size() * sizeof(int32_t));
  w.bytes(blocks.data(), blocks.size() * sizeof(int32_t));
  std::vector<uint8_t> hs;
  for (const BlockHash& h : hashes) {
    hs.push_back(h.size);
    hs.insert(hs.end(), h.bytes.begin(), h.bytes.end());
  }
  w.bytes(hs.data(), hs.size());
  w.bytes(worker_address.data(), worker_address.size());
  w.bytes(rkey.data(), rkey.size());
  w.put<uint64_t>(XXH3_64bits(w.out.data(), w.out.size()));  // version 2: the checksum
  return std::move(w.out);
}

TransferDescriptor TransferDescriptor::decode(const uint8_t* data, uint64_t size) {
  if (!data) fail(Errc::kInvalidArgument, "descriptor is NULL");
  {
    Reader head(data, size);
    if (head.get<uint32_t>("magic") != kMagic)
      fail(Errc::kInvalidArgument, "descriptor: not a pagedkv transfer descriptor (bad magic)");
    const uint32_t version = head.get<uint32_t>("version");
    if (version != kVersion)
      fail(Errc::kInvalidArgument, "descriptor: version " + std::to_string(version) +
                                       " is not supported (this library reads version " +
                                       std::to_string(kVersion) + ")");
  }
  // The checksum of every byte before it, verified before any field is
  // used: the addresses in a descriptor (remote_base, the arena's extent)
  // cannot be checked against the exporter's memory, and a read at a
  // corrupted one over a shared-memory transport is a wild read in this
  // process. A descriptor cut or changed in transit is refused here.
  uint64_t sum = 0;
  if (size < 16) fail(Errc::kInvalidArgument, "descriptor: truncated at checksum");
  std::memcpy(&sum, data + size - sizeof sum, sizeof sum);
  if (XXH3_64bits(data, size - sizeof sum) != sum)
    fail(Errc::kInvalidArgument,
         "descriptor: checksum mismatch (cut or corrupted in transit: its bytes are not those "
         "pkv_transfer_export_descriptor gave)");
  Reader r(data, size - sizeof sum);
  r.get<uint32_t>("magic");
  r.get<uint32_t>("version");
  TransferDescriptor d;
  d.num_layers = r.get<uint32_t>("num_layers");
  d.num_kv_heads = r.get<uint32_t>("num_kv_heads");
  d.block_size = r.get<uint32_t>("block_size");
  d.head_dim = r.get<uint32_t>("head_dim");
  d.dtype = r.get<uint32_t>("dtype");
  d.device_type = r.get<int32_t>("device_type");
  d.kv_scale_granularity = r.get<uint32_t>("kv_scale_granularity");
  d.k_scales = read_vec<float>(r, kMaxScales, "k_scales");
  d.v_scales = read_vec<float>(r, kMaxScales, "v_scales");
  d.remote_base = r.get<uint64_t>("remote_base");
  d.plane_bytes = r.get<uint64_t>("plane_bytes");
  d.block_bytes = r.get<uint64_t>("block_bytes");
  d.arena_blocks = r.get<uint64_t>("arena_blocks");
  d.export_id = r.get<uint64_t>("export_id");
  d.lora_id = r.get<uint64_t>("lora_id");
  d.hash_algo = r.get<uint32_t>("hash_algo");
  d.tokens = read_vec<int32_t>(r, kMaxTokens, "tokens");
  d.blocks = read_vec<int32_t>(r, kMaxTokens, "blocks");
  constexpr size_t kHash = 1 + sizeof(BlockHash{}.bytes);
  uint64_t n;
  const uint8_t* p = r.array(kHash, kMaxTokens, &n, "hashes");
  d.hashes.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    d.hashes[i].size = p[i * kHash];
    std::memcpy(d.hashes[i].bytes.data(), p + i * kHash + 1, kHash - 1);
    // A digest of at most 32 bytes, zero past its size (BlockHash's form).
    const BlockHash& h = d.hashes[i];
    if (h.size > h.bytes.size() ||
        std::any_of(h.bytes.begin() + h.size, h.bytes.end(), [](uint8_t b) { return b != 0; }))
      fail(Errc::kInvalidArgument, "descriptor: hashes[" + std::to_string(i) + "] is not a digest (" +
                                       std::to_string(h.size) + " bytes)");
  }
  p = r.array(1, kMaxBlob, &n, "worker_address");
  d.worker_address.assign(reinterpret_cast<const char*>(p), n);
  p = r.array(1, kMaxBlob, &n, "rkey");
  d.rkey.assign(reinterpret_cast<const char*>(p), n);
  if (!r.done()) fail(Errc::kInvalidArgument, "descriptor: trailing bytes after the rkey");

  // Internal consistency: every remote read stays inside the exported arena.
  const auto bad = [](const std::string& m) { fail(Errc::kInvalidArgument, "descriptor: " + m); };
  if (d.tokens.empty()) bad("holds no tokens");
  if (d.block_size == 0 || d.num_layers == 0) bad("block_size or num_layers is 0");
  if (d.blocks.size() != (d.tokens.size() + d.block_size - 1) / d.block_size)
    bad(std::to_string(d.blocks.size()) + " blocks do not hold " + std::to_string(d.tokens.size()) +
        " tokens of block_size " + std::to_string(d.block_size));
  if (d.hashes.size() > d.tokens.size() / d.block_size) bad("more hashes than full blocks");
  if (d.block_bytes == 0 || d.arena_blocks == 0 || d.arena_blocks > uint64_t(INT32_MAX) ||
      d.plane_bytes / d.arena_blocks != d.block_bytes || d.plane_bytes % d.arena_blocks != 0)
    bad("arena geometry (plane_bytes, block_bytes, arena_blocks) is inconsistent");
  for (size_t i = 0; i < d.blocks.size(); ++i)
    if (d.blocks[i] <= 0 || uint64_t(d.blocks[i]) >= d.arena_blocks)
      bad("blocks[" + std::to_string(i) + "] = " + std::to_string(d.blocks[i]) +
          " is not a block of the exporter's arena");
  if (d.worker_address.empty() || d.rkey.empty()) bad("worker_address or rkey is empty");
  return d;
}

}  // namespace pagedkv
