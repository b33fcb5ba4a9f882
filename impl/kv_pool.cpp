// Pool creation, storage, stats, events and validation. Sequence operations
// are in kv_pool_seq.cpp.
#include "kv_pool.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace pagedkv {

std::string seq_name(SeqId id) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "seq 0x%016llx", static_cast<unsigned long long>(id));
  return buf;
}

std::string unknown_seq(SeqId id, uint16_t tag) {
  if (uint16_t(id >> SeqTable::kTagShift) == tag) return seq_name(id) + " is stale or unknown";
  return seq_name(id) + " is stale or unknown: it is not an id of this pool (another pool's, or " +
         "not a sequence id)";
}

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

uint64_t checked_mul(uint64_t a, uint64_t b, const char* what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    fail(Errc::kInvalidArgument, std::string(what) + " overflows 64 bits");
  return r;
}

void check_scales(const float* k, const float* v, uint64_t n, const char* kname,
                  const char* vname) {
  for (int w = 0; w < 2; ++w) {
    const float* x = w == 0 ? k : v;
    for (uint64_t i = 0; i < n; ++i) {
      if (!(std::isfinite(x[i]) && x[i] > 0.0f))
        fail(Errc::kInvalidArgument, std::string(w == 0 ? kname : vname) + "[" + str(i) + "] = " +
                                         std::to_string(x[i]) + " is not a finite scale > 0");
    }
  }
}

uint64_t scale_count(const PoolOptions& o) {
  return o.kv_scale_granularity == 1 ? uint64_t(o.num_layers) * o.num_kv_heads : o.num_layers;
}

void check_kv_scale_options(const PoolOptions& o) {
  if (o.kv_scale_granularity > 1)
    fail(Errc::kInvalidArgument, "kv_scale_granularity " + str(o.kv_scale_granularity) +
                                     " is neither PKV_KV_SCALE_PER_TENSOR nor "
                                     "PKV_KV_SCALE_PER_HEAD");
  const uint64_t n = o.k_scales.size();
  if (n == 0) return;
  if (o.num_layers == 0 || !is_fp8(o.dtype))
    fail(Errc::kInvalidArgument,
         "num_kv_scales is " + str(n) + " but dtype " + dtype_name(uint32_t(o.dtype)) +
             (o.num_layers == 0 ? " without storage" : "") + " takes no scales (fp8 pools only)");
  if (n != scale_count(o))
    fail(Errc::kInvalidArgument,
         "num_kv_scales is " + str(n) + ", expected " + str(scale_count(o)) +
             (o.kv_scale_granularity == 1 ? " (num_layers * num_kv_heads, per head)"
                                          : " (num_layers, per tensor)"));
  check_scales(o.k_scales.data(), o.v_scales.data(), n, "k_scales", "v_scales");
}

// An MLA pool's latent geometry; resolves num_kv_heads and head_dim so the
// rest of the pool sees one plane of head_dim = rank + rope per layer.
void resolve_mla_options(PoolOptions& o) {
  if (o.kv_layout > 1)
    fail(Errc::kInvalidArgument,
         "kv_layout " + str(o.kv_layout) + " is neither PKV_KV_LAYOUT_MHA nor PKV_KV_LAYOUT_MLA");
  if (!o.is_mla()) {
    if (o.kv_lora_rank != 0 || o.qk_rope_head_dim != 0)
      fail(Errc::kInvalidArgument, "kv_lora_rank " + str(o.kv_lora_rank) +
                                       " and qk_rope_head_dim " + str(o.qk_rope_head_dim) +
                                       " must be 0 unless kv_layout is PKV_KV_LAYOUT_MLA");
    return;
  }
  if (o.num_layers == 0)
    fail(Errc::kInvalidArgument,
         "kv_layout PKV_KV_LAYOUT_MLA needs storage (num_layers > 0): a manager-only pool has no "
         "page layout");
  if (o.kv_lora_rank == 0 || o.kv_lora_rank > 4096)
    fail(Errc::kInvalidArgument,
         "kv_lora_rank " + str(o.kv_lora_rank) + " is outside [1, 4096] with PKV_KV_LAYOUT_MLA");
  if (o.qk_rope_head_dim > 1024)
    fail(Errc::kInvalidArgument, "qk_rope_head_dim " + str(o.qk_rope_head_dim) +
                                     " is outside [0, 1024] with PKV_KV_LAYOUT_MLA");
  if (o.device_type == kDeviceCuda && o.kv_lora_rank > 1024)
    fail(Errc::kInvalidArgument, "kv_lora_rank " + str(o.kv_lora_rank) +
                                     " exceeds 1024, the most the CUDA MLA kernel takes");
  const uint32_t d = o.kv_lora_rank + o.qk_rope_head_dim;
  if (o.num_kv_heads > 1)
    fail(Errc::kInvalidArgument,
         "num_kv_heads " + str(o.num_kv_heads) +
             " must be 0 or 1 with PKV_KV_LAYOUT_MLA (one latent per token)");
  if (o.head_dim != 0 && o.head_dim != d)
    fail(Errc::kInvalidArgument, "head_dim " + str(o.head_dim) +
                                     " must be 0 or kv_lora_rank + qk_rope_head_dim = " + str(d) +
                                     " with PKV_KV_LAYOUT_MLA");
  if (o.dtype != DType::kF32 && o.dtype != DType::kF16 && o.dtype != DType::kBF16)
    fail(Errc::kInvalidArgument, "dtype " + str(uint32_t(o.dtype)) + " (" +
                                     dtype_name(uint32_t(o.dtype)) +
                                     ") is not an MLA storage type (f32, f16, bf16)");
  o.num_kv_heads = 1;
  o.head_dim = d;
}

void check_options(const PoolOptions& o) {
  if (o.block_size < 1 || o.block_size > 1024)
    fail(Errc::kInvalidArgument, "block_size " + str(o.block_size) + " is outside [1, 1024]");
  if (hash_digest_size(o.hash_algo) == 0)
    fail(Errc::kInvalidArgument, "hash_algo " + str(uint32_t(o.hash_algo)) + " is unknown");
  if (o.enable_events && o.max_events == 0)
    fail(Errc::kInvalidArgument, "max_events is 0 but enable_events is 1");
  if (o.device_type != kDeviceCpu && o.device_type != kDeviceCuda)
    fail(Errc::kInvalidArgument, "device_type " + std::to_string(o.device_type) +
                                     " is neither PKV_DEVICE_CPU nor PKV_DEVICE_CUDA");
  if (o.device_type == kDeviceCpu && o.device_id != 0)
    fail(Errc::kInvalidArgument,
         "device_id " + std::to_string(o.device_id) + " must be 0 for a CPU pool");
  if (o.device_id < 0)
    fail(Errc::kInvalidArgument, "device_id " + std::to_string(o.device_id) + " is negative");
  if (o.max_pinned_blocks > 0 && !o.enable_retention)
    fail(Errc::kInvalidArgument,
         "max_pinned_blocks " + str(o.max_pinned_blocks) + " is set but enable_retention is 0");
  if (o.num_layers > 0) {
    if (o.num_kv_heads == 0 || o.num_kv_heads > 4096)
      fail(Errc::kInvalidArgument,
           "num_kv_heads " + str(o.num_kv_heads) + " is outside [1, 4096] with num_layers > 0");
    if (o.head_dim == 0 || o.head_dim > 4096)
      fail(Errc::kInvalidArgument,
           "head_dim " + str(o.head_dim) + " is outside [1, 4096] with num_layers > 0");
    // The CPU kernels take any head dim (vectorised when it is a multiple of
    // the vector width); the CUDA kernels are compiled for a few.
    if (o.device_type == kDeviceCuda && !o.is_mla() && !cuda_head_dim_supported(o.head_dim))
      fail(Errc::kInvalidArgument, "head_dim " + str(o.head_dim) +
                                       " is not supported by the CUDA attention kernels "
                                       "(allowed on a CUDA pool: " +
                                       std::string(kCudaHeadDims) + ")");
    if (o.num_layers > 65536)
      fail(Errc::kInvalidArgument, "num_layers " + str(o.num_layers) + " exceeds 65536");
    if (o.dtype != DType::kF32 && o.dtype != DType::kF16 && o.dtype != DType::kBF16 &&
        !is_fp8(o.dtype))
      fail(Errc::kInvalidArgument, "dtype " + str(uint32_t(o.dtype)) + " (" +
                                       dtype_name(uint32_t(o.dtype)) +
                                       ") is not a KV storage type (f32, f16, bf16, fp8_e4m3, "
                                       "fp8_e5m2)");
  }
  check_kv_scale_options(o);
}

}  // namespace

Pool::Pool(const PoolOptions& opts, uint64_t bytes_per_block)
    : opts_(opts),
      bytes_per_block_(bytes_per_block),
      events_(opts.enable_events, opts.max_events),
      blocks_(int32_t(opts.num_blocks), opts.enable_prefix_caching, &events_),
      seqs_(tag_.value(), &token_arena_, tag_.first_generation()),
      root_(hash_root(opts.hash_algo, opts.hash_seed)),
      hasher_(std::make_unique<BlockHasher>(opts.hash_algo)) {
  if ((opts.block_size & (opts.block_size - 1)) == 0) bs_shift_ = __builtin_ctz(opts.block_size);
  blocks_.set_block_size(opts.block_size);
  events_.keep_tokens(opts.block_size);
}

Pool::~Pool() {
  close();
  tag_.note_generation(seqs_.max_generation());  // the tag's next holder starts above
}

std::shared_ptr<Pool> Pool::create(const PoolOptions& in) {
  PoolOptions o = in;
  resolve_mla_options(o);
  check_options(o);
  const uint32_t planes_per_layer = o.is_mla() ? 1 : 2;
  uint64_t bpb = 0;
  if (o.num_layers > 0) {
    const char* what = "num_layers * num_kv_heads * head_dim * block_size (bytes per block)";
    uint64_t per_plane =
        checked_mul(checked_mul(checked_mul(o.num_kv_heads, o.block_size, what), o.head_dim, what),
                    dtype_size(o.dtype), what);
    bpb = checked_mul(per_plane, uint64_t(planes_per_layer) * o.num_layers, what);
  }
  if (o.num_blocks == 0) {
    if (bpb == 0)
      fail(Errc::kInvalidArgument,
           "num_blocks is 0 and the pool has no storage (num_layers 0) to derive it from "
           "memory_budget_bytes");
    o.num_blocks = o.memory_budget_bytes / bpb;
    if (o.num_blocks < 2)
      fail(Errc::kInvalidArgument, "memory_budget_bytes " + str(o.memory_budget_bytes) + " holds " +
                                       str(o.num_blocks) + " blocks of " + str(bpb) +
                                       " bytes; at least 2 are needed");
  }
  if (o.num_blocks < 2)
    fail(Errc::kInvalidArgument, "num_blocks " + str(o.num_blocks) + " is below 2");
  if (o.num_blocks > uint64_t(std::numeric_limits<int32_t>::max()) - 2) {
    if (in.num_blocks == 0)  // derived: the caller set the budget, not num_blocks
      fail(Errc::kInvalidArgument, "memory_budget_bytes " + str(o.memory_budget_bytes) + " holds " +
                                       str(o.num_blocks) + " blocks of " + str(bpb) +
                                       " bytes, more than 2^31 - 3; set num_blocks or a smaller "
                                       "budget");
    fail(Errc::kInvalidArgument, "num_blocks " + str(o.num_blocks) + " exceeds 2^31 - 3");
  }
  if (bpb) checked_mul(bpb, o.num_blocks, "num_blocks * bytes per block (the KV arena)");

  // Pinned blocks are never evicted: at least one block must stay
  // allocatable whatever is pinned.
  if (o.enable_retention && o.max_pinned_blocks >= o.num_blocks - 1)
    fail(Errc::kInvalidArgument, "max_pinned_blocks " + str(o.max_pinned_blocks) +
                                     " leaves no block to allocate (num_blocks " +
                                     str(o.num_blocks) + ")");

  std::shared_ptr<Pool> p(new Pool(o, bpb));
  if (o.enable_partial_reuse && o.enable_prefix_caching)
    p->blocks_.enable_partial(p->root_, o.block_size);
  if (o.enable_retention) p->blocks_.enable_retention(o.max_pinned_blocks);

  // Plans of CUDA pools live on the device even without storage.
  if (o.device_type == kDeviceCuda)
    p->backend_ = make_cuda_backend(o.device_id);
  else if (o.num_layers > 0)
    p->backend_ = make_cpu_backend(int32_t(std::min<uint32_t>(o.num_threads, 1024)));
  if (o.num_layers > 0) {
    KvLayout l{int32_t(o.num_blocks), int32_t(o.num_kv_heads), int32_t(o.block_size),
               int32_t(o.head_dim), o.dtype};
    p->arena_.layout = l;
    p->arena_.num_layers = int32_t(o.num_layers);
    p->arena_.planes_per_layer = int32_t(planes_per_layer);
    std::shared_ptr<Backend> be = p->backend_;
    // FP8: the per-head scales follow the planes, in the same allocation
    // (so a kernel holding the arena holds them too).
    const size_t planes_bytes = l.layer_bytes() * planes_per_layer * o.num_layers;
    const size_t scales_at = KvArena::scales_offset(planes_bytes);
    const size_t bytes = is_fp8(o.dtype)
                             ? scales_at + sizeof(float) * 2 * o.num_layers * o.num_kv_heads
                             : planes_bytes;
    void* base = be->allocate(bytes);
    // Not [be]: a transfer engine may keep the arena (reserved) past the
    // pool, and the backend's worker threads must not stay with it.
    p->arena_hold_ = be->hold(base, be);  // deallocates base when it throws
    p->arena_.base = base;
    if (is_fp8(o.dtype)) {
      p->arena_.scales = reinterpret_cast<const float*>(static_cast<char*>(base) + scales_at);
      p->k_scales_ = o.k_scales;
      p->v_scales_ = o.v_scales;
      if (p->k_scales_.empty()) {
        p->k_scales_.assign(scale_count(o), 1.0f);
        p->v_scales_.assign(scale_count(o), 1.0f);
      }
      p->upload_scales();
    }
  }
  return p;
}

void Pool::close() {
  std::lock_guard<OpMutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  seqs_.clear();
  token_arena_.release();  // the sequences held all of it
  // Queued offloads are abandoned; the tiers' memory and file go now.
  blocks_.set_evict_sink(nullptr);
  tiers_.reset();
  pending_loads_.clear();
  // Frees the storage unless a kernel outside the lock still holds it (then
  // it goes when that kernel returns). The backend stays: live batches free
  // their plan memory through it.
  arena_.base = nullptr;
  arena_hold_.reset();
  last_plan_.reset();  // live plans keep their own memory
  spare_plan_.reset();
}

void Pool::check_open() const {
  if (closed_) fail(Errc::kInvalidState, "the pool was destroyed");
}

PoolStats Pool::stats() const {
  OpMutex::ConstGuard lock(mu_);
  if (!closed_) const_cast<Pool*>(this)->tick();  // what the clock already decided
  PoolStats s;
  s.block_size = opts_.block_size;
  s.num_blocks = opts_.num_blocks;
  s.num_free_blocks = uint64_t(blocks_.num_free());
  s.num_used_blocks = uint64_t(blocks_.num_used());
  s.num_cached_blocks = uint64_t(blocks_.num_cached());
  s.num_seqs = seqs_.size();
  s.usage = double(s.num_used_blocks) / double(opts_.num_blocks - 1);
  s.prefix_query_tokens = prefix_query_tokens_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.num_evictions = blocks_.num_evictions();
  s.num_cow_copies = num_cow_copies_;
  s.num_events_dropped = events_.dropped();
  s.kv_bytes_per_block = bytes_per_block_;
  s.kv_bytes_allocated = closed_ ? 0 : bytes_per_block_ * opts_.num_blocks;
  s.num_tokens = num_tokens_;
  s.num_partial_hits = num_partial_hits_;
  s.partial_hit_tokens = partial_hit_tokens_;
  s.num_pinned_blocks = blocks_.num_pinned();
  s.num_pins_degraded = num_pins_degraded_;
  // Kept up to date by every operation (BlockPool::fill), so this is O(1).
  if (bytes_per_block_ && !closed_) {
    const uint64_t bs = opts_.block_size, filled = blocks_.filled();
    const uint64_t per_token = bytes_per_block_ / bs;
    s.kv_bytes_used = filled * per_token;
    s.kv_bytes_wasted = (s.num_used_blocks * bs - filled) * per_token;
  }
  return s;
}

size_t Pool::drain_events(Event* out, size_t capacity, int32_t* tokens) {
  std::lock_guard<OpMutex> lock(mu_);
  keep_lane();  // events only
  pull_tier_events();
  return events_.drain(out, capacity, tokens);
}

int Pool::drain_one_event(Event* out, int32_t* tokens, bool tokens_room) {
  std::lock_guard<OpMutex> lock(mu_);
  keep_lane();  // events only
  pull_tier_events();
  return events_.drain_one(out, tokens, tokens_room);
}

void Pool::reset_prefix_cache() {
  std::lock_guard<OpMutex> lock(mu_);
  if (tiers_) {
    // Whatever made the device cache stale (new weights) made the tiers
    // stale too. Pending loads are dropped: their blocks lose their hashes
    // below and stay unwritten.
    tiers_->wait_idle();
    tiers_->clear();
    pending_loads_.clear();
    pull_tier_events();
  }
  blocks_.reset_cache();
}

std::vector<CopyPair> Pool::pending_copies() const {
  OpMutex::ConstGuard lock(mu_);
  return blocks_.pending_copies();
}

size_t Pool::num_pending_events() const {
  OpMutex::ConstGuard lock(mu_);
  return events_.size();
}

void Pool::shrink_events_for_testing() {
  std::lock_guard<OpMutex> lock(mu_);
  keep_lane();  // events only: the fault tests' lane steps stay lane steps
  events_.shrink_to_fit();
}

std::string Pool::validate() const {
  OpMutex::ConstGuard lock(mu_);
  std::string err = blocks_.check();
  if (err.empty() && tiers_) err = tiers_->check();
  if (!err.empty()) return err;
  const int32_t nb = blocks_.num_blocks();
  const uint64_t bs = opts_.block_size;
  std::vector<int32_t> refs(nb, 0);
  std::string bad, tail_bad;  // tail_bad is reported after the ref counts agree
  uint64_t tokens = 0;
  seqs_.for_each([&](SeqId id, const Sequence& q) {
    if (!bad.empty()) return;
    const std::string who = seq_name(id);
    tokens += q.tokens.size();
    if (q.num_committed > q.tokens.size()) {
      bad = "written state: " + who + " has more committed positions than tokens";
      return;
    }
    if (q.blocks.size() * bs < q.tokens.size()) {
      bad = "block tables: " + who + " has fewer slots than tokens";
      return;
    }
    if (q.num_null > q.blocks.size()) {
      bad = "block tables: " + who + " has more window-released entries than blocks";
      return;
    }
    if (blocks_.caching() && q.hashes.size() != q.tokens.size() / bs) {
      bad = "block hashes: " + who + " has " + std::to_string(q.hashes.size()) + " hashes for " +
            std::to_string(q.tokens.size() / bs) + " full blocks";
      return;
    }
    if (!q.tail_shared && !tail_is_exclusive(q) && tail_bad.empty())
      tail_bad = "block tables: " + who +
                 " is marked as holding its tail blocks alone, but one is shared or cached";
    for (size_t j = 0; j < q.blocks.size(); ++j) {
      int32_t b = q.blocks[j];
      if ((j < q.num_null) != (b == BlockPool::kNullBlock)) {
        bad = "block tables: " + who + " has the null block outside its window prefix";
        return;
      }
      if (b < 0 || b >= nb) {
        bad = "block tables: " + who + " names block " + std::to_string(b) + " out of range";
        return;
      }
      if (b == BlockPool::kNullBlock) continue;
      ++refs[b];
      const uint64_t held = q.tokens.size() > j * bs ? q.tokens.size() - j * bs : 0;
      // A tail the sequence holds alone (tail_shared false) has exactly
      // its fill: the decode fast path adds slots on top of it.
      const bool own_tail = !q.tail_shared && j >= q.tokens.size() / bs;
      if (blocks_.fill(b) < std::min(held, bs) || blocks_.fill(b) > bs ||
          (own_tail && blocks_.fill(b) != std::min(held, bs))) {
        bad = "stats: block " + std::to_string(b) + " of " + who + " has fill " +
              std::to_string(blocks_.fill(b)) + " but holds " + std::to_string(std::min(held, bs)) +
              " of its tokens";
        return;
      }
      const BlockHash& h = blocks_.hash(b);
      if (!h.empty() && j < q.hashes.size() && h != q.hashes[j]) {
        bad = "block hashes: block " + std::to_string(b) + " of " + who +
              " is cached under a hash other than the sequence's";
        return;
      }
    }
  });
  if (!bad.empty()) return bad;
  // Written state (DESIGN.md §9): no sequence counts on slots that are not
  // written (BlockPool::check covers cached blocks in the free queue).
  seqs_.for_each([&](SeqId id, const Sequence& q) {
    if (!bad.empty()) return;
    // With a window, only the keys the next query reads must be written.
    const uint64_t w = opts_.sliding_window, nc = q.num_committed;
    const uint64_t from = w && nc + 1 > w ? nc + 1 - w : 0;
    const uint64_t c = computed_tokens(q, from);
    if (c < nc)
      bad = "written state: " + seq_name(id) + " counts " + std::to_string(nc) +
            " tokens as computed but only its first " + std::to_string(c) +
            " positions have written slots";
    else if (q.num_cached > q.tokens.size())
      bad = "written state: " + seq_name(id) + " has more cached tokens than tokens";
  });
  if (!bad.empty()) return bad;
  if (tokens != num_tokens_)
    return "stats: the token count " + std::to_string(num_tokens_) + " disagrees with the " +
           std::to_string(tokens) + " tokens of the sequences";
  for (int32_t b = 0; b < nb; ++b)
    if (refs[b] != blocks_.ref(b))
      return "ref counts: block " + std::to_string(b) + " has ref " +
             std::to_string(blocks_.ref(b)) + " but " + std::to_string(refs[b]) +
             " table references";
  if (tail_bad.empty()) tail_bad = check_lane();
  return tail_bad;
}

// The decode lane, while it stands (no counted call since it was last
// exact): the next steady step plans from it without reading the
// sequences, so each entry must be exactly its sequence's state.
std::string Pool::check_lane() const {
  const DecodeMemo& m = decode_memo_;
  if (!m.lane_committed || m.lane_ops != mu_.ops()) return "";
  if (m.tails.size() != m.ids.size() || m.live.size() != m.ids.size())
    return "decode lane: " + std::to_string(m.tails.size()) + " entries for " +
           std::to_string(m.ids.size()) + " ids";
  for (size_t i = 0; i < m.ids.size(); ++i) {
    const Sequence* q = seqs_.find(m.ids[i]);
    const DecodeTail& t = m.tails[i];
    const std::string who =
        "decode lane: entry " + std::to_string(i) + " (" + seq_name(m.ids[i]) + ")";
    if (q == nullptr || q != m.live[i]) return who + " names no live sequence, or another";
    if (t.n != q->tokens.size() || t.tok != q->tokens.data() ||
        t.cap != DecodeTail::capacity_of(*q))
      return who + " disagrees with its sequence's tokens";
    if (t.epoch != q->writes_epoch || t.table_version != q->table_version || q->tail_shared ||
        q->num_committed < t.n)
      return who + " disagrees with its sequence's epochs, table version, tail or computed count";
    if (t.n == 0 || t.block_index != div_bs(t.n - 1) || t.block_index >= q->blocks.size() ||
        t.block != q->blocks[t.block_index])
      return who + " names a block other than its sequence's last";
  }
  return "";
}

std::vector<std::pair<int32_t, uint32_t>> Pool::written_after(
    std::vector<WrittenRange> ranges) const {
  // A slot is written once the slots before it are: ranges of one block
  // apply in slot order, each extending the count if it starts within it.
  std::sort(ranges.begin(), ranges.end(), [](const WrittenRange& a, const WrittenRange& b) {
    return a.block != b.block ? a.block < b.block : a.lo < b.lo;
  });
  std::vector<std::pair<int32_t, uint32_t>> out;
  for (const WrittenRange& r : ranges) {
    if (out.empty() || out.back().first != r.block)
      out.emplace_back(r.block, blocks_.written(r.block));
    uint32_t& w = out.back().second;
    if (r.lo <= w) w = std::max(w, r.hi);
  }
  return out;
}

void Pool::apply_written(std::vector<WrittenRange>& ranges) {
  // A plan's sequences write distinct blocks (shared ones are copied
  // first), so the general path's sort is rarely needed.
  if (written_stamp_.size() < opts_.num_blocks) written_stamp_.assign(opts_.num_blocks, 0);
  if (++written_round_ == 0) {  // wrapped: old stamps could match
    std::fill(written_stamp_.begin(), written_stamp_.end(), 0);
    written_round_ = 1;
  }
  bool distinct = true;
  for (const WrittenRange& r : ranges) {
    uint32_t& st = written_stamp_[size_t(r.block)];
    if (st == written_round_) {
      distinct = false;
      break;
    }
    st = written_round_;
  }
  if (!distinct) {
    const auto after = written_after(std::move(ranges));  // may throw: before any change
    for (const auto& [blk, w] : after) blocks_.set_written(blk, w);
    return;
  }
  for (const WrittenRange& r : ranges) {
    const uint32_t w = blocks_.written(r.block);
    if (r.lo <= w && r.hi > w) blocks_.set_written(r.block, r.hi);
  }
}

// ------------------------------------------------------------------ storage

TensorArg Pool::kv_tensor(uint32_t layer, uint32_t which) const {
  OpMutex::ConstGuard lock(mu_);
  check_open();
  if (!has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (created with num_layers 0)");
  if (layer >= opts_.num_layers)
    fail(Errc::kInvalidArgument,
         "layer " + str(layer) + " is out of range [0, " + str(opts_.num_layers) + ")");
  if (which > 1)
    fail(Errc::kInvalidArgument, "which " + str(which) + " is neither PKV_KV_KEY nor PKV_KV_VALUE");
  if (opts_.is_mla()) {
    if (which != 0)
      fail(Errc::kInvalidArgument,
           "which is PKV_KV_VALUE but an MLA pool stores no V: its one latent tensor per layer "
           "is PKV_KV_KEY");
    TensorArg t;
    t.data = arena_.plane(int32_t(layer), 0);
    t.dtype = uint32_t(opts_.dtype);
    t.device_type = opts_.device_type;
    t.device_id = opts_.device_id;
    t.ndim = 3;
    t.shape[0] = int64_t(opts_.num_blocks);
    t.shape[1] = opts_.block_size;
    t.shape[2] = opts_.head_dim;
    t.strides[2] = 1;
    t.strides[1] = opts_.head_dim;
    t.strides[0] = int64_t(opts_.head_dim) * opts_.block_size;
    return t;
  }
  TensorArg t;
  t.data = arena_.plane(int32_t(layer), int32_t(which));
  t.dtype = uint32_t(opts_.dtype);
  t.device_type = opts_.device_type;
  t.device_id = opts_.device_id;
  t.ndim = 4;
  t.shape[0] = int64_t(opts_.num_blocks);
  t.shape[1] = opts_.num_kv_heads;
  t.shape[2] = opts_.block_size;
  t.shape[3] = opts_.head_dim;
  t.strides[3] = 1;
  t.strides[2] = opts_.head_dim;
  t.strides[1] = int64_t(opts_.head_dim) * opts_.block_size;
  t.strides[0] = t.strides[1] * opts_.num_kv_heads;
  return t;
}

void Pool::check_block_ids(const int32_t* ids, uint64_t n, const char* name) const {
  for (uint64_t i = 0; i < n; ++i)
    if (ids[i] < 1 || uint64_t(ids[i]) >= opts_.num_blocks)
      fail(Errc::kInvalidArgument, std::string(name) + "[" + str(i) +
                                       "] = " + std::to_string(ids[i]) +
                                       " is not a block id in [1, " + str(opts_.num_blocks) + ")");
}

// ids sorted as (block, index); fails naming the first two indices that
// hold the same block, the message ending with `why`.
static std::vector<std::pair<int32_t, uint64_t>> distinct_blocks(const int32_t* ids, uint64_t n,
                                                                 const char* name,
                                                                 const char* why) {
  std::vector<std::pair<int32_t, uint64_t>> sorted(n);
  for (uint64_t i = 0; i < n; ++i) sorted[i] = {ids[i], i};
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t k = 1; k < n; ++k)
    if (sorted[k].first == sorted[k - 1].first)
      fail(Errc::kInvalidArgument, std::string(name) + "[" + str(sorted[k - 1].second) + "] and " +
                                       name + "[" + str(sorted[k].second) + "] are both block " +
                                       std::to_string(sorted[k].first) + ": " + why);
  return sorted;
}

void Pool::check_copy_pairs(const int32_t* src, const int32_t* dst, uint64_t n) const {
  // The backends copy all pairs at once (CUDA: one launch; CPU: in
  // parallel once large enough), so a block written by one pair and read
  // or written by another would race. A pair copying a block onto itself
  // changes nothing and is allowed.
  if (n < 2) return;
  const auto dsts =
      distinct_blocks(dst, n, "dst", "pairs are copied at once, a block may be written by one");
  for (uint64_t j = 0; j < n; ++j) {
    const auto it = std::lower_bound(dsts.begin(), dsts.end(), std::make_pair(src[j], uint64_t(0)));
    if (it != dsts.end() && it->first == src[j] && it->second != j)
      fail(Errc::kInvalidArgument,
           "src[" + str(j) + "] = " + std::to_string(src[j]) + " is also dst[" + str(it->second) +
               "]: pairs are copied at once, so a chain of copies would race");
  }
}

void Pool::reserve_copies(size_t n) {
  if (!arena_.base) return;  // a manager-only pool moves no bytes
  if (copy_stamp_.empty()) copy_stamp_.assign(opts_.num_blocks, 0);
  copy_src_.reserve(n);
  copy_dst_.reserve(n);
}

void Pool::run_pending_copies(void* stream) {
  auto& pending = blocks_.pending_copies();
  if (pending.empty()) return;
  if (!arena_.base) {  // manager-only pool: nothing to move
    pending.clear();
    return;
  }
  // One backend call copies its pairs in parallel, so a copy whose source
  // is an earlier copy's destination (or whose destination another copy
  // reads or writes) starts a new round: rounds keep sequential semantics.
  // A block's stamp says what the current round does with it (2 * round:
  // read, 2 * round + 1: written; older values: untouched), so starting a
  // round is one increment, not a clear of a per-block array.
  reserve_copies(pending.size());
  copy_src_.clear();
  copy_dst_.clear();
  auto next_round = [&] {
    if (++copy_round_ >= (1u << 31)) {  // stamps would wrap: restart them
      std::fill(copy_stamp_.begin(), copy_stamp_.end(), 0);
      copy_round_ = 1;
    }
  };
  auto flush = [&] {
    if (copy_src_.empty()) return;
    std::unique_lock<std::shared_mutex> kv(kv_mu_);
    backend_->copy_blocks(arena_, copy_src_.data(), copy_dst_.data(), int64_t(copy_src_.size()),
                          stream);
    copy_src_.clear();
    copy_dst_.clear();
    next_round();
  };
  next_round();
  for (const CopyPair& c : pending) {
    const uint32_t read = 2 * copy_round_, written = read + 1;
    if (copy_stamp_[c.src] == written || copy_stamp_[c.dst] >= read) flush();
    const uint32_t r = 2 * copy_round_;
    copy_src_.push_back(c.src);
    copy_dst_.push_back(c.dst);
    if (copy_stamp_[c.src] < r) copy_stamp_[c.src] = r;
    copy_stamp_[c.dst] = r + 1;
  }
  flush();
  pending.clear();
}

void Pool::copy_blocks(const int32_t* src, const int32_t* dst, uint64_t n, void* stream) {
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  if (!has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (created with num_layers 0)");
  check_block_ids(src, n, "src");
  check_block_ids(dst, n, "dst");
  check_copy_pairs(src, dst, n);
  blocks_.reserve_events(n);  // may throw: first
  settle_tiers_locked(stream);
  run_pending_copies(stream);
  std::unique_lock<std::shared_mutex> kv(kv_mu_);
  if (n) backend_->copy_blocks(arena_, src, dst, int64_t(n), stream);
  // A copy carries the source's written state (the pairs are independent:
  // check_copy_pairs); a cached destination that is no longer fully
  // written leaves the cache, and so does one that now holds the K/V of
  // other tokens: its hash stays only when the source is cached under the
  // same hash (same tokens, same parents, same extra keys).
  bool lowered = false;
  for (uint64_t i = 0; i < n; ++i) {
    lowered |= blocks_.written(src[i]) < blocks_.written(dst[i]);
    blocks_.set_written(dst[i], blocks_.written(src[i]));
    if (!blocks_.fully_written(dst[i]) || !(blocks_.hash(src[i]) == blocks_.hash(dst[i])))
      blocks_.uncache_block(dst[i]);
  }
  if (lowered) recount_committed();
}

void Pool::recount_committed() noexcept {
  // A sequence's committed count lets plans skip re-checking its context;
  // after a copy overwrote blocks with less written K/V it must not claim
  // more than its blocks now hold, so its next plan recomputes the rest.
  const uint64_t w = opts_.sliding_window;
  seqs_.for_each([&](SeqId, const Sequence& cq) {
    Sequence& q = const_cast<Sequence&>(cq);  // our own table, only viewed as const
    for (;;) {  // with a window, the keys a committed count vouches for move with it
      const uint64_t nc = q.num_committed, from = w && nc + 1 > w ? nc + 1 - w : 0;
      const uint64_t c = computed_tokens(q, from);
      if (c >= nc) break;
      q.num_committed = c;
    }
  });
}

void Pool::swap_blocks(const int32_t* ids, uint64_t n, void* host, uint64_t host_bytes,
                       bool to_host, void* stream) {
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  if (!has_storage())
    fail(Errc::kInvalidState, "the pool has no KV storage (created with num_layers 0)");
  // host_bytes bounds num_blocks: checked before blocks[0, num_blocks) is
  // read, so a count beyond the buffer is refused, not read past the
  // caller's array.
  uint64_t need;
  if (__builtin_mul_overflow(n, bytes_per_block_, &need) || host_bytes < need)
    fail(Errc::kInvalidArgument, "host_bytes " + str(host_bytes) + " is below num_blocks * " +
                                     str(bytes_per_block_) + " bytes per block");
  check_block_ids(ids, n, "blocks");
  // A swap-in writes every block at once (CUDA: one launch; CPU: in
  // parallel once large enough): two host slots into one block would race.
  if (!to_host && n >= 2)
    distinct_blocks(ids, n, "blocks",
                    "a swap-in writes its blocks at once, a block may be written by one");
  // The moved bytes must not wrap the address space or overlap the blocks
  // themselves (the pool's own storage handed back as the host buffer).
  const uintptr_t h = reinterpret_cast<uintptr_t>(host),
                  a = reinterpret_cast<uintptr_t>(arena_.base);
  const uintptr_t a_end = a + arena_.bytes();
  uintptr_t h_end;
  if (__builtin_add_overflow(h, need, &h_end))
    fail(Errc::kInvalidArgument,
         "host_buffer + num_blocks * bytes_per_block wraps the address space");
  if (n && h < a_end && a < h_end)
    fail(Errc::kInvalidArgument, "host_buffer overlaps the pool's KV storage");
  settle_tiers_locked(stream);
  run_pending_copies(stream);
  if (to_host) {
    std::shared_lock<std::shared_mutex> kv(kv_mu_);
    if (n) backend_->swap(arena_, ids, int64_t(n), host, true, stream);
  } else {
    std::unique_lock<std::shared_mutex> kv(kv_mu_);
    if (n) backend_->swap(arena_, ids, int64_t(n), host, false, stream);
  }
  // A swap-in restores the K/V of the tokens each block holds: those slots
  // (its fill) count as written.
  if (!to_host)
    for (uint64_t i = 0; i < n; ++i) blocks_.set_written(ids[i], blocks_.fill(ids[i]));
}

uint64_t Pool::num_kv_scales() const { return k_scales_.size(); }

void Pool::upload_scales() {
  const uint32_t heads = opts_.num_kv_heads;
  const bool per_head = opts_.kv_scale_granularity == 1;
  std::vector<float> expanded(size_t(2) * opts_.num_layers * heads);
  for (uint32_t layer = 0; layer < opts_.num_layers; ++layer) {
    for (uint32_t h = 0; h < heads; ++h) {
      const size_t i = per_head ? size_t(layer) * heads + h : layer;
      expanded[(size_t(2) * layer) * heads + h] = k_scales_[i];
      expanded[(size_t(2) * layer + 1) * heads + h] = v_scales_[i];
    }
  }
  // Kernels already queued on any stream finish with the old scales; the
  // new ones are in place before this returns (docs/threading.md).
  backend_->synchronize_device();
  backend_->upload(const_cast<float*>(arena_.scales), expanded.data(),
                   sizeof(float) * expanded.size(), nullptr);
  backend_->synchronize(nullptr);
}

void Pool::check_fp8() const {
  if (!has_storage() || !is_fp8(opts_.dtype))
    fail(Errc::kInvalidState, std::string("the pool's dtype is ") +
                                  (has_storage() ? dtype_name(uint32_t(opts_.dtype)) : "none") +
                                  ", not fp8: it has no KV scales");
}

void Pool::set_kv_scales(const float* k, const float* v, uint64_t n) {
  std::lock_guard<OpMutex> lock(mu_);
  check_open();
  check_fp8();
  if (n != k_scales_.size())
    fail(Errc::kInvalidArgument,
         "num_scales is " + str(n) + ", expected " + str(k_scales_.size()) +
             (opts_.kv_scale_granularity == 1 ? " (num_layers * num_kv_heads, per head)"
                                              : " (num_layers, per tensor)"));
  check_scales(k, v, n, "k_scales", "v_scales");
  std::vector<float> nk(k, k + n), nv(v, v + n);
  // Writers of the arena are exclusive of every kernel (docs/threading.md).
  std::unique_lock<std::shared_mutex> kv(kv_mu_);
  std::swap(k_scales_, nk);
  std::swap(v_scales_, nv);
  try {
    upload_scales();
  } catch (...) {
    std::swap(k_scales_, nk);
    std::swap(v_scales_, nv);
    throw;
  }
}

void Pool::kv_scales(std::vector<float>* k, std::vector<float>* v) const {
  OpMutex::ConstGuard lock(mu_);
  check_open();
  check_fp8();
  *k = k_scales_;
  *v = v_scales_;
}

}  // namespace pagedkv
