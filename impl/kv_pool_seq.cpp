// Sequence operations of the pool: create, match_prefix, append (with
// copy-on-write and the sliding window), fork, truncate, free.
#include <algorithm>
#include <chrono>
#include <limits>
#include <tuple>

#include "key_domains.h"
#include "kv_pool.h"
#include "seq_util.h"

namespace pagedkv {

namespace {

using seq_util::grow;
using seq_util::kMaxReserveTokens;
using seq_util::kMaxSeqTokens;
using seq_util::str;

// Blocks of requests without LoRA, multimodal items or (past the first
// block) salt hash with no extra keys: the plain overload is the faster one.
const std::vector<ExtraKey> kNoExtraKeys;
bool no_extra_keys(const HashContext& c, uint64_t start) {
  return c.lora_id == 0 && c.lora_name.empty() && c.mm_items.empty() &&
         (c.cache_salt.empty() || start > 0);
}

}  // namespace

Sequence& Pool::seq_or_throw(SeqId id) {
  check_open();
  Sequence* s = seqs_.find(id);
  if (!s) fail(Errc::kNotFound, unknown_seq(id, tag()));
  return *s;
}

const Sequence& Pool::seq_or_throw(SeqId id) const {
  return const_cast<Pool*>(this)->seq_or_throw(id);
}

size_t Pool::hash_new_blocks(Sequence& s) {
  const size_t first = s.hashes.size();
  if (!blocks_.caching()) return first;
  const uint64_t bs = opts_.block_size;
  const uint64_t full = div_bs(s.tokens.size());
  if (full <= first) return first;
  grow(s.hashes, full);
  try {
    for (uint64_t j = first; j < full; ++j) {
      const BlockHash& parent = j ? s.hashes[j - 1] : root_;
      s.hashes.push_back(no_extra_keys(s.ctx, j * bs)
                             ? hasher_->hash(parent, s.tokens.data() + j * bs, bs, kNoExtraKeys)
                             : hasher_->hash(parent, s.tokens.data() + j * bs, bs, s.ctx, j * bs));
    }
  } catch (...) {
    s.hashes.resize(first);
    throw;
  }
  return first;
}

void Pool::cache_new_blocks(const Sequence& s, size_t from) noexcept {
  const uint32_t bs = opts_.block_size;
  for (size_t j = from; j < s.hashes.size(); ++j) {
    blocks_.cache_block(s.blocks[j], s.hashes[j], j ? &s.hashes[j - 1] : nullptr, bs, s.ctx.lora_id,
                        s.tokens.data() + j * bs);
    if (blocks_.retention()) assign_priority(s, j, blocks_.ref(s.blocks[j]) == 1);
  }
}

size_t Pool::count_unwritten(const Sequence& s, size_t begin, size_t end) const {
  size_t count = 0;
  end = std::min(end, s.blocks.size());
  for (size_t j = begin; j < end; ++j) {
    const int32_t b = s.blocks[j];
    count += b != BlockPool::kNullBlock && blocks_.ref(b) == 1 && !blocks_.hash(b).empty() &&
             !blocks_.fully_written(b);
  }
  return count;
}

void Pool::uncache_unwritten(const Sequence& s, size_t begin, size_t end) noexcept {
  // Blocks we hold alone are about to enter the free queue, where a later
  // lookup would find them: one whose K/V no committed step (copy, swap-in)
  // wrote leaves the cache (REMOVED) and goes to the head of the queue. A
  // block another sequence holds keeps its hash: that holder may still
  // write it, and lookups skip it until then.
  end = std::min(end, s.blocks.size());
  for (size_t j = begin; j < end; ++j) {
    const int32_t b = s.blocks[j];
    if (b != BlockPool::kNullBlock && blocks_.ref(b) == 1 && !blocks_.fully_written(b))
      blocks_.uncache_block(b);
  }
}

uint64_t Pool::computed_tokens(const Sequence& s, uint64_t from) const {
  const uint64_t bs = opts_.block_size, n = s.tokens.size();
  for (size_t j = std::max<uint64_t>(s.num_null, div_bs(from)); j < s.blocks.size(); ++j) {
    const uint32_t w = blocks_.written(s.blocks[j]);
    if (w < bs) return std::min<uint64_t>(n, j * bs + w);
  }
  return std::min<uint64_t>(n, s.blocks.size() * bs);
}

void Pool::release_blocks_reverse(const std::vector<int32_t>& blocks, size_t begin,
                                  size_t end) noexcept {
  BlockPool::ReleaseBatch batch(blocks_);
  for (size_t j = end; j-- > begin;)
    if (blocks[j] != BlockPool::kNullBlock) blocks_.release(blocks[j]);
}

HashContext make_hash_context(const PoolOptions& opts, const SeqOptions& o) {
  uint64_t prev_end = 0;
  for (size_t i = 0; i < o.mm_items.size(); ++i) {
    const MmItem& m = o.mm_items[i];
    std::string at = "mm_items[" + str(i) + "]";
    if (m.hash.empty()) fail(Errc::kInvalidArgument, at + ".hash is empty");
    if (m.length == 0) fail(Errc::kInvalidArgument, at + ".length is 0");
    if (m.offset + m.length < m.offset)
      fail(Errc::kInvalidArgument, at + " offset + length overflows");
    if (i > 0 && m.offset < prev_end)
      fail(Errc::kInvalidArgument, at + " starts at " + str(m.offset) +
                                       ", before the previous item ends (" + str(prev_end) +
                                       "): items must be sorted and non-overlapping");
    prev_end = m.offset + m.length;
  }
  HashContext ctx;
  ctx.algo = opts.hash_algo;
  ctx.block_size = opts.block_size;
  ctx.lora_id = o.lora_id;
  ctx.lora_name = o.lora_name;
  ctx.cache_salt = o.cache_salt;
  ctx.mm_items = o.mm_items;
  if (opts.strict_key_domains) apply_strict_key_domains(ctx);
  if (opts.tagged_keys) {
    ctx.tagged = true;
    ctx.lora_path = o.lora_path;
  }
  return ctx;
}

HashContext Pool::make_ctx(const SeqOptions& o) const { return make_hash_context(opts_, o); }

SeqId Pool::seq_create(const SeqOptions& o, bool hidden) {
  HashContext ctx = make_ctx(o);
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  if (seqs_.full()) fail(Errc::kOutOfMemory, "the pool's sequence table is full");
  SeqId id;
  Sequence& s = seqs_.add(&id);
  s.ctx = std::move(ctx);
  s.priority = o.priority;
  if (hidden) seqs_.set_hidden(id, true);
  return id;
}

void Pool::find_hits(const HashContext& ctx, const int32_t* tokens, uint64_t n,
                     const BlockHash* given, uint64_t num_given, HashVector& hashes,
                     std::vector<int32_t>& hits) const {
  if (!blocks_.caching() || n == 0) return;
  const uint64_t bs = opts_.block_size;
  const uint64_t max_blocks = given ? std::min((n - 1) / bs, num_given) : (n - 1) / bs;
  const auto hash_at = [&](uint64_t j, const BlockHash& parent) {
    return hasher_->hash(parent, tokens + j * bs, bs, ctx, j * bs);
  };
  if (given && max_blocks > 0) {
    // The engine hashed the prompt at arrival: the cache key carries its
    // domain (seed, algorithm, key-domain mode, salt, LoRA, multimodal
    // items), so one computed for another domain must not be used here.
    // Two links are recomputed (not the whole chain, which is what the
    // caller saves): the first block, which carries every key of the
    // sequence, and the last one used.
    if (hash_at(0, root_) != given[0])
      fail(Errc::kInvalidArgument,
           "hashes[0] is not the hash of the first block of tokens for this pool and sequence "
           "(another seed, algorithm, key-domain mode, cache salt, LoRA or multimodal item?)");
    const uint64_t last = max_blocks - 1;
    if (last > 0 && hash_at(last, given[last - 1]) != given[last])
      fail(Errc::kInvalidArgument, "hashes[" + str(last) + "] does not chain from hashes[" +
                                       str(last - 1) + "] over tokens [" + str(last * bs) + ", " +
                                       str((last + 1) * bs) + ")");
  }
  for (uint64_t j = 0; j < max_blocks; ++j) {
    BlockHash h = given ? given[j] : hash_at(j, j ? hashes.back() : root_);
    int32_t b = blocks_.lookup_written(h);  // never a block nobody wrote
    if (b < 0) break;
    if (j == 0) {
      hits.reserve(max_blocks);
      hashes.reserve(max_blocks);
    }
    hashes.push_back(h);
    hits.push_back(b);
  }
}

uint64_t Pool::match_prefix(SeqId id, const int32_t* tokens, uint64_t n) {
  return match_prefix_hashes(id, tokens, n, nullptr, 0);
}

uint64_t Pool::match_prefix_hashes(SeqId id, const int32_t* tokens, uint64_t n,
                                   const BlockHash* given, uint64_t num_given) {
  std::lock_guard<OpMutex> lock(mu_);
  return match_locked(id, tokens, n, false, given, num_given).full_tokens;
}

PrefixMatch Pool::match_prefix_partial(SeqId id, const int32_t* tokens, uint64_t n) {
  std::lock_guard<OpMutex> lock(mu_);
  return match_locked(id, tokens, n, opts_.enable_partial_reuse, nullptr, 0);
}

std::pair<int32_t, uint32_t> Pool::find_partial(const Sequence& s, const int32_t* tokens,
                                                uint64_t n) const {
  const uint64_t bs = opts_.block_size, m = s.blocks.size(), hit = m * bs;
  // At least one token is left to compute, and a whole block would have
  // been a full hit.
  const uint64_t cap = std::min<uint64_t>(bs - 1, n - 1 - hit);
  if (cap == 0) return {-1, 0};
  const BlockHash* parent = m ? &s.hashes[m - 1] : nullptr;
  const int32_t* q = tokens + hit;
  std::vector<std::tuple<uint32_t, int32_t, const int32_t*>>
      found;  // (matching tokens, block, its tokens)
  // Children of a popular prefix can be many (every request that diverges
  // right after a system prompt): the scan is bounded.
  constexpr size_t kMaxCandidates = 256;
  blocks_.for_each_child(parent, kMaxCandidates, [&](int32_t b, const int32_t* bt) {
    uint32_t c = 0;
    while (c < cap && bt[c] == q[c]) ++c;
    if (c > 0) found.emplace_back(c, b, bt);
  });
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) > std::get<0>(b)
                                            : std::get<1>(a) < std::get<1>(b);
  });
  for (const auto& [c, b, bt] : found) {
    // Equal parents and tokens are not enough: the block's extra keys (a
    // first block's salt, LoRA, multimodal items) must be the request's,
    // or its K/V is another tenant's or another adapter's. Rehashing the
    // candidate's own tokens under the request's keys must give its hash.
    if (hasher_->hash(parent ? *parent : root_, bt, bs, s.ctx, hit) == blocks_.hash(b))
      return {b, c};
  }
  return {-1, 0};
}

PrefixMatch Pool::match_locked(SeqId id, const int32_t* tokens, uint64_t n, bool partial,
                               const BlockHash* given, uint64_t num_given) {
  Sequence& s = seq_or_throw(id);
  if (!s.tokens.empty() || !s.blocks.empty())
    fail(Errc::kInvalidState, seq_name(id) + " already holds " + str(s.tokens.size()) +
                                  " tokens; match_prefix needs an empty sequence");
  if (n > kMaxSeqTokens) fail(Errc::kInvalidArgument, "num_tokens " + str(n) + " exceeds 2^31 - 1");
  PrefixMatch r;
  const uint64_t bs = opts_.block_size;
  if (given && num_given > n / bs)
    fail(Errc::kInvalidArgument, "num_hashes " + str(num_given) + " exceeds the " + str(n / bs) +
                                     " full blocks of num_tokens " + str(n));
  if (!blocks_.caching() || n == 0) {
    prefix_query_tokens_ += n;
    return r;
  }
  tick();
  std::pair<int32_t, uint32_t> part{-1, 0};
  // Look up into the sequence's empty vectors (what can throw), undone on
  // failure; the hits are attached only when all of it worked.
  try {
    find_hits(s.ctx, tokens, n, given, num_given, s.hashes, s.blocks);
    if (partial) part = find_partial(s, tokens, n);
    if (part.second) {
      s.blocks.reserve(s.blocks.size() + 1);
      grow(blocks_.pending_copies(), blocks_.pending_copies().size() + 1);
      blocks_.reserve_events(1);  // the eviction of the block it takes
    }
    s.tokens.reserve(s.blocks.size() * bs + part.second);
  } catch (...) {
    s.blocks.clear();
    s.hashes.clear();
    throw;
  }
  // Commit: nothing below throws.
  const uint64_t hit = s.blocks.size() * bs;
  s.tokens.assign(tokens, tokens + hit);
  for (int32_t b : s.blocks) blocks_.touch(b);
  if (blocks_.retention())
    for (size_t j = 0; j < s.blocks.size(); ++j) assign_priority(s, j, false);
  r.full_tokens = hit;
  // The hits left the free queue: the partial hit needs one more block.
  if (const uint32_t k = part.second; k > 0 && blocks_.num_free() > 0) {
    // The first k slots of the cached block are ours: a fresh block gets
    // a copy of them (run before the next step's writes, as copy-on-write
    // copies are; an engine without pool storage is told to make it). If
    // the fresh block is the cached one itself (it was next in the free
    // queue), its slots already hold them.
    const int32_t src = part.first, dst = blocks_.allocate();
    if (dst != src) blocks_.add_pending_copy(src, dst);
    blocks_.set_fill(dst, k);
    blocks_.set_written(dst, k);
    s.blocks.push_back(dst);
    s.tokens.insert(s.tokens.end(), tokens + hit, tokens + hit + k);
    r.partial_tokens = k;
    r.copy_src = src;
    r.copy_dst = dst;
    ++num_partial_hits_;
    partial_hit_tokens_ += k;
  }
  const uint64_t got = hit + r.partial_tokens;
  s.num_cached = s.num_committed = got;  // hits hold written K/V
  num_tokens_ += got;
  prefix_query_tokens_ += n;
  prefix_hit_tokens_ += got;
  if (got) {
    ++s.version;
    ++s.table_version;
  }
  return r;
}

uint64_t Pool::now_ns() const {
  if (manual_clock_) return manual_now_ns_;
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

void Pool::set_clock(uint64_t t) {
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  manual_clock_ = true;
  manual_now_ns_ = std::max(manual_now_ns_, t);  // a clock never runs back
  tick();
}

std::pair<uint32_t, uint64_t> Pool::block_retention(const Sequence& s, size_t j) const {
  const uint64_t bs = opts_.block_size, lo = j * bs, hi = lo + bs;
  bool any = false;
  uint32_t p = kPriorityDefault;
  uint64_t d = 0;
  // The block gets the highest priority of the ranges touching it (a range
  // ending mid-block keeps the whole block: its first tokens need it).
  for (const RetentionRange& r : s.retention) {
    if (r.begin >= hi || r.end <= lo) continue;
    if (!any || r.priority > p ||
        (r.priority == p && d != 0 && (r.duration_ns == 0 || r.duration_ns > d))) {
      p = r.priority;
      d = r.duration_ns;
    }
    any = true;
  }
  return {p, any ? d : 0};
}

void Pool::assign_priority(const Sequence& s, size_t j, bool filled) noexcept {
  const int32_t b = s.blocks[j];
  if (b == BlockPool::kNullBlock || blocks_.hash(b).empty()) return;
  auto [p, d] = block_retention(s, j);
  const uint32_t cur = blocks_.priority(b);
  if (!filled) {
    if (p < cur) return;
    if (p == cur) {  // the longer of the two durations (0 = for good)
      const uint64_t cd = blocks_.priority_duration(b);
      d = (d == 0 || cd == 0) ? 0 : std::max(d, cd);
    }
  }
  if (p == kPriorityPinned && cur != kPriorityPinned &&
      blocks_.num_pinned() >= blocks_.max_pinned()) {
    // The pinning budget is spent: the block gets the highest priority that
    // can still be evicted (pool.h, max_pinned_blocks).
    p = kPriorityPinned - 1;
    ++num_pins_degraded_;
    if (!filled && p < cur) return;
  }
  blocks_.set_priority(b, p, d);
}

void Pool::set_retention(SeqId id, const RetentionRange* ranges, uint64_t n) {
  std::lock_guard<OpMutex> lock(mu_);
  Sequence& s = seq_or_throw(id);
  if (!blocks_.retention())
    fail(Errc::kInvalidState, "the pool was created without enable_retention");
  if (n > kMaxRetentionRanges)
    fail(Errc::kInvalidArgument, "num_ranges " + str(n) + " exceeds " + str(kMaxRetentionRanges));
  bool pins = false;
  for (uint64_t i = 0; i < n; ++i) {
    const RetentionRange& r = ranges[i];
    const std::string at = "ranges[" + str(i) + "]";
    if (r.begin >= r.end)
      fail(Errc::kInvalidArgument,
           at + ".token_begin " + str(r.begin) + " is not below its token_end " + str(r.end));
    if (r.priority > kPriorityPinned)
      fail(Errc::kInvalidArgument, at + ".priority " + str(r.priority) + " is outside [0, 100]");
    pins |= r.priority == kPriorityPinned;
  }
  std::vector<RetentionRange> next(ranges, ranges + n);  // may throw: first
  tick();
  // Pins the budget cannot hold are refused here, where the caller can act
  // on it; blocks the sequence caches later degrade instead (pool.h).
  next.swap(s.retention);  // no allocation: swapped back on refusal
  // A block the sequence filled and holds alone takes the new ranges'
  // priority exactly, lower ones and an unpin included (pool.h); its prefix
  // hits and blocks others share only ever rise, as at caching.
  const uint64_t hits = div_bs(s.num_cached);
  const auto own = [&](size_t j) { return j >= hits && blocks_.ref(s.blocks[j]) == 1; };
  // The pins the new ranges drop from the sequence's own blocks come back to
  // the budget in this call: moving a pin between its blocks needs no room.
  uint64_t new_pins = 0, dropped_pins = 0;
  for (size_t j = 0; j < s.blocks.size(); ++j) {
    const int32_t b = s.blocks[j];
    if (b == BlockPool::kNullBlock || blocks_.hash(b).empty()) continue;
    const bool was = blocks_.priority(b) == kPriorityPinned;
    const bool will = block_retention(s, j).first == kPriorityPinned;
    new_pins += !was && will;
    dropped_pins += was && !will && own(j);
  }
  if ((pins && blocks_.max_pinned() == 0) ||
      blocks_.num_pinned() - dropped_pins + new_pins > blocks_.max_pinned()) {
    s.retention.swap(next);
    fail(Errc::kOutOfBlocks,
         "ranges pin " + str(new_pins) + " more cached blocks of " + seq_name(id) +
             (dropped_pins ? " (and unpin " + str(dropped_pins) + ")" : "") + " but " +
             str(blocks_.num_pinned()) + " of max_pinned_blocks " + str(blocks_.max_pinned()) +
             " are pinned" + (blocks_.max_pinned() == 0 ? " (pinning is off)" : ""));
  }
  // Unpins before pins, so that a pin the budget holds once the dropped
  // ones are back is not degraded for being assigned first.
  for (bool pinning : {false, true})
    for (size_t j = 0; j < s.blocks.size(); ++j)
      if ((block_retention(s, j).first == kPriorityPinned) == pinning)
        assign_priority(s, j, own(j));
}

void Pool::priority_counts(uint64_t* out) const {
  OpMutex::ConstGuard lock(mu_);
  check_open();
  const_cast<Pool*>(this)->tick();  // what the clock already decided
  blocks_.priority_counts(out);
}

Pool::AppendNeed Pool::append_need(const Sequence& s, uint64_t n, uint32_t lookahead) const {
  const uint64_t n0 = s.tokens.size();
  if (n > kMaxSeqTokens || n0 + n + lookahead > kMaxSeqTokens)
    fail(Errc::kInvalidArgument, "the sequence would hold " + str(n0) + " + " + str(n) + " + " +
                                     str(lookahead) + " slots, more than 2^31 - 1");
  const uint64_t bs = opts_.block_size;
  const uint64_t nb = s.blocks.size();
  AppendNeed need;
  const uint64_t want = div_bs(n0 + n + lookahead + bs - 1);
  need.fresh = want > nb ? want - nb : 0;
  if (n > 0 && s.tail_shared) {
    // Existing blocks that this append writes into and others share.
    const uint64_t last = std::min<uint64_t>(nb, div_bs(n0 + n + bs - 1));
    for (uint64_t j = div_bs(n0); j < last; ++j)
      if (blocks_.ref(s.blocks[j]) > 1) ++need.cow;
  }
  need.window_first = need.window_end = s.num_null;
  const uint64_t w = opts_.sliding_window;
  // The next plan's first query is at the latest the first position no
  // committed step covered (num_committed, at most n0): it sees keys
  // > q0 - w, so blocks wholly before q0 - w + 1 are never read again.
  // Positions appended but not yet computed keep their keys (a step that
  // was prepared and aborted computed nothing). Without new tokens nothing
  // is released, so the last token stays queryable.
  const uint64_t q0 = std::min(n0, s.num_committed);
  if (w > 0 && n > 0 && q0 + 1 > w) {
    const uint64_t end = std::min<uint64_t>(nb, (q0 + 1 - w) / bs);
    for (uint64_t j = s.num_null; j < end; ++j)
      // A pinned block released here stays cached in the held level: it
      // frees nothing for the allocations.
      if (blocks_.ref(s.blocks[j]) == 1 && !blocks_.held(s.blocks[j])) ++need.window_gain;
    need.window_end = std::max(end, need.window_first);
  }
  return need;
}

void Pool::append(SeqId id, const int32_t* tokens, uint64_t n, uint32_t lookahead) {
  std::lock_guard<OpMutex> lock(mu_);
  Sequence& s = seq_or_throw(id);
  tick();
  if (n == 1 && lookahead == 0 && !s.tail_shared && opts_.sliding_window == 0 &&
      s.tokens.size() < kMaxSeqTokens) {
    // Decode fast path: one token into a tail that is ours alone (no copy,
    // no cached hash to drop), at most one new block.
    const uint64_t n0 = s.tokens.size();
    const uint64_t j = div_bs(n0);
    const bool new_block = j >= s.blocks.size();
    if (!new_block || blocks_.num_free() > 0) {
      const bool fills = div_bs(n0 + 1) > j;  // this token fills a block
      grow(s.tokens, n0 + 1);
      if (!new_block && !fills) {  // most decode appends: nothing else can fail
        s.tokens.push_back(tokens[0]);
        clamp_written(s.blocks[j], n0 - j * opts_.block_size);
        blocks_.add_filled_slot(s.blocks[j]);
        ++num_tokens_;
        ++s.version;
        return;
      }
      // What can throw first: room in the vectors and for events, the hash.
      if (new_block) grow(s.blocks, s.blocks.size() + 1);
      if (new_block || fills) blocks_.reserve_events(2);
      s.tokens.push_back(tokens[0]);
      size_t h0 = s.hashes.size();
      if (fills) {
        try {
          h0 = hash_new_blocks(s);
        } catch (...) {
          s.tokens.pop_back();
          throw;
        }
      }
      if (new_block) {
        s.blocks.push_back(blocks_.allocate());
        s.bump_table_appended();
      }
      clamp_written(s.blocks[j], n0 - j * opts_.block_size);
      blocks_.add_filled_slot(s.blocks[j]);
      if (fills) cache_new_blocks(s, h0);
      ++num_tokens_;
      ++s.version;
      return;
    }
  }
  const AppendNeed need = append_need(s, n, lookahead);
  const uint64_t take = need.fresh + need.cow;
  const uint64_t avail = uint64_t(blocks_.num_free()) + need.window_gain;
  if (take > avail)
    fail(Errc::kOutOfBlocks, seq_name(id) + " needs " + str(take) + " blocks for " + str(n) +
                                 " tokens + " + str(lookahead) + " lookahead; " + str(avail) +
                                 " are free");
  if (n == 0 && need.fresh == 0 && need.window_end == need.window_first) return;  // no change
  const uint64_t n0 = s.tokens.size();
  // Everything that can throw comes first: room in every vector that grows
  // and for the events (an eviction per block taken, a dropped and a new
  // hash per block written), then the new tokens and their hashes, taken
  // back on failure. The commit below cannot fail half-way.
  grow(s.tokens, n0 + n);
  grow(s.blocks, s.blocks.size() + need.fresh);
  if (need.cow) grow(blocks_.pending_copies(), blocks_.pending_copies().size() + need.cow);
  blocks_.reserve_events(take + 2 * (div_bs(n) + 2) + (need.window_end - need.window_first));
  s.tokens.insert(s.tokens.end(), tokens, tokens + n);
  size_t h0;
  try {
    h0 = hash_new_blocks(s);
  } catch (...) {
    s.tokens.resize(n0);
    throw;
  }

  apply_append(s, n0, n, need, h0);
}

void Pool::apply_append(Sequence& s, uint64_t n0, uint64_t n, const AppendNeed& need,
                        size_t h0) noexcept {
  const uint64_t bs = opts_.block_size;
  bool replaced = need.window_end > need.window_first;  // a block of the table changed
  // 1. Sliding window: release what no query will read again, tail first.
  uncache_unwritten(s, need.window_first, need.window_end);  // none while the invariants hold
  {
    BlockPool::ReleaseBatch batch(blocks_);
    for (uint64_t j = need.window_end; j-- > need.window_first;) {
      blocks_.release(s.blocks[j]);
      s.blocks[j] = BlockPool::kNullBlock;
    }
  }
  s.num_null = need.window_end;

  // 2. Blocks this append writes into: shared ones are copied first
  // (copy-on-write), exclusive ones drop a cached hash their new content
  // will no longer match.
  if (n > 0 && s.tail_shared) {
    const uint64_t last = std::min<uint64_t>(s.blocks.size(), div_bs(n0 + n + bs - 1));
    for (uint64_t j = div_bs(n0); j < last; ++j) {
      const int32_t b = s.blocks[j];
      if (blocks_.ref(b) > 1) {
        const int32_t fresh = blocks_.allocate();
        if (j * bs < n0) {  // it holds tokens of ours: their KV must follow
          blocks_.add_pending_copy(b, fresh);
          blocks_.set_written(fresh, blocks_.written(b));  // the copy carries them
          ++num_cow_copies_;
        }
        blocks_.release(b);
        s.blocks[j] = fresh;
        replaced = true;
      } else if (!blocks_.hash(b).empty()) {
        blocks_.uncache_block(b);
      }
    }
  }

  // 3. New blocks at the end of the table.
  for (uint64_t i = 0; i < need.fresh; ++i) s.blocks.push_back(blocks_.allocate());

  // 4. The blocks written hold the new tokens (all ours alone now); the
  // blocks they fill enter the prefix cache.
  // Slots that receive new tokens hold no K/V of them yet.
  for (uint64_t j = div_bs(n0), end = n0 + n; n > 0 && j * bs < end; ++j) {
    blocks_.set_fill(s.blocks[j], uint32_t(std::min<uint64_t>(bs, end - j * bs)));
    clamp_written(s.blocks[j], j * bs < n0 ? n0 - j * bs : 0);
  }
  cache_new_blocks(s, h0);
  if (s.tail_shared && tail_is_exclusive(s)) {
    // The tail became ours alone because its other holders went away. A
    // shared block's fill is its fullest holder's, which may be more than
    // we hold (we truncated into it): it must be ours before the decode
    // fast path counts single slots on top of it.
    settle_tail_fill(s);
    s.tail_shared = false;
  }
  num_tokens_ += n;
  ++s.version;
  if (replaced)
    ++s.table_version;
  else
    s.bump_table_appended();
}

void Pool::settle_tail_fill(const Sequence& s) noexcept {
  const uint64_t bs = opts_.block_size, n = s.tokens.size();
  for (size_t j = div_bs(n); j < s.blocks.size(); ++j)
    if (s.blocks[j] != BlockPool::kNullBlock)
      blocks_.set_fill(s.blocks[j], uint32_t(j * bs < n ? n - j * bs : 0));
}

bool Pool::tail_is_exclusive(const Sequence& s) const {
  for (size_t j = div_bs(s.tokens.size()); j < s.blocks.size(); ++j) {
    const int32_t b = s.blocks[j];
    if (b != BlockPool::kNullBlock && (blocks_.ref(b) > 1 || !blocks_.hash(b).empty()))
      return false;
  }
  return true;
}

uint64_t Pool::blocks_needed(SeqId id, uint64_t n, uint32_t lookahead) const {
  OpMutex::ConstGuard lock(mu_);
  const Sequence& s = seq_or_throw(id);
  const AppendNeed need = append_need(s, n, lookahead);
  // Net of what the window gives back first, as append counts it: the
  // append fits exactly when this is at most the free blocks.
  const uint64_t take = need.fresh + need.cow;
  return take > need.window_gain ? take - need.window_gain : 0;
}

SeqId Pool::fork(SeqId parent, bool hidden) {
  std::lock_guard<OpMutex> lock(mu_);
  Sequence& p = seq_or_throw(parent);
  if (seqs_.full()) fail(Errc::kOutOfMemory, "the pool's sequence table is full");
  // Copy before inserting so that a failed allocation leaves no half child.
  Sequence copy(&token_arena_);  // its vectors are swapped into the new slot
  copy.tokens = p.tokens;
  copy.blocks = p.blocks;
  copy.hashes = p.hashes;
  copy.ctx = p.ctx;
  copy.retention = p.retention;
  SeqId cid;
  Sequence& c = seqs_.add(&cid);
  c.tokens.swap(copy.tokens);
  c.blocks.swap(copy.blocks);
  c.hashes.swap(copy.hashes);
  c.ctx = std::move(copy.ctx);
  c.retention.swap(copy.retention);
  c.priority = p.priority;
  c.num_cached = p.num_cached;
  c.num_committed = p.num_committed;
  c.num_null = p.num_null;
  num_tokens_ += c.tokens.size();
  for (int32_t b : c.blocks)
    if (b != BlockPool::kNullBlock) blocks_.share(b);
  p.tail_shared = c.tail_shared = true;
  if (hidden) seqs_.set_hidden(cid, true);
  return cid;
}

void Pool::reserve(SeqId id, uint64_t n) {
  std::lock_guard<OpMutex> lock(mu_);
  Sequence& s = seq_or_throw(id);
  if (n > kMaxSeqTokens) fail(Errc::kInvalidArgument, "num_tokens " + str(n) + " exceeds 2^31 - 1");
  const uint64_t bs = opts_.block_size;
  // No more than the sequence could ever hold: without a sliding window each
  // of its blocks is a distinct one of the pool's (a huge count from a
  // binding then reserves megabytes, not gigabytes).
  if (opts_.sliding_window == 0) n = std::min<uint64_t>(n, uint64_t(blocks_.num_blocks()) * bs);
  n = std::min(n, kMaxReserveTokens);
  // Capacity only: a failure part-way leaves nothing a caller can see.
  s.tokens.reserve(n);
  s.blocks.reserve((n + bs - 1) / bs);
  if (blocks_.caching()) s.hashes.reserve(n / bs);
}

void Pool::truncate(SeqId id, uint64_t m) {
  std::lock_guard<OpMutex> lock(mu_);
  Sequence& s = seq_or_throw(id);
  const uint64_t n0 = s.tokens.size();
  if (m > n0)
    fail(Errc::kInvalidArgument,
         "num_tokens " + str(m) + " exceeds the " + str(n0) + " tokens of " + seq_name(id));
  const uint64_t bs = opts_.block_size;
  const uint64_t w = opts_.sliding_window;
  if (w > 0 && m > 0 && s.num_null > 0) {
    // The last token left (position m - 1) must stay queryable: it reads
    // keys from m - w on, and those must still be stored.
    const uint64_t lo = (m > w ? m - w : 0) / bs;
    if (lo < s.num_null)
      fail(Errc::kInvalidArgument, "num_tokens " + str(m) + " would need keys of " + seq_name(id) +
                                       " that its sliding window already released");
  }
  const uint64_t keep = (m + bs - 1) / bs;
  tick();
  blocks_.reserve_events(1 + count_unwritten(s, keep, s.blocks.size()));  // may throw: first
  if (m % bs != 0 && m / bs < s.blocks.size()) {
    // The block of the new last token becomes partial. If it is ours alone,
    // a hash it holds goes (even one our own hashes no longer cover: an
    // earlier truncate of it while shared kept it) and its fill follows, so
    // a cached block is always full; if shared, the next write into it
    // copies, so nothing shared is lost.
    const int32_t b = s.blocks[m / bs];
    if (b != BlockPool::kNullBlock && blocks_.ref(b) == 1) {
      blocks_.uncache_block(b);
      blocks_.set_fill(b, uint32_t(m % bs));
      clamp_written(b, m % bs);
    }
  }
  // Full blocks leaving the sequence whose K/V nobody wrote must not be
  // found by a later match_prefix.
  uncache_unwritten(s, keep, s.blocks.size());
  release_blocks_reverse(s.blocks, keep, s.blocks.size());
  s.blocks.resize(std::min<uint64_t>(keep, s.blocks.size()));
  s.tokens.resize(m);
  if (s.hashes.size() > m / bs) s.hashes.resize(m / bs);
  s.num_null = std::min<uint64_t>(s.num_null, s.blocks.size());
  s.num_cached = std::min(s.num_cached, m);
  s.num_committed = std::min(s.num_committed, m);
  // With a window, a committed count vouches only for the keys its next
  // query reads; cut back, it may reach slots a step never wrote (a prefill
  // whose early context the window made unnecessary): lower it to what is
  // written.
  for (uint64_t nc = s.num_committed; w > 0; nc = s.num_committed) {
    const uint64_t c = computed_tokens(s, nc + 1 > w ? nc + 1 - w : 0);
    if (c >= nc) break;
    s.num_committed = c;
  }
  if (m < n0) ++s.writes_epoch;  // a step prepared before may have written tokens now gone
  s.tail_shared = !tail_is_exclusive(s);
  num_tokens_ -= n0 - m;
  ++s.version;
  ++s.table_version;
}

void Pool::free(SeqId id) {
  std::lock_guard<OpMutex> lock(mu_);
  Sequence& s = seq_or_throw(id);
  blocks_.reserve_events(count_unwritten(s, 0, s.blocks.size()));  // may throw: first
  tick();
  free_locked(id, s);
}

void Pool::free_locked(SeqId id, Sequence& s) noexcept {
  // Full blocks whose K/V was never written leave the prefix cache (and go
  // to the head of the free queue).
  uncache_unwritten(s, 0, s.blocks.size());
  release_blocks_reverse(s.blocks, 0, s.blocks.size());
  num_tokens_ -= s.tokens.size();
  seqs_.remove(id);
}

SeqInfo Pool::seq_info(SeqId id) const {
  OpMutex::ConstGuard lock(mu_);
  const Sequence& s = seq_or_throw(id);
  SeqInfo i;
  i.priority = s.priority;
  i.num_tokens = s.tokens.size();
  i.num_cached_tokens = s.num_cached;
  i.num_blocks = s.blocks.size();
  i.num_slots = s.blocks.size() * opts_.block_size;
  i.lora_id = s.ctx.lora_id;
  i.num_computed_tokens = computed_tokens(s);
  return i;
}

uint64_t Pool::block_table(SeqId id, int32_t* out, uint64_t capacity) const {
  OpMutex::ConstGuard lock(mu_);
  const Sequence& s = seq_or_throw(id);
  if (out && capacity >= s.blocks.size()) std::copy(s.blocks.begin(), s.blocks.end(), out);
  return s.blocks.size();
}

uint64_t Pool::block_hashes(SeqId id, BlockHash* out, uint64_t capacity) const {
  OpMutex::ConstGuard lock(mu_);
  const Sequence& s = seq_or_throw(id);
  if (out && capacity >= s.hashes.size()) std::copy(s.hashes.begin(), s.hashes.end(), out);
  return s.hashes.size();
}

}  // namespace pagedkv
