// pagedkv/hash.h: block hashes without a pool.
#include "capi_util.h"
#include "hash/block_hash.h"
#include "key_domains.h"

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

namespace {

pagedkv::HashAlgo check_algo(uint32_t algo, const char* name) {
  if (pagedkv::hash_digest_size(pagedkv::HashAlgo(algo)) == 0)
    fail(Errc::kInvalidArgument,
         std::string(name) + " " + std::to_string(algo) + " is not a PKV_HASH_* algorithm");
  return pagedkv::HashAlgo(algo);
}

// The defaults of pkv_hash_options that are not 0 (for pc::fill_defaults).
void hash_options_defaults(pkv_hash_options& o) {
  o.algo = PKV_HASH_SHA256_CBOR;
  o.block_size = 16;
  o.seed = "";
}

}  // namespace

extern "C" {

uint32_t pkv_hash_size(uint32_t algo) {
  return uint32_t(pagedkv::hash_digest_size(pagedkv::HashAlgo(algo)));
}

void pkv_hash_options_init(pkv_hash_options* opts) {
  pc::init_frozen<pc::kHashOptionsFrozen>(opts, hash_options_defaults);
}

pkv_status pkv_hash_options_init_sized(pkv_hash_options* opts, size_t size) {
  PKV_GUARD(pc::init_sized(opts, "opts", size, pc::kHashOptionsV1, "pkv_hash_options",
                           hash_options_defaults));
}

pkv_status pkv_hash_prefix(const pkv_hash_options* opts, const int32_t* tokens, uint64_t num_tokens,
                           pkv_block_hash* out_hashes, uint64_t capacity,
                           uint64_t* out_num_blocks) {
  PKV_GUARD({
    pc::require(opts, "opts");
    pc::check_struct_size(opts->struct_size, pc::kHashOptionsV1, "opts", "pkv_hash_options",
                          "pkv_hash_options_init");
    pc::require(out_num_blocks, "out_num_blocks");
    pagedkv::HashContext ctx;
    ctx.algo = check_algo(opts->algo, "opts->algo");
    if (opts->block_size == 0) fail(Errc::kInvalidArgument, "opts->block_size is 0");
    ctx.block_size = opts->block_size;
    if (num_tokens > 0 && !tokens)
      fail(Errc::kInvalidArgument,
           "tokens is NULL but num_tokens is " + std::to_string(num_tokens));
    if (opts->num_mm_items > 0 && !opts->mm_items)
      fail(Errc::kInvalidArgument, "opts->mm_items is NULL but opts->num_mm_items is " +
                                       std::to_string(opts->num_mm_items));
    ctx.lora_id = opts->lora_id;
    if (PKV_HAS_FIELD(opts, lora_name) && opts->lora_name) ctx.lora_name = opts->lora_name;
    if (opts->cache_salt) ctx.cache_salt = opts->cache_salt;
    uint64_t prev_end = 0;
    for (uint32_t i = 0; i < opts->num_mm_items; ++i) {
      const pkv_mm_item& m = opts->mm_items[i];
      std::string at = "opts->mm_items[" + std::to_string(i) + "]";
      if (!m.hash || !*m.hash) fail(Errc::kInvalidArgument, at + ".hash is NULL or empty");
      if (m.length == 0) fail(Errc::kInvalidArgument, at + ".length is 0");
      if (m.offset + m.length < m.offset)
        fail(Errc::kInvalidArgument, at + " offset + length overflows");
      if (i > 0 && m.offset < prev_end)
        fail(Errc::kInvalidArgument, at + " overlaps or precedes the previous item");
      prev_end = m.offset + m.length;
      ctx.mm_items.push_back({m.offset, m.length, m.hash});
    }
    if (PKV_HAS_FIELD(opts, strict_key_domains)) {
      bool strict = false;
      pc::key_domains(opts->strict_key_domains, "opts->strict_key_domains", &strict, &ctx.tagged);
      if (strict) pagedkv::apply_strict_key_domains(ctx);
    }
    if (ctx.tagged && PKV_HAS_FIELD(opts, lora_path) && opts->lora_path)
      ctx.lora_path = opts->lora_path;
    const uint64_t blocks = num_tokens / opts->block_size;
    if (blocks > capacity) {
      *out_num_blocks = blocks;
      fail(Errc::kBufferTooSmall, "out_hashes holds " + std::to_string(capacity) + " hashes, " +
                                      std::to_string(blocks) + " are needed");
    }
    if (blocks > 0) pc::require(out_hashes, "out_hashes");
    const pagedkv::BlockHash root = pagedkv::hash_root(ctx.algo, opts->seed ? opts->seed : "");
    std::vector<pagedkv::BlockHash> hs =
        pagedkv::hash_prefix(ctx, root, tokens, size_t(blocks * opts->block_size));
    for (size_t i = 0; i < hs.size(); ++i) pc::copy_hash(hs[i], &out_hashes[i]);
    *out_num_blocks = hs.size();
  });
}

pkv_status pkv_hash_root(uint32_t algo, const char* seed, pkv_block_hash* out) {
  PKV_GUARD({
    pagedkv::HashAlgo a = check_algo(algo, "algo");
    pc::require(out, "out");
    pc::copy_hash(pagedkv::hash_root(a, seed ? seed : ""), out);
  });
}

}  // extern "C"
