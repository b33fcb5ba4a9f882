// GroupBatch (group_plan.h): step plans over a multi-group pool.
#include "group_plan.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "error.h"

namespace pagedkv {

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

std::string at(uint32_t i, SeqId id) { return "seqs[" + str(i) + "]: " + seq_name(id); }

}  // namespace

std::unique_ptr<GroupBatch> GroupBatch::prepare(const std::shared_ptr<GroupPool>& pool,
                                                const SeqId* seqs, const uint32_t* query_counts,
                                                uint32_t num_seqs, bool persistent) {
  GroupPool& p = *pool;
  std::lock_guard<std::mutex> lock(p.mu_);
  if (p.closed_) fail(Errc::kInvalidState, "the pool was destroyed");
  if (num_seqs == 0) fail(Errc::kInvalidArgument, "num_seqs is 0");
  const uint64_t bs = p.opts_.block_size;
  const uint32_t G = p.num_groups();
  std::unique_ptr<GroupBatch> b(new GroupBatch);
  b->pool_ = pool;
  b->seqs_.assign(seqs, seqs + num_seqs);
  std::vector<GroupPool::Seq*> live(num_seqs);
  std::vector<uint64_t> computed(num_seqs);
  std::unordered_set<SeqId> seen;
  seen.reserve(num_seqs);

  // Validate everything before touching anything.
  uint64_t tokens = 0, max_ctx = 0;
  uint32_t max_q = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    auto it = p.seqs_.find(seqs[i]);
    if (it == p.seqs_.end())
      fail(Errc::kNotFound, "seqs[" + str(i) + "]: " + unknown_seq(seqs[i], p.tag_.value()));
    if (!seen.insert(seqs[i]).second)
      fail(Errc::kInvalidArgument, at(i, seqs[i]) + " appears twice in the batch");
    GroupPool::Seq& s = it->second;
    const uint64_t n = s.tokens.size();
    const uint32_t q = query_counts[i];
    if (q == 0 || q > n)
      fail(Errc::kInvalidArgument, "query_counts[" + str(i) + "] = " + str(q) + " is outside [1, " +
                                       str(n) + "], the tokens of " + seq_name(seqs[i]));
    const uint64_t start = n - q;
    // A sequence planned for the first time was appended to by manager
    // calls that counted its tokens computed at once: from now on only a
    // committed plan does, starting with this one's queries.
    const uint64_t c = s.planned ? s.num_computed : std::min(s.num_computed, start);
    if (start > c)
      fail(Errc::kInvalidState,
           at(i, seqs[i]) + " would attend over tokens [" + str(c) + ", " + str(start) +
               ") whose K/V no committed step wrote; compute them in this step: query_counts[" +
               str(i) + "] >= " + str(n - c));
    for (uint32_t g = 0; g < G; ++g) {
      const GroupSpec& spec = p.groups_[g];
      if (spec.kind == GroupKind::kRecurrent) {
        if (s.table[g].empty())
          fail(Errc::kInvalidState, at(i, seqs[i]) + " has no state slot in group " + str(g) +
                                        " yet (pkv_seq_append gives it one)");
        // The state holds every token counted computed, those a first plan
        // takes back included (appends before the pool's first plan
        // counted them): recomputing some of them would apply them twice.
        // Only a recompute from position 0 (the state restarts) is whole.
        const uint64_t held = s.planned ? c : (start == 0 ? 0 : s.num_computed);
        if (start < held)
          fail(Errc::kInvalidArgument,
               "query_counts[" + str(i) + "] = " + str(q) + " recomputes tokens [" + str(start) +
                   ", " + str(held) + ") of " + seq_name(seqs[i]) + " that the state of group " +
                   str(g) + " already holds (a recurrent state cannot be rolled back)");
        continue;
      }
      const uint64_t w = spec.sliding_window;
      const uint64_t first_key = w > 0 && start + 1 > w ? start + 1 - w : 0;
      if (w > 0 && first_key / bs < s.num_null[g])
        fail(Errc::kInvalidArgument,
             "query_counts[" + str(i) + "] = " + str(q) + " makes position " + str(start) + " of " +
                 seq_name(seqs[i]) + " a query, which needs keys from " + str(first_key) +
                 " on that the sliding window of group " + str(g) + " already released");
    }
    live[i] = &s;
    computed[i] = c;
    tokens += q;
    max_ctx = std::max(max_ctx, n);
    max_q = std::max(max_q, q);
  }
  // A live state slot that another sequence starts from (a fork child
  // before its first append) must keep its state: the step writes a copy.
  std::vector<std::pair<uint32_t, uint32_t>> moves;  // (sequence, group)
  for (uint32_t i = 0; i < num_seqs; ++i)
    for (uint32_t g = 0; g < G; ++g) {
      if (!p.recurrent(g)) continue;
      const int32_t slot = live[i]->table[g][0];
      if (p.ref_[slot] - p.pin_[slot] > 1 || !p.key_[slot].empty()) moves.push_back({i, g});
    }
  if (moves.size() > uint64_t(p.queue_.size()))
    fail(Errc::kOutOfBlocks, "the plan must move " + str(moves.size()) +
                                 " shared state slots to copies; " + str(p.queue_.size()) +
                                 " blocks are free");
  for (const auto& m : moves)
    p.copies_[m.second].reserve(p.copies_[m.second].size() + moves.size());
  const uint64_t i32max = uint64_t(std::numeric_limits<int32_t>::max());
  uint64_t max_pages = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) max_pages += (live[i]->tokens.size() + bs - 1) / bs;
  if (tokens > i32max || max_pages > i32max)
    fail(Errc::kInvalidArgument, "the batch has " + str(tokens) + " query tokens and " +
                                     str(max_pages) + " pages; each must fit in int32");

  // The arrays (may throw: nothing changed yet).
  b->qptr_.assign(num_seqs + 1, 0);
  b->ctx_.resize(num_seqs);
  b->positions_.reserve(tokens);
  b->last_rows_.resize(num_seqs);
  for (uint32_t i = 0; i < num_seqs; ++i) {
    const uint64_t n = live[i]->tokens.size();
    for (uint64_t pos = n - query_counts[i]; pos < n; ++pos) b->positions_.push_back(int64_t(pos));
    b->qptr_[i + 1] = int32_t(b->positions_.size());
    b->ctx_[i] = int32_t(n);
    b->last_rows_[i] = int64_t(b->positions_.size()) - 1;
  }
  b->groups_.resize(G);
  for (uint32_t g = 0; g < G; ++g) {
    Arrays& a = b->groups_[g];
    const bool rec = p.recurrent(g);
    a.pptr.assign(num_seqs + 1, 0);
    a.last.resize(num_seqs);
    a.slots.reserve(rec ? num_seqs : tokens);
    for (uint32_t i = 0; i < num_seqs; ++i) {
      const std::vector<int32_t>& t = live[i]->table[g];
      const uint64_t n = live[i]->tokens.size();
      if (rec) {  // the live state slot is the sequence's one page
        if (!persistent) a.pidx.push_back(t[0]);
        a.slots.push_back(t[0]);
        a.last[i] = 1;
      } else {
        const uint64_t np = (n + bs - 1) / bs;
        if (!persistent) a.pidx.insert(a.pidx.end(), t.begin(), t.begin() + np);
        for (uint64_t pos = n - query_counts[i]; pos < n; ++pos)
          a.slots.push_back(int64_t(t[pos / bs]) * int64_t(bs) + int64_t(pos % bs));
        a.last[i] = int32_t(n - (np - 1) * bs);
      }
      a.pptr[i + 1] = int32_t(a.pidx.size());
    }
    if (persistent) {
      // Rows hold the tables as they are now; a state slot moved below is
      // patched there (which cannot throw).
      std::vector<GroupRow> rows(num_seqs);
      for (uint32_t i = 0; i < num_seqs; ++i) {
        const GroupPool::Seq& s = *live[i];
        const uint64_t np = (s.tokens.size() + bs - 1) / bs;
        rows[i] = {seqs[i], s.table[g].data(), rec ? 1u : uint32_t(np),
                   rec ? 0u : uint32_t(std::min<uint64_t>(s.num_null[g], np)), s.version[g]};
      }
      a.table = group_page_table(p.kept_tables_[g], rows, !rec, &a.rewritten);
      for (uint32_t i = 0; i <= num_seqs; ++i) a.pptr[i] = int32_t(uint64_t(i) * a.table->stride);
    }
  }
  const uint64_t snapshots = b->plan_snapshots(live, query_counts);
  if (moves.size() + snapshots > uint64_t(p.queue_.size()))
    fail(Errc::kOutOfBlocks, "the plan needs " + str(moves.size() + snapshots) +
                                 " blocks (state slot moves and snapshot slots); " +
                                 str(p.queue_.size()) + " are free");
  b->epochs_.resize(num_seqs);
  b->ends_.resize(num_seqs);
  BatchInfo& info = b->info_;
  info.num_seqs = num_seqs;
  info.num_tokens = tokens;
  info.num_pages =
      persistent ? uint64_t(num_seqs) * b->groups_[0].table->stride : b->groups_[0].pidx.size();
  info.max_context = max_ctx;
  info.max_query = max_q;
  info.block_size = uint32_t(bs);

  // Nothing below throws.
  for (const auto& m : moves) {
    int32_t& slot = live[m.first]->table[m.second][0];
    const int32_t next = p.allocate(m.second);
    p.record_copy(m.second, slot, next);
    ++p.cow_;
    p.release(slot);
    slot = next;
    const uint32_t version = ++live[m.first]->version[m.second];
    Arrays& a = b->groups_[m.second];
    if (a.table) {  // the row was written with the old slot
      a.table->ids[size_t(m.first) * a.table->stride] = next;
      a.table->version[m.first] = version;
    } else {
      a.pidx[m.first] = next;
    }
    a.slots[m.first] = next;
  }
  b->take_snapshots();
  p.planned_ = true;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    GroupPool::Seq& s = *live[i];
    if (!s.planned) {
      // Full blocks from its first query on were cached at append, before
      // anything wrote them: those it holds alone leave the cache now.
      s.num_computed = computed[i];
      for (uint32_t g = 0; g < G; ++g) {
        if (p.recurrent(g)) continue;
        for (uint64_t k = computed[i] / bs; k < s.table[g].size(); ++k) {
          const int32_t blk = s.table[g][k];
          if (blk != 0 && p.ref_[blk] == 1 && !p.key_[blk].empty()) p.uncache(blk);
        }
      }
      s.planned = true;
    }
    b->epochs_[i] = s.epoch;
    b->ends_[i] = s.tokens.size();
  }
  b->state_ = State::kOpen;
  b->recyclable_ = true;
  return b;
}

GroupBatch::~GroupBatch() {
  if (!recyclable_) return;
  std::lock_guard<std::mutex> lock(pool_->mu_);
  // ABI 1 compatibility, as manager-only single-group plans: a plan
  // destroyed with neither commit nor abort counts as committed.
  if (state_ == State::kOpen && !pool_->closed_) {
    try {
      commit_locked();
    } catch (...) {  // out of memory caching: the tokens stay counted, their blocks uncached
    }
  }
  // Under the lock, as the single-group plan's: the next prepare updates a
  // kept table in place once it holds the only reference, and only the
  // lock orders that with this plan's reads (libc++'s use counts are
  // relaxed).
  for (Arrays& g : groups_) g.table.reset();
}

void GroupBatch::commit() {
  std::lock_guard<std::mutex> lock(pool_->mu_);
  if (state_ == State::kAborted)
    fail(Errc::kInvalidState, "the batch was aborted (pkv_batch_abort); it cannot be committed");
  if (state_ == State::kCommitted) return;
  if (pool_->closed_) fail(Errc::kInvalidState, "the pool was destroyed");
  commit_locked();
}

void GroupBatch::abort() {
  std::lock_guard<std::mutex> lock(pool_->mu_);
  if (state_ == State::kCommitted)
    fail(Errc::kInvalidState, "the step is already committed (pkv_batch_commit)");
  if (state_ == State::kOpen && !pool_->closed_) drop_snapshots();
  state_ = State::kAborted;
}

void GroupBatch::commit_locked() {
  GroupPool& p = *pool_;
  state_ = State::kCommitted;
  keep_snapshots();  // first: it hands every slot back whatever follows
  // A sequence freed or truncated since prepare is skipped: its slots may
  // hold other tokens now, and counting less is always safe.
  for (size_t i = 0; i < seqs_.size(); ++i) {
    auto it = p.seqs_.find(seqs_[i]);
    if (it == p.seqs_.end() || it->second.epoch != epochs_[i]) continue;
    GroupPool::Seq& s = it->second;
    const uint64_t old = s.num_computed;
    s.num_computed = std::max(old, std::min<uint64_t>(ends_[i], s.tokens.size()));
    p.cache_computed(s, old / p.opts_.block_size);
  }
}

TensorArg GroupBatch::host_array(const void* data, size_t len, DType dtype) const {
  TensorArg t;
  t.ndim = 1;
  t.strides[0] = 1;
  t.device_type = pool_->opts_.device_type;
  t.device_id = pool_->opts_.device_id;
  t.dtype = uint32_t(dtype);
  t.data = const_cast<void*>(data);
  t.shape[0] = int64_t(len);
  return t;
}

TensorArg GroupBatch::plan_tensor(uint32_t g, uint32_t which) const {
  if (g >= groups_.size())
    fail(Errc::kInvalidArgument,
         "group " + str(g) + " is out of range (the pool has " + str(groups_.size()) + ")");
  const Arrays& a = groups_[g];
  if (which >= kPlanSnapshotIndptr && which <= kPlanSnapshotBlocks) {
    if (!pool_->recurrent(g))
      fail(Errc::kInvalidArgument, "which " + str(which) +
                                       " is a PKV_PLAN_SNAPSHOT_* array but group " + str(g) +
                                       " is not PKV_GROUP_RECURRENT");
    if (which == kPlanSnapshotIndptr)
      return host_array(a.snap_ptr.data(), a.snap_ptr.size(), DType::kI32);
    if (which == kPlanSnapshotRows)
      return host_array(a.snap_rows.data(), a.snap_rows.size(), DType::kI64);
    return host_array(a.snap_blocks.data(), a.snap_blocks.size(), DType::kI32);
  }
  if (which > 5)
    fail(Errc::kInvalidArgument, "which " + str(which) +
                                     " is not a PKV_PLAN_* array (0..5) or a PKV_PLAN_SNAPSHOT_* "
                                     "array (16..18)");
  const std::vector<int32_t>* i32[6] = {nullptr, &qptr_, &a.pptr, &a.pidx, &a.last, &ctx_};
  if (which == 0) return host_array(a.slots.data(), a.slots.size(), DType::kI64);
  if (which == 3 && a.table)  // the kept table's rows of this plan
    return host_array(a.table->ids.get(), size_t(info_.num_seqs) * a.table->stride, DType::kI32);
  return host_array(i32[which]->data(), i32[which]->size(), DType::kI32);
}

TensorArg GroupBatch::token_positions() const {
  return host_array(positions_.data(), positions_.size(), DType::kI64);
}

TensorArg GroupBatch::last_token_indices() const {
  return host_array(last_rows_.data(), last_rows_.size(), DType::kI64);
}

}  // namespace pagedkv
