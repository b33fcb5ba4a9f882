// Block hashes: canonical CBOR of the block triple, then SHA-256 (OpenSSL) or
// XXH3-128 (libxxhash).
//
// Extra keys follow vLLM's generate_block_hash_extra_keys
// (vllm/v1/core/kv_cache_utils.py, main as of 2025-11; docs/vllm-compat.md):
// the tuple is lora_keys + mm_keys + cache_salt_keys (+ prompt_embeds_keys,
// which we do not support), the salt only when start_token_idx == 0 and the
// salt is non-empty, and None (CBOR null) when the list is empty; the triple
// hashed is (parent_block_hash bytes, tuple(token_ids), extra_keys) and the
// root is hash_fn(PYTHONHASHSEED string). An mm item is keyed in a block when
// the half-open ranges [offset, offset + length) and [start, end) overlap
// (upstream: `end > offset` and not `start >= offset + length`), as the pair
// (identifier, offset - start). The LoRA key is lora_name upstream now
// (lora_int_id before); we key whichever the caller sets, id first.
// vLLM 0.33.0 tags each key (HashContext::tagged): ("lora", lora_name,
// lora_path), ("mm", identifier, offset - start), ("cache_salt", salt).
#include "hash/block_hash.h"

// OpenSSL 3 deprecates its one-algorithm SHA256_* calls for EVP, whose
// provider dispatch costs more than the compression itself for a block's
// ~100 bytes (Zen 3 with SHA-NI: EVP init/update/final 170 ns, SHA256_*
// 115 ns; 64 block hashes in a 1024-sequence decode step). Every 3.x still
// has them; where a build of OpenSSL leaves them out, EVP does the work.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/evp.h>
#include <openssl/opensslv.h>
#include <openssl/sha.h>
#include <xxhash.h>
#if !defined(OPENSSL_NO_DEPRECATED_3_0) && \
    (!defined(OPENSSL_VERSION_MAJOR) || OPENSSL_VERSION_MAJOR < 4)
#define PKV_SHA256_DIRECT 1
#endif

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "error.h"
#include "hash/cbor_tokens.h"
#include "hash/cbor_writer.h"

namespace pagedkv {
namespace {

// Fetched once: explicit fetching avoids OpenSSL 3's per-init implicit
// lookup, and an EVP_MD is immutable and safe to share across threads.
const EVP_MD* sha256_md() {
  static const EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  if (md == nullptr) fail(Errc::kInternal, "OpenSSL: SHA256 is not available");
  return md;
}

void check_algo(HashAlgo algo) {
  if (hash_digest_size(algo) == 0)
    fail(Errc::kInvalidArgument,
         "algo: unknown hash algorithm " + std::to_string(static_cast<uint32_t>(algo)));
}

uint64_t item_end(const MmItem& m) {
  return m.length > std::numeric_limits<uint64_t>::max() - m.offset
             ? std::numeric_limits<uint64_t>::max()
             : m.offset + m.length;
}

// The mm items overlapping [start, end) are a contiguous run of a sorted,
// non-overlapping list: [*first, *last). Unsorted input gives some subset,
// never out-of-range access.
void mm_range(const std::vector<MmItem>& items, uint64_t start, uint64_t end, size_t* first,
              size_t* last) {
  size_t i = std::partition_point(items.begin(), items.end(),
                                  [start](const MmItem& m) { return item_end(m) <= start; }) -
             items.begin();
  *first = i;
  while (i < items.size() && items[i].offset < end) ++i;
  *last = i;
}

bool mm_overlaps(const MmItem& m, uint64_t start, uint64_t end) {
  return m.length > 0 && m.offset < end && item_end(m) > start;
}

size_t bound_head_and_tokens(const BlockHash& parent, size_t n) {
  if (parent.size > sizeof(parent.bytes))
    fail(Errc::kInvalidArgument,
         "parent: hash size " + std::to_string(parent.size) + " exceeds 32");
  return 1 + cbor::kMaxHeadSize + sizeof(parent.bytes) + cbor::kMaxHeadSize +
         n * cbor::kMaxInt32Size + cbor::kInt32sSlack;
}

// Writes "[parent bytes, [tokens]," i.e. everything up to the extra keys.
uint8_t* put_head_and_tokens(uint8_t* p, const BlockHash& parent, const int32_t* tokens, size_t n) {
  *p++ = cbor::kMajorArray | 3;
  // The parent is at most 32 bytes: a fixed-size copy beats memcpy(size).
  p = cbor::put_head(p, cbor::kMajorBytes, parent.size);
  std::memcpy(p, parent.bytes.data(), parent.bytes.size());
  p += parent.size;
  p = cbor::put_head(p, cbor::kMajorArray, n);
  return cbor::put_tokens(p, tokens, n);
}

// An mm key: [hash, offset - start] with the difference as a CBOR signed
// integer (negative when the item began in an earlier block).
constexpr size_t kMmKeyOverhead = 1 + 2 * cbor::kMaxHeadSize;

// The tags of vLLM 0.33's keys, and the bytes a tag adds at most: its text
// and one more array element head.
constexpr std::string_view kTagLora = "lora", kTagMm = "mm", kTagSalt = "cache_salt";
constexpr size_t kTagOverhead = 2 + kTagSalt.size();

uint8_t* put_text(uint8_t* p, std::string_view s) {
  return cbor::put_string(p, cbor::kMajorText, s.data(), s.size());
}

// [hash, offset - start], or ["mm", hash, offset - start] when tagged.
uint8_t* put_mm_key(uint8_t* p, const std::string& hash, uint64_t offset, uint64_t start,
                    bool tagged = false) {
  if (tagged) {
    *p++ = cbor::kMajorArray | 3;
    p = put_text(p, kTagMm);
  } else {
    *p++ = cbor::kMajorArray | 2;
  }
  p = cbor::put_string(p, cbor::kMajorText, hash.data(), hash.size());
  return offset >= start ? cbor::put_head(p, cbor::kMajorUint, offset - start)
                         : cbor::put_head(p, cbor::kMajorNegInt, start - offset - 1);
}

size_t bound_extra(const std::vector<ExtraKey>& extra) {
  size_t b = cbor::kMaxHeadSize;
  for (const ExtraKey& k : extra)
    b += kMmKeyOverhead + kTagOverhead + k.tag.size() + k.text2.size() +
         (k.kind != ExtraKey::Kind::kUint ? k.text.size() : 0);
  return b;
}

uint8_t* put_extra(uint8_t* p, const std::vector<ExtraKey>& extra) {
  if (extra.empty()) {
    *p++ = cbor::kNull;
    return p;
  }
  p = cbor::put_head(p, cbor::kMajorArray, extra.size());
  for (const ExtraKey& k : extra) {
    if (!k.tag.empty() && k.kind != ExtraKey::Kind::kMm) {
      p = cbor::put_head(p, cbor::kMajorArray, k.has_text2 ? 3 : 2);
      p = put_text(p, k.tag);
    }
    if (k.kind == ExtraKey::Kind::kUint) {
      p = cbor::put_head(p, cbor::kMajorUint, k.uint_value);
    } else if (k.kind == ExtraKey::Kind::kText) {
      p = cbor::put_string(p, cbor::kMajorText, k.text.data(), k.text.size());
      if (k.has_text2) p = put_text(p, k.text2);
    } else {  // an mm key, tagged "mm" or bare
      // offset - start as unsigned operands: 0 - |rel| for a negative rel.
      const uint64_t start = k.offset < 0 ? uint64_t(0) - uint64_t(k.offset) : 0;
      const uint64_t offset = k.offset < 0 ? 0 : uint64_t(k.offset);
      p = put_mm_key(p, k.text, offset, start, !k.tag.empty());
    }
  }
  return p;
}

bool salt_applies(const HashContext& ctx, uint64_t start) {
  return start == 0 && !ctx.cache_salt.empty();
}

size_t bound_extra(const HashContext& ctx, uint64_t start, size_t mm_first, size_t mm_last) {
  size_t b = cbor::kMaxHeadSize;
  if (ctx.lora_id != 0) b += cbor::kMaxHeadSize;
  const size_t tag = ctx.tagged ? kTagOverhead + cbor::kMaxHeadSize : 0;
  if (!ctx.lora_name.empty())
    b +=
        cbor::kMaxHeadSize + ctx.lora_name.size() + tag + cbor::kMaxHeadSize + ctx.lora_path.size();
  for (size_t i = mm_first; i < mm_last; ++i)
    b += kMmKeyOverhead + tag + ctx.mm_items[i].hash.size();
  if (salt_applies(ctx, start)) b += cbor::kMaxHeadSize + tag + ctx.cache_salt.size();
  return b;
}

uint8_t* put_extra(uint8_t* p, const HashContext& ctx, uint64_t start, uint64_t end,
                   size_t mm_first, size_t mm_last) {
  size_t count = (ctx.lora_id != 0) + !ctx.lora_name.empty() + salt_applies(ctx, start);
  for (size_t i = mm_first; i < mm_last; ++i) count += mm_overlaps(ctx.mm_items[i], start, end);
  if (count == 0) {
    *p++ = cbor::kNull;
    return p;
  }
  p = cbor::put_head(p, cbor::kMajorArray, count);
  if (ctx.lora_id != 0) p = cbor::put_head(p, cbor::kMajorUint, ctx.lora_id);
  if (!ctx.lora_name.empty()) {
    if (ctx.tagged) {
      *p++ = cbor::kMajorArray | 3;
      p = put_text(p, kTagLora);
    }
    p = put_text(p, ctx.lora_name);
    if (ctx.tagged) p = put_text(p, ctx.lora_path);
  }
  for (size_t i = mm_first; i < mm_last; ++i) {
    const MmItem& m = ctx.mm_items[i];
    if (mm_overlaps(m, start, end)) p = put_mm_key(p, m.hash, m.offset, start, ctx.tagged);
  }
  if (salt_applies(ctx, start)) {
    if (ctx.tagged) {
      *p++ = cbor::kMajorArray | 2;
      p = put_text(p, kTagSalt);
    }
    p = put_text(p, ctx.cache_salt);
  }
  return p;
}

void digest_into(HashAlgo algo, EVP_MD_CTX* md_ctx, const uint8_t* data, size_t len,
                 BlockHash* out) {
  if (algo == HashAlgo::kXxh3_128) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, len));
    std::memcpy(out->bytes.data(), c.digest, 16);
    std::memset(out->bytes.data() + 16, 0, 16);
    out->size = 16;
    return;
  }
#if defined(PKV_SHA256_DIRECT)
  (void)md_ctx;
  SHA256_CTX c;
  if (SHA256_Init(&c) != 1 || SHA256_Update(&c, data, len) != 1 ||
      SHA256_Final(out->bytes.data(), &c) != 1)
    fail(Errc::kInternal, "OpenSSL: SHA-256 digest failed");
  out->size = 32;
  return;
#endif
  unsigned int md_len = 0;
  if (EVP_DigestInit_ex2(md_ctx, nullptr, nullptr) != 1 ||
      EVP_DigestUpdate(md_ctx, data, len) != 1 ||
      EVP_DigestFinal_ex(md_ctx, out->bytes.data(), &md_len) != 1 || md_len != 32)
    fail(Errc::kInternal, "OpenSSL: SHA-256 digest failed");
  out->size = 32;
}

}  // namespace

BlockHash digest_bytes(HashAlgo algo, const uint8_t* data, size_t len) {
  check_algo(algo);
  BlockHash out;
#if !defined(PKV_SHA256_DIRECT)
  if (algo == HashAlgo::kSha256Cbor) {  // digest_into's EVP path needs a context
    unsigned int md_len = 0;
    if (EVP_Digest(data, len, out.bytes.data(), &md_len, sha256_md(), nullptr) != 1 || md_len != 32)
      fail(Errc::kInternal, "OpenSSL: SHA-256 digest failed");
    out.size = 32;
    return out;
  }
#endif
  digest_into(algo, nullptr, data, len, &out);
  return out;
}

size_t hash_digest_size(HashAlgo algo) {
  switch (algo) {
    case HashAlgo::kSha256Cbor:
      return 32;
    case HashAlgo::kXxh3_128:
      return 16;
  }
  return 0;
}

size_t BlockHashHasher::operator()(const BlockHash& h) const noexcept {
  uint64_t v;
  std::memcpy(&v, h.bytes.data(), sizeof v);
  return static_cast<size_t>(v);
}

struct BlockHasher::State {
  EVP_MD_CTX* md_ctx = nullptr;
  std::vector<uint8_t> buf;

  uint8_t* reserve(size_t n) {
    if (buf.size() < n) buf.resize(std::max(n, buf.size() * 2));
    return buf.data();
  }
  ~State() { EVP_MD_CTX_free(md_ctx); }
};

BlockHasher::BlockHasher(HashAlgo algo) : algo_(algo), state_(nullptr) {
  check_algo(algo);
  std::unique_ptr<State> s(new State());  // freed if what follows throws
#if !defined(PKV_SHA256_DIRECT)           // else digest_into needs no EVP context
  if (algo == HashAlgo::kSha256Cbor) {
    s->md_ctx = EVP_MD_CTX_new();
    // The first init binds the digest; later inits (md == nullptr) reuse the
    // provider context instead of fetching and allocating again.
    if (s->md_ctx == nullptr || EVP_DigestInit_ex2(s->md_ctx, sha256_md(), nullptr) != 1)
      fail(Errc::kInternal, "OpenSSL: cannot create a SHA-256 context");
  }
#endif
  s->reserve(1024);
  state_ = s.release();
}

BlockHasher::~BlockHasher() { delete state_; }

BlockHash BlockHasher::hash(const BlockHash& parent, const int32_t* tokens, size_t n,
                            const std::vector<ExtraKey>& extra) {
  uint8_t* const base = state_->reserve(bound_head_and_tokens(parent, n) + bound_extra(extra));
  uint8_t* p = put_head_and_tokens(base, parent, tokens, n);
  p = put_extra(p, extra);
  BlockHash out;
  digest_into(algo_, state_->md_ctx, base, static_cast<size_t>(p - base), &out);
  return out;
}

BlockHash BlockHasher::hash(const BlockHash& parent, const int32_t* tokens, size_t n,
                            const HashContext& ctx, uint64_t start) {
  const uint64_t end = start + n;
  size_t mm_first = 0, mm_last = 0;
  if (!ctx.mm_items.empty()) mm_range(ctx.mm_items, start, end, &mm_first, &mm_last);
  uint8_t* const base = state_->reserve(bound_head_and_tokens(parent, n) +
                                        bound_extra(ctx, start, mm_first, mm_last));
  uint8_t* p = put_head_and_tokens(base, parent, tokens, n);
  p = put_extra(p, ctx, start, end, mm_first, mm_last);
  BlockHash out;
  digest_into(algo_, state_->md_ctx, base, static_cast<size_t>(p - base), &out);
  return out;
}

BlockHash hash_block(HashAlgo algo, const BlockHash& parent, const int32_t* tokens, size_t n,
                     const std::vector<ExtraKey>& extra) {
  BlockHasher hasher(algo);
  return hasher.hash(parent, tokens, n, extra);
}

std::vector<uint8_t> encode_block_cbor(const BlockHash& parent, const int32_t* tokens, size_t n,
                                       const std::vector<ExtraKey>& extra) {
  std::vector<uint8_t> out(bound_head_and_tokens(parent, n) + bound_extra(extra));
  uint8_t* p = put_head_and_tokens(out.data(), parent, tokens, n);
  p = put_extra(p, extra);
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

std::vector<uint8_t> encode_seed_cbor(std::string_view seed) {
  std::vector<uint8_t> out(cbor::kMaxHeadSize + seed.size());
  uint8_t* p = cbor::put_string(out.data(), cbor::kMajorText, seed.data(), seed.size());
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

BlockHash hash_root(HashAlgo algo, std::string_view seed) {
  check_algo(algo);
  const std::vector<uint8_t> bytes = encode_seed_cbor(seed);
  BlockHash out;
  if (algo == HashAlgo::kXxh3_128) {
    digest_into(algo, nullptr, bytes.data(), bytes.size(), &out);
    return out;
  }
  EVP_MD_CTX* md_ctx = EVP_MD_CTX_new();
  if (md_ctx == nullptr || EVP_DigestInit_ex2(md_ctx, sha256_md(), nullptr) != 1) {
    EVP_MD_CTX_free(md_ctx);
    fail(Errc::kInternal, "OpenSSL: cannot create a SHA-256 context");
  }
  try {
    digest_into(algo, md_ctx, bytes.data(), bytes.size(), &out);
  } catch (...) {
    EVP_MD_CTX_free(md_ctx);
    throw;
  }
  EVP_MD_CTX_free(md_ctx);
  return out;
}

std::vector<ExtraKey> block_extra_keys(const HashContext& ctx, uint64_t start, uint64_t end) {
  std::vector<ExtraKey> keys;
  if (ctx.lora_id != 0) keys.push_back(ExtraKey::uint(ctx.lora_id));
  if (!ctx.lora_name.empty()) {
    keys.push_back(ctx.tagged
                       ? ExtraKey::tagged_pair(std::string(kTagLora), ctx.lora_name, ctx.lora_path)
                       : ExtraKey::str(ctx.lora_name));
  }
  if (!ctx.mm_items.empty()) {
    size_t first = 0, last = 0;
    mm_range(ctx.mm_items, start, end, &first, &last);
    for (size_t i = first; i < last; ++i) {
      const MmItem& m = ctx.mm_items[i];
      if (!mm_overlaps(m, start, end)) continue;
      ExtraKey k = ExtraKey::mm(
          m.hash, m.offset >= start ? int64_t(m.offset - start) : -int64_t(start - m.offset));
      keys.push_back(ctx.tagged ? ExtraKey::tagged(std::string(kTagMm), std::move(k))
                                : std::move(k));
    }
  }
  if (salt_applies(ctx, start)) {
    ExtraKey k = ExtraKey::str(ctx.cache_salt);
    keys.push_back(ctx.tagged ? ExtraKey::tagged(std::string(kTagSalt), std::move(k))
                              : std::move(k));
  }
  return keys;
}

std::vector<BlockHash> hash_prefix(const HashContext& ctx, const BlockHash& root,
                                   const int32_t* tokens, size_t n) {
  check_algo(ctx.algo);
  if (ctx.block_size == 0) fail(Errc::kInvalidArgument, "block_size: must be positive");
  if (tokens == nullptr && n != 0) fail(Errc::kInvalidArgument, "tokens: NULL with num_tokens > 0");
  if (root.size != hash_digest_size(ctx.algo))
    fail(Errc::kInvalidArgument, "root: digest size does not match the hash algorithm");

  const size_t bs = ctx.block_size;
  const size_t num_blocks = n / bs;
  std::vector<BlockHash> out(num_blocks);
  if (num_blocks == 0) return out;

  BlockHasher hasher(ctx.algo);
  const bool plain =
      ctx.lora_id == 0 && ctx.lora_name.empty() && ctx.cache_salt.empty() && ctx.mm_items.empty();
  static const std::vector<ExtraKey> kNoExtra;
  const BlockHash* parent = &root;
  for (size_t b = 0; b < num_blocks; ++b) {
    const int32_t* block = tokens + b * bs;
    out[b] = plain ? hasher.hash(*parent, block, bs, kNoExtra)
                   : hasher.hash(*parent, block, bs, ctx, static_cast<uint64_t>(b) * bs);
    parent = &out[b];
  }
  return out;
}

}  // namespace pagedkv
