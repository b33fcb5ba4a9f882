// Batched and fused sequence operations: one lock and one validation pass
// for what engines otherwise do in a loop of calls (a decode step's appends,
// frees of finished requests, admission = create + prefix match + append).
// Each is all or nothing: every check (ids, duplicates, free blocks) comes
// first, then whatever can throw (allocation, hashing) is staged and undone
// on failure, and the commit cannot fail.
#include <algorithm>

#include "kv_pool.h"
#include "seq_util.h"

namespace pagedkv {

using seq_util::grow;
using seq_util::kMaxSeqTokens;
using seq_util::str;

namespace {

std::string at(const char* name, uint64_t i, SeqId id) {
  return std::string(name) + "[" + str(i) + "]: " + seq_name(id);
}

}  // namespace

void Pool::batch_member_fail(const SeqId* ids, uint64_t i, bool found) const {
  if (!found) fail(Errc::kNotFound, "seqs[" + str(i) + "]: " + unknown_seq(ids[i], tag()));
  fail(Errc::kInvalidArgument, at("seqs", i, ids[i]) + " appears twice in the batch");
}

void Pool::append_batch(const SeqId* ids, const int32_t* tokens, uint64_t m) {
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  if (m == 0) return;
  std::vector<BatchItem>& items = batch_items_;
  std::vector<AppendNeed>& needs = batch_needs_;
  items.clear();
  needs.clear();
  items.reserve(m);  // may throw: nothing changed yet

  // 1. In order, as if the appends ran one after another: the checks, room
  // in the vectors that grow, then the token and the hashes of the blocks
  // it fills (one pass: each sequence's lines are loaded once). What can
  // throw (a check, an allocation, hashing) takes back the tokens and
  // hashes staged so far; nothing else changed yet.
  const uint64_t mark = ++plan_epoch_;
  const uint64_t bs = opts_.block_size;
  uint64_t take = 0, gain = 0, events = 0, cow = 0;
  const uint64_t free_now = uint64_t(blocks_.num_free());
  constexpr uint64_t kAhead = 16, kNear = 8, kClose = 4;  // prefetch distances, in sequences
  try {
    for (uint64_t i = 0; i < m; ++i) {
      if (i + kAhead < m) seqs_.prefetch(ids[i + kAhead]);
      Sequence* s = batch_member(ids, i, mark);
      BatchItem it{s, s->tokens.size(), uint32_t(s->hashes.size()), BatchItem::kSimple};
      const uint64_t j = div_bs(it.n0);
      if (j < s->blocks.size()) __builtin_prefetch(s->blocks.data() + j);  // read in step 2
      // The decode fast path: no new block, nothing fills.
      const bool simple = !s->tail_shared && opts_.sliding_window == 0 && it.n0 < kMaxSeqTokens &&
                          j < s->blocks.size() && div_bs(it.n0 + 1) == j;
      if (!simple) {
        AppendNeed need;
        try {
          need = append_need(*s, 1, 0);
        } catch (const Error& e) {
          fail(e.code(), at("seqs", i, ids[i]) + ": " + e.what());
        }
        take += need.fresh + need.cow;
        gain += need.window_gain;
        cow += need.cow;
        events += need.fresh + need.cow + 4 + (need.window_end - need.window_first);
        if (take > free_now + gain)
          fail(Errc::kOutOfBlocks, at("seqs", i, ids[i]) + ": the appends up to this one need " +
                                       str(take) + " blocks; " + str(free_now + gain) +
                                       " are free (nothing was appended)");
        grow(s->blocks, s->blocks.size() + need.fresh);
        it.need = uint32_t(needs.size());
        needs.push_back(need);
      }
      grow(s->tokens, it.n0 + 1);
      items.push_back(it);             // reserved
      s->tokens.push_back(tokens[i]);  // reserved
      if (!simple) {
        items.back().h0 = uint32_t(hash_new_blocks(*s));  // on failure s->hashes is as before
        for (size_t k = items.back().h0; k < s->hashes.size(); ++k)
          blocks_.prefetch_cache_slot(s->hashes[k]);  // inserted in step 2
      }
    }
    blocks_.reserve_events(events);
    if (cow) grow(blocks_.pending_copies(), blocks_.pending_copies().size() + cow);
  } catch (...) {
    for (const BatchItem& it : items) {
      it.s->tokens.resize(it.n0);
      it.s->hashes.resize(it.h0);
    }
    throw;
  }

  // 2. Commit, in order (nothing fails from here).
  tick();  // retention: priorities whose time ran out, before allocating
  for (uint64_t i = 0; i < m; ++i) {
    // The slot, then its table entry, then that block's counts.
    if (i + kAhead < m) __builtin_prefetch(items[i + kAhead].s);
    if (i + kNear < m) {
      const BatchItem& a = items[i + kNear];
      if (a.need == BatchItem::kSimple) __builtin_prefetch(a.s->blocks.data() + div_bs(a.n0));
    }
    if (i + kClose < m) {
      const BatchItem& a = items[i + kClose];
      if (a.need == BatchItem::kSimple) blocks_.prefetch_counts(a.s->blocks[div_bs(a.n0)]);
    }
    const BatchItem& it = items[i];
    Sequence& s = *it.s;
    if (it.need == BatchItem::kSimple) {
      const uint64_t j = div_bs(it.n0);
      clamp_written(s.blocks[j], it.n0 - j * bs);
      blocks_.add_filled_slot(s.blocks[j]);
      ++num_tokens_;
      ++s.version;
    } else {
      apply_append(s, it.n0, 1, needs[it.need], it.h0);
    }
  }
}

void Pool::free_batch(const SeqId* ids, uint64_t m) {
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  const uint64_t mark = ++plan_epoch_;
  size_t events = 0;
  for (uint64_t i = 0; i < m; ++i) {
    Sequence* s = batch_member(ids, i, mark);
    events += count_unwritten(*s, 0, s->blocks.size());
  }
  blocks_.reserve_events(events);  // may throw: before any change
  tick();
  for (uint64_t i = 0; i < m; ++i) free_locked(ids[i], *seqs_.find(ids[i]));
}

Pool::Admitted Pool::admit(const SeqOptions& o, const int32_t* tokens, uint64_t n,
                           const BlockHash* given, uint64_t num_given, uint32_t lookahead,
                           TieredMatch* tiered) {
  HashContext ctx = make_ctx(o);
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  if (n > kMaxSeqTokens || n + lookahead > kMaxSeqTokens)
    fail(Errc::kInvalidArgument, "the sequence would hold " + str(n) + " + " + str(lookahead) +
                                     " slots, more than 2^31 - 1");
  const uint64_t bs = opts_.block_size;
  if (given && num_given > n / bs)
    fail(Errc::kInvalidArgument, "num_hashes " + str(num_given) + " exceeds the " + str(n / bs) +
                                     " full blocks of num_tokens " + str(n));
  if (seqs_.full()) fail(Errc::kOutOfMemory, "the pool's sequence table is full");

  // 1. The hits, found without attaching them.
  HashVector hashes{ArenaAllocator<BlockHash>(&token_arena_)};  // moved into the sequence
  std::vector<int32_t> hits;
  find_hits(ctx, tokens, n, given, num_given, hashes, hits);
  const uint64_t k = hits.size(), n_hit = k * bs;

  // 2. Blocks, counted as match_prefix then append would take them: hits
  // that sit in the free queue leave it; with a sliding window the append
  // releases the hits wholly behind its first query's window again.
  const uint64_t want = div_bs(n + lookahead + bs - 1);
  const uint64_t fresh = want > k ? want - k : 0;
  uint64_t leaving = 0, gain = 0, window_end = 0;
  // A free pinned hit sits in the queue's held level, not among the free
  // blocks: it neither leaves them nor, released by the window, rejoins them.
  for (int32_t b : hits) leaving += blocks_.ref(b) == 0 && !blocks_.held(b);
  const uint64_t w = opts_.sliding_window;
  if (w > 0 && n > n_hit && n_hit + 1 > w) {
    window_end = std::min<uint64_t>(k, (n_hit + 1 - w) / bs);
    for (uint64_t j = 0; j < window_end; ++j)
      gain += blocks_.ref(hits[j]) == 0 && !blocks_.held(hits[j]);
  }
  const uint64_t avail = uint64_t(blocks_.num_free()) - leaving + gain;
  if (fresh > avail)
    fail(Errc::kOutOfBlocks, "the prompt of " + str(n) + " tokens + " + str(lookahead) +
                                 " lookahead needs " + str(fresh) + " new blocks (" + str(k) +
                                 " cached); " + str(avail) + " are free");

  // 3. What can throw, on a new sequence that nothing else sees yet. Tier
  // hits (tiered) continue the device hits; their blocks are among the
  // fresh ones counted above, so they change nothing of the count.
  TierHits tier_hits;
  SeqId id;
  Sequence& s = seqs_.add(&id);
  size_t h0;
  try {
    if (tiered && n > 0 && blocks_.caching()) {
      const uint64_t max_blocks = given ? std::min((n - 1) / bs, num_given) : (n - 1) / bs;
      tier_hits = find_tier_hits(ctx, tokens, k, max_blocks - k, k ? hashes.back() : root_, given);
    }
    s.ctx = std::move(ctx);
    s.priority = o.priority;
    s.tokens.reserve(n);
    s.tokens.assign(tokens, tokens + n);
    s.blocks.reserve(std::max<uint64_t>(want, 1));
    s.hashes = std::move(hashes);
    for (const auto& t : tier_hits) s.hashes.push_back(t.first);
    h0 = hash_new_blocks(s);
    blocks_.reserve_events(fresh + 2 * (div_bs(n) + 2) + window_end);
    grow(pending_loads_, pending_loads_.size() + tier_hits.size());
  } catch (...) {
    seqs_.remove(id);
    for (const auto& t : tier_hits) tiers_->unpin(t.second);
    throw;
  }

  // 4. Commit: attach the hits, then append the rest.
  tick();  // retention: priorities whose time ran out, before allocating
  for (int32_t b : hits) {
    blocks_.touch(b);
    s.blocks.push_back(b);
  }
  if (blocks_.retention())  // a hit may raise its block's priority, as in match_prefix
    for (size_t j = 0; j < s.blocks.size(); ++j) assign_priority(s, j, false);
  TieredMatch r;
  r.device = n_hit;
  attach_tier_hits(s, tier_hits, r);  // not computed until the next plan loads them
  const uint64_t got = n_hit + r.host + r.file;
  s.num_committed = n_hit;
  s.num_cached = got;
  prefix_query_tokens_ += n;
  prefix_hit_tokens_ += got;
  num_tokens_ += got;
  AppendNeed need;
  need.fresh = fresh - tier_hits.size();
  need.window_first = 0;
  need.window_end = window_end;
  apply_append(s, got, n - got, need, h0);
  if (tiered) *tiered = r;
  return {id, got};
}

}  // namespace pagedkv
