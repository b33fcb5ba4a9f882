// GroupPool: creation, the shared block budget and the per-sequence calls
// (kv_groups.h). The hit search is in group_hit.cpp.
#include "kv_groups.h"

#include <xxhash.h>

#include <algorithm>
#include <random>

#include "error.h"
#include "group_plan_table.h"
#include "seq_util.h"

namespace pagedkv {

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// The sequence (n0 tokens) can take n more and lookahead slots: at most
// 2^31 - 1 slots, checked so that n0 + n + lookahead cannot wrap.
void check_room(uint64_t n0, uint64_t n, uint32_t lookahead) {
  if (n > seq_util::kMaxSeqTokens - n0 || n + lookahead > seq_util::kMaxSeqTokens - n0)
    fail(Errc::kInvalidArgument, "the sequence would hold " + str(n0) + " + " + str(n) + " + " +
                                     str(lookahead) + " slots, more than 2^31 - 1");
}

void check_group(const GroupSpec& g, uint32_t i, uint32_t block_size) {
  const std::string at = "groups[" + str(i) + "].";
  if (g.num_layers == 0) fail(Errc::kInvalidArgument, at + "num_layers is 0");
  // Bounds every group's page (group_block_bytes) well inside 64 bits: at
  // most 2^34 * 2^16 bytes (recurrent) or 2^33 * 2^10 * 4 * 2^16 (full).
  if (g.num_layers > kMaxGroupLayers)
    fail(Errc::kInvalidArgument,
         at + "num_layers " + str(g.num_layers) + " exceeds " + str(kMaxGroupLayers));
  if (!g.layer_ids.empty() && g.layer_ids.size() != g.num_layers)
    fail(Errc::kInvalidArgument, at + "layer_ids holds " + str(g.layer_ids.size()) +
                                     " entries, not num_layers " + str(g.num_layers));
  if (g.kind == GroupKind::kRecurrent) {
    if (g.state_bytes == 0) fail(Errc::kInvalidArgument, at + "state_bytes is 0");
    if (g.state_bytes > (uint64_t(1) << 34))
      fail(Errc::kInvalidArgument, at + "state_bytes exceeds 16 GiB");
  } else if (g.kind == GroupKind::kMla) {
    if (g.kv_lora_rank == 0) fail(Errc::kInvalidArgument, at + "kv_lora_rank is 0");
    if (g.kv_lora_rank > 65536 || g.rope_dim > 65536)
      fail(Errc::kInvalidArgument, at + "kv_lora_rank + rope_dim exceeds 2 x 65536");
  } else {
    if (g.num_kv_heads == 0) fail(Errc::kInvalidArgument, at + "num_kv_heads is 0");
    if (g.head_dim == 0) fail(Errc::kInvalidArgument, at + "head_dim is 0");
    if (g.num_kv_heads > 65536 || g.head_dim > 65536)
      fail(Errc::kInvalidArgument, at + "num_kv_heads or head_dim exceeds 65536");
  }
  if (g.kind == GroupKind::kSlidingWindow) {
    if (g.sliding_window == 0) fail(Errc::kInvalidArgument, at + "sliding_window is 0");
  } else if (g.sliding_window != 0) {
    fail(Errc::kInvalidArgument, at + "sliding_window is " + str(g.sliding_window) +
                                     " but kind is not PKV_GROUP_SLIDING_WINDOW");
  }
  if (g.snapshot_every_block && g.kind != GroupKind::kRecurrent)
    fail(Errc::kInvalidArgument, at + "flags has PKV_GROUP_SNAPSHOT_EVERY_BLOCK but kind is not "
                                      "PKV_GROUP_RECURRENT");
  (void)block_size;
}

// Model layer ids are given for every group or for none, and name each
// layer once: a layer in two groups would have two caches.
void check_layer_ids(const std::vector<GroupSpec>& groups) {
  size_t given = 0;
  for (const GroupSpec& g : groups) given += g.layer_ids.empty() ? 0 : 1;
  if (given == 0) return;
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> seen;
  for (uint32_t i = 0; i < groups.size(); ++i) {
    if (groups[i].layer_ids.empty())
      fail(Errc::kInvalidArgument, "groups[" + str(i) +
                                       "].layer_ids is NULL while other groups give layer ids: "
                                       "give them for every group or for none");
    for (uint32_t k = 0; k < groups[i].layer_ids.size(); ++k) {
      const uint32_t id = groups[i].layer_ids[k];
      auto [it, fresh] = seen.emplace(id, std::make_pair(i, k));
      if (!fresh)
        fail(Errc::kInvalidArgument,
             "groups[" + str(i) + "].layer_ids[" + str(k) + "] = " + str(id) + " is also groups[" +
                 str(it->second.first) + "].layer_ids[" + str(it->second.second) + "]");
    }
  }
}

}  // namespace

uint64_t group_block_bytes(const GroupSpec& g, uint32_t block_size) {
  if (g.kind == GroupKind::kRecurrent) return g.state_bytes * g.num_layers;
  const uint64_t per_token = g.kind == GroupKind::kMla ? uint64_t(g.kv_lora_rank) + g.rope_dim
                                                       : 2 * uint64_t(g.num_kv_heads) * g.head_dim;
  return per_token * block_size * dtype_size(g.dtype) * g.num_layers;
}

size_t GroupPool::KeyHasher::operator()(const Key& k) const noexcept {
  // Digests come from requests, so the bucket is a keyed hash of the whole
  // digest (as prefix_cache.cpp does), never raw digest bytes.
  return size_t(XXH3_64bits_withSeed(k.hash.bytes.data(), k.hash.size,
                                     seed ^ (uint64_t(k.group) * 0x9E3779B97F4A7C15ull)));
}

std::shared_ptr<GroupPool> GroupPool::create(const PoolOptions& base,
                                             std::vector<GroupSpec> groups) {
  const uint32_t bs = base.block_size;
  if (bs == 0 || bs > 1024)
    fail(Errc::kInvalidArgument, "base->block_size " + str(bs) + " must be in [1, 1024]");
  if (hash_digest_size(base.hash_algo) == 0)
    fail(Errc::kInvalidArgument,
         "base->hash_algo " + str(uint32_t(base.hash_algo)) + " is not a PKV_HASH_* value");
  if (base.num_layers != 0)
    fail(Errc::kUnsupported,
         "base->num_layers is " + str(base.num_layers) +
             ": multi-group pools are manager only (the engine owns the KV tensors); set 0");
  if (base.sliding_window != 0)
    fail(Errc::kInvalidArgument,
         "base->sliding_window must be 0: give the window in a PKV_GROUP_SLIDING_WINDOW group");
  if (base.enable_events || base.enable_partial_reuse || base.enable_retention)
    fail(Errc::kUnsupported,
         "base->enable_events, enable_partial_reuse and enable_retention are not supported on "
         "multi-group pools");
  if (groups.empty()) fail(Errc::kInvalidArgument, "num_groups is 0");
  if (groups.size() > kMaxGroups)
    fail(Errc::kInvalidArgument, "num_groups exceeds " + str(kMaxGroups));
  for (uint32_t i = 0; i < groups.size(); ++i) check_group(groups[i], i, bs);
  check_layer_ids(groups);
  auto p = std::shared_ptr<GroupPool>(new GroupPool(base, std::move(groups)));
  return p;
}

GroupPool::GroupPool(const PoolOptions& base, std::vector<GroupSpec> groups)
    : opts_(base),
      groups_(std::move(groups)),
      root_(hash_root(base.hash_algo, base.hash_seed)),
      cache_(16, KeyHasher{std::random_device{}() * 0x100000001B3ull ^ std::random_device{}()}) {
  for (const GroupSpec& g : groups_)
    bytes_per_block_ = std::max(bytes_per_block_, group_block_bytes(g, opts_.block_size));
  uint64_t nb = opts_.num_blocks;
  if (nb == 0) {
    if (opts_.memory_budget_bytes == 0)
      fail(Errc::kInvalidArgument, "base->num_blocks and base->memory_budget_bytes are both 0");
    nb = opts_.memory_budget_bytes / bytes_per_block_;
    if (nb < 2)
      fail(Errc::kInvalidArgument, "base->memory_budget_bytes " + str(opts_.memory_budget_bytes) +
                                       " holds " + str(nb) + " blocks of " + str(bytes_per_block_) +
                                       " bytes; at least 2 are needed");
    if (nb > uint64_t(1) << 30)
      fail(Errc::kInvalidArgument, "base->memory_budget_bytes " + str(opts_.memory_budget_bytes) +
                                       " holds " + str(nb) + " blocks of " + str(bytes_per_block_) +
                                       " bytes; at most 2^30 are allowed (set base->num_blocks)");
  }
  if (nb < 2 || nb > uint64_t(1) << 30)
    fail(Errc::kInvalidArgument, "base->num_blocks " + str(nb) + " must be in [2, 2^30]");
  uint64_t arena;  // what the stats report as kv_bytes_allocated
  if (__builtin_mul_overflow(bytes_per_block_, nb, &arena))
    fail(Errc::kInvalidArgument, "base->num_blocks " + str(nb) + " * " + str(bytes_per_block_) +
                                     " bytes per block overflows 64 bits");
  opts_.num_blocks = nb;
  num_blocks_ = int32_t(nb);
  ref_.assign(nb, 0);
  group_of_.assign(nb, -1);
  pin_.assign(nb, 0);
  plan_hold_.assign(nb, 0);
  key_.assign(nb, BlockHash{});
  cached_at_.assign(nb, 0);
  queue_ = FreeBlockQueue(num_blocks_);
  copies_.resize(groups_.size());
  kept_tables_.resize(groups_.size());
  cache_.reserve(nb);
  // Without layer ids, model layers are numbered through the groups in order.
  uint32_t next = 0;
  for (uint32_t g = 0; g < groups_.size(); ++g)
    for (uint32_t k = 0; k < groups_[g].num_layers; ++k)
      layers_.emplace(groups_[g].layer_ids.empty() ? next++ : groups_[g].layer_ids[k],
                      std::make_pair(g, k));
}

bool GroupPool::layer(uint32_t model_layer, uint32_t* group, uint32_t* index) const {
  auto it = layers_.find(model_layer);
  if (it == layers_.end()) return false;
  *group = it->second.first;
  *index = it->second.second;
  return true;
}

GroupPool::Seq& GroupPool::seq_or_throw(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) fail(Errc::kNotFound, unknown_seq(id, tag_.value()));
  return it->second;
}

const GroupPool::Seq& GroupPool::seq_or_throw(SeqId id) const {
  return const_cast<GroupPool*>(this)->seq_or_throw(id);
}

SeqId GroupPool::new_id() {
  constexpr int kTagShift = 48;  // SeqTable::kTagShift
  if (next_id_ >= (SeqId(1) << kTagShift))
    fail(Errc::kOutOfMemory, "the pool has handed out 2^48 - 1 sequence ids");
  tag_.note_generation(uint32_t(next_id_ >> 24));  // bits 24..47, as SeqTable's generation
  return (SeqId(tag_.value()) << kTagShift) | next_id_++;
}

SeqId GroupPool::seq_create(const SeqOptions& o) {
  HashContext ctx = make_hash_context(opts_, o);
  std::lock_guard<std::mutex> lock(mu_);
  Seq s;
  s.ctx = std::move(ctx);
  s.priority = o.priority;
  s.planned = planned_;
  s.table.resize(groups_.size());
  s.num_null.assign(groups_.size(), 0);
  s.state_src.assign(groups_.size(), 0);
  s.version.assign(groups_.size(), 0);
  const SeqId id = new_id();
  seqs_.emplace(id, std::move(s));
  return id;
}

int32_t GroupPool::allocate(uint32_t g) {
  const int32_t b = queue_.pop_front();
  if (!key_[b].empty()) {
    uncache(b);
    ++evictions_;
  }
  ref_[b] = 1;
  group_of_[b] = int32_t(g);
  return b;
}

void GroupPool::release(int32_t b) {
  if (--ref_[b] > 0) return;
  // Cached blocks wait at the tail (evicted last), the others are reused first.
  if (key_[b].empty()) {
    group_of_[b] = -1;
    queue_.push_front_run(b);
  } else {
    queue_.push_back(b);
  }
}

void GroupPool::record_copy(uint32_t g, int32_t src, int32_t dst) {
  // Both blocks stay referenced until the engine took the copy: freed
  // meanwhile, one could go to another group whose copies the engine may
  // run first (take_copies is per group), so a block would be overwritten
  // before it was read, or a copy would land after a newer one.
  ++ref_[src];
  ++ref_[dst];
  ++pin_[src];
  ++pin_[dst];
  copies_[g].push_back({src, dst});
}

void GroupPool::cache(int32_t b, uint32_t g, const BlockHash& h) noexcept {
  if (!opts_.enable_prefix_caching || !key_[b].empty()) return;
  try {
    cache_.emplace(Key{h, g}, b);  // allocates a node: first
  } catch (...) {
    return;  // out of memory: the block stays uncached
  }
  key_[b] = h;
  cached_at_[b] = ++cache_clock_;
}

void GroupPool::uncache(int32_t b) {
  auto range = cache_.equal_range(Key{key_[b], uint32_t(group_of_[b])});
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == b) {
      cache_.erase(it);
      break;
    }
  key_[b] = BlockHash{};
}

int32_t GroupPool::lookup(const BlockHash& h, uint32_t g) const {
  // Equal hashes (a block recomputed after a hit capped below it, or filled
  // by two sequences at once) map to several blocks; the multimap's order
  // among them is unspecified (libstdc++ puts the newest first). vLLM hits
  // the oldest, and which one a hit takes decides the block ids and what
  // stays in the free queue, so the oldest it is.
  auto range = cache_.equal_range(Key{h, g});
  int32_t best = -1;
  for (auto it = range.first; it != range.second; ++it)
    if (best < 0 || cached_at_[it->second] < cached_at_[best]) best = it->second;
  return best;
}

uint64_t GroupPool::window_end(uint32_t g, uint64_t n0) const {
  const GroupSpec& spec = groups_[g];
  if (spec.kind != GroupKind::kSlidingWindow || n0 + 1 <= spec.sliding_window) return 0;
  // The first new token at n0 sees keys > n0 - w: blocks wholly before
  // n0 - w + 1 are never read again.
  return (n0 + 1 - spec.sliding_window) / opts_.block_size;
}

bool GroupPool::snapshot_due(const Seq& s, uint32_t g) const {
  const uint64_t bs = opts_.block_size, n = s.tokens.size();
  // Only a computed state is worth keeping (and may be hit).
  return opts_.enable_prefix_caching && recurrent(g) && !s.table[g].empty() && n > 0 &&
         s.num_computed >= n && n % bs == 0 && s.hashes.size() >= n / bs &&
         lookup(s.hashes[n / bs - 1], g) < 0;
}

void GroupPool::hash_full_blocks(Seq& s) {
  const uint64_t bs = opts_.block_size, full = s.tokens.size() / bs;
  if (s.hashes.size() >= full) return;
  BlockHasher hasher(opts_.hash_algo);
  for (uint64_t k = s.hashes.size(); k < full; ++k) {
    const BlockHash& parent = k ? s.hashes[k - 1] : root_;
    s.hashes.push_back(hasher.hash(parent, s.tokens.data() + k * bs, bs, s.ctx, k * bs));
  }
}

GroupPool::Need GroupPool::need_of(const Seq& s, uint64_t n, uint32_t lookahead) const {
  const uint64_t bs = opts_.block_size, n0 = s.tokens.size();
  const uint64_t want = ceil_div(n0 + n + lookahead, bs);
  Need need;
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    const std::vector<int32_t>& t = s.table[g];
    if (recurrent(g)) {
      // One live state slot: taken at the first append (from the state to
      // start from), moved to a copy when it is shared or its state at a
      // block boundary is kept as a snapshot.
      if (n == 0) continue;
      if (t.empty())
        ++need.fresh;
      else if (ref_[t[0]] > 1 || !key_[t[0]].empty() || snapshot_due(s, g))
        ++need.cow;
      continue;
    }
    if (want > t.size()) need.fresh += want - t.size();
    // Blocks this append writes into that others hold or the cache keeps
    // (a truncated cached block) are copied first.
    const uint64_t last = std::min<uint64_t>(t.size(), ceil_div(n0 + n, bs));
    for (uint64_t j = n0 / bs; n > 0 && j < last; ++j)
      if (t[j] != 0 && (ref_[t[j]] > 1 || !key_[t[j]].empty())) ++need.cow;
    if (n > 0) {
      const uint64_t end =
          std::min<uint64_t>(t.size(), window_end(g, std::min(n0, s.num_computed)));
      for (uint64_t j = s.num_null[g]; j < end; ++j)
        if (t[j] != 0 && ref_[t[j]] == 1) ++need.gain;
    }
  }
  return need;
}

uint64_t GroupPool::blocks_needed(SeqId id, uint64_t n, uint32_t lookahead) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Seq& s = seq_or_throw(id);
  check_room(s.tokens.size(), n, lookahead);  // as append: need_of sums in 64 bits
  const Need need = need_of(s, n, lookahead);
  const uint64_t take = need.fresh + need.cow;
  return take > need.gain ? take - need.gain : 0;
}

void GroupPool::append(SeqId id, const int32_t* tokens, uint64_t n, uint32_t lookahead) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& s = seq_or_throw(id);
  const uint64_t bs = opts_.block_size, n0 = s.tokens.size();
  check_room(n0, n, lookahead);
  const Need need = need_of(s, n, lookahead);
  if (need.fresh + need.cow > uint64_t(queue_.size()) + need.gain)
    fail(Errc::kOutOfBlocks, "the append needs " + str(need.fresh + need.cow) +
                                 " blocks over all groups; " + str(queue_.size()) + " free + " +
                                 str(need.gain) + " the sliding window gives back");
  // What may throw comes first, while nothing changed: room in every vector
  // that grows, then the new tokens and the hashes of the blocks they fill
  // (taken back on failure). Nothing below throws.
  s.tokens.reserve(n0 + n);
  s.hashes.reserve((n0 + n) / bs);
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    copies_[g].reserve(copies_[g].size() + s.table[g].size() + 1);
    if (!recurrent(g)) s.table[g].reserve(ceil_div(n0 + n + lookahead, bs));
  }
  // Whether each recurrent group keeps a snapshot is decided now, as
  // need_of counted it: an allocation below may evict the cached snapshot
  // of the same hash, and deciding after it would take a block more than
  // counted (one that may not be free).
  uint64_t due = 0;
  for (uint32_t g = 0; g < groups_.size(); ++g)
    if (snapshot_due(s, g)) due |= uint64_t(1) << g;
  const uint64_t k0 = s.hashes.size();
  s.tokens.insert(s.tokens.end(), tokens, tokens + n);  // reserved
  try {
    hash_full_blocks(s);
  } catch (...) {
    s.tokens.resize(n0);
    s.hashes.resize(k0);
    throw;
  }
  // The window releases of every group first: need_of counted what they
  // give back towards the allocations of all groups.
  for (uint32_t g = 0; g < groups_.size() && n > 0; ++g) {
    if (recurrent(g)) continue;
    std::vector<int32_t>& t = s.table[g];
    // The window moves with the computed tokens (all of them before the
    // pool's first plan): uncomputed ones will be queries needing it.
    // Released nearest-first so the earliest blocks reach the free tail
    // last and are evicted last (as vLLM's remove_skipped_blocks).
    const uint64_t end = std::min<uint64_t>(t.size(), window_end(g, std::min(n0, s.num_computed)));
    ReleaseBatch batch(queue_);
    for (uint64_t j = end; j-- > s.num_null[g];)
      if (t[j] != 0) {
        release(t[j]);
        t[j] = 0;
      }
    s.num_null[g] = std::max(s.num_null[g], end);
  }
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    std::vector<int32_t>& t = s.table[g];
    if (recurrent(g)) {
      if (n > 0) append_state(s, g, (due >> g) & 1, n0);
      continue;
    }
    const uint64_t last = std::min<uint64_t>(t.size(), ceil_div(n0 + n, bs));
    for (uint64_t j = n0 / bs; n > 0 && j < last; ++j) {
      const int32_t b = t[j];
      if (b == 0 || (ref_[b] == 1 && key_[b].empty())) continue;
      const int32_t nb = allocate(g);
      record_copy(g, b, nb);
      ++cow_;
      t[j] = nb;
      ++s.version[g];
      release(b);
    }
    while (t.size() < ceil_div(n0 + n + lookahead, bs)) t.push_back(allocate(g));
  }
  if (!planned_) s.num_computed = s.tokens.size();
  cache_computed(s, k0);
}

void GroupPool::cache_computed(const Seq& s, uint64_t from) {
  const uint64_t end = std::min<uint64_t>(s.hashes.size(), s.num_computed / opts_.block_size);
  for (uint64_t k = from; k < end; ++k)
    for (uint32_t g = 0; g < groups_.size(); ++g)
      if (!recurrent(g) && !uncacheable_window(g) && k < s.table[g].size() && s.table[g][k] != 0)
        cache(s.table[g][k], g, s.hashes[k]);
  // A live state that a committed step computed up to a block boundary is
  // that boundary's state, cached now as vLLM's align mode caches the
  // running state block of a step that ends there (a later prompt may hit
  // it before the owner's next step). The owner's next append (or plan)
  // moves to a copy, as it did to keep the snapshot then. Before a
  // sequence's first plan (appends count tokens computed, and that plan may
  // restart the state) it is kept at the next append or free, as before.
  for (uint32_t g = 0; g < groups_.size() && s.planned; ++g)
    if (snapshot_due(s, g))
      cache(s.table[g][0], g, s.hashes[s.tokens.size() / opts_.block_size - 1]);
}

void GroupPool::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

void GroupPool::append_state(Seq& s, uint32_t g, bool keep, uint64_t n0) {
  std::vector<int32_t>& t = s.table[g];
  if (t.empty()) {
    const int32_t slot = allocate(g);
    if (s.state_src[g] != 0) {
      record_copy(g, s.state_src[g], slot);
      ++cow_;
      release(s.state_src[g]);
      s.state_src[g] = 0;
    }
    t.push_back(slot);
    return;
  }
  const int32_t slot = t[0];
  if (!keep && ref_[slot] == 1 && key_[slot].empty()) return;
  // The slot holds the state at the current length: it stays as is (a
  // snapshot, or the state a fork child starts from) and the sequence goes
  // on in a copy.
  const int32_t next = allocate(g);
  record_copy(g, slot, next);
  ++cow_;
  if (keep) cache(slot, g, s.hashes[n0 / opts_.block_size - 1]);
  release(slot);
  t[0] = next;
  ++s.version[g];
}

uint64_t GroupPool::match_prefix(SeqId id, const int32_t* tokens, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& s = seq_or_throw(id);
  bool holds_blocks = false;
  for (uint32_t g = 0; g < groups_.size(); ++g)
    holds_blocks = holds_blocks || !s.table[g].empty() || s.state_src[g] != 0;
  if (!s.tokens.empty() || holds_blocks)
    fail(Errc::kInvalidState,
         seq_name(id) + " is not empty (it holds " + str(s.tokens.size()) + " tokens and blocks)");
  if (n > seq_util::kMaxSeqTokens) fail(Errc::kInvalidArgument, "num_tokens exceeds 2^31 - 1");
  const uint64_t bs = opts_.block_size;
  if (!opts_.enable_prefix_caching || n <= bs) {
    query_tokens_ += n;
    return 0;
  }
  // What may throw (hashing, the hit, room in the vectors) before any change.
  const std::vector<BlockHash> hashes = hash_prefix(s.ctx, root_, tokens, (n - 1) / bs * bs);
  std::vector<std::vector<int32_t>> hit;
  const uint64_t k = find_hit(hashes, hashes.size(), &hit);
  if (k > 0) {
    s.tokens.reserve(k * bs);
    s.hashes.reserve(k);
    for (auto& t : s.table) t.reserve(k);
  }
  query_tokens_ += n;
  if (k == 0) return 0;
  s.tokens.assign(tokens, tokens + k * bs);
  s.hashes.assign(hashes.begin(), hashes.begin() + k);
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    if (recurrent(g)) {
      // The snapshot at the hit point is the state to start from.
      const int32_t b = hit[g].back();
      if (ref_[b] == 0) queue_.remove(b);
      ++ref_[b];
      s.state_src[g] = b;
      continue;
    }
    s.table[g] = hit[g];
    ++s.version[g];
    uint64_t nulls = 0;
    while (nulls < k && hit[g][nulls] == 0) ++nulls;
    s.num_null[g] = nulls;
    for (int32_t b : hit[g]) {
      if (b == 0) continue;
      if (ref_[b] == 0) queue_.remove(b);
      ++ref_[b];
    }
  }
  s.num_cached = s.num_computed = k * bs;  // cached blocks hold computed K/V
  hit_tokens_ += k * bs;
  return k * bs;
}

SeqId GroupPool::fork(SeqId parent) {
  std::lock_guard<std::mutex> lock(mu_);
  const Seq& p = seq_or_throw(parent);
  Seq child = p;
  const SeqId id = new_id();  // may throw: before the references below
  for (uint32_t g = 0; g < groups_.size(); ++g)
    if (recurrent(g)) {
      // The child starts from the parent's state; its first append copies it.
      child.state_src[g] = p.table[g].empty() ? p.state_src[g] : p.table[g][0];
      child.table[g].clear();
    }
  // Stored first (may throw), then referenced (cannot): an allocation
  // failure leaves every block's count as it was.
  const Seq& c = seqs_.emplace(id, std::move(child)).first->second;
  for (const auto& t : c.table)
    for (int32_t b : t)
      if (b != 0) ++ref_[b];
  for (int32_t b : c.state_src)
    if (b != 0) ++ref_[b];
  return id;
}

void GroupPool::reserve(SeqId id, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& s = seq_or_throw(id);
  if (n > uint64_t(INT32_MAX))
    fail(Errc::kInvalidArgument, "num_tokens " + str(n) + " exceeds 2^31 - 1");
  // No more than the sequence could ever hold: a full-attention (or MLA)
  // group takes a distinct block of the pool per block of tokens.
  const uint64_t bs = opts_.block_size;
  for (const GroupSpec& g : groups_)
    if (g.kind == GroupKind::kFull || g.kind == GroupKind::kMla)
      n = std::min<uint64_t>(n, uint64_t(num_blocks_) * bs);
  n = std::min(n, seq_util::kMaxReserveTokens);
  // Capacity only: a failure part-way leaves nothing a caller can see.
  s.tokens.reserve(n);
  s.hashes.reserve(n / bs);
  for (uint32_t g = 0; g < groups_.size(); ++g)
    if (!recurrent(g)) s.table[g].reserve(ceil_div(n, bs));
}

void GroupPool::truncate(SeqId id, uint64_t num_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& s = seq_or_throw(id);
  const uint64_t bs = opts_.block_size, n = num_tokens;
  if (n > s.tokens.size())
    fail(Errc::kInvalidArgument,
         "num_tokens " + str(n) + " exceeds the sequence's " + str(s.tokens.size()) + " tokens");
  const uint64_t keep = ceil_div(n, bs);
  for (uint32_t g = 0; g < groups_.size(); ++g)
    if (recurrent(g) && n < s.tokens.size())
      fail(Errc::kInvalidArgument, "num_tokens " + str(n) + " is below the sequence's " +
                                       str(s.tokens.size()) + " tokens but group " + str(g) +
                                       " is recurrent: its state cannot be rolled back");
  for (uint32_t g = 0; g < groups_.size(); ++g)
    if (s.num_null[g] > window_end(g, n) && window_end(g, n) < keep)
      fail(Errc::kInvalidArgument, "num_tokens " + str(n) + " would need blocks of group " +
                                       str(g) + " that its sliding window already released");
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    std::vector<int32_t>& t = s.table[g];
    if (recurrent(g)) continue;
    ReleaseBatch batch(queue_);
    while (t.size() > keep) {
      if (t.back() != 0) release(t.back());
      t.pop_back();
    }
    ++s.version[g];
    s.num_null[g] = std::min<uint64_t>(s.num_null[g], keep);
  }
  // A plan prepared before skips the sequence at commit only when tokens it
  // may have written are gone (as Pool::truncate's writes_epoch): a truncate
  // to the current length drops none, and skipping would leave a recurrent
  // state the step advanced ahead of the computed tokens (applied twice by
  // the next step).
  if (n < s.tokens.size()) ++s.epoch;
  s.tokens.resize(n);
  s.hashes.resize(std::min<uint64_t>(s.hashes.size(), n / bs));
  s.num_cached = std::min(s.num_cached, n);
  s.num_computed = std::min(s.num_computed, n);
}

void GroupPool::free(SeqId id) {
  std::lock_guard<std::mutex> lock(mu_);
  Seq& s = seq_or_throw(id);
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    // A state at a block boundary outlives the sequence as a snapshot.
    if (snapshot_due(s, g) && ref_[s.table[g][0]] == 1)
      cache(s.table[g][0], g, s.hashes[s.tokens.size() / opts_.block_size - 1]);
    const std::vector<int32_t>& t = s.table[g];
    ReleaseBatch batch(queue_);
    for (size_t j = t.size(); j-- > 0;)
      if (t[j] != 0) release(t[j]);
    if (s.state_src[g] != 0) release(s.state_src[g]);
  }
  seqs_.erase(id);
}

SeqInfo GroupPool::seq_info(SeqId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Seq& s = seq_or_throw(id);
  SeqInfo info;
  info.priority = s.priority;
  info.num_tokens = s.tokens.size();
  info.num_cached_tokens = s.num_cached;
  info.num_computed_tokens = s.num_computed;
  info.lora_id = s.ctx.lora_id;
  for (uint32_t g = 0; g < groups_.size(); ++g) {
    info.num_blocks += s.table[g].size() - s.num_null[g];
    if (!recurrent(g))
      info.num_slots = std::max<uint64_t>(info.num_slots, s.table[g].size() * opts_.block_size);
  }
  return info;
}

uint64_t GroupPool::block_table(SeqId id, uint32_t g, int32_t* out, uint64_t cap) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Seq& s = seq_or_throw(id);
  if (g >= groups_.size())
    fail(Errc::kInvalidArgument,
         "group " + str(g) + " is out of range (the pool has " + str(groups_.size()) + ")");
  const std::vector<int32_t>& t = s.table[g];
  // All or nothing, as Pool::block_table: a too-small buffer is left as it
  // was (the caller gets PKV_E_BUFFER_TOO_SMALL and the size).
  if (out && cap >= t.size()) std::copy(t.begin(), t.end(), out);
  return t.size();
}

PoolStats GroupPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PoolStats st;
  st.block_size = opts_.block_size;
  st.num_blocks = uint64_t(num_blocks_);
  st.num_free_blocks = uint64_t(queue_.size());
  st.num_used_blocks = uint64_t(num_blocks_ - 1 - queue_.size());
  st.num_cached_blocks = cache_.size();
  st.num_seqs = seqs_.size();
  for (const auto& kv : seqs_) st.num_tokens += kv.second.tokens.size();
  st.usage = double(st.num_used_blocks) / double(num_blocks_ - 1);
  st.prefix_query_tokens = query_tokens_;
  st.prefix_hit_tokens = hit_tokens_;
  st.num_evictions = evictions_;
  st.num_cow_copies = cow_;
  st.kv_bytes_per_block = bytes_per_block_;
  st.kv_bytes_allocated = bytes_per_block_ * uint64_t(num_blocks_);
  st.kv_bytes_used = bytes_per_block_ * st.num_used_blocks;
  return st;
}

GroupStats GroupPool::group_stats(uint32_t g) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (g >= groups_.size())
    fail(Errc::kInvalidArgument,
         "group " + str(g) + " is out of range (the pool has " + str(groups_.size()) + ")");
  GroupStats st;
  st.bytes_per_block = group_block_bytes(groups_[g], opts_.block_size);
  for (int32_t b = 1; b < num_blocks_; ++b) {
    if (group_of_[b] != int32_t(g)) continue;
    st.num_used_blocks += ref_[b] > 0;
    st.num_cached_blocks += !key_[b].empty();
  }
  for (const auto& kv : seqs_) st.num_null_entries += kv.second.num_null[g];
  return st;
}

uint64_t GroupPool::take_copies(uint32_t g, int32_t* src, int32_t* dst, uint64_t cap) {
  std::lock_guard<std::mutex> lock(mu_);
  if (g >= groups_.size())
    fail(Errc::kInvalidArgument,
         "group " + str(g) + " is out of range (the pool has " + str(groups_.size()) + ")");
  auto& c = copies_[g];
  const uint64_t n = c.size();
  if (n > cap) return n;
  for (uint64_t i = 0; i < n; ++i) {
    src[i] = c[i].first;
    dst[i] = c[i].second;
  }
  for (uint64_t i = n; i-- > 0;) {
    --pin_[c[i].second];
    --pin_[c[i].first];
    release(c[i].second);
    release(c[i].first);
  }
  c.clear();
  return n;
}

std::string GroupPool::check() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (const char* q = queue_.check(); q && *q) return std::string("free queue: ") + q;
  std::vector<int32_t> refs(num_blocks_, 0);
  for (const auto& kv : seqs_) {
    const Seq& s = kv.second;
    for (uint32_t g = 0; g < groups_.size(); ++g)
      for (size_t j = 0; j < s.table[g].size(); ++j) {
        const int32_t b = s.table[g][j];
        if (b < 0 || b >= num_blocks_)
          return "seq " + str(kv.first) + " group " + str(g) + " holds block " + std::to_string(b) +
                 " out of range";
        if ((b == 0) != (j < s.num_null[g]))
          return "seq " + str(kv.first) + " group " + str(g) + " entry " + str(j) +
                 (b == 0 ? " is null past the window" : " is not null inside the released run");
        if (b == 0) continue;
        if (group_of_[b] != int32_t(g))
          return "block " + str(b) + " is in a table of group " + str(g) + " but belongs to " +
                 std::to_string(group_of_[b]);
        ++refs[b];
      }
    for (uint32_t g = 0; g < groups_.size(); ++g) {
      const int32_t b = s.state_src[g];
      if (b == 0) continue;
      if (!recurrent(g) || b < 0 || b >= num_blocks_ || group_of_[b] != int32_t(g))
        return "seq " + str(kv.first) + " group " + str(g) + " starts from a bad state block";
      ++refs[b];
    }
    for (uint32_t g = 0; g < groups_.size(); ++g)
      if (recurrent(g) && s.table[g].size() > 1)
        return "seq " + str(kv.first) + " holds more than one state slot in group " + str(g);
  }
  for (const auto& c : copies_)
    for (const auto& pair : c) ++refs[pair.first], ++refs[pair.second];  // pinned until taken
  for (int32_t b = 1; b < num_blocks_; ++b) refs[b] += plan_hold_[b];    // open plans' snapshots
  if (ref_[0] != 0 || queue_.contains(0)) return "the null block is in use or free";
  for (int32_t b = 1; b < num_blocks_; ++b) {
    if (refs[b] != ref_[b])
      return "block " + str(b) + " has ref " + std::to_string(ref_[b]) + " but " +
             std::to_string(refs[b]) + " table entries";
    if ((ref_[b] == 0) != queue_.contains(b))
      return "block " + str(b) + (ref_[b] ? " is used and free" : " is neither used nor free");
    if (!key_[b].empty() && group_of_[b] < 0) return "cached block " + str(b) + " has no group";
    if (plan_hold_[b] != 0 && (!key_[b].empty() || group_of_[b] < 0 || !recurrent(group_of_[b])))
      return "snapshot slot " + str(b) + " of an open plan is cached or not a recurrent block";
  }
  size_t keyed = 0;
  for (int32_t b = 1; b < num_blocks_; ++b) keyed += !key_[b].empty();
  if (keyed != cache_.size())
    return str(keyed) + " blocks hold a hash but the cache has " + str(cache_.size()) + " entries";
  for (const auto& e : cache_)
    if (key_[e.second] != e.first.hash || group_of_[e.second] != int32_t(e.first.group))
      return "cache entry for block " + str(e.second) + " does not match its hash or group";
  return "";
}

}  // namespace pagedkv
