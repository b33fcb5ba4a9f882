/* pagedkv/hash.h: block hashes for prefix caching, usable without a pool.
 *
 * Hashes chain: h_i = H(cbor([h_{i-1} bytes, [tokens of block i], extra])),
 * where extra is null or the array
 *   [lora_id?, lora_name?, [mm hash, mm offset - block start]..., cache_salt?]
 * (LoRA id / name on every block when set, one pair per multimodal item the
 * block overlaps, the cache salt on the first block only), and
 * h_{-1} = H(cbor(seed string)). CBOR is canonical (RFC 8949 core
 * deterministic). With PKV_HASH_SHA256_CBOR the bytes equal vLLM's
 * sha256_cbor for the same seed (vLLM's PYTHONHASHSEED) and the same
 * request: current vLLM keys a LoRA adapter by name (set lora_name, leave
 * lora_id 0); older vLLM keyed it by id. docs/vllm-compat.md says which
 * vLLM behaviour is followed and where it differs. Only full blocks are
 * hashed.
 */
#ifndef PAGEDKV_HASH_H
#define PAGEDKV_HASH_H

#include "pagedkv/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PKV_HASH_SHA256_CBOR 1 /* 32-byte digests; collision resistant (default) */
#define PKV_HASH_XXH3_128 2    /* 16-byte digests; fast, for trusted tenants */

/* Every hash is stored in PKV_HASH_MAX_BYTES bytes; shorter digests are
 * zero-padded. pkv_hash_size() gives the meaningful length. */
#define PKV_HASH_MAX_BYTES 32

typedef struct pkv_block_hash {
  uint8_t bytes[PKV_HASH_MAX_BYTES];
} pkv_block_hash;

/* Digest length of a PKV_HASH_* algorithm; 0 if unknown. */
PKV_API uint32_t pkv_hash_size(uint32_t algo);

/* A multimodal item occupying tokens [offset, offset + length) of a prompt,
 * identified by a content hash string (e.g. the hex digest of the image). */
typedef struct pkv_mm_item {
  uint64_t offset;
  uint64_t length;
  const char* hash; /* NUL-terminated, non-empty; copied by the callee */
} pkv_mm_item;

#define PKV_HASH_OPTIONS_VERSION 3 /* 2: lora_name; 3: strict_key_domains */

typedef struct pkv_hash_options {
  uint32_t struct_size; /* sizeof(pkv_hash_options); set by _init */
  uint32_t algo;        /* PKV_HASH_*; default PKV_HASH_SHA256_CBOR */
  uint32_t block_size;  /* tokens per block; default 16 */
  uint32_t num_mm_items;
  const char* seed;            /* root seed string; default "" (never NULL after _init) */
  uint64_t lora_id;            /* 0 = no LoRA */
  const char* cache_salt;      /* NULL or "" = no salt */
  const pkv_mm_item* mm_items; /* sorted by offset, non-overlapping */
  /* Version 2 (read only when struct_size covers it): */
  const char* lora_name; /* NULL or "" = none; UTF-8 LoRA adapter name (vLLM's lora_name) */
  /* Version 3 (read only when struct_size covers it): */
  uint32_t strict_key_domains; /* as pkv_pool_options.strict_key_domains: hash
                                  like a pool created with it */
} pkv_hash_options;

/* Sets defaults. Always call before filling fields. */
PKV_API void pkv_hash_options_init(pkv_hash_options* opts);

/* Hashes of the full blocks of tokens[0, num_tokens): floor(num_tokens /
 * block_size) digests written to out_hashes (capacity entries). If capacity
 * is too small, returns PKV_E_BUFFER_TOO_SMALL with *out_num_blocks set to
 * the count needed. Routers use it to predict prefix-cache hits. */
PKV_API pkv_status pkv_hash_prefix(const pkv_hash_options* opts, const int32_t* tokens,
                                   uint64_t num_tokens, pkv_block_hash* out_hashes,
                                   uint64_t capacity, uint64_t* out_num_blocks);

/* The root hash h_{-1} for algo and seed. */
PKV_API pkv_status pkv_hash_root(uint32_t algo, const char* seed, pkv_block_hash* out);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_HASH_H */
