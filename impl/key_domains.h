// Strict key domains (pkv_pool_options.strict_key_domains): in vLLM's key
// encoding a cache salt, a multimodal item hash and a LoRA name are all bare
// text extra keys, so an unsalted request whose item hash (or LoRA name)
// equals a salt hashes its first block like the salted request's. Strict
// mode gives each domain a prefix whose first byte differs, so no key of one
// domain equals a key of another. Applied where a request's hash context is
// assembled (pool and pkv_hash_prefix).
#pragma once

#include "hash/block_hash.h"

namespace pagedkv {

inline void apply_strict_key_domains(HashContext& ctx) {
  if (!ctx.cache_salt.empty()) ctx.cache_salt.insert(0, "salt:");
  if (!ctx.lora_name.empty()) ctx.lora_name.insert(0, "lora:");
  for (MmItem& m : ctx.mm_items) m.hash.insert(0, "mm:");
}

}  // namespace pagedkv
