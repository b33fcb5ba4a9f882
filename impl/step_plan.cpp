#include "step_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace pagedkv {

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

// The dtype a k, v or q tensor must have: the pool's, or on an FP8 pool
// the tensor's own if it is f32, f16 or bf16.
DType activation_dtype(DType pool, const TensorArg* t, const char* name) {
  if (!is_fp8(pool) || t == nullptr) return pool;
  const DType d = DType(t->dtype);
  if (d == DType::kF32 || d == DType::kF16 || d == DType::kBF16) return d;
  fail(Errc::kInvalidArgument,
       std::string(name) + " has dtype " + dtype_name(t->dtype) + " (" + str(t->dtype) +
           "), expected f32, f16 or bf16 (the pool stores " + dtype_name(uint32_t(pool)) + ")");
}

PlanView view_at(const char* base, const size_t* off, const BatchInfo& info) {
  PlanView v{};
  v.num_seqs = int32_t(info.num_seqs);
  v.num_tokens = int64_t(info.num_tokens);
  v.max_query = int32_t(info.max_query);
  v.max_context = int32_t(info.max_context);
  v.slot_mapping = reinterpret_cast<const int64_t*>(base + off[0]);
  v.query_indptr = reinterpret_cast<const int32_t*>(base + off[1]);
  v.page_indptr = reinterpret_cast<const int32_t*>(base + off[2]);
  v.page_indices = reinterpret_cast<const int32_t*>(base + off[3]);
  v.last_page_len = reinterpret_cast<const int32_t*>(base + off[4]);
  v.context_lens = reinterpret_cast<const int32_t*>(base + off[5]);
  return v;
}

// The bytes of every layer's K and V planes (and an FP8 pool's scales): no
// output may land there (attention holds the KV lock shared, so other
// readers run alongside).
ByteSpan arena_span(const KvArena& a) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(a.base);
  return ByteSpan{b, b + a.bytes()};
}

// Layer l's K and V planes (adjacent), or its MLA latent plane.
ByteSpan layer_span(const KvArena& a, uint32_t l) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(a.plane(int32_t(l), 0));
  return ByteSpan{b, b + size_t(a.planes_per_layer) * a.layout.layer_bytes()};
}

}  // namespace

std::unique_ptr<Batch> Batch::prepare(const std::shared_ptr<Pool>& pool, const SeqId* seqs,
                                      const uint32_t* query_counts, uint32_t num_seqs, void* stream,
                                      bool persistent_table) {
  return make(pool, num_seqs,
              [&](Batch& b) { b.build(seqs, query_counts, num_seqs, stream, persistent_table); });
}

template <class Build>
std::unique_ptr<Batch> Batch::make(const std::shared_ptr<Pool>& pool, uint32_t num_seqs,
                                   Build&& build) {
  Pool& p = *pool;
  std::lock_guard<OpMutex> lock(p.mu_);
  p.check_open();
  if (num_seqs == 0) fail(Errc::kInvalidArgument, "num_seqs is 0");
  std::unique_ptr<Batch> b(new Batch);
  b->pool_ = pool;
  // The plan's memory and per-sequence state: recycled from an earlier
  // plan, so a steady-state step allocates nothing.
  b->host_ = take_plan_host(p.spare_plan_);
  try {
    build(*b);
  } catch (...) {
    // Back for the next plan (this batch is dropped without the lock,
    // which prepare holds).
    recycle_plan_host(p.spare_plan_, std::move(b->host_));
    throw;
  }
  return b;
}

std::unique_ptr<Batch> Batch::prepare_decode(const std::shared_ptr<Pool>& pool, const SeqId* seqs,
                                             const int32_t* tokens, uint32_t num_seqs, void* stream,
                                             bool persistent_table) {
  return make(pool, num_seqs, [&](Batch& b) {
    if (!b.build_decode_steady(seqs, tokens, num_seqs, stream, persistent_table))
      b.build_decode(seqs, tokens, num_seqs, stream, persistent_table);
  });
}

void Batch::start_host(const SeqId* seqs, uint32_t num_seqs) {
  PlanHost& h = *host_;
  h.seqs.assign(seqs, seqs + num_seqs);
  h.live.resize(num_seqs);
  h.versions.resize(num_seqs);
  h.epochs.resize(num_seqs);
  h.pages.resize(num_seqs);
  h.ends.resize(num_seqs);
  h.table_versions.resize(num_seqs);
  // Not cleared here: the steady decode path overwrites one range per
  // sequence in place (clearing would zero them all again each step);
  // the others clear it before they append.
  h.ranges.reserve(num_seqs);  // one each in a decode step
  h.unsure.clear();
  removals_ = pool_->seqs_.removals();
}

void Batch::build(const SeqId* seqs, const uint32_t* query_counts, uint32_t num_seqs, void* stream,
                  bool persistent_table) {
  Pool& p = *pool_;
  PlanHost& h = *host_;
  const uint64_t bs = p.opts_.block_size;
  const uint64_t w = p.opts_.sliding_window;
  start_host(seqs, num_seqs);
  h.ranges.clear();
  // Raw pointers: stores through them cannot alias the vectors' own
  // members, so the loops below keep them in registers.
  Sequence** const live = h.live.data();
  uint32_t* const versions = h.versions.data();
  uint32_t* const epochs = h.epochs.data();
  uint32_t* const page_counts = h.pages.data();
  uint64_t* const ends = h.ends.data();

  // One pass validates everything before touching anything, and notes
  // what the plan needs of each sequence: the slots its queries write
  // (ranges), and whether its context may hold unwritten slots (unsure).
  const uint64_t epoch = ++p.plan_epoch_;
  uint64_t tokens = 0, pages = 0, max_ctx = 0;
  uint32_t max_q = 0, max_pages = 0;
  // Sequences are looked up kNear ahead of their checks (in h.live), once
  // their slot arrived (prefetched kAhead ahead), and the block-table
  // entry of their first query is prefetched then.
  constexpr uint32_t kAhead = 16, kNear = 8;
  const auto resolve = [&](uint32_t j) {
    Sequence* a = p.seqs_.find(seqs[j]);
    live[j] = a;
    if (!a) return;
    const uint64_t n = a->tokens.size(), q = query_counts[j];
    if (q <= n && p.div_bs(n - q) < a->blocks.size())
      __builtin_prefetch(a->blocks.data() + p.div_bs(n - q));
  };
  for (uint32_t j = 0; j < std::min(kNear, num_seqs); ++j) resolve(j);
  for (uint32_t i = 0; i < num_seqs; ++i) {
    if (i + kAhead < num_seqs) p.seqs_.prefetch(seqs[i + kAhead]);
    if (i + kNear < num_seqs) resolve(i + kNear);
    Sequence* s = live[i];
    if (!s) fail(Errc::kNotFound, "seqs[" + str(i) + "]: " + unknown_seq(seqs[i], p.tag()));
    if (s->plan_mark == epoch)
      fail(Errc::kInvalidArgument,
           "seqs[" + str(i) + "]: " + seq_name(seqs[i]) + " appears twice in the batch");
    s->plan_mark = epoch;
    const uint64_t n = s->tokens.size();
    const uint32_t q = query_counts[i];
    if (q == 0 || q > n)
      fail(Errc::kInvalidArgument, "query_counts[" + str(i) + "] = " + str(q) + " is outside [1, " +
                                       str(n) + "], the tokens of " + seq_name(seqs[i]));
    // The first query (position n - q) reads keys from n - q - w + 1 on:
    // none of them may lie in a block the sliding window released.
    const uint64_t first_key = n - q + 1 > w ? n - q + 1 - w : 0;
    if (w > 0 && first_key / bs < s->num_null)
      fail(Errc::kInvalidArgument, "query_counts[" + str(i) + "] = " + str(q) + " makes position " +
                                       str(n - q) + " of " + seq_name(seqs[i]) +
                                       " a query, which needs keys from " + str(first_key) +
                                       " on that the sliding window already released");
    const uint64_t start = n - q;
    const uint32_t np = uint32_t(p.div_bs(n + bs - 1));
    versions[i] = s->version;
    epochs[i] = s->writes_epoch;
    ends[i] = n;
    page_counts[i] = np;
    for (uint64_t j = p.div_bs(start); j * bs < n; ++j)
      h.ranges.push_back({i,
                          uint32_t(j),
                          {s->blocks[j], uint32_t(std::max(start, j * bs) - j * bs),
                           uint32_t(std::min(n, (j + 1) * bs) - j * bs)}});
    // Without a window, positions before num_committed are written
    // (validate checks it): a decode step's context usually is all of
    // them. The others are checked below, once every range is known.
    if (w != 0 || s->num_committed < start) h.unsure.push_back(i);
    tokens += q;
    pages += np;
    max_ctx = std::max(max_ctx, n);
    max_q = std::max(max_q, q);
    max_pages = std::max(max_pages, np);
  }
  const uint64_t i32max = uint64_t(std::numeric_limits<int32_t>::max());
  if (tokens > i32max || pages > i32max)
    fail(Errc::kInvalidArgument, "the batch has " + str(tokens) + " query tokens and " +
                                     str(pages) + " pages; each must fit in int32");
  // Offload tiers: queued offloads finish before this plan's writes, and
  // tier hits are loaded before the written check below reads their state.
  p.settle_tiers_locked(stream);

  // The context each query reads: every context slot must hold written
  // K/V, or be written by this same plan first (a layer's cache write
  // precedes its attention). Otherwise the engine must compute those
  // tokens as queries: fail before changing anything.
  // The written counts after this plan's own writes, needed only when a
  // context block is not written yet (rare: built on first use).
  std::vector<std::pair<int32_t, uint32_t>> after;
  bool have_after = false;
  for (const uint32_t i : h.unsure) {
    const Sequence& s = *live[i];
    const uint64_t n = ends[i], ctx_end = n - query_counts[i];
    const uint64_t first_key = w > 0 && n - query_counts[i] + 1 > w ? ctx_end + 1 - w : 0;
    const uint64_t from = first_unwritten(s, ctx_end, first_key, after, have_after, [&] {
      std::vector<WrittenRange> rs(h.ranges.size());
      for (size_t k = 0; k < rs.size(); ++k) rs[k] = h.ranges[k].r;
      return rs;
    });
    if (from < ctx_end)
      fail(Errc::kInvalidState,
           "seqs[" + str(i) + "]: " + seq_name(seqs[i]) + " would attend over tokens [" +
               str(from) + ", " + str(ctx_end) +
               ") whose K/V no committed step wrote (the step meant to compute them was "
               "aborted, or the sequence it shared them with went away before writing); "
               "compute them in this step: query_counts[" +
               str(i) + "] >= " + str(n - from));
  }

  // A persistent table: its rows replace the CSR page ids (room made
  // before anything changes: it may fail; the rows are written below).
  if (persistent_table) table_ = page_table_for(p.page_table_, max_pages, num_seqs);
  const PlanArrays a = lay_out(tokens, pages, max_ctx, max_q, num_seqs);
  // The arrays, and the persistent table's rows, in one pass (no throw
  // from here to the copies below). The slots come from the ranges.
  PageTable* const t = table_.get();
  int64_t tk = 0, pg = 0;
  size_t rewritten = 0, k = 0;
  a.qptr[0] = a.pptr[0] = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    const uint64_t n = ends[i];
    const uint32_t np = page_counts[i];
    for (; k < h.ranges.size() && h.ranges[k].seq == i; ++k) {
      const QueryRange& q = h.ranges[k];
      const int64_t first = int64_t(q.r.block) * int64_t(bs);
      for (uint32_t slot = q.r.lo; slot < q.r.hi; ++slot) a.slots[tk++] = first + slot;
    }
    pg += t ? int64_t(t->stride) : int64_t(np);
    a.qptr[i + 1] = int32_t(tk);
    a.pptr[i + 1] = int32_t(pg);
    a.last[i] = int32_t(n - (uint64_t(np) - 1) * bs);
    a.ctx[i] = int32_t(n);
    if (t) rewritten += update_page_row(*t, i, seqs[i], *live[i], np);
  }
  finish(a, seqs, rewritten, stream);
}

Batch::PlanArrays Batch::lay_out(uint64_t tokens, uint64_t pages, uint64_t max_ctx, uint32_t max_q,
                                 uint32_t num_seqs) {
  Pool& p = *pool_;
  PlanHost& h = *host_;
  if (table_) pages = uint64_t(num_seqs) * table_->stride;
  const bool on_device = p.backend_ && p.backend_->device_type() != kDeviceCpu;
  const bool host_table = table_ && !on_device;

  BatchInfo& info = info_;
  info.num_seqs = num_seqs;
  info.num_tokens = tokens;
  info.num_pages = pages;
  info.max_context = max_ctx;
  info.max_query = max_q;
  info.block_size = uint32_t(p.opts_.block_size);

  // One buffer: i64 slots first, then the i32 arrays.
  // A host pool's persistent table is not in the buffer: plans point at it.
  const size_t sizes[6] = {
      tokens * 8,      (num_seqs + 1) * 4ull, (num_seqs + 1) * 4ull, host_table ? 0 : pages * 4,
      num_seqs * 4ull, num_seqs * 4ull};
  size_t off = 0;
  for (int a = 0; a < 6; ++a) {
    offsets_[a] = off;
    off += (sizes[a] + 7) & ~size_t(7);
  }
  bytes_ = off;
  // Two copies of the arrays: the kernels read the first, callers get the
  // second (plan_tensor), so nothing a caller writes into a plan array can
  // move a kernel's reads or writes out of bounds (DESIGN.md section 9).
  reserve_plan_words(h, 2 * off / 8);
  // Nothing counts as computed yet: commit() (or a cache write of every
  // layer) says the step's writes happened.
  if (p.has_storage()) {
    layer_written_.assign(p.opts_.num_layers, 0);
    layers_left_ = p.opts_.num_layers;
  }
  h.page_indptr_off = offsets_[2];
  h.page_indices_off = offsets_[3];
  char* base = reinterpret_cast<char*>(h.data.get());
  PlanArrays a;
  a.slots = reinterpret_cast<int64_t*>(base + offsets_[0]);
  a.qptr = reinterpret_cast<int32_t*>(base + offsets_[1]);
  a.pptr = reinterpret_cast<int32_t*>(base + offsets_[2]);
  a.pidx = reinterpret_cast<int32_t*>(base + offsets_[3]);
  a.last = reinterpret_cast<int32_t*>(base + offsets_[4]);
  a.ctx = reinterpret_cast<int32_t*>(base + offsets_[5]);
  return a;
}

void Batch::finish(const PlanArrays& a, const SeqId* seqs, size_t rewritten, void* stream) {
  Pool& p = *pool_;
  PlanHost& h = *host_;
  PageTable* const t = table_.get();
  const uint32_t num_seqs = info_.num_seqs;
  const uint64_t pages = info_.num_pages;
  const bool on_device = p.backend_ && p.backend_->device_type() != kDeviceCpu;
  const bool host_table = t && !on_device;
  char* base = reinterpret_cast<char*>(h.data.get());
  const size_t off = bytes_;
  if (!t)
    rows_reused_ =
        fill_page_rows(p.last_plan_.get(), h, seqs, h.live.data(), a.pptr, a.pidx, num_seqs);
  else
    rows_reused_ = num_seqs - rewritten;
  if (t && !host_table) std::memcpy(a.pidx, t->kern.get(), pages * sizeof(int32_t));
  host_view_ = view_at(base, offsets_, info_);
  if (host_table) host_view_.page_indices = t->kern.get();

  if (on_device) {
    std::memcpy(base + off, base, off);  // the callers' copy, uploaded with the kernels'
    device_ = p.backend_->allocate_async(2 * bytes_, stream);
    stream_ = stream;
    try {
      p.run_pending_copies(stream);
      p.backend_->upload(device_, base, 2 * bytes_, stream);
    } catch (...) {
      p.backend_->deallocate_async(device_, stream);
      device_ = nullptr;
      throw;
    }
    view_ = view_at(static_cast<const char*>(device_), offsets_, info_);
  } else {
    p.run_pending_copies(stream);
    view_ = host_view_;
  }
  state_ = State::kOpen;
  recyclable_ = true;
  if (!t) remember_plan(p.last_plan_, p.spare_plan_, host_);
}

Batch::~Batch() {
  const bool count = state_ == State::kOpen && !pool_->has_storage();
  if (!recyclable_) return;  // prepare failed (and holds the lock); nothing on the device yet
  std::lock_guard<OpMutex> lock(pool_->mu_);
  // ABI 1 compatibility: a manager-only pool's engine writes K/V elsewhere
  // and older callers never commit, so a step destroyed without abort
  // counts as done. A pool with storage knows better: unless every layer
  // was written (or the caller committed), nothing counts.
  if (count && !pool_->closed_) {
    try {
      commit_locked();
    } catch (...) {  // out of memory: the tokens stay uncomputed, which is safe
    }
  }
  // The plan memory goes back to the pool for the next plan.
  if (!pool_->closed_) recycle_plan_host(pool_->spare_plan_, std::move(host_));
  table_.reset();  // under the lock: the next plan may update it in place
  // A plan going away changes no sequence unless it committed just now
  // (ABI 1): the lane stays exact, also when an engine drops the previous
  // step's plan after preparing the next. The lane's own step committed
  // here has kept the lane or ended it already.
  Pool::DecodeMemo& memo = pool_->decode_memo_;
  if (memo.lane_batch == this) {
    pool_->keep_lane();
    memo.lane_batch = nullptr;
  } else if (!(count && !pool_->closed_)) {
    pool_->keep_lane();
  }
  if (device_) pool_->backend_->deallocate_async(device_, stream_);
  if (positions_device_) pool_->backend_->deallocate_async(positions_device_, stream_);
}

void Batch::commit() { commit_checked(true); }

void Batch::commit_general_for_testing() { commit_checked(false); }

void Batch::commit_checked(bool fast) {
  std::lock_guard<OpMutex> lock(pool_->mu_);
  if (state_ == State::kAborted)
    fail(Errc::kInvalidState, "the batch was aborted (pkv_batch_abort); it cannot be committed");
  if (state_ == State::kCommitted) return pool_->keep_lane();  // changes nothing
  pool_->check_open();
  commit_locked(fast);
}

void Batch::abort() {
  std::lock_guard<OpMutex> lock(pool_->mu_);
  if (state_ == State::kCommitted) {
    pool_->keep_lane();  // refused: nothing changes
    fail(Errc::kInvalidState,
         "the step is already committed (pkv_batch_commit, or pkv_cache_write of every layer)");
  }
  state_ = State::kAborted;
}

// The plan rows' sequences as commit finds them: null when one was freed,
// or truncated or rewritten, since prepare (its slots may hold other
// tokens now). The arrays are read through local pointers so that the
// stores of a commit pass do not force them to be loaded again.
struct Batch::CommitRows {
  Sequence** live;
  const SeqId* ids;
  const uint32_t* epochs;
  size_t m;
  bool same;  // no sequence removed since prepare: live[] still stands

  explicit CommitRows(PlanHost& h, bool same_)
      : live(h.live.data()),
        ids(h.seqs.data()),
        epochs(h.epochs.data()),
        m(h.seqs.size()),
        same(same_) {}
  // Row i's sequence; row i + 16's lines are requested on the way. live[i]
  // is only ever cleared: a sequence that went away does not come back.
  Sequence* at(size_t i, SeqTable& seqs) {
    constexpr size_t kAhead = 16;
    if (i + kAhead < m) {
      if (!same)
        seqs.prefetch(ids[i + kAhead]);
      else if (const Sequence* a = live[i + kAhead]) {
        __builtin_prefetch(a);
        __builtin_prefetch(&a->writes_epoch);  // the line after tokens and blocks
      }
    }
    Sequence* s = same ? live[i] : seqs.find(ids[i]);
    if (s && s->writes_epoch != epochs[i]) s = nullptr;
    live[i] = s;
    return s;
  }
};

void Batch::commit_locked(bool fast) {
  Pool& p = *pool_;
  PlanHost& h = *host_;
  const size_t m = h.seqs.size();
  // A sequence freed or truncated since prepare is skipped (its slots may
  // hold other tokens now), and so is any block its table no longer names
  // at that place (a copy-on-write moved it, or it was released): marking
  // less is always safe, the next plan computes the rest.
  // The sequences prepare resolved still stand unless some sequence was
  // freed since (a slot is reused only after a free); otherwise each id is
  // looked up again, so a freed one is never read through its old slot.
  const bool same = p.seqs_.removals() == removals_;
  if (fast && p.opts_.sliding_window == 0 && decode_shaped()) return commit_decode_locked(same);
  // Ranges in blocks the sequence holds alone (its tail, by the
  // tail_shared promise: every decode query but those that fill a block)
  // cannot meet another sequence's range, so only the others need
  // Pool::apply_written's check for ranges sharing a block.
  h.written.clear();
  h.exclusive.clear();
  h.written.reserve(h.ranges.size());  // may throw: before any change
  h.exclusive.reserve(h.ranges.size());
  // Prefetch distances, in sequences: the slot, then (once it arrived)
  // the table entry of the first range, and the block's counts.
  constexpr size_t kNear = 8;
  Sequence** const live = h.live.data();
  CommitRows rows(h, same);
  const QueryRange* const ranges = h.ranges.data();
  const size_t num_ranges = h.ranges.size();
  size_t k = 0;
  for (size_t i = 0; i < m; ++i) {
    Sequence* s = rows.at(i, p.seqs_);
    if (same && i + kNear < m && k + kNear < num_ranges)
      if (const Sequence* a = live[i + kNear]) {
        const QueryRange& q = ranges[k + kNear];  // a range of a sequence near i + kNear
        if (q.index < a->blocks.size()) __builtin_prefetch(a->blocks.data() + q.index);
      }
    if (k + kNear < num_ranges) p.blocks_.prefetch_counts(ranges[k + kNear].r.block);
    const size_t first = k;  // the ranges of sequence i: [first, k)
    while (k < num_ranges && ranges[k].seq == i) ++k;
    if (!s) continue;
    const uint64_t tail = s->tail_shared ? ~uint64_t(0) : p.div_bs(s->tokens.size());
    for (size_t r = first; r < k; ++r) {
      const QueryRange& q = ranges[r];
      if (q.index < s->blocks.size() && s->blocks[q.index] == q.r.block)
        (q.index >= tail ? h.exclusive : h.written).push_back(q.r);
    }
  }
  p.apply_written(h.written);  // may throw before any change
  for (const WrittenRange& r : h.exclusive) {
    const uint32_t w = p.blocks_.written(r.block);
    if (r.lo <= w && r.hi > w) p.blocks_.set_written(r.block, r.hi);
  }
  state_ = State::kCommitted;
  if (p.opts_.sliding_window == 0) {
    for (size_t i = 0; i < m; ++i)
      if (Sequence* s = h.live[i])
        s->num_committed = std::max(s->num_committed,
                                    std::min(h.ends[i], p.computed_tokens(*s, s->num_committed)));
    return;
  }
  // With a window, tokens before it may never have been computed (nothing
  // reads them): a sequence whose every query slot is now written counts
  // up to its end, which lets the window release behind it.
  std::vector<uint8_t> whole(m, 1);
  for (const QueryRange& q : h.ranges) {
    const Sequence* s = h.live[q.seq];
    const bool ok = s && q.index < s->blocks.size() && s->blocks[q.index] == q.r.block &&
                    p.blocks_.written(q.r.block) >= q.r.hi;
    if (!ok) whole[q.seq] = 0;
  }
  for (size_t i = 0; i < m; ++i)
    if (Sequence* s = h.live[i]; s && whole[i])
      s->num_committed = std::max(s->num_committed, h.ends[i]);
}

bool Batch::decode_shaped() const {
  if (decode_step_) return true;
  const PlanHost& h = *host_;
  const size_t m = h.seqs.size();
  if (h.ranges.size() != m) return false;
  for (size_t i = 0; i < m; ++i)
    if (h.ranges[i].seq != i || h.ranges[i].r.hi != h.ranges[i].r.lo + 1) return false;
  return true;
}

// commit_locked for a decode step (one query per sequence, no window): the
// general path's three passes (classify the ranges, mark them, then walk
// each sequence's blocks for its computed count) in one, for what nearly
// every sequence of such a step is: its query slot is the next one of a
// tail block it holds alone, and everything before it was computed. That
// slot is marked and the count moves past it at once (no other range can
// touch that block, and the count depends on nothing else). The rest (a
// query that filled its block, a shared tail, a context not yet computed)
// take the general path's rules after all ranges are marked.
void Batch::commit_decode_locked(bool same) {
  Pool& p = *pool_;
  PlanHost& h = *host_;
  // The steady step that wrote the lane, committed next: the lane stays
  // exact if every sequence counts its step's token as computed.
  Pool::DecodeMemo& memo = p.decode_memo_;
  const bool lane = memo.lane_batch == this && p.lane_follows();
  const size_t m = h.seqs.size();
  const uint64_t bs = p.opts_.block_size;
  h.written.clear();
  h.unsure.clear();
  h.written.reserve(m);  // may throw: before any change
  h.unsure.reserve(m);
  constexpr size_t kNear = 8;
  Sequence** const live = h.live.data();
  const QueryRange* const ranges = h.ranges.data();
  const uint64_t* const ends = h.ends.data();
  const uint32_t* const versions = h.versions.data();
  // Row i of sequence s (still the row's sequence) in general.
  auto row = [&](size_t i, Sequence* s) {
    const QueryRange& q = ranges[i];
    if (q.index >= s->blocks.size() || s->blocks[q.index] != q.r.block) {
      h.unsure.push_back(uint32_t(i));  // its count may still move (reserved)
      return;
    }
    const bool alone = !s->tail_shared && q.index >= p.div_bs(s->tokens.size());
    if (!alone) {
      h.written.push_back(q.r);  // reserved
      h.unsure.push_back(uint32_t(i));
      return;
    }
    const uint32_t w = p.blocks_.written(q.r.block);
    if (q.r.lo <= w && q.r.hi > w) p.blocks_.set_written(q.r.block, q.r.hi);
    // Computed up to the query and its slot now written: computed through
    // it (computed_tokens would stop in this block or at its end, and the
    // count never passes ends[i]).
    const uint64_t at = q.index * bs + q.r.lo;
    if (s->num_committed == at && p.blocks_.written(q.r.block) >= q.r.hi && q.index >= s->num_null)
      s->num_committed = ends[i];
    else if (s->num_committed < ends[i])
      h.unsure.push_back(uint32_t(i));
  };
  // Row i's query slot marked and its sequence's count moved, where that
  // slot is the next one of a tail block s holds alone.
  auto mark = [&](size_t i, Sequence* s, const QueryRange& q) {
    const int32_t b = q.r.block;
    const uint32_t w = p.blocks_.written(b);
    if (w == q.r.lo) p.blocks_.set_written(b, q.r.hi);
    if (s->num_committed == ends[i] - 1 && w >= q.r.lo)
      s->num_committed = ends[i];
    else if (s->num_committed < ends[i])
      h.unsure.push_back(uint32_t(i));
  };
  // Unchanged since prepare (no append, truncate or copy-on-write moved
  // its tokens or blocks), its tail its own, and a query that does not
  // fill its block: the row's block is its tail, which no other row
  // writes, so the general rule reduces to mark.
  auto same_row = [&](size_t i) {
    Sequence* s = live[i];
    const QueryRange& q = ranges[i];
    if (s->version != versions[i] || s->tail_shared || q.r.hi >= bs) {
      if (s->writes_epoch == h.epochs[i])
        row(i, s);
      else
        live[i] = nullptr;  // truncated since prepare: as CommitRows::at
      return;
    }
    mark(i, s, q);
  };
  if (lane && lane_ && same) {
    // The lane's own step, and nothing ran on the pool since it: every
    // sequence is as prepare left it. Those it did not list continued
    // inside a tail block they hold alone (pass 1 of a lane step), so
    // same_row's checks hold for them without reading them again.
    const uint32_t* slow = h.slow.data();
    const uint32_t* const slow_end = slow + lane_slow_;
    size_t next_slow = slow != slow_end ? *slow : m;
    // The counts in a local: through p.blocks_ the compiler reloaded the
    // array's address after every store to a sequence.
    BlockPool::Counts* const cn = p.blocks_.counts_for_decode();
    for (size_t i = 0; i < m; ++i) {
      if (i + kNear < m) {
        __builtin_prefetch(cn + ranges[i + kNear].r.block, 1);
        __builtin_prefetch(&live[i + kNear]->num_committed, 1);
      }
      if (i == next_slow) {
        same_row(i);
        next_slow = ++slow != slow_end ? *slow : m;
        continue;
      }
      // mark's usual outcome in line: the slot is the block's next one and
      // the sequence counted every token before it.
      Sequence* const s = live[i];
      const QueryRange& q = ranges[i];
      BlockPool::Counts& c = cn[q.r.block];
      const uint64_t e = ends[i];
      if (__builtin_expect(c.written == q.r.lo && s->num_committed == e - 1, 1)) {
        c.written = uint16_t(q.r.hi);
        s->num_committed = e;
        continue;
      }
      mark(i, s, q);
    }
  } else if (same) {
    for (size_t i = 0; i < m; ++i) {
      if (i + kNear < m) {
        p.blocks_.prefetch_counts(ranges[i + kNear].r.block);
        __builtin_prefetch(live[i + kNear]);
      }
      same_row(i);
    }
  } else {
    CommitRows rows(h, same);
    for (size_t i = 0; i < m; ++i) {
      Sequence* s = rows.at(i, p.seqs_);
      if (i + kNear < m) p.blocks_.prefetch_counts(ranges[i + kNear].r.block);
      if (s) row(i, s);
    }
  }
  p.apply_written(h.written);  // only shared or filled blocks; distinct ones allocate nothing
  state_ = State::kCommitted;
  bool exact = lane;
  for (const uint32_t i : h.unsure) {
    Sequence* s = live[i];
    if (s)
      s->num_committed =
          std::max(s->num_committed, std::min(ends[i], p.computed_tokens(*s, s->num_committed)));
    exact = exact && s && s->num_committed >= ends[i];
  }
  if (lane) {
    memo.lane_ops = exact ? p.mu_.ops() : Pool::DecodeMemo::kNoLane;
    memo.lane_committed = exact;
  }
}

TensorArg Batch::plan_tensor(uint32_t which) const {
  if (which > 5)
    fail(Errc::kInvalidArgument, "which " + str(which) + " is not a PKV_PLAN_* array (0..5)");
  const uint64_t S = info_.num_seqs;
  const int64_t lens[6] = {int64_t(info_.num_tokens), int64_t(S + 1), int64_t(S + 1),
                           int64_t(info_.num_pages),  int64_t(S),     int64_t(S)};
  TensorArg t;
  const char* base = device_ ? static_cast<const char*>(device_)
                             : reinterpret_cast<const char*>(host_->data.get());
  if (!device_) {
    char* h = reinterpret_cast<char*>(host_->data.get());
    std::call_once(callers_copy_, [&] { std::memcpy(h + bytes_, h, bytes_); });
  }
  t.data = const_cast<char*>(base + bytes_ + offsets_[which]);  // the callers' copy
  if (which == uint32_t(PlanArray::kPageIndices) && table_ && !device_) t.data = table_->call.get();
  t.dtype = which == 0 ? uint32_t(DType::kI64) : uint32_t(DType::kI32);
  t.device_type = pool_->opts_.device_type;
  t.device_id = pool_->opts_.device_id;
  t.ndim = 1;
  t.shape[0] = lens[which];
  t.strides[0] = 1;
  return t;
}

void Batch::check_fresh() const {
  const Pool& p = *pool_;
  p.check_open();
  const PlanHost& h = *host_;
  for (size_t i = 0; i < h.seqs.size(); ++i) {
    const Sequence* s = p.seqs_.find(h.seqs[i]);
    if (!s) fail(Errc::kInvalidState, "the plan is stale: " + seq_name(h.seqs[i]) + " was freed");
    if (s->version != h.versions[i])
      fail(Errc::kInvalidState, "the plan is stale: " + seq_name(h.seqs[i]) +
                                    " changed (append, truncate) after pkv_batch_prepare");
  }
}

void Batch::write(uint32_t layer, const TensorArg* k, const TensorArg* v, void* stream) {
  Pool& p = *pool_;
  std::unique_lock<OpMutex> lock(p.mu_);
  p.keep_lane();  // checks only, until the write's second section
  check_layer_call(layer, false, "pkv_cache_write");
  const PoolOptions& o = p.opts_;
  RowsSpec spec{o.dtype,
                o.device_type,
                o.device_id,
                int64_t(info_.num_tokens),
                int64_t(o.num_kv_heads),
                int64_t(o.head_dim)};
  ByteSpan ks, vs;
  spec.dtype = activation_dtype(o.dtype, k, "k");
  Tensor3 k3 = check_rows(k, "k", spec, &ks);
  spec.dtype = activation_dtype(o.dtype, v, "v");
  Tensor3 v3 = check_rows(v, "v", spec, &vs);
  // k and v may be read from other layers' storage (the write holds the
  // KV lock exclusively), not from the planes this write fills.
  const ByteSpan dst = layer_span(p.arena_, layer);
  check_disjoint(ks, "k", dst, "the pool's KV storage of the layer it writes");
  check_disjoint(vs, "v", dst, "the pool's KV storage of the layer it writes");
  // The kernel runs outside the lock (docs/threading.md): it holds the
  // storage, so a pool destroyed meanwhile frees it only when this returns.
  const KvArena arena = p.arena_;
  const std::shared_ptr<void> hold = p.arena_hold_;
  lock.unlock();
  std::unique_lock<std::shared_mutex> kv_lock(p.kv_mu_);
  p.backend_->write(arena, int32_t(layer), view_, k3, v3, stream);
  // Lock order is mu_ before kv_mu_ (swap_blocks and copy_blocks hold mu_
  // while they take kv_mu_): let go of the KV lock before taking mu_ again.
  kv_lock.unlock();
  lock.lock();
  mark_layer_written_keeping_lane(layer);
}

void Batch::mark_layer_written_keeping_lane(uint32_t layer) {
  Pool& p = *pool_;
  const bool follows = p.lane_follows();
  const State before = state_;
  mark_layer_written(layer);
  // A layer that is not the last changes nothing the lane holds; the last
  // commits, which keeps the lane or ends it when this step wrote it, and
  // ends it otherwise (another plan's sequences counted more tokens).
  if (follows && (state_ == before || p.decode_memo_.lane_batch == this)) p.keep_lane();
}

void Batch::mark_layer_written(uint32_t layer) {
  if (layer_written_[layer] == 0) {
    layer_written_[layer] = 1;
    --layers_left_;
  }
  if (layers_left_ == 0 && state_ == State::kOpen && !pool_->closed_) commit_locked();
}

void Batch::check_layer_call(uint32_t layer, bool mla, const char* call) const {
  const Pool& p = *pool_;
  check_fresh();
  if (!p.has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (created with num_layers 0)");
  const PoolOptions& o = p.opts_;
  if (o.is_mla() != mla)
    fail(Errc::kInvalidState,
         std::string(call) +
             (mla ? " needs an MLA pool (kv_layout PKV_KV_LAYOUT_MLA); this pool stores K and V: "
                    "use pkv_cache_write / pkv_attention_forward"
                  : " cannot serve an MLA pool (kv_layout PKV_KV_LAYOUT_MLA): use "
                    "pkv_mla_cache_write / pkv_mla_attention"));
  if (layer >= o.num_layers)
    fail(Errc::kInvalidArgument,
         "layer " + str(layer) + " is out of range [0, " + str(o.num_layers) + ")");
}

void Batch::attend(uint32_t layer, const TensorArg* q, const TensorArg* out, const TensorArg* lse,
                   const AttentionParams& params, void* stream) {
  Pool& p = *pool_;
  std::unique_lock<OpMutex> lock(p.mu_);
  p.keep_lane();  // reads only
  check_layer_call(layer, false, "pkv_attention_forward");
  const PoolOptions& o = p.opts_;
  if (!std::isfinite(params.softmax_scale) || params.softmax_scale < 0)
    fail(Errc::kInvalidArgument, "params->softmax_scale must be finite and >= 0");
  if (!std::isfinite(params.logit_softcap) || params.logit_softcap < 0)
    fail(Errc::kInvalidArgument, "params->logit_softcap must be finite and >= 0");
  if (o.sliding_window > 0 &&
      (params.sliding_window == 0 || params.sliding_window > o.sliding_window))
    fail(Errc::kInvalidArgument, "params->sliding_window " + str(params.sliding_window) +
                                     " must be in [1, " + str(o.sliding_window) +
                                     "]: the pool's window released older blocks");
  if (params.sliding_window > uint32_t(std::numeric_limits<int32_t>::max()))
    fail(Errc::kInvalidArgument, "params->sliding_window exceeds 2^31 - 1");
  RowsSpec qs{
      activation_dtype(o.dtype, q, "q"), o.device_type,      o.device_id, int64_t(info_.num_tokens),
      -int64_t(o.num_kv_heads),          int64_t(o.head_dim)};
  ByteSpan q_span, out_span, lse_span;
  Tensor3 q3 = check_rows(q, "q", qs, &q_span);
  // The kernels index a sequence's query rows of one KV head (its queries
  // times the q heads per KV head) with int32.
  const int64_t group = q3.n1 / int64_t(o.num_kv_heads);
  if (int64_t(info_.max_query) * group > std::numeric_limits<int32_t>::max())
    fail(Errc::kInvalidArgument,
         "q has " + str(uint64_t(q3.n1)) + " heads, " + str(uint64_t(group)) +
             " per KV head: with the plan's " + str(info_.max_query) +
             " queries of one sequence that is more than 2^31 - 1 query rows per KV head");
  RowsSpec os{q3.dtype, o.device_type, o.device_id, q3.n0, q3.n1, q3.n2, true};
  Tensor3 out3 = check_rows(out, "out", os, &out_span);
  const ByteSpan kv = arena_span(p.arena_);
  check_disjoint(out_span, "out", q_span, "q");
  check_disjoint(out_span, "out", kv, "the pool's KV storage");
  AttentionArgs args{};
  args.softmax_scale =
      params.softmax_scale != 0 ? params.softmax_scale : 1.0f / std::sqrt(float(o.head_dim));
  args.sliding_window = int32_t(params.sliding_window);
  args.logit_softcap = params.logit_softcap;
  if (lse) {
    args.lse =
        check_lse(lse, o.device_type, o.device_id, q3.n0, q3.n1, &args.lse_stride0, &lse_span);
    check_disjoint(lse_span, "lse", q_span, "q");
    check_disjoint(lse_span, "lse", out_span, "out");
    check_disjoint(lse_span, "lse", kv, "the pool's KV storage");
  }
  const KvArena arena = p.arena_;
  const std::shared_ptr<void> hold = p.arena_hold_;  // as in write()
  lock.unlock();
  std::shared_lock<std::shared_mutex> kv_lock(p.kv_mu_);
  p.backend_->attend(arena, int32_t(layer), view_, q3, out3, args, stream);
}

}  // namespace pagedkv
