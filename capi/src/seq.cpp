// pagedkv/pool.h: sequences.
#include "capi_util.h"

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

void check_tokens(const int32_t* tokens, uint64_t n) {
  if (n > 0 && !tokens) fail(Errc::kInvalidArgument, "tokens is NULL but num_tokens is " + str(n));
}

// pkv_seq_admit and pkv_seq_admit_hashes (hashes NULL: no precomputed
// hashes), each under its own guard.
void admit(pkv_pool* pool, const pkv_seq_options* opts, const int32_t* tokens, uint64_t num_tokens,
           const pkv_block_hash* hashes, uint64_t num_hashes, uint32_t num_lookahead,
           pkv_seq_id* out_seq, uint64_t* out_num_cached) {
  pagedkv::Pool& p = pc::pool_of(pool);
  check_tokens(tokens, num_tokens);
  pc::require(out_seq, "out_seq");
  pc::require(out_num_cached, "out_num_cached");
  const pagedkv::SeqOptions o = pc::seq_options(opts);
  const std::vector<pagedkv::BlockHash> hs = pc::block_hashes(p, hashes, num_hashes, num_tokens);
  static const pagedkv::BlockHash kNone{};
  const pagedkv::BlockHash* given = hashes ? (hs.empty() ? &kNone : hs.data()) : nullptr;
  const pagedkv::Pool::Admitted a = pc::with_opts_prefix(
      [&] { return p.admit(o, tokens, num_tokens, given, hs.size(), num_lookahead); });
  *out_seq = a.id;
  *out_num_cached = a.num_cached;
}

}  // namespace

std::vector<pagedkv::BlockHash> pkv_capi::block_hashes(const pagedkv::Pool& p,
                                                       const pkv_block_hash* hashes, uint64_t n,
                                                       uint64_t num_tokens) {
  if (n > 0 && !hashes) fail(Errc::kInvalidArgument, "hashes is NULL but num_hashes is " + str(n));
  // Before reading hashes[0, n): a count beyond the prompt's full blocks is
  // refused, not read past the caller's array (or allocated: a huge one was
  // PKV_E_OUT_OF_MEMORY).
  const uint64_t full = num_tokens / p.options().block_size;
  if (n > full)
    fail(Errc::kInvalidArgument, "num_hashes " + str(n) + " exceeds the " + str(full) +
                                     " full blocks of num_tokens " + str(num_tokens));
  const uint8_t size = uint8_t(pagedkv::hash_digest_size(p.options().hash_algo));
  std::vector<pagedkv::BlockHash> out(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::memcpy(out[i].bytes.data(), hashes[i].bytes, size);  // padding stays zero
    out[i].size = size;
  }
  return out;
}

pagedkv::SeqOptions pkv_capi::seq_options(const pkv_seq_options* opts) {
  pagedkv::SeqOptions o;
  if (opts) {
    pc::check_struct_size(opts->struct_size, pc::kSeqOptionsV1, "opts", "pkv_seq_options",
                          "pkv_seq_options_init");
    o.priority = opts->priority;
    o.lora_id = opts->lora_id;
    if (PKV_HAS_FIELD(opts, lora_name) && opts->lora_name) o.lora_name = opts->lora_name;
    if (PKV_HAS_FIELD(opts, lora_path) && opts->lora_path) o.lora_path = opts->lora_path;
    if (opts->cache_salt) o.cache_salt = opts->cache_salt;
    if (opts->num_mm_items > 0 && !opts->mm_items)
      fail(Errc::kInvalidArgument,
           "opts->mm_items is NULL but opts->num_mm_items is " + str(opts->num_mm_items));
    for (uint32_t i = 0; i < opts->num_mm_items; ++i) {
      const pkv_mm_item& m = opts->mm_items[i];
      if (!m.hash) fail(Errc::kInvalidArgument, "opts->mm_items[" + str(i) + "].hash is NULL");
      o.mm_items.push_back({m.offset, m.length, m.hash});
    }
  }
  return o;
}

extern "C" {

void pkv_seq_options_init(pkv_seq_options* opts) { pc::init_frozen<pc::kSeqOptionsFrozen>(opts); }

pkv_status pkv_seq_options_init_sized(pkv_seq_options* opts, size_t size) {
  PKV_GUARD(pc::init_sized(opts, "opts", size, pc::kSeqOptionsV1, "pkv_seq_options"));
}

pkv_status pkv_seq_create(pkv_pool* pool, const pkv_seq_options* opts, pkv_seq_id* out) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      pc::require(out, "out");
      const pagedkv::SeqOptions o = pc::seq_options(opts);
      try {
        *out = p.seq_create(o);
      } catch (const pagedkv::Error& e) {
        if (e.code() == Errc::kInvalidArgument) fail(e.code(), std::string("opts->") + e.what());
        throw;
      }
    });
  });
}

pkv_status pkv_seq_match_prefix(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                uint64_t num_tokens, uint64_t* out_num_cached) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      check_tokens(tokens, num_tokens);
      pc::require(out_num_cached, "out_num_cached");
      *out_num_cached = p.match_prefix(seq, tokens, num_tokens);
    });
  });
}

pkv_status pkv_seq_append(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                          uint64_t num_tokens, uint32_t num_lookahead) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      check_tokens(tokens, num_tokens);
      p.append(seq, tokens, num_tokens, num_lookahead);
    });
  });
}

pkv_status pkv_seq_blocks_needed(const pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens,
                                 uint32_t num_lookahead, uint64_t* out_blocks) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      pc::require(out_blocks, "out_blocks");
      *out_blocks = p.blocks_needed(seq, num_tokens, num_lookahead);
    });
  });
}

pkv_status pkv_seq_fork(pkv_pool* pool, pkv_seq_id parent, pkv_seq_id* out_child) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      pc::require(out_child, "out_child");
      *out_child = p.fork(parent);
    });
  });
}

pkv_status pkv_seq_reserve(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens) {
  PKV_GUARD(pc::with_pool(pool, [&](auto& p) { p.reserve(seq, num_tokens); }));
}

pkv_status pkv_seq_truncate(pkv_pool* pool, pkv_seq_id seq, uint64_t num_tokens) {
  PKV_GUARD(pc::with_pool(pool, [&](auto& p) { p.truncate(seq, num_tokens); }));
}

pkv_status pkv_seq_free(pkv_pool* pool, pkv_seq_id seq) {
  PKV_GUARD(pc::with_pool(pool, [&](auto& p) { p.free(seq); }));
}

void pkv_seq_info_init(pkv_seq_info* info) { pc::init_frozen<pc::kSeqInfoFrozen>(info); }

pkv_status pkv_seq_info_init_sized(pkv_seq_info* info, size_t size) {
  PKV_GUARD(pc::init_sized(info, "info", size, pc::kSeqInfoV1, "pkv_seq_info"));
}

pkv_status pkv_seq_get_info(const pkv_pool* pool, pkv_seq_id seq, pkv_seq_info* out) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      pc::require(out, "out");
      pc::check_struct_size(out->struct_size, pc::kSeqInfoV1, "out", "pkv_seq_info",
                            "pkv_seq_info_init");
      pagedkv::SeqInfo i = p.seq_info(seq);
      pkv_seq_info r;
      std::memset(&r, 0, sizeof r);
      r.struct_size = sizeof r;
      r.priority = i.priority;
      r.num_tokens = i.num_tokens;
      r.num_cached_tokens = i.num_cached_tokens;
      r.num_blocks = i.num_blocks;
      r.num_slots = i.num_slots;
      r.lora_id = i.lora_id;
      r.num_computed_tokens = i.num_computed_tokens;
      pc::write_out(out, r);
    });
  });
}

pkv_status pkv_seq_get_block_table(const pkv_pool* pool, pkv_seq_id seq, int32_t* out_blocks,
                                   uint64_t capacity, uint64_t* out_len) {
  PKV_GUARD({
    pc::with_pool(pool, [&](auto& p) {
      if (capacity > 0) pc::require(out_blocks, "out_blocks");
      pc::require(out_len, "out_len");
      uint64_t len = p.block_table(seq, out_blocks, capacity);
      *out_len = len;
      if (len > capacity)
        fail(Errc::kBufferTooSmall, "out_blocks holds " + str(capacity) +
                                        " entries, the table of " + pagedkv::seq_name(seq) +
                                        " has " + str(len));
    });
  });
}

pkv_status pkv_seq_get_block_hashes(const pkv_pool* pool, pkv_seq_id seq,
                                    pkv_block_hash* out_hashes, uint64_t capacity,
                                    uint64_t* out_len) {
  PKV_GUARD({
    const pagedkv::Pool& p = pc::pool_of(pool);
    if (capacity > 0) pc::require(out_hashes, "out_hashes");
    pc::require(out_len, "out_len");
    uint64_t len = p.block_hashes(seq, nullptr, 0);
    *out_len = len;
    if (len > capacity)
      fail(Errc::kBufferTooSmall, "out_hashes holds " + str(capacity) + " hashes, " +
                                      pagedkv::seq_name(seq) + " has " + str(len));
    std::vector<pagedkv::BlockHash> hs(len);
    len = p.block_hashes(seq, hs.data(), hs.size());
    if (len != hs.size())  // the sequence changed between the two calls
      fail(Errc::kInvalidState, pagedkv::seq_name(seq) + " changed during the call; retry");
    for (size_t i = 0; i < hs.size(); ++i) pc::copy_hash(hs[i], &out_hashes[i]);
  });
}

void pkv_prefix_match_init(pkv_prefix_match* out) { pc::init_frozen<pc::kPrefixMatchFrozen>(out); }

pkv_status pkv_prefix_match_init_sized(pkv_prefix_match* out, size_t size) {
  PKV_GUARD(pc::init_sized(out, "out", size, pc::kPrefixMatchV1, "pkv_prefix_match"));
}

pkv_status pkv_seq_match_prefix_partial(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                        uint64_t num_tokens, pkv_prefix_match* out) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    check_tokens(tokens, num_tokens);
    pc::require(out, "out");
    pc::check_struct_size(out->struct_size, pc::kPrefixMatchV1, "out", "pkv_prefix_match",
                          "pkv_prefix_match_init");
    const pagedkv::PrefixMatch m = p.match_prefix_partial(seq, tokens, num_tokens);
    pkv_prefix_match r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.partial_tokens = m.partial_tokens;
    r.num_cached = m.full_tokens + m.partial_tokens;
    // No copy to make (none, or the block was reused in place): both null.
    const bool copy = m.partial_tokens > 0 && m.copy_src != m.copy_dst;
    r.copy_src = copy ? m.copy_src : PKV_NULL_BLOCK;
    r.copy_dst = copy ? m.copy_dst : PKV_NULL_BLOCK;
    pc::write_out(out, r);
  });
}

pkv_status pkv_seq_set_retention(pkv_pool* pool, pkv_seq_id seq, const pkv_retention_range* ranges,
                                 uint64_t num_ranges) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    if (num_ranges > 0) pc::require(ranges, "ranges");
    // An unknown sequence is named first, as by every other seq call: the
    // checks made here, before the pool's own, look it up before failing.
    auto refuse = [&](const std::string& why) {
      (void)p.seq_info(seq);
      fail(Errc::kInvalidArgument, why);
    };
    if (num_ranges > PKV_RETENTION_MAX_RANGES)
      refuse("num_ranges " + str(num_ranges) + " exceeds " + str(PKV_RETENTION_MAX_RANGES));
    std::vector<pagedkv::RetentionRange> rs(num_ranges);
    for (uint64_t i = 0; i < num_ranges; ++i) {
      if (ranges[i].reserved != 0)
        refuse("ranges[" + str(i) + "].reserved is " + str(ranges[i].reserved) + ", not 0");
      rs[i] = {ranges[i].token_begin, ranges[i].token_end, ranges[i].priority,
               ranges[i].duration_ns};
    }
    p.set_retention(seq, rs.data(), rs.size());
  });
}

pkv_status pkv_seq_append_batch(pkv_pool* pool, const pkv_seq_id* seqs, const int32_t* tokens,
                                uint64_t num_seqs) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    if (num_seqs > 0) {
      pc::require(seqs, "seqs");
      pc::require(tokens, "tokens");
    }
    p.append_batch(seqs, tokens, num_seqs);
  });
}

pkv_status pkv_seq_free_batch(pkv_pool* pool, const pkv_seq_id* seqs, uint64_t num_seqs) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    if (num_seqs > 0) pc::require(seqs, "seqs");
    p.free_batch(seqs, num_seqs);
  });
}

pkv_status pkv_seq_match_prefix_hashes(pkv_pool* pool, pkv_seq_id seq, const int32_t* tokens,
                                       uint64_t num_tokens, const pkv_block_hash* hashes,
                                       uint64_t num_hashes, uint64_t* out_num_cached) {
  PKV_GUARD({
    pagedkv::Pool& p = pc::pool_of(pool);
    check_tokens(tokens, num_tokens);
    pc::require(out_num_cached, "out_num_cached");
    const std::vector<pagedkv::BlockHash> hs = pc::block_hashes(p, hashes, num_hashes, num_tokens);
    // A non-NULL pointer selects the hash path even for zero hashes.
    static const pagedkv::BlockHash kNone{};
    *out_num_cached =
        p.match_prefix_hashes(seq, tokens, num_tokens, hs.empty() ? &kNone : hs.data(), hs.size());
  });
}

pkv_status pkv_seq_admit(pkv_pool* pool, const pkv_seq_options* opts, const int32_t* tokens,
                         uint64_t num_tokens, uint32_t num_lookahead, pkv_seq_id* out_seq,
                         uint64_t* out_num_cached) {
  // Its own guard, so that messages name pkv_seq_admit, not the hash variant.
  PKV_GUARD(
      admit(pool, opts, tokens, num_tokens, nullptr, 0, num_lookahead, out_seq, out_num_cached));
}

pkv_status pkv_seq_admit_hashes(pkv_pool* pool, const pkv_seq_options* opts, const int32_t* tokens,
                                uint64_t num_tokens, const pkv_block_hash* hashes,
                                uint64_t num_hashes, uint32_t num_lookahead, pkv_seq_id* out_seq,
                                uint64_t* out_num_cached) {
  PKV_GUARD(admit(pool, opts, tokens, num_tokens, hashes, num_hashes, num_lookahead, out_seq,
                  out_num_cached));
}

}  // extern "C"
