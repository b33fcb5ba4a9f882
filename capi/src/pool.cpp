// pagedkv/pool.h: pool lifetime, stats, events, validation, storage.
#include <algorithm>
#include <vector>

#include "capi_util.h"

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

// The defaults of pkv_pool_options that are not 0 (for pc::fill_defaults).
void pool_options_defaults(pkv_pool_options& o) {
  o.block_size = 16;
  o.hash_algo = PKV_HASH_SHA256_CBOR;
  o.enable_prefix_caching = 1;
  o.hash_seed = "";
  o.max_events = 65536;
  o.dtype = PKV_DTYPE_BF16;
  o.device_type = PKV_DEVICE_CPU;
}

}  // namespace

// strict_key_domains of pkv_pool_options and pkv_hash_options
// (PKV_KEY_DOMAINS_*) into the two flags of PoolOptions.
void pkv_capi::key_domains(uint32_t v, const char* name, bool* strict, bool* tagged) {
  if (v > PKV_KEY_DOMAINS_VLLM_TAGGED)
    fail(Errc::kInvalidArgument,
         std::string(name) + " is " + std::to_string(v) +
             ", not PKV_KEY_DOMAINS_VLLM (0), _STRICT (1) or _VLLM_TAGGED (2)");
  *strict = v == PKV_KEY_DOMAINS_STRICT;
  *tagged = v == PKV_KEY_DOMAINS_VLLM_TAGGED;
}

namespace {

// The FP8 scale fields; their values are checked by the pool.
void read_kv_scales(const pkv_pool_options& in, pagedkv::PoolOptions* o) {
  o->kv_scale_granularity = in.kv_scale_granularity;
  const uint64_t n = in.num_kv_scales;
  if (n == 0) {
    if (in.k_scales || in.v_scales)
      fail(Errc::kInvalidArgument, "opts->num_kv_scales is 0 but k_scales or v_scales is set");
    return;
  }
  pc::require(in.k_scales, "opts->k_scales");
  pc::require(in.v_scales, "opts->v_scales");
  // Before k_scales[0, n) and v_scales[0, n) are read: n must be the count
  // the other fields call for (the pool checks the values); a count the
  // pool would refuse is not read past the caller's arrays.
  const bool fp8 = in.dtype == PKV_DTYPE_FP8_E4M3 || in.dtype == PKV_DTYPE_FP8_E5M2;
  if (!fp8 || in.num_layers == 0)
    fail(Errc::kInvalidArgument,
         "opts->num_kv_scales is " + str(n) + " but dtype " + str(in.dtype) +
             (in.num_layers == 0 ? " without storage" : "") + " takes no scales (fp8 pools only)");
  if (in.kv_scale_granularity > PKV_KV_SCALE_PER_HEAD)
    fail(Errc::kInvalidArgument, "opts->kv_scale_granularity " + str(in.kv_scale_granularity) +
                                     " is neither PKV_KV_SCALE_PER_TENSOR nor "
                                     "PKV_KV_SCALE_PER_HEAD");
  const bool per_head = in.kv_scale_granularity == PKV_KV_SCALE_PER_HEAD;
  const uint64_t want = uint64_t(in.num_layers) * (per_head ? in.num_kv_heads : 1);
  if (n != want)
    fail(Errc::kInvalidArgument,
         "opts->num_kv_scales is " + str(n) + ", expected " + str(want) +
             (per_head ? " (num_layers * num_kv_heads, per head)" : " (num_layers, per tensor)"));
  if (n > (uint64_t(1) << 28))  // more than 65536 layers * 4096 heads
    fail(Errc::kInvalidArgument, "opts->num_kv_scales " + str(n) + " is too large");
  o->k_scales.assign(in.k_scales, in.k_scales + n);
  o->v_scales.assign(in.v_scales, in.v_scales + n);
}

}  // namespace

extern "C" {

void pkv_pool_options_init(pkv_pool_options* opts) {
  pc::init_frozen<pc::kPoolOptionsFrozen>(opts, pool_options_defaults);
}

pkv_status pkv_pool_options_init_sized(pkv_pool_options* opts, size_t size) {
  PKV_GUARD(pc::init_sized(opts, "opts", size, pc::kPoolOptionsV1, "pkv_pool_options",
                           pool_options_defaults));
}

pkv_status pkv_pool_create(const pkv_pool_options* opts, pkv_pool** out) {
  PKV_GUARD({
    pc::require(opts, "opts");
    pc::check_struct_size(opts->struct_size, pc::kPoolOptionsV1, "opts", "pkv_pool_options",
                          "pkv_pool_options_init");
    pc::require(out, "out");
    pagedkv::PoolOptions o;
    o.block_size = opts->block_size;
    o.num_blocks = opts->num_blocks;
    o.memory_budget_bytes = opts->memory_budget_bytes;
    o.hash_algo = pagedkv::HashAlgo(opts->hash_algo);
    o.enable_prefix_caching = pc::flag(opts->enable_prefix_caching, "opts->enable_prefix_caching");
    o.hash_seed = opts->hash_seed ? opts->hash_seed : "";
    o.sliding_window = opts->sliding_window;
    o.enable_events = pc::flag(opts->enable_events, "opts->enable_events");
    o.max_events = opts->max_events;
    o.num_layers = opts->num_layers;
    o.num_kv_heads = opts->num_kv_heads;
    o.head_dim = opts->head_dim;
    o.dtype = pagedkv::DType(opts->dtype);
    o.device_type = opts->device_type;
    o.device_id = opts->device_id;
    o.num_threads = opts->num_threads;
    if (PKV_HAS_FIELD(opts, strict_key_domains))
      pc::key_domains(opts->strict_key_domains, "opts->strict_key_domains", &o.strict_key_domains,
                      &o.tagged_keys);
    if (PKV_HAS_FIELD(opts, v_scales)) read_kv_scales(*opts, &o);
    if (PKV_HAS_FIELD(opts, enable_partial_reuse))
      o.enable_partial_reuse = pc::flag(opts->enable_partial_reuse, "opts->enable_partial_reuse");
    if (PKV_HAS_FIELD(opts, enable_retention))
      o.enable_retention = pc::flag(opts->enable_retention, "opts->enable_retention");
    if (PKV_HAS_FIELD(opts, max_pinned_blocks)) o.max_pinned_blocks = opts->max_pinned_blocks;
    if (PKV_HAS_FIELD(opts, qk_rope_head_dim)) {
      o.kv_layout = opts->kv_layout;
      o.kv_lora_rank = opts->kv_lora_rank;
      o.qk_rope_head_dim = opts->qk_rope_head_dim;
    }
    try {
      auto p = std::make_unique<pkv_pool>();
      p->impl = pagedkv::Pool::create(o);
      *out = p.release();
    } catch (const pagedkv::Error& e) {
      if (e.code() == Errc::kInvalidArgument)  // option checks name the field bare
        fail(e.code(), std::string("opts->") + e.what());
      throw;
    }
  });
}

void pkv_pool_destroy(pkv_pool* pool) {
  if (!pool) return;
  try {
    if (pool->impl) pool->impl->close();
    if (pool->groups) pool->groups->close();
  } catch (...) {
  }
  delete pool;
}

pkv_status pkv_pool_get_options(const pkv_pool* pool, pkv_pool_options* out) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      pc::require(out, "out");
      pc::check_struct_size(out->struct_size, pc::kPoolOptionsV1, "out", "pkv_pool_options",
                            "pkv_pool_options_init");
      const pagedkv::PoolOptions& o = p.options();
      pkv_pool_options r;
      std::memset(&r, 0, sizeof r);
      r.struct_size = sizeof r;
      r.block_size = o.block_size;
      r.num_blocks = o.num_blocks;
      r.memory_budget_bytes = o.memory_budget_bytes;
      r.hash_algo = uint32_t(o.hash_algo);
      r.enable_prefix_caching = o.enable_prefix_caching;
      r.hash_seed = o.hash_seed.c_str();  // owned by the pool
      r.sliding_window = o.sliding_window;
      r.enable_events = o.enable_events;
      r.max_events = o.max_events;
      r.num_layers = o.num_layers;
      r.num_kv_heads = o.num_kv_heads;
      r.head_dim = o.head_dim;
      r.dtype = uint32_t(o.dtype);
      r.device_type = o.device_type;
      r.device_id = o.device_id;
      r.num_threads = o.num_threads;
      r.strict_key_domains = o.tagged_keys          ? PKV_KEY_DOMAINS_VLLM_TAGGED
                             : o.strict_key_domains ? PKV_KEY_DOMAINS_STRICT
                                                    : PKV_KEY_DOMAINS_VLLM;
      r.kv_scale_granularity = o.kv_scale_granularity;
      r.num_kv_scales = uint32_t(p.num_kv_scales());
      r.enable_partial_reuse = o.enable_partial_reuse;
      r.enable_retention = o.enable_retention;
      r.max_pinned_blocks = o.max_pinned_blocks;
      r.kv_layout = o.kv_layout;
      r.kv_lora_rank = o.kv_lora_rank;
      r.qk_rope_head_dim = o.qk_rope_head_dim;
      pc::write_out(out, r);
    });
  });
}

pkv_status pkv_pool_bytes_per_block(const pkv_pool* pool, uint64_t* out) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      pc::require(out, "out");
      *out = p.bytes_per_block();
    });
  });
}

void pkv_pool_stats_init(pkv_pool_stats* stats) { pc::init_frozen<pc::kPoolStatsFrozen>(stats); }

pkv_status pkv_pool_stats_init_sized(pkv_pool_stats* stats, size_t size) {
  PKV_GUARD(pc::init_sized(stats, "stats", size, pc::kPoolStatsV1, "pkv_pool_stats"));
}

pkv_status pkv_pool_get_stats(const pkv_pool* pool, pkv_pool_stats* out) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      pc::require(out, "out");
      pc::check_struct_size(out->struct_size, pc::kPoolStatsV1, "out", "pkv_pool_stats",
                            "pkv_pool_stats_init");
      pagedkv::PoolStats s = p.stats();
      pkv_pool_stats r;
      std::memset(&r, 0, sizeof r);
      r.struct_size = sizeof r;
      r.block_size = s.block_size;
      r.num_blocks = s.num_blocks;
      r.num_free_blocks = s.num_free_blocks;
      r.num_used_blocks = s.num_used_blocks;
      r.num_cached_blocks = s.num_cached_blocks;
      r.num_seqs = s.num_seqs;
      r.num_tokens = s.num_tokens;
      r.usage = s.usage;
      r.prefix_query_tokens = s.prefix_query_tokens;
      r.prefix_hit_tokens = s.prefix_hit_tokens;
      r.num_evictions = s.num_evictions;
      r.num_cow_copies = s.num_cow_copies;
      r.num_events_dropped = s.num_events_dropped;
      r.kv_bytes_per_block = s.kv_bytes_per_block;
      r.kv_bytes_allocated = s.kv_bytes_allocated;
      r.kv_bytes_used = s.kv_bytes_used;
      r.kv_bytes_wasted = s.kv_bytes_wasted;
      r.num_partial_hits = s.num_partial_hits;
      r.partial_hit_tokens = s.partial_hit_tokens;
      r.num_pinned_blocks = s.num_pinned_blocks;
      r.num_pins_degraded = s.num_pins_degraded;
      pc::write_out(out, r);
    });
  });
}

pkv_status pkv_pool_drain_events(pkv_pool* pool, pkv_event* out, uint64_t capacity,
                                 uint64_t* out_count) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    if (capacity > 0) pc::require(out, "out");
    pc::require(out_count, "out_count");
    // Drain in chunks through a small buffer: no allocation sized by the
    // caller's capacity. Events of other media (tiers) are not this
    // version's: they are drained and skipped (pkv_pool_drain_events_v2).
    pagedkv::Event buf[64];
    uint64_t done = 0;
    while (done < capacity) {
      size_t want = size_t(std::min<uint64_t>(64, capacity - done));
      size_t got = p.drain_events(buf, want);
      size_t kept = 0;
      for (size_t i = 0; i < got; ++i) {
        const pagedkv::Event& e = buf[i];
        // Tier events (pagedkv/tiers.h) are not this call's: it reports
        // the device's blocks, as in ABI 1.
        if (e.medium != 0) continue;
        pkv_event& o = out[done + kept++];
        std::memset(&o, 0, sizeof o);
        o.seq_no = e.seq_no;
        o.type = uint32_t(e.type);
        o.block_id = e.block_id;
        pc::copy_hash(e.block_hash, &o.block_hash);
        pc::copy_hash(e.parent_hash, &o.parent_hash);
        o.has_parent = e.parent_hash.empty() ? 0 : 1;
        o.num_tokens = e.num_tokens;
        o.lora_id = e.lora_id;
      }
      done += kept;
      if (got < want) break;
    }
    *out_count = done;
  });
}

pkv_status pkv_pool_reset_prefix_cache(pkv_pool* pool) {
  PKV_GUARD(pc::pool_of(pool).reset_prefix_cache());
}

pkv_status pkv_pool_validate(const pkv_pool* pool) {
  PKV_GUARD({
    std::string broken;
    pc::with_pool(pool, [&](auto& p) { broken = p.validate(); });
    if (!broken.empty()) fail(Errc::kInvariant, broken);
  });
}

pkv_status pkv_pool_kv_tensor(const pkv_pool* pool, uint32_t layer, uint32_t which,
                              pkv_tensor* out) {
  PKV_GUARD({
    const pagedkv::Pool& p = pc::pool_of(pool);
    pc::require(out, "out");
    pc::from_arg(p.kv_tensor(layer, which), out);
  });
}

pkv_status pkv_pool_copy_blocks(pkv_pool* pool, const int32_t* src, const int32_t* dst,
                                uint64_t num_pairs, void* stream) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    if (num_pairs > 0) {
      pc::require(src, "src");
      pc::require(dst, "dst");
    }
    p.copy_blocks(src, dst, num_pairs, stream);
  });
}

pkv_status pkv_pool_swap_blocks(pkv_pool* pool, const int32_t* blocks, uint64_t num_blocks,
                                void* host_buffer, uint64_t host_bytes, uint32_t direction,
                                void* stream) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    if (direction != PKV_SWAP_OUT && direction != PKV_SWAP_IN)
      fail(Errc::kInvalidArgument,
           "direction " + str(direction) + " is neither PKV_SWAP_OUT nor PKV_SWAP_IN");
    if (num_blocks > 0) {
      pc::require(blocks, "blocks");
      pc::require(host_buffer, "host_buffer");
    }
    p.swap_blocks(blocks, num_blocks, host_buffer, host_bytes, direction == PKV_SWAP_OUT, stream);
  });
}

pkv_status pkv_pool_set_kv_scales(pkv_pool* pool, const float* k_scales, const float* v_scales,
                                  uint64_t num_scales) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    if (num_scales > 0) {
      pc::require(k_scales, "k_scales");
      pc::require(v_scales, "v_scales");
    }
    p.set_kv_scales(k_scales, v_scales, num_scales);
  });
}

pkv_status pkv_pool_get_kv_scales(const pkv_pool* pool, float* k_out, float* v_out,
                                  uint64_t capacity, uint64_t* out_len) {
  PKV_GUARD({
    const pagedkv::Pool& p = pc::pool_of(pool);
    pc::require(out_len, "out_len");
    std::vector<float> k, v;
    p.kv_scales(&k, &v);
    // NULL outputs are refused before *out_len is written (outputs are
    // left alone on failure); a too-small capacity reports the size.
    if (capacity >= k.size()) {
      pc::require(k_out, "k_out");
      pc::require(v_out, "v_out");
    }
    *out_len = k.size();
    if (capacity < k.size())
      fail(Errc::kBufferTooSmall,
           "capacity " + str(capacity) + " is below the " + str(k.size()) + " scales of the pool");
    std::copy(k.begin(), k.end(), k_out);
    std::copy(v.begin(), v.end(), v_out);
  });
}

pkv_status pkv_pool_set_clock(pkv_pool* pool, uint64_t now_ns) {
  PKV_GUARD(pc::pool_of(pool).set_clock(now_ns));
}

pkv_status pkv_pool_get_priority_counts(const pkv_pool* pool, uint64_t* out_counts,
                                        uint64_t capacity, uint64_t* out_len) {
  PKV_GUARD({
    const pagedkv::Pool& p = pc::pool_of(pool);
    if (capacity > 0) pc::require(out_counts, "out_counts");
    pc::require(out_len, "out_len");
    constexpr uint64_t kLevels = PKV_PRIORITY_MAX + 1;
    *out_len = kLevels;
    if (capacity < kLevels)
      fail(Errc::kBufferTooSmall, "out_counts holds " + str(capacity) + " entries, " +
                                      str(kLevels) + " priorities are counted");
    p.priority_counts(out_counts);
  });
}

}  // extern "C"
