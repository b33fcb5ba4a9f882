// pagedkv/tiers.h: offload tiers.
#include "capi_util.h"

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

namespace {

void check_tokens(const int32_t* tokens, uint64_t n) {
  if (n > 0 && !tokens)
    fail(Errc::kInvalidArgument, "tokens is NULL but num_tokens is " + std::to_string(n));
}

void check_match_out(pkv_tier_match* out) {
  pc::require(out, "out");
  pc::check_struct_size(out->struct_size, pc::kTierMatchV1, "out", "pkv_tier_match",
                        "pkv_tier_match_init");
}

void write_match(const pagedkv::TieredMatch& m, pkv_tier_match* out) {
  pkv_tier_match r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.device_tokens = m.device;
  r.host_tokens = m.host;
  r.file_tokens = m.file;
  r.num_cached = m.device + m.host + m.file;
  pc::write_out(out, r);
}

}  // namespace

void pkv_tier_options_init(pkv_tier_options* opts) {
  pc::init_frozen<pc::kTierOptionsFrozen>(opts);
}

pkv_status pkv_tier_options_init_sized(pkv_tier_options* opts, size_t size) {
  PKV_GUARD(pc::init_sized(opts, "opts", size, pc::kTierOptionsV1, "pkv_tier_options"));
}

pkv_status pkv_pool_attach_tiers(pkv_pool* pool, const pkv_tier_options* opts) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    pc::require(opts, "opts");
    pc::check_struct_size(opts->struct_size, pc::kTierOptionsV1, "opts", "pkv_tier_options",
                          "pkv_tier_options_init");
    pagedkv::TierOptions o;
    o.flags = opts->flags;
    o.host_bytes = opts->host_bytes;
    if (opts->file_dir) o.file_dir = opts->file_dir;
    o.file_bytes = opts->file_bytes;
    try {
      p.attach_tiers(o);
    } catch (const pagedkv::Error& e) {
      if (e.code() != Errc::kInvalidArgument) throw;
      fail(e.code(), std::string("opts->") + e.what());  // the fields are the caller's opts
    }
  });
}

void pkv_tier_match_init(pkv_tier_match* out) { pc::init_frozen<pc::kTierMatchFrozen>(out); }

pkv_status pkv_tier_match_init_sized(pkv_tier_match* out, size_t size) {
  PKV_GUARD(pc::init_sized(out, "out", size, pc::kTierMatchV1, "pkv_tier_match"));
}

pkv_status pkv_seq_match_prefix_tiered(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                       uint64_t num_tokens, pkv_tier_match* out) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    check_tokens(tokens, num_tokens);
    check_match_out(out);
    write_match(p.match_prefix_tiered(seq, tokens, num_tokens), out);
  });
}

pkv_status pkv_seq_match_prefix_hashes_tiered(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                              uint64_t num_tokens, const pkv_block_hash* hashes,
                                              uint64_t num_hashes, pkv_tier_match* out) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    check_tokens(tokens, num_tokens);
    check_match_out(out);
    const std::vector<pagedkv::BlockHash> hs = pc::block_hashes(p, hashes, num_hashes, num_tokens);
    // A non-NULL pointer selects the hash path even for zero hashes.
    static const pagedkv::BlockHash kNone{};
    write_match(
        p.match_prefix_tiered(seq, tokens, num_tokens, hs.empty() ? &kNone : hs.data(), hs.size()),
        out);
  });
}

pkv_status pkv_seq_admit_tiered(pkv_pool* pool, const pkv_seq_options* opts, const int32_t* tokens,
                                uint64_t num_tokens, const pkv_block_hash* hashes,
                                uint64_t num_hashes, uint32_t num_lookahead, pkv_seq_id* out_seq,
                                pkv_tier_match* out) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    check_tokens(tokens, num_tokens);
    pc::require(out_seq, "out_seq");
    check_match_out(out);
    const pagedkv::SeqOptions o = pc::seq_options(opts);
    const std::vector<pagedkv::BlockHash> hs = pc::block_hashes(p, hashes, num_hashes, num_tokens);
    static const pagedkv::BlockHash kNone{};
    const pagedkv::BlockHash* given = hashes ? (hs.empty() ? &kNone : hs.data()) : nullptr;
    pagedkv::TieredMatch m;
    const pagedkv::Pool::Admitted a = pc::with_opts_prefix(
        [&] { return p.admit(o, tokens, num_tokens, given, hs.size(), num_lookahead, &m); });
    *out_seq = a.id;
    write_match(m, out);
  });
}

void pkv_tier_stats_init(pkv_tier_stats* stats) { pc::init_frozen<pc::kTierStatsFrozen>(stats); }

pkv_status pkv_tier_stats_init_sized(pkv_tier_stats* stats, size_t size) {
  PKV_GUARD(pc::init_sized(stats, "stats", size, pc::kTierStatsV1, "pkv_tier_stats"));
}

pkv_status pkv_pool_get_tier_stats(const pkv_pool* pool, uint32_t medium, pkv_tier_stats* out) {
  PKV_GUARD({
    const pagedkv::Pool& p = pc::pool_of(pool);
    pc::require(out, "out");
    pc::check_struct_size(out->struct_size, pc::kTierStatsV1, "out", "pkv_tier_stats",
                          "pkv_tier_stats_init");
    const pagedkv::TierStats s = p.tier_stats(medium);
    pkv_tier_stats r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.medium = medium;
    r.capacity_blocks = s.capacity_blocks;
    r.num_blocks = s.num_blocks;
    r.bytes = s.bytes;
    r.num_stored = s.num_stored;
    r.num_removed = s.num_removed;
    r.num_hits = s.num_hits;
    r.num_loaded = s.num_loaded;
    r.bytes_stored = s.bytes_stored;
    r.bytes_loaded = s.bytes_loaded;
    r.load_ns = s.load_ns;
    r.num_checksum_failures = s.num_checksum_failures;
    r.num_io_errors = s.num_io_errors;
    r.num_dropped = s.num_dropped;
    pc::write_out(out, r);
  });
}

pkv_status pkv_pool_flush_tiers(pkv_pool* pool) { PKV_GUARD(pc::pool_of(pool).flush_tiers()); }
