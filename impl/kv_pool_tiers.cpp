// The pool's offload tiers (pkv_pool_attach_tiers): evicted cached blocks
// go to host memory (and a file) through impl/tier/; a tiered prefix match
// continues the device hits with tier hits, loaded into fresh blocks before
// anything reads them. DESIGN.md §9: tiers move written blocks only, carry
// a checksum, and turn a mismatch or an I/O error into a miss.
#include <algorithm>

#include "kv_pool.h"
#include "seq_util.h"

namespace pagedkv {

using seq_util::grow;
using seq_util::str;

void Pool::attach_tiers(const TierOptions& o) {
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  if (!has_storage())
    fail(Errc::kInvalidState,
         "the pool has no KV storage (created with num_layers 0): a manager-only pool has no "
         "blocks to offload");
  if (!blocks_.caching())
    fail(Errc::kInvalidState,
         "prefix caching is off (enable_prefix_caching 0): nothing is cached "
         "to offload");
  if (tiers_) fail(Errc::kInvalidState, "the pool already has tiers (attach them once)");
  if (o.flags != 0) fail(Errc::kInvalidArgument, "flags " + str(o.flags) + " is not 0");
  if (o.file_dir.empty() && o.file_bytes != 0)
    fail(Errc::kInvalidArgument,
         "file_bytes " + str(o.file_bytes) + " is set but file_dir is NULL or empty");
  // The backend decides how bytes move: the CPU backend's storage is host
  // memory the copy thread copies itself; a CUDA pool's tiers queue copies
  // between the device and page-locked slots (tier_set.h).
  tiers_ = std::make_unique<TierSet>(o, arena_, arena_hold_, opts_.block_size,
                                     size_t(opts_.num_blocks), backend_);
  blocks_.set_evict_sink(tiers_.get());
}

Pool::TierHits Pool::find_tier_hits(const HashContext& ctx, const int32_t* tokens, uint64_t first,
                                    uint64_t room, const BlockHash& parent,
                                    const BlockHash* given) {
  TierHits found;
  if (!tiers_ || room == 0) return found;
  const uint64_t bs = opts_.block_size;
  try {
    found.reserve(room);
    for (uint64_t j = first; found.size() < room; ++j) {
      const BlockHash h = given ? given[j]
                                : hasher_->hash(found.empty() ? parent : found.back().first,
                                                tokens + j * bs, bs, ctx, j * bs);
      const TierRef t = tiers_->lookup_pin(h);
      if (t.slot < 0) break;
      found.emplace_back(h, t);
    }
  } catch (...) {
    for (const auto& f : found) tiers_->unpin(f.second);
    throw;
  }
  return found;
}

void Pool::attach_tier_hits(Sequence& s, const TierHits& hits, TieredMatch& r) noexcept {
  // The blocks are cached now (a lookup skips them until their load wrote
  // them) and count as cached tokens, not yet as computed ones
  // (pkv_seq_info.num_computed_tokens).
  const uint32_t bs = opts_.block_size;
  for (const auto& [h, ref] : hits) {
    const size_t j = s.blocks.size();
    const int32_t b = blocks_.allocate();
    blocks_.set_fill(b, bs);
    s.blocks.push_back(b);
    blocks_.cache_block(b, h, j ? &s.hashes[j - 1] : nullptr, bs, s.ctx.lora_id,
                        s.tokens.data() + j * bs);
    if (blocks_.retention()) assign_priority(s, j, true);
    pending_loads_.push_back({b, h, ref});
    (ref.medium == Medium::kHost ? r.host : r.file) += bs;
  }
}

TieredMatch Pool::match_prefix_tiered(SeqId id, const int32_t* tokens, uint64_t n,
                                      const BlockHash* given, uint64_t num_given) {
  std::lock_guard<OpMutex> lock(mu_);
  TieredMatch r;
  r.device = match_locked(id, tokens, n, false, given, num_given).full_tokens;
  if (!tiers_ || n == 0 || !blocks_.caching()) return r;
  Sequence& s = *seqs_.find(id);  // match_locked checked it
  const uint64_t bs = opts_.block_size, first = s.blocks.size();
  // As far as find_hits looked (given hashes: their checked range).
  const uint64_t max_blocks = given ? std::min((n - 1) / bs, num_given) : (n - 1) / bs;
  const uint64_t room =
      std::min<uint64_t>(uint64_t(blocks_.num_free()), max_blocks > first ? max_blocks - first : 0);
  if (room == 0) return r;
  // Look the chain up in the tiers, pinning what is found so the copy
  // thread cannot evict it before its load; then make room for everything
  // the commit does. A failure here keeps the device hits (already
  // attached) and unpins: the tiers are an optimisation, never an error.
  TierHits found;
  try {
    found = find_tier_hits(s.ctx, tokens, first, room, first ? s.hashes[first - 1] : root_, given);
    if (found.empty()) return r;
    grow(s.blocks, first + found.size());
    grow(s.hashes, first + found.size());
    grow(s.tokens, (first + found.size()) * bs);
    grow(pending_loads_, pending_loads_.size() + found.size());
    blocks_.reserve_events(2 * found.size());  // an eviction and a store per block
  } catch (...) {
    for (const auto& f : found) tiers_->unpin(f.second);
    return r;
  }
  // Commit: nothing below throws.
  for (const auto& f : found) s.hashes.push_back(f.first);
  s.tokens.insert(s.tokens.end(), tokens + first * bs, tokens + (first + found.size()) * bs);
  attach_tier_hits(s, found, r);
  const uint64_t got = found.size() * bs;
  s.num_cached += got;
  num_tokens_ += got;
  prefix_hit_tokens_ += got;
  ++s.version;
  ++s.table_version;
  return r;
}

void Pool::settle_tiers_slow(void* stream) {
  // CPU: waits for the queued offloads. CUDA: waits until they were issued
  // and orders stream (whose work writes the storage next) after them.
  tiers_->flush(stream);
  if (!pending_loads_.empty()) {
    // Copy-on-write copies recorded before a load read and write blocks as
    // they were then: a copy's source or destination may since have been
    // freed and taken by a tier hit, so they run before the loads write
    // into those blocks (after the offloads above read what they evict).
    run_pending_copies(stream);
    const uint32_t bs = opts_.block_size;
    // Loads write into the storage: exclusive of every kernel (CUDA: of
    // every launch; the copies are queued on stream, before the plan's).
    std::unique_lock<std::shared_mutex> kv(kv_mu_);
    tiers_->begin_loads(stream);
    for (const PendingLoad& l : pending_loads_) {
      // The sequence that took the hit may have gone (or truncated into
      // the block) since: then the block is no longer waiting for it.
      const bool waiting = blocks_.ref(l.block) > 0 && blocks_.hash(l.block) == l.hash &&
                           blocks_.written(l.block) == 0;
      if (!waiting) {
        tiers_->unpin(l.ref);
      } else if (tiers_->load(l.ref, l.block, l.hash)) {
        blocks_.set_written(l.block, bs);
      } else {
        // Never served: the block stays unwritten and leaves the cache, so
        // a plan over it fails and the engine computes those tokens.
        blocks_.uncache_block(l.block);
      }
    }
    tiers_->end_loads();
    pending_loads_.clear();
  }
  pull_tier_events();
}

void Pool::pull_tier_events() noexcept {
  if (!tiers_) return;
  tiers_->take_events(&tier_events_);
  for (const Event& e : tier_events_) events_.push(e);
  tier_events_.clear();
}

void Pool::flush_tiers() {
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  if (!tiers_) return;
  // Pending loads go on the stream the pool last planned on (no stream is
  // given here); then everything completes, on the host.
  settle_tiers_slow(tiers_->source_stream());
  tiers_->wait_idle();
  pull_tier_events();
}

TierStats Pool::tier_stats(uint32_t medium) const {
  OpMutex::ConstGuard lock(mu_);
  check_open();
  if (medium != uint32_t(Medium::kHost) && medium != uint32_t(Medium::kFile))
    fail(Errc::kInvalidArgument,
         "medium " + str(medium) + " is neither PKV_MEDIUM_HOST nor PKV_MEDIUM_FILE");
  if (!tiers_ || !tiers_->has(Medium(medium)))
    fail(Errc::kInvalidState, std::string("the pool has no ") +
                                  (medium == uint32_t(Medium::kHost) ? "host" : "file") +
                                  " tier (pkv_pool_attach_tiers)");
  return tiers_->stats(Medium(medium));
}

}  // namespace pagedkv
