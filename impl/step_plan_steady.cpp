// The steady state of a decode loop: every sequence of a
// pkv_batch_prepare_decode step continues a tail it holds alone after a
// context already computed, as nearly every sequence of an engine's running
// batch does from one step to the next.
//
// build_decode spends most of a 1024-sequence step on bookkeeping for what
// a steady step never has: staging each append to take it back, the general
// append for the eighth of the sequences that fill or open a block, the
// written-context walk. Here one pass resolves the ids and checks that
// every sequence is steady, and the next ones make the appends and write
// the plan rows. Anything else (an unknown or repeated id, a shared tail,
// a context not computed, a sliding window, too few free blocks) sends the
// whole step back to build_decode before anything changed, so both paths
// give the same plan, the same block ids and the same events
// (tests/core/plan_decode_test.cpp, fuzz_ops).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "lane_scan.h"
#include "seq_util.h"
#include "step_plan.h"

namespace pagedkv {

using seq_util::grow;
using seq_util::kMaxSeqTokens;

void Pool::remember_decode(const SeqId* seqs, Sequence* const* live, uint32_t n) noexcept {
  try {
    decode_memo_.ids.assign(seqs, seqs + n);
    decode_memo_.live.assign(live, live + n);
    decode_memo_.removals = seqs_.removals();
  } catch (...) {  // no memo: the next step looks its ids up
    decode_memo_.ids.clear();
    decode_memo_.removals = ~uint64_t(0);
  }
}

// One token at n0 into a tail s holds alone that opens a block (allocated
// here; room made) or fills one (token appended and hashed from h0 by the
// caller): the fused append's special cases without the general path's
// bookkeeping. The filled total is the caller's. Returns the token's block.
int32_t Pool::append_steady(Sequence& s, uint64_t n0, size_t h0, int32_t token) noexcept {
  const uint64_t j = div_bs(n0);
  if (s.tokens.size() == n0) s.tokens.push_back(token);  // else appended with its hash
  if (j == s.blocks.size()) {
    s.blocks.push_back(blocks_.allocate());
    s.bump_table_appended();
    blocks_.prefetch_allocation();  // the step's next open, ~16 sequences on
  }
  const int32_t blk = s.blocks[j];
  blocks_.counts_for_decode()[blk].add_token(uint32_t(n0 - j * opts_.block_size));
  if (h0 < s.hashes.size()) cache_new_blocks(s, h0);
  return blk;
}

namespace {

// A sequence whose step opens or fills a block (pass 1): room for the
// block it opens, and the lines the next passes read requested now. Its
// persistent-table row gains that block in pass 3 (if the table stays:
// page_table_for keeps it unless it is too small or held by a live plan):
// two entries that lie anywhere in tables of ~64k pages. What pass 2
// hashes: the filled block's tokens, its parent's hash.
void note_special(Sequence& s, uint32_t i, uint64_t n0, bool opens, bool fills, int shift,
                  const PageTable* kept_table,
                  std::vector<std::pair<uint32_t, uint32_t>>& special) {
  const uint64_t j = n0 >> shift, mask = (uint64_t(1) << shift) - 1;
  if (opens) {
    grow(s.blocks, s.blocks.size() + 1);
    __builtin_prefetch(s.blocks.data() + s.blocks.size(), 1);  // where pass 3 appends
    if (kept_table != nullptr && i < kept_table->rows && j < kept_table->stride) {
      const size_t at = size_t(i) * kept_table->stride + j;
      __builtin_prefetch(kept_table->kern.get() + at, 1);
      __builtin_prefetch(kept_table->call.get() + at, 1);
    }
  }
  if (fills) {
    __builtin_prefetch(s.tokens.data() + (n0 & ~mask));
    if (!s.hashes.empty()) __builtin_prefetch(s.hashes.data() + s.hashes.size() - 1);
  }
  special.push_back({i, uint32_t(s.hashes.size())});  // (index, hashes before)
}

}  // namespace

// Pass 3 of a steady step, in a function of its own (inside
// build_decode_steady its registers spill): each sequence's token, its
// block's counts, its commit row, its lane entry, its page-table row if it
// changed, and its slot; then the plan rows that need none of these. Those that open or fill a
// block take Pool::append_steady. Returns the page-table rows rewritten.
struct Batch::SteadyRows {
  Pool& p;
  Sequence* const* live;
  Pool::DecodeMemo::Tail* tails;
  BlockPool::Counts* counts;
  const int32_t* tokens;
  const SeqId* seqs;
  const uint64_t* ends;
  const uint32_t* page_counts;
  uint32_t* versions;
  uint32_t* epochs;
  QueryRange* ranges;
  PageTable* t;
  PlanArrays a;
  const std::pair<uint32_t, uint32_t>* next;
  const std::pair<uint32_t, uint32_t>* last;
  uint64_t bs;
  int shift;  // log2(bs)
  bool rows_current;

  // A step not from the lane: pass 1 wrote the ends and page counts, and
  // each lane entry is written whole (its block from the last steady step
  // where the sequence's table did not change since, else -1).
  [[gnu::noinline]] size_t run_general(uint32_t n) {
    // Every member in a local first: the loop calls append_steady, which
    // as far as the compiler knows could write *this, so it reloaded each
    // member every iteration (callgrind: ~84 instructions per sequence).
    Pool& pool = p;
    Sequence* const* const lv = live;
    Pool::DecodeMemo::Tail* const tl = tails;
    BlockPool::Counts* const cn = counts;
    const int32_t* const tk = tokens;
    const SeqId* const ids = seqs;
    const uint32_t* const pc = page_counts;
    uint32_t* const ver = versions;
    uint32_t* const ep = epochs;
    QueryRange* const rg = ranges;
    int64_t* const slots = a.slots;
    PageTable* const table = t;
    const std::pair<uint32_t, uint32_t>* nx = next;
    const std::pair<uint32_t, uint32_t>* const nx_end = last;
    const uint64_t mask = bs - 1;
    const int64_t block_size = int64_t(bs);
    size_t rewritten = 0;
    for (uint32_t i = 0; i < n; ++i) {
      Sequence& s = *lv[i];
      Pool::DecodeMemo::Tail& m = tl[i];
      const uint64_t n0 = ends[i] - 1;
      const uint64_t j = pc[i] - 1, off = n0 & mask;
      int32_t blk;
      if (__builtin_expect(nx != nx_end && nx->first == i, 0)) {
        blk = pool.append_steady(s, n0, nx->second, tk[i]);
        ++nx;
      } else {
        s.tokens.push_back(tk[i]);  // room made by pass 1
        blk = m.block >= 0 ? m.block : s.blocks[j];
        cn[blk].add_token(uint32_t(off));
      }
      m = {s.table_version,  uint32_t(j),     blk,
           uint32_t(n0 + 1), s.tokens.data(), DecodeTail::capacity_of(s),
           s.writes_epoch};
      ver[i] = ++s.version;
      ep[i] = m.epoch;
      rg[i] = {i, uint32_t(j), {blk, uint32_t(off), uint32_t(off + 1)}};
      // The persistent table's row, if its sequence or block table changed.
      if (table != nullptr) rewritten += update_page_row(*table, i, ids[i], s, pc[i]);
      slots[i] = int64_t(blk) * block_size + int64_t(off);
    }
    return rewritten;
  }

  // A lane step: each entry's count and block are exact (but where a
  // sequence enters a block, whose block pass 1 read). The sequences pass 1
  // did not list (slow[0, num_slow), in order) continue inside their
  // block, away from both its ends, with room for the token: their block is
  // the lane's and none of them is special, and where the table's rows are
  // current (rows_current) or there is no table their row stands. They take
  // a short loop (callgrind: ~59 instructions a row, against ~93 when every
  // row took lane_row's path); the listed ones, or every one when each row
  // must be checked, take lane_row.
  [[gnu::noinline]] size_t run_lane(uint32_t n, const uint32_t* slow, uint32_t num_slow) {
    Sequence* const* const lv = live;
    Pool::DecodeMemo::Tail* const tl = tails;
    BlockPool::Counts* const cn = counts;
    const int32_t* const tk = tokens;
    uint32_t* const ver = versions;
    uint32_t* const ep = epochs;
    QueryRange* const rg = ranges;
    int64_t* const slots = a.slots;
    const int sh = shift;
    const uint32_t mask = uint32_t(bs - 1);
    const uint32_t* const slow_end = slow + num_slow;
    uint32_t next_slow = slow != slow_end ? *slow : n;
    constexpr uint32_t kAhead = 8;  // prefetch distance, in sequences
    const uint32_t ahead_end = n > kAhead ? n - kAhead : 0;
    size_t rewritten = 0;
    if (t != nullptr && !rows_current) {  // any row may have changed
      for (uint32_t i = 0; i < n; ++i) {
        if (i < ahead_end) request_row(tl, lv, cn, i + kAhead);
        rewritten += lane_row(i);
      }
      return rewritten;
    }
    for (uint32_t i = 0; i < n; ++i) {
      if (i < ahead_end) request_row(tl, lv, cn, i + kAhead);
      if (__builtin_expect(i == next_slow, 0)) {
        rewritten += lane_row(i);
        next_slow = ++slow != slow_end ? *slow : n;
        continue;
      }
      Sequence& s = *lv[i];
      Pool::DecodeMemo::Tail& m = tl[i];
      // Inside the block of its last token, which the entry names.
      const uint32_t n0 = m.n, j = m.block_index, off = n0 & mask;
      const int32_t blk = m.block;
      s.tokens.push_back(tk[i]);  // room: pass 1 lists a sequence without
      cn[blk].add_token(off);
      m.n = n0 + 1;
      ver[i] = ++s.version;
      ep[i] = m.epoch;
      rg[i] = {i, j, {blk, off, off + 1}};
      slots[i] = (int64_t(blk) << sh) + int64_t(off);
    }
    return rewritten;
  }

  // The lines lane row i writes: their addresses are in the lane, so no
  // load waits for another (measured: requesting them a few sequences
  // ahead was 10 % faster than requesting them all in pass 1).
  static void request_row(const DecodeTail* tl, Sequence* const* lv, const BlockPool::Counts* cn,
                          uint32_t i) {
    const DecodeTail& f = tl[i];
    __builtin_prefetch(lv[i], 1);
    __builtin_prefetch(f.tok + f.n, 1);
    __builtin_prefetch(cn + f.block, 1);
  }

  // Lane row i in general: a block opened or filled (append_steady) or
  // entered, and its table row checked where it may have changed.
  [[gnu::noinline]] size_t lane_row(uint32_t i) {
    Sequence& s = *live[i];
    Pool::DecodeMemo::Tail& m = tails[i];
    const uint64_t n0 = m.n, j = n0 >> shift, off = n0 & (bs - 1);
    int32_t blk;
    if (next != last && next->first == i) {
      blk = p.append_steady(s, n0, next->second, tokens[i]);
      ++next;
    } else {
      s.tokens.push_back(tokens[i]);  // room made by pass 1
      blk = m.block;
      counts[blk].add_token(uint32_t(off));
    }
    m.block_index = uint32_t(j);
    m.block = blk;
    if (off == 0) m.table_version = s.table_version;  // entered a block
    m.n = uint32_t(n0 + 1);
    versions[i] = ++s.version;
    epochs[i] = m.epoch;
    ranges[i] = {i, uint32_t(j), {blk, uint32_t(off), uint32_t(off + 1)}};
    const bool rewrite = t != nullptr && (!rows_current || off == 0);
    const size_t rewritten = rewrite ? update_page_row(*t, i, seqs[i], s, page_counts[i]) : 0;
    a.slots[i] = int64_t(blk) * int64_t(bs) + int64_t(off);
    return rewritten;
  }

  // The plan rows that follow from the ends and page counts alone, in a
  // loop of their own that the compiler vectorises.
  void other_rows(uint32_t n) {
    const uint64_t mask = bs - 1;
    const int32_t stride = t ? int32_t(t->stride) : 0;
    a.qptr[0] = a.pptr[0] = 0;
    for (uint32_t i = 0; i < n; ++i) {
      a.qptr[i + 1] = int32_t(i + 1);
      a.last[i] = int32_t((ends[i] - 1) & mask) + 1;
      a.ctx[i] = int32_t(ends[i]);
    }
    if (t) {
      for (uint32_t i = 0; i < n; ++i) a.pptr[i + 1] = int32_t(i + 1) * stride;
    } else {
      int32_t pg = 0;
      for (uint32_t i = 0; i < n; ++i) a.pptr[i + 1] = pg += int32_t(page_counts[i]);
    }
  }
};

bool Batch::build_decode_steady(const SeqId* seqs, const int32_t* tokens, uint32_t num_seqs,
                                void* stream, bool persistent_table) {
  Pool& p = *pool_;
  if (p.opts_.sliding_window != 0 || p.bs_shift_ < 0) return false;
  PlanHost& h = *host_;
  start_host(seqs, num_seqs);
  Sequence** const live = h.live.data();
  uint32_t* const page_counts = h.pages.data();
  uint64_t* const ends = h.ends.data();
  BlockPool::Counts* const counts = p.blocks_.counts_for_decode();
  const int shift = p.bs_shift_;
  const uint64_t bs = p.opts_.block_size, mask = bs - 1;

  // 1. Checks, counts and room in the vectors (capacity only: nothing a
  // caller can observe changes).
  std::vector<std::pair<uint32_t, uint32_t>>& special = h.special;  // (index, hashes before)
  special.clear();
  uint64_t fresh = 0, pages = 0, max_ctx = 0;
  uint32_t max_pages = 0;
  constexpr uint32_t kAhead = 8;  // prefetch distance, in sequences
  // The ids of the pool's previous decode step, in its order, with no
  // sequence freed since, still name the sequences they did then, and are
  // distinct (an engine's running batch between admissions and finishes):
  // no lookup. Otherwise each id is looked up, and a repeated one finds its
  // sequence marked (the general path names it).
  Pool::DecodeMemo& memo = p.decode_memo_;
  const bool same = memo.removals == p.seqs_.removals() && memo.ids.size() == num_seqs &&
                    std::memcmp(memo.ids.data(), seqs, num_seqs * sizeof(SeqId)) == 0;
  if (same) std::memcpy(live, memo.live.data(), num_seqs * sizeof(Sequence*));
  // Each sequence's block from the last steady step, where its block table
  // did not change since (Pool::DecodeMemo::Tail; block -1: not known).
  // Reading it there instead of in the block table spares a step a page per
  // sequence: over a thousand sequences, more pages than the TLB holds.
  if (!same || memo.tails.size() != num_seqs)
    memo.tails.assign(num_seqs, {0, 0, -1, 0, nullptr, 0, 0});
  Pool::DecodeMemo::Tail* const tails = memo.tails.data();
  const uint64_t mark = ++p.plan_epoch_;
  const PageTable* const kept_table = persistent_table ? p.page_table_.get() : nullptr;
  // The lane (Pool::DecodeMemo): nothing ran since the last steady step
  // over these ids and its exact commit, so each sequence is as the lane
  // says. Pass 1 then reads only the lane; the few sequences that enter or
  // fill a block, or need room, are read in full after it, and pass 3
  // requests the other lines it writes from the lane.
  const bool lane =
      same && memo.lane_committed && p.lane_follows() && memo.tails.size() == num_seqs;
  uint32_t lane_slow = 0;                     // h.slow's entries (a lane step)
  memo.lane_ops = Pool::DecodeMemo::kNoLane;  // exact again only once this step succeeds
  if (lane) {
    h.slow.resize(num_seqs);
    const LaneScan scan = scan_lane(tails, num_seqs, shift, ends, page_counts, h.slow.data());
    if (scan.slow > num_seqs) return false;  // a sequence at kMaxSeqTokens
    lane_slow = scan.slow;
    pages = scan.pages;
    max_ctx = scan.max_ctx;
    max_pages = scan.max_pages;
    for (uint32_t k = 0; k < scan.slow; ++k) {
      // The lines of a listed sequence this loop and note_special read (its
      // tokens and table, its hashes), requested a few ahead: the lane step
      // read none of them (perf: most of note_special's samples fell on the
      // load of the hashes' end).
      if (k + kAhead < scan.slow) {
        const Sequence* f = live[h.slow[k + kAhead]];
        __builtin_prefetch(f, 1);
        __builtin_prefetch(&f->hashes);
      }
      const uint32_t i = h.slow[k];
      Pool::DecodeMemo::Tail& m = tails[i];
      Sequence& s = *live[i];
      const uint64_t n0 = m.n, j = n0 >> shift, nb = s.blocks.size();
      const bool crosses = (n0 & mask) == 0, fills = ((n0 + 1) & mask) == 0, opens = j == nb;
      grow(s.tokens, n0 + 1);
      m.tok = s.tokens.data();
      m.cap = DecodeTail::capacity_of(s);
      __builtin_prefetch(s.tokens.data() + n0, 1);
      // Entering a block the table already holds (appended ahead): the
      // lane's block is that one. One the step opens: append_steady's.
      if (crosses && j < nb) m.block = s.blocks[j];
      if (opens | fills) note_special(s, i, n0, opens, fills, shift, kept_table, special);
      fresh += opens;
    }
  }
  for (uint32_t i = 0; i < num_seqs && !lane; ++i) {
    if (same) {
      if (i + kAhead < num_seqs) {
        const char* next = reinterpret_cast<const char*>(live[i + kAhead]);
        __builtin_prefetch(next);
        __builtin_prefetch(next + 64);
      }
    } else {
      if (i + kAhead < num_seqs) p.seqs_.prefetch(seqs[i + kAhead]);
      Sequence* const sp = p.seqs_.find(seqs[i]);
      if (sp == nullptr || sp->plan_mark == mark) return false;
      sp->plan_mark = mark;
      live[i] = sp;
    }
    Sequence& s = *live[i];
    const uint64_t n0 = s.tokens.size(), j = n0 >> shift, nb = s.blocks.size();
    if (s.tail_shared || s.num_committed < n0 || n0 >= kMaxSeqTokens || j > nb) return false;
    const bool opens = j == nb, fills = ((n0 + 1) & mask) == 0;
    grow(s.tokens, n0 + 1);
    // Pass 3's scattered lines, requested now: a step's lines do not stay
    // in cache from one step to the next (measured: requesting them a few
    // sequences ahead in pass 3 instead left the step 20 % slower), and
    // pass 1 is the first to know them. The token's place and the block's
    // counts: at once where the memo knows the block, else the block's
    // table entry now and, once it arrived, kAhead sequences later, the
    // counts.
    __builtin_prefetch(s.tokens.data() + n0, 1);
    Pool::DecodeMemo::Tail& m = tails[i];
    if (m.block >= 0 && (m.table_version != s.table_version || m.block_index != j || j >= nb))
      m.block = -1;
    if (m.block >= 0)
      __builtin_prefetch(counts + m.block, 1);
    else if (j < nb)
      __builtin_prefetch(s.blocks.data() + j);
    if (i >= kAhead && tails[i - kAhead].block < 0) {
      const Sequence& b = *live[i - kAhead];
      const uint64_t jb = page_counts[i - kAhead] - 1;
      if (jb < b.blocks.size()) __builtin_prefetch(counts + b.blocks[jb], 1);
    }
    if (opens | fills) {
      note_special(s, i, n0, opens, fills, shift, kept_table, special);
      fresh += opens;
    }
    const uint32_t np = uint32_t(j + 1);  // the query's block is the last page
    ends[i] = n0 + 1;
    page_counts[i] = np;
    pages += np;
    max_ctx = std::max(max_ctx, n0 + 1);
    max_pages = std::max(max_pages, np);
  }
  if (fresh > uint64_t(p.blocks_.num_free()) || pages > uint64_t(INT32_MAX)) return false;
  // The ids are good: loads and offloads the tiers queued are settled
  // before anything changes, as build_decode does at this point (and a
  // refused call settles nothing).
  p.settle_tiers_locked(stream);

  // 2. What can still throw, taken back on failure: the hashes of the
  // blocks the step fills (their token first), room for the events, the
  // plan's memory.
  size_t hashed = 0;
  PlanArrays a;
  constexpr size_t kHashAhead = 4;  // in special sequences (half of them fill)
  try {
    for (; hashed < special.size(); ++hashed) {
      // A later block's tokens and parent hash, requested a few blocks
      // ahead: pass 1's requests come too late when its loop was short
      // (a lane step reads only these sequences).
      if (hashed + kHashAhead < special.size()) {
        const uint32_t k = special[hashed + kHashAhead].first;
        const Sequence& f = *live[k];
        if ((ends[k] & mask) == 0) {
          const int32_t* block = f.tokens.data() + ((ends[k] - 1) & ~mask);
          __builtin_prefetch(block);
          __builtin_prefetch(block + bs - 1);
          if (!f.hashes.empty()) __builtin_prefetch(f.hashes.data() + f.hashes.size() - 1);
        }
      }
      const uint32_t i = special[hashed].first;
      if ((ends[i] & mask) != 0) continue;  // opens a block, fills none
      Sequence& s = *live[i];
      s.tokens.push_back(tokens[i]);
      try {
        p.hash_new_blocks(s);
      } catch (...) {
        s.tokens.pop_back();
        throw;
      }
      // Pass 3 registers the block in the prefix cache: its lines there
      // are requested now, while the other blocks hash.
      const uint64_t j = (ends[i] - 1) >> shift;
      if (j < s.blocks.size() && !s.hashes.empty())
        p.blocks_.prefetch_cache_block(s.blocks[j], s.hashes.back());
    }
    p.blocks_.reserve_events(5 * special.size());
    if (persistent_table) table_ = page_table_for(p.page_table_, max_pages, num_seqs);
    a = lay_out(num_seqs, pages, max_ctx, 1, num_seqs);
  } catch (...) {
    for (size_t k = 0; k < hashed; ++k) {
      const uint32_t i = special[k].first;
      if ((ends[i] & mask) != 0) continue;
      Sequence& s = *live[i];
      s.tokens.pop_back();
      s.hashes.resize(special[k].second);
    }
    table_.reset();
    throw;
  }

  // 3. The appends, in order (block ids and events come out as
  // build_decode's), and the plan's rows; nothing fails from here to
  // finish().
  p.tick();  // retention: priorities whose time ran out, before allocating
  PageTable* const t = table_.get();
  // Reserved by start_host: no allocation; and the size the last steady
  // step left, usually: nothing zeroed (each range is written below).
  h.ranges.resize(num_seqs);
  SteadyRows rows{p, live, tails, counts, tokens, seqs, ends, page_counts, h.versions.data(),
                  h.epochs.data(), h.ranges.data(), t, a, special.data(),
                  special.data() + special.size(), bs, shift,
                  // The lane's table is this plan's: each row still holds
                  // its sequence's pages, and only a row whose sequence
                  // enters a block changes.
                  lane && t != nullptr && t == memo.lane_table};
  const size_t rewritten =
      lane ? rows.run_lane(num_seqs, h.slow.data(), lane_slow) : rows.run_general(num_seqs);
  rows.other_rows(num_seqs);

  p.blocks_.add_filled(num_seqs);  // one slot each
  p.num_tokens_ += num_seqs;
  // As build_decode: offloads this step's allocations queued reach their
  // tier before the plan's copies and writes.
  p.settle_tiers_locked(stream);
  finish(a, seqs, rewritten, stream);
  decode_step_ = steady_ = true;
  lane_ = lane;
  lane_slow_ = lane_slow;
  if (!same) p.remember_decode(seqs, live, num_seqs);
  // A lane only over ids remembered (remember_decode keeps none when it
  // cannot allocate): the next step could not follow it anyway.
  memo.lane_ops = memo.ids.size() == num_seqs ? p.mu_.ops() : Pool::DecodeMemo::kNoLane;
  memo.lane_batch = this;
  memo.lane_committed = false;
  memo.lane_table = t;
  return true;
}

}  // namespace pagedkv
