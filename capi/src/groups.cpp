// pagedkv/groups.h: multi-group pools.
#include <algorithm>

#include "capi_util.h"

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

// The first version ended at layer_ids; flags and reserved1 came after.
constexpr uint32_t kGroupSpecV1 = offsetof(pkv_kv_group_spec, flags);
constexpr uint32_t kGroupStatsV1 = sizeof(pkv_group_stats);

// The defaults of pkv_kv_group_spec that are not 0 (for pc::fill_defaults).
void group_spec_defaults(pkv_kv_group_spec& o) {
  o.kind = PKV_GROUP_FULL;
  o.num_layers = 1;
  o.dtype = PKV_DTYPE_BF16;
}

pagedkv::GroupSpec group_spec(const pkv_kv_group_spec& in, uint32_t i) {
  const std::string at = "groups[" + str(i) + "]";
  pc::check_struct_size(in.struct_size, kGroupSpecV1, at.c_str(), "pkv_kv_group_spec",
                        "pkv_kv_group_spec_init");
  pagedkv::GroupSpec g;
  if (in.kind > PKV_GROUP_RECURRENT)
    fail(Errc::kInvalidArgument, at + ".kind " + str(in.kind) + " is not a PKV_GROUP_* value");
  if (in.reserved != 0) fail(Errc::kInvalidArgument, at + ".reserved is not 0");
  if (pkv_dtype_size(in.dtype) == 0 || in.dtype == PKV_DTYPE_I32 || in.dtype == PKV_DTYPE_I64)
    fail(Errc::kInvalidArgument, at + ".dtype " + str(in.dtype) + " is not a KV PKV_DTYPE_*");
  g.kind = pagedkv::GroupKind(in.kind);
  g.num_layers = in.num_layers;
  g.num_kv_heads = in.num_kv_heads;
  g.head_dim = in.head_dim;
  g.sliding_window = in.sliding_window;
  g.kv_lora_rank = in.kv_lora_rank;
  g.rope_dim = in.rope_dim;
  g.state_bytes = in.state_bytes;
  g.dtype = pagedkv::DType(in.dtype);
  if (PKV_HAS_FIELD(&in, flags)) {
    if (in.flags & ~uint32_t(PKV_GROUP_SNAPSHOT_EVERY_BLOCK))
      fail(Errc::kInvalidArgument,
           at + ".flags " + str(in.flags) + " has bits that are not PKV_GROUP_SNAPSHOT_* flags");
    g.snapshot_every_block = (in.flags & PKV_GROUP_SNAPSHOT_EVERY_BLOCK) != 0;
  }
  if (PKV_HAS_FIELD(&in, reserved1) && in.reserved1 != 0)
    fail(Errc::kInvalidArgument, at + ".reserved1 is not 0");
  // Before layer_ids[0, num_layers) is read: a count beyond what a pool
  // takes is refused, not read past the caller's array (the pool checks the
  // rest of the spec).
  if (in.num_layers > pagedkv::kMaxGroupLayers)
    fail(Errc::kInvalidArgument,
         at + ".num_layers " + str(in.num_layers) + " exceeds " + str(pagedkv::kMaxGroupLayers));
  if (in.layer_ids && in.num_layers > 0)
    g.layer_ids.assign(in.layer_ids, in.layer_ids + in.num_layers);
  return g;
}

pagedkv::GroupPool& groups_of(const pkv_pool* pool) {
  pc::require(pool, "pool");
  if (!pool->groups)
    fail(Errc::kUnsupported,
         "pool is a single-group pool (pkv_pool_create); this call needs one "
         "from pkv_pool_create_groups");
  return *pool->groups;
}

}  // namespace

extern "C" {

void pkv_kv_group_spec_init(pkv_kv_group_spec* spec) {
  pc::init_frozen<pc::kGroupSpecFrozen>(spec, group_spec_defaults);
}

pkv_status pkv_kv_group_spec_init_sized(pkv_kv_group_spec* spec, size_t size) {
  PKV_GUARD(
      pc::init_sized(spec, "spec", size, kGroupSpecV1, "pkv_kv_group_spec", group_spec_defaults));
}

pkv_status pkv_pool_create_groups(const pkv_pool_options* base, const pkv_kv_group_spec* groups,
                                  uint32_t num_groups, pkv_pool** out) {
  PKV_GUARD({
    pc::require(base, "base");
    pc::check_struct_size(base->struct_size, pc::kPoolOptionsV1, "base", "pkv_pool_options",
                          "pkv_pool_options_init");
    pc::require(out, "out");
    if (num_groups > 0) pc::require(groups, "groups");
    // A flag's value is checked before whether the pool kind supports it,
    // as pkv_pool_create does: 2 is a bad value, not an unsupported option.
    pagedkv::PoolOptions o;
    o.block_size = base->block_size;
    o.num_blocks = base->num_blocks;
    o.memory_budget_bytes = base->memory_budget_bytes;
    o.hash_algo = pagedkv::HashAlgo(base->hash_algo);
    o.enable_prefix_caching = pc::flag(base->enable_prefix_caching, "base->enable_prefix_caching");
    o.hash_seed = base->hash_seed ? base->hash_seed : "";
    o.sliding_window = base->sliding_window;
    o.enable_events = pc::flag(base->enable_events, "base->enable_events");
    o.num_layers = base->num_layers;
    if (PKV_HAS_FIELD(base, strict_key_domains))
      pc::key_domains(base->strict_key_domains, "base->strict_key_domains", &o.strict_key_domains,
                      &o.tagged_keys);
    if (PKV_HAS_FIELD(base, enable_partial_reuse))
      o.enable_partial_reuse = pc::flag(base->enable_partial_reuse, "base->enable_partial_reuse");
    if (PKV_HAS_FIELD(base, enable_retention))
      o.enable_retention = pc::flag(base->enable_retention, "base->enable_retention");
    // Before groups[0, num_groups) is read: a count beyond what a pool
    // takes is refused, not read past the caller's array.
    if (num_groups > pagedkv::kMaxGroups)
      fail(Errc::kInvalidArgument,
           "num_groups " + str(num_groups) + " exceeds " + str(pagedkv::kMaxGroups));
    std::vector<pagedkv::GroupSpec> specs;
    specs.reserve(num_groups);
    // The caller's array steps by its own spec size: an older binary's
    // specs are shorter than this header's. Each is read into a zeroed
    // spec, no byte past its struct_size.
    const uint32_t stride = num_groups > 0 ? groups[0].struct_size : 0;
    if (num_groups > 0)
      pc::check_struct_size(stride, kGroupSpecV1, "groups[0]", "pkv_kv_group_spec",
                            "pkv_kv_group_spec_init");
    for (uint32_t i = 0; i < num_groups; ++i) {
      const char* at = reinterpret_cast<const char*>(groups) + uint64_t(i) * stride;
      pkv_kv_group_spec in;
      std::memset(&in, 0, sizeof in);
      std::memcpy(&in, at, std::min<size_t>(stride, sizeof in));
      if (in.struct_size != stride)
        fail(Errc::kInvalidArgument, "groups[" + str(i) + "].struct_size " + str(in.struct_size) +
                                         " differs from groups[0].struct_size " + str(stride) +
                                         " (one array, one spec version)");
      specs.push_back(group_spec(in, i));
    }
    auto p = std::make_unique<pkv_pool>();
    p->groups = pagedkv::GroupPool::create(o, std::move(specs));
    *out = p.release();
  });
}

pkv_status pkv_pool_num_groups(const pkv_pool* pool, uint32_t* out) {
  PKV_GUARD({
    pc::require(pool, "pool");
    pc::require(out, "out");
    *out = pool->groups ? pool->groups->num_groups() : 1;
  });
}

pkv_status pkv_pool_group_of_layer(const pkv_pool* pool, uint32_t layer, uint32_t* out_group,
                                   uint32_t* out_index) {
  PKV_GUARD({
    pc::require(pool, "pool");
    pc::require(out_group, "out_group");
    pc::require(out_index, "out_index");
    uint32_t g = 0, k = layer;
    bool found;
    if (pool->groups) {
      found = pool->groups->layer(layer, &g, &k);
    } else {
      found = layer < pc::pool_of(pool).options().num_layers;
    }
    if (!found) fail(Errc::kNotFound, "layer " + str(layer) + " is in no group of the pool");
    *out_group = g;
    *out_index = k;
  });
}

pkv_status pkv_seq_group_block_table(const pkv_pool* pool, pkv_seq_id seq, uint32_t group,
                                     int32_t* out_blocks, uint64_t capacity, uint64_t* out_len) {
  PKV_GUARD({
    pc::require(pool, "pool");
    if (capacity > 0) pc::require(out_blocks, "out_blocks");
    pc::require(out_len, "out_len");
    uint64_t len;
    if (pool->groups) {
      len = pool->groups->block_table(seq, group, out_blocks, capacity);
    } else {
      if (group != 0)
        fail(Errc::kInvalidArgument, "group " + str(group) + " is out of range (the pool has 1)");
      len = pc::pool_of(pool).block_table(seq, out_blocks, capacity);
    }
    *out_len = len;
    if (len > capacity)
      fail(Errc::kBufferTooSmall, "out_blocks holds " + str(capacity) + " entries, the table of " +
                                      pagedkv::seq_name(seq) + " in group " + str(group) + " has " +
                                      str(len));
  });
}

void pkv_group_stats_init(pkv_group_stats* stats) { pc::init_frozen<pc::kGroupStatsFrozen>(stats); }

pkv_status pkv_group_stats_init_sized(pkv_group_stats* stats, size_t size) {
  PKV_GUARD(pc::init_sized(stats, "stats", size, kGroupStatsV1, "pkv_group_stats"));
}

pkv_status pkv_pool_group_stats(const pkv_pool* pool, uint32_t group, pkv_group_stats* out) {
  PKV_GUARD({
    pagedkv::GroupPool& p = groups_of(pool);
    pc::require(out, "out");
    pc::check_struct_size(out->struct_size, kGroupStatsV1, "out", "pkv_group_stats",
                          "pkv_group_stats_init");
    const pagedkv::GroupStats s = p.group_stats(group);
    pkv_group_stats r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.kind = uint32_t(p.group(group).kind);
    r.num_used_blocks = s.num_used_blocks;
    r.num_cached_blocks = s.num_cached_blocks;
    r.num_null_entries = s.num_null_entries;
    r.bytes_per_block = s.bytes_per_block;
    pc::write_out(out, r);
  });
}

pkv_status pkv_pool_group_take_copies(pkv_pool* pool, uint32_t group, int32_t* src, int32_t* dst,
                                      uint64_t capacity, uint64_t* out_len) {
  PKV_GUARD({
    pagedkv::GroupPool& p = groups_of(pool);
    if (capacity > 0) {
      pc::require(src, "src");
      pc::require(dst, "dst");
    }
    pc::require(out_len, "out_len");
    const uint64_t n = p.take_copies(group, src, dst, capacity);
    *out_len = n;
    if (n > capacity)
      fail(Errc::kBufferTooSmall,
           "src and dst hold " + str(capacity) + " entries; " + str(n) + " copies are pending");
  });
}

}  // extern "C"
