#include "step_plan.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace pagedkv {

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

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

// The bytes of every layer's K and V planes: no output may land there
// (attention holds the KV lock shared, so other readers run alongside).
ByteSpan arena_span(const KvArena& a) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(a.base);
  return ByteSpan{b, b + size_t(2) * size_t(a.num_layers) * a.layout.layer_bytes()};
}

// Layer l's K and V planes (adjacent).
ByteSpan layer_span(const KvArena& a, uint32_t l) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(a.plane(int32_t(l), 0));
  return ByteSpan{b, b + 2 * a.layout.layer_bytes()};
}

}  // namespace

std::unique_ptr<Batch> Batch::prepare(const std::shared_ptr<Pool>& pool, const SeqId* seqs,
                                      const uint32_t* query_counts, uint32_t num_seqs,
                                      void* stream) {
  Pool& p = *pool;
  std::lock_guard<std::mutex> lock(p.mu_);
  p.check_open();
  if (num_seqs == 0) fail(Errc::kInvalidArgument, "num_seqs is 0");
  const uint64_t bs = p.opts_.block_size;
  std::unique_ptr<Batch> b(new Batch);
  b->pool_ = pool;
  b->seqs_.assign(seqs, seqs + num_seqs);
  b->versions_.resize(num_seqs);
  std::vector<Sequence*> live(num_seqs);

  // Validate everything before touching anything.
  const uint64_t epoch = ++p.plan_epoch_;
  uint64_t tokens = 0, pages = 0, max_ctx = 0;
  uint32_t max_q = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    Sequence* s = p.seqs_.find(seqs[i]);
    if (!s)
      fail(Errc::kNotFound, "seqs[" + str(i) + "]: " + seq_name(seqs[i]) + " is stale or unknown");
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
    const uint64_t w = p.opts_.sliding_window;
    const uint64_t first_key = n - q + 1 > w ? n - q + 1 - w : 0;
    if (w > 0 && first_key / bs < s->num_null)
      fail(Errc::kInvalidArgument, "query_counts[" + str(i) + "] = " + str(q) + " makes position " +
                                       str(n - q) + " of " + seq_name(seqs[i]) +
                                       " a query, which needs keys from " + str(first_key) +
                                       " on that the sliding window already released");
    live[i] = s;
    b->versions_[i] = s->version;
    tokens += q;
    pages += (n + bs - 1) / bs;
    max_ctx = std::max(max_ctx, n);
    max_q = std::max(max_q, q);
  }
  const uint64_t i32max = uint64_t(std::numeric_limits<int32_t>::max());
  if (tokens > i32max || pages > i32max)
    fail(Errc::kInvalidArgument, "the batch has " + str(tokens) + " query tokens and " +
                                     str(pages) + " pages; each must fit in int32");

  BatchInfo& info = b->info_;
  info.num_seqs = num_seqs;
  info.num_tokens = tokens;
  info.num_pages = pages;
  info.max_context = max_ctx;
  info.max_query = max_q;
  info.block_size = uint32_t(bs);

  // One buffer: i64 slots first, then the i32 arrays.
  const size_t sizes[6] = {tokens * 8, (num_seqs + 1) * 4ull, (num_seqs + 1) * 4ull,
                           pages * 4,  num_seqs * 4ull,       num_seqs * 4ull};
  size_t off = 0;
  for (int a = 0; a < 6; ++a) {
    b->offsets_[a] = off;
    off += (sizes[a] + 7) & ~size_t(7);
  }
  b->bytes_ = off;
  // Two copies of the arrays: the kernels read the first, callers get the
  // second (plan_tensor), so nothing a caller writes into a plan array can
  // move a kernel's reads or writes out of bounds (DESIGN.md section 9).
  b->host_.assign(2 * off / 8, 0);
  char* base = reinterpret_cast<char*>(b->host_.data());
  int64_t* slots = reinterpret_cast<int64_t*>(base + b->offsets_[0]);
  int32_t* qptr = reinterpret_cast<int32_t*>(base + b->offsets_[1]);
  int32_t* pptr = reinterpret_cast<int32_t*>(base + b->offsets_[2]);
  int32_t* pidx = reinterpret_cast<int32_t*>(base + b->offsets_[3]);
  int32_t* last = reinterpret_cast<int32_t*>(base + b->offsets_[4]);
  int32_t* ctx = reinterpret_cast<int32_t*>(base + b->offsets_[5]);
  int64_t t = 0, pg = 0;
  qptr[0] = pptr[0] = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    const Sequence& s = *live[i];
    const uint64_t n = s.tokens.size();
    const uint64_t np = (n + bs - 1) / bs;
    for (uint64_t pos = n - query_counts[i]; pos < n; ++pos)
      slots[t++] = int64_t(s.blocks[pos / bs]) * int64_t(bs) + int64_t(pos % bs);
    for (uint64_t j = 0; j < np; ++j) pidx[pg++] = s.blocks[j];
    qptr[i + 1] = int32_t(t);
    pptr[i + 1] = int32_t(pg);
    last[i] = int32_t(n - (np - 1) * bs);
    ctx[i] = int32_t(n);
  }
  std::memcpy(base + off, base, off);
  b->host_view_ = view_at(base, b->offsets_, info);

  if (p.backend_ && p.backend_->device_type() != kDeviceCpu) {
    b->device_ = p.backend_->allocate_async(2 * b->bytes_, stream);
    b->stream_ = stream;
    try {
      p.run_pending_copies(stream);
      p.backend_->upload(b->device_, base, 2 * b->bytes_, stream);
    } catch (...) {
      p.backend_->deallocate_async(b->device_, stream);
      b->device_ = nullptr;
      throw;
    }
    b->view_ = view_at(static_cast<const char*>(b->device_), b->offsets_, info);
  } else {
    p.run_pending_copies(stream);
    b->view_ = b->host_view_;
  }
  // The plan is made: its sequences' tokens count as computed (the engine
  // runs its cache writes), which the sliding window and the prefix cache
  // go by.
  for (Sequence* s : live) s->num_planned = s->tokens.size();
  return b;
}

Batch::~Batch() {
  if (!device_) return;
  std::lock_guard<std::mutex> lock(pool_->mu_);
  pool_->backend_->deallocate_async(device_, stream_);
}

TensorArg Batch::plan_tensor(uint32_t which) const {
  if (which > 5)
    fail(Errc::kInvalidArgument, "which " + str(which) + " is not a PKV_PLAN_* array (0..5)");
  const uint64_t S = info_.num_seqs;
  const int64_t lens[6] = {int64_t(info_.num_tokens), int64_t(S + 1), int64_t(S + 1),
                           int64_t(info_.num_pages),  int64_t(S),     int64_t(S)};
  TensorArg t;
  const char* base =
      device_ ? static_cast<const char*>(device_) : reinterpret_cast<const char*>(host_.data());
  t.data = const_cast<char*>(base + bytes_ + offsets_[which]);  // the callers' copy
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
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const Sequence* s = p.seqs_.find(seqs_[i]);
    if (!s) fail(Errc::kInvalidState, "the plan is stale: " + seq_name(seqs_[i]) + " was freed");
    if (s->version != versions_[i])
      fail(Errc::kInvalidState, "the plan is stale: " + seq_name(seqs_[i]) +
                                    " changed (append, truncate) after pkv_batch_prepare");
  }
}

void Batch::write(uint32_t layer, const TensorArg* k, const TensorArg* v, void* stream) {
  Pool& p = *pool_;
  std::unique_lock<std::mutex> lock(p.mu_);
  check_fresh();
  if (!p.has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (created with num_layers 0)");
  const PoolOptions& o = p.opts_;
  if (layer >= o.num_layers)
    fail(Errc::kInvalidArgument,
         "layer " + str(layer) + " is out of range [0, " + str(o.num_layers) + ")");
  RowsSpec spec{o.dtype,
                o.device_type,
                o.device_id,
                int64_t(info_.num_tokens),
                int64_t(o.num_kv_heads),
                int64_t(o.head_dim)};
  ByteSpan ks, vs;
  Tensor3 k3 = check_rows(k, "k", spec, &ks);
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
}

void Batch::attend(uint32_t layer, const TensorArg* q, const TensorArg* out, const TensorArg* lse,
                   const AttentionParams& params, void* stream) {
  Pool& p = *pool_;
  std::unique_lock<std::mutex> lock(p.mu_);
  check_fresh();
  if (!p.has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (created with num_layers 0)");
  const PoolOptions& o = p.opts_;
  if (layer >= o.num_layers)
    fail(Errc::kInvalidArgument,
         "layer " + str(layer) + " is out of range [0, " + str(o.num_layers) + ")");
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
  RowsSpec qs{o.dtype,
              o.device_type,
              o.device_id,
              int64_t(info_.num_tokens),
              -int64_t(o.num_kv_heads),
              int64_t(o.head_dim)};
  ByteSpan q_span, out_span, lse_span;
  Tensor3 q3 = check_rows(q, "q", qs, &q_span);
  RowsSpec os{o.dtype, o.device_type, o.device_id, q3.n0, q3.n1, q3.n2, true};
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
