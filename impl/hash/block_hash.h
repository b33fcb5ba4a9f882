// Chained block hashes for prefix caching (DESIGN.md §3). One block's hash is
// H(canonical CBOR of [parent digest bytes, [token ids], extra keys | null]);
// the root parent is H(canonical CBOR of the seed string). With
// HashAlgo::kSha256Cbor this is byte-compatible with vLLM's sha256_cbor.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagedkv {

// Values equal PKV_HASH_*.
enum class HashAlgo : uint32_t { kSha256Cbor = 1, kXxh3_128 = 2 };

size_t hash_digest_size(HashAlgo algo);  // 32 or 16; 0 if unknown

struct BlockHash {
  std::array<uint8_t, 32> bytes{};  // digest, zero-padded past size
  uint8_t size = 0;                 // 0 = "no hash"

  bool empty() const { return size == 0; }
  bool operator==(const BlockHash& o) const { return size == o.size && bytes == o.bytes; }
  bool operator!=(const BlockHash& o) const { return !(*this == o); }
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const noexcept;  // digests are uniform: take 8 bytes
};

// One extra key: an unsigned integer (LoRA id), a text string (LoRA name,
// cache salt) or a multimodal item: the pair [content hash, item offset
// minus block start] (a CBOR array of a text string and a signed integer).
struct ExtraKey {
  enum class Kind : uint8_t { kUint, kText, kMm } kind;
  uint64_t uint_value = 0;
  std::string text;
  int64_t offset = 0;  // kMm: item offset relative to the block's first token
  // Tagged keys (HashContext::tagged): a non-empty tag makes the key the
  // array [tag, text, (text2 | offset)?]: ("lora", name, path), ("mm",
  // hash, offset), ("cache_salt", salt).
  std::string tag;
  std::string text2;
  bool has_text2 = false;

  static ExtraKey uint(uint64_t v) { return {Kind::kUint, v, {}, 0, {}, {}, false}; }
  static ExtraKey str(std::string s) { return {Kind::kText, 0, std::move(s), 0, {}, {}, false}; }
  static ExtraKey mm(std::string hash, int64_t rel) {
    return {Kind::kMm, 0, std::move(hash), rel, {}, {}, false};
  }
  static ExtraKey tagged(std::string tag, ExtraKey k) {
    k.tag = std::move(tag);
    return k;
  }
  static ExtraKey tagged_pair(std::string tag, std::string a, std::string b) {
    return {Kind::kText, 0, std::move(a), 0, std::move(tag), std::move(b), true};
  }
};

struct MmItem {
  uint64_t offset;
  uint64_t length;
  std::string hash;
};

// What a request contributes to its blocks' extra keys.
struct HashContext {
  HashAlgo algo = HashAlgo::kSha256Cbor;
  uint32_t block_size = 16;
  uint64_t lora_id = 0;          // 0 = none
  std::string lora_name;         // empty = none (vLLM keys adapters by name)
  std::string cache_salt;        // empty = none
  std::vector<MmItem> mm_items;  // sorted by offset
  // vLLM 0.33's tagged keys (pkv_pool_options.strict_key_domains = 2):
  // ("lora", lora_name, lora_path), ("mm", hash, offset - start),
  // ("cache_salt", salt), each a CBOR array; lora_id stays a bare integer.
  bool tagged = false;
  std::string lora_path;  // keyed with lora_name when tagged
};

BlockHash hash_root(HashAlgo algo, std::string_view seed);

// Extra keys of the block covering tokens [start, end): LoRA id and LoRA
// name (each if set), [hash, offset - start] of every mm item overlapping the
// block, the salt if start == 0.
std::vector<ExtraKey> block_extra_keys(const HashContext& ctx, uint64_t start, uint64_t end);

BlockHash hash_block(HashAlgo algo, const BlockHash& parent, const int32_t* tokens, size_t n,
                     const std::vector<ExtraKey>& extra);

// Reusable hasher for the hot path (keeps its digest context and CBOR buffer).
class BlockHasher {
 public:
  explicit BlockHasher(HashAlgo algo);
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;

  BlockHash hash(const BlockHash& parent, const int32_t* tokens, size_t n,
                 const std::vector<ExtraKey>& extra);

  // Same as hash(parent, tokens, n, block_extra_keys(ctx, start, start + n))
  // without building the key vector (no allocation in steady state).
  // ctx.algo and ctx.block_size are not consulted: this hasher's algo rules.
  BlockHash hash(const BlockHash& parent, const int32_t* tokens, size_t n, const HashContext& ctx,
                 uint64_t start);

  HashAlgo algo() const { return algo_; }

 private:
  struct State;
  HashAlgo algo_;
  State* state_;
};

// Hashes of the full blocks of tokens[0, n), chained from root.
std::vector<BlockHash> hash_prefix(const HashContext& ctx, const BlockHash& root,
                                   const int32_t* tokens, size_t n);

// The digest alone of bytes already encoded: the primitive every block hash
// ends in (bench_hash's ceiling). SHA-256 leaves hash.bytes[32] unused.
BlockHash digest_bytes(HashAlgo algo, const uint8_t* data, size_t len);

// The exact bytes that are hashed (for tests and debugging): canonical CBOR
// of [parent bytes, [tokens], extra | null], and of the seed string.
std::vector<uint8_t> encode_block_cbor(const BlockHash& parent, const int32_t* tokens, size_t n,
                                       const std::vector<ExtraKey>& extra);
std::vector<uint8_t> encode_seed_cbor(std::string_view seed);

}  // namespace pagedkv
