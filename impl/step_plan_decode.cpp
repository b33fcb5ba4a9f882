// Fused decode steps (pkv_batch_prepare_decode): one token appended to each
// sequence and the plan whose queries are those tokens, under one lock.
//
// A decode step through pkv_seq_append_batch and pkv_batch_prepare_ex
// resolves and checks every id twice and walks each sequence's lines in
// two separate passes; here one pass checks both calls' conditions and
// stages the tokens, and a second applies the appends and writes the plan
// rows while each sequence's lines are still in cache. Unlike the two
// calls, nothing is appended when the plan cannot be built (a context
// that no committed step wrote, for instance).
#include <algorithm>
#include <cstdint>

#include "seq_util.h"
#include "step_plan.h"

namespace pagedkv {

using seq_util::grow;
using seq_util::kMaxSeqTokens;
using seq_util::str;

void Batch::build_decode(const SeqId* seqs, const int32_t* tokens, uint32_t num_seqs, void* stream,
                         bool persistent_table) {
  Pool& p = *pool_;
  PlanHost& h = *host_;
  const uint64_t bs = p.opts_.block_size;
  const uint64_t w = p.opts_.sliding_window;
  start_host(seqs, num_seqs);
  h.ranges.clear();
  std::vector<Pool::BatchItem>& items = p.batch_items_;
  std::vector<Pool::AppendNeed>& needs = p.batch_needs_;
  items.clear();
  needs.clear();
  items.reserve(num_seqs);
  Sequence** const live = h.live.data();
  uint32_t* const page_counts = h.pages.data();
  uint64_t* const ends = h.ends.data();

  // 1. Every check of the append and of the plan, in order, staging the
  // tokens and the hashes of the blocks they fill; on failure they are
  // taken back and nothing else changed.
  const uint64_t mark = ++p.plan_epoch_;
  const uint64_t free_now = uint64_t(p.blocks_.num_free());
  uint64_t take = 0, gain = 0, events = 0, cow = 0, pages = 0, max_ctx = 0;
  uint32_t max_pages = 0;
  constexpr uint32_t kAhead = 16;  // prefetch distance, in sequences
  PlanArrays a;
  try {
    for (uint32_t i = 0; i < num_seqs; ++i) {
      if (i + kAhead < num_seqs) p.seqs_.prefetch(seqs[i + kAhead]);
      Sequence* s = p.batch_member(seqs, i, mark);
      live[i] = s;
      Pool::BatchItem it{s, s->tokens.size(), uint32_t(s->hashes.size()), Pool::BatchItem::kSimple};
      const uint64_t n0 = it.n0, j = p.div_bs(n0);
      if (j < s->blocks.size()) __builtin_prefetch(s->blocks.data() + j);
      // The query at n0 reads keys from n0 + 1 - w on (the append
      // releases none of them: its window follows the committed tokens).
      if (w > 0) {
        const uint64_t first_key = n0 + 1 > w ? n0 + 1 - w : 0;
        if (first_key / bs < s->num_null)
          fail(Errc::kInvalidArgument, "seqs[" + str(i) + "]: " + seq_name(seqs[i]) +
                                           " would query position " + str(n0) +
                                           ", which needs keys from " + str(first_key) +
                                           " on that the sliding window already released");
      }
      if (w != 0 || s->num_committed < n0) h.unsure.push_back(i);
      const bool simple = !s->tail_shared && w == 0 && n0 < kMaxSeqTokens && j < s->blocks.size() &&
                          n0 + 1 - j * bs < bs;
      if (!simple) {
        Pool::AppendNeed need;
        try {
          need = p.append_need(*s, 1, 0);
        } catch (const Error& e) {
          fail(e.code(), "seqs[" + str(i) + "]: " + seq_name(seqs[i]) + ": " + e.what());
        }
        take += need.fresh + need.cow;
        gain += need.window_gain;
        cow += need.cow;
        events += need.fresh + need.cow + 4 + (need.window_end - need.window_first);
        if (take > free_now + gain)
          fail(Errc::kOutOfBlocks, "seqs[" + str(i) + "]: " + seq_name(seqs[i]) +
                                       ": the appends up to this one need " + str(take) +
                                       " blocks; " + str(free_now + gain) +
                                       " are free (nothing was appended)");
        grow(s->blocks, s->blocks.size() + need.fresh);
        it.need = uint32_t(needs.size());
        needs.push_back(need);
      }
      grow(s->tokens, n0 + 1);
      items.push_back(it);  // reserved
      s->tokens.push_back(tokens[i]);
      if (!simple) {
        items.back().h0 = uint32_t(p.hash_new_blocks(*s));  // on failure s->hashes is as before
        for (size_t k = items.back().h0; k < s->hashes.size(); ++k)
          p.blocks_.prefetch_cache_slot(s->hashes[k]);
      }
      const uint64_t n = n0 + 1;
      const uint32_t np = uint32_t(j + 1);  // the query's block is the last page
      ends[i] = n;
      page_counts[i] = np;
      pages += np;
      max_ctx = std::max(max_ctx, n);
      max_pages = std::max(max_pages, np);
    }
    // Tier hits are loaded before the written check reads their state (and
    // only once every id is known good: a refused call loads nothing).
    p.settle_tiers_locked(stream);
    check_decode_context(seqs);
    if (pages > uint64_t(INT32_MAX))
      fail(Errc::kInvalidArgument, "the batch has " + str(pages) + " pages; it must fit in int32");
    p.blocks_.reserve_events(events);
    if (cow) {
      grow(p.blocks_.pending_copies(), p.blocks_.pending_copies().size() + cow);
      p.reserve_copies(p.blocks_.pending_copies().size() + cow);  // finish() runs them
    }
    if (persistent_table) table_ = page_table_for(p.page_table_, max_pages, num_seqs);
    a = lay_out(num_seqs, pages, max_ctx, 1, num_seqs);
  } catch (...) {
    for (const Pool::BatchItem& it : items) {
      it.s->tokens.resize(it.n0);
      it.s->hashes.resize(it.h0);
    }
    table_.reset();
    throw;
  }

  // 2. The appends and the plan's rows, sequence by sequence (nothing
  // fails from here to finish()).
  p.tick();  // retention: priorities whose time ran out, before allocating
  PageTable* const t = table_.get();
  uint32_t* const versions = h.versions.data();
  uint32_t* const epochs = h.epochs.data();
  constexpr uint32_t kNear = 8, kClose = 4;
  int64_t pg = 0;
  size_t rewritten = 0;
  a.qptr[0] = a.pptr[0] = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    // The slot, then its table entry, then that block's counts.
    if (i + kAhead < num_seqs) __builtin_prefetch(items[i + kAhead].s);
    if (i + kNear < num_seqs) {
      const Pool::BatchItem& b = items[i + kNear];
      if (b.need == Pool::BatchItem::kSimple)
        __builtin_prefetch(b.s->blocks.data() + (page_counts[i + kNear] - 1));
    }
    if (i + kClose < num_seqs) {
      const Pool::BatchItem& b = items[i + kClose];
      if (b.need == Pool::BatchItem::kSimple)
        p.blocks_.prefetch_counts(b.s->blocks[page_counts[i + kClose] - 1]);
    }
    const Pool::BatchItem& it = items[i];
    Sequence& s = *it.s;
    const uint64_t n0 = it.n0, j = page_counts[i] - 1, off = n0 - j * bs;
    if (it.need == Pool::BatchItem::kSimple) {
      p.clamp_written(s.blocks[j], off);
      p.blocks_.add_filled_slot(s.blocks[j]);
      ++p.num_tokens_;
      ++s.version;
    } else {
      p.apply_append(s, n0, 1, needs[it.need], it.h0);
    }
    const int32_t blk = s.blocks[j];
    const uint32_t np = page_counts[i];
    h.ranges.push_back({i, uint32_t(j), {blk, uint32_t(off), uint32_t(off + 1)}});  // reserved
    versions[i] = s.version;
    epochs[i] = s.writes_epoch;
    a.slots[i] = int64_t(blk) * int64_t(bs) + int64_t(off);
    pg += t ? int64_t(t->stride) : int64_t(np);
    a.qptr[i + 1] = int32_t(i + 1);
    a.pptr[i + 1] = int32_t(pg);
    a.last[i] = int32_t(off + 1);  // the query's block is the last page
    a.ctx[i] = int32_t(n0 + 1);
    if (t) rewritten += update_page_row(*t, i, seqs[i], s, np);
  }
  // Blocks this step's allocations evicted may be queued for offload: their
  // bytes must reach the tier before the copies below or the step's writes
  // overwrite them (as prepare's own settle does after append_batch).
  p.settle_tiers_locked(stream);
  finish(a, seqs, rewritten, stream);
  decode_step_ = true;
  p.remember_decode(seqs, live, num_seqs);  // the next step over these ids looks none up
}

// prepare's written-context check for a decode step, before its appends:
// the context of sequence i is [0, n0) of its current blocks (an append
// that copies a shared tail carries the written count into the copy, and a
// window append releases no key a query still reads), and the only slots
// the plan itself writes first are each sequence's slot n0.
void Batch::check_decode_context(const SeqId* seqs) {
  Pool& p = *pool_;
  PlanHost& h = *host_;
  const uint64_t bs = p.opts_.block_size, w = p.opts_.sliding_window;
  std::vector<std::pair<int32_t, uint32_t>> after;
  bool have_after = false;
  for (const uint32_t i : h.unsure) {
    const Sequence& s = *h.live[i];
    const uint64_t ctx_end = h.ends[i] - 1;
    const uint64_t first_key = w > 0 && ctx_end + 1 > w ? ctx_end + 1 - w : 0;
    const uint64_t from = first_unwritten(s, ctx_end, first_key, after, have_after, [&] {
      // The step's own writes, into blocks that stay in place (a new
      // block or a copy is in nobody's context).
      std::vector<WrittenRange> rs;
      for (size_t k = 0; k < h.seqs.size(); ++k) {
        const Sequence& o = *h.live[k];
        const uint64_t n0 = h.ends[k] - 1, jj = p.div_bs(n0);
        if (jj >= o.blocks.size()) continue;
        const int32_t b = o.blocks[jj];
        if (o.tail_shared && p.blocks_.ref(b) > 1) continue;
        rs.push_back({b, uint32_t(n0 - jj * bs), uint32_t(n0 - jj * bs + 1)});
      }
      return rs;
    });
    if (from < ctx_end)
      fail(Errc::kInvalidState,
           "seqs[" + str(i) + "]: " + seq_name(seqs[i]) + " would attend over tokens [" +
               str(from) + ", " + str(ctx_end) +
               ") whose K/V no committed step wrote (nothing was appended): compute them "
               "with pkv_batch_prepare and query_counts[" +
               str(i) + "] >= " + str(ctx_end + 1 - from));
  }
}

}  // namespace pagedkv
