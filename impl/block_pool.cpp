#include "block_pool.h"

#include <algorithm>
#include <functional>

namespace pagedkv {

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching, EventQueue* events)
    : num_blocks_(num_blocks),
      caching_(enable_caching),
      ref_(num_blocks, 0),
      hash_(num_blocks),
      lora_(num_blocks, 0),
      counts_(num_blocks),
      queue_(num_blocks, 1),
      cache_(hash_.data(), num_blocks),
      events_(events) {}

int32_t BlockPool::lookup_written(const BlockHash& h) const {
  if (!caching_) return -1;
  for (int32_t b = cache_.find(h); b >= 0; b = cache_.next_duplicate(b))
    if (fully_written(b)) return b;
  return -1;
}

void BlockPool::evict(int32_t id) noexcept {
  if (sink_ && fully_written(id)) sink_->on_evict(id, hash_[id], lora_[id]);
  uncache_block(id);
  ++num_evictions_;
}

void BlockPool::cache_block(int32_t id, const BlockHash& h, const BlockHash* parent,
                            uint32_t num_tokens, uint64_t lora_id, const int32_t* tokens) noexcept {
  if (!caching_ || id == kNullBlock || !hash_[id].empty()) return;
  hash_[id] = h;
  lora_[id] = lora_id;
  cache_.insert(id);
  if (partial_ && tokens) {
    partial_->parent[id] = parent ? *parent : partial_->root;
    partial_->children.insert(id);
    std::copy(tokens, tokens + block_size_, partial_->tokens.begin() + size_t(id) * block_size_);
  }
  if (events_ && events_->enabled()) {
    Event e;
    e.type = EventType::kStored;
    e.block_id = id;
    e.block_hash = h;
    if (parent) e.parent_hash = *parent;
    e.num_tokens = num_tokens;
    e.lora_id = lora_id;
    events_->push(e, tokens);
  }
}

void BlockPool::uncache_block(int32_t id) noexcept {
  if (hash_[id].empty()) return;
  cache_.erase(id);
  if (partial_ && !partial_->parent[id].empty()) {
    partial_->children.erase(id);
    partial_->parent[id] = BlockHash{};
  }
  if (events_ && events_->enabled()) {
    Event e;
    e.type = EventType::kRemoved;
    e.block_id = id;
    e.block_hash = hash_[id];
    e.lora_id = lora_[id];
    events_->push(e);
  }
  hash_[id] = BlockHash{};
  lora_[id] = 0;
  if (ret_) set_priority(id, kPriorityDefault, 0);  // a block without content keeps nothing
}

void BlockPool::reset_cache() noexcept {
  cache_.clear();
  if (partial_) {
    partial_->children.clear();
    for (auto& h : partial_->parent) h = BlockHash{};
  }
  for (auto& h : hash_) h = BlockHash{};
  std::fill(lora_.begin(), lora_.end(), 0);
  if (ret_) {
    // Nothing is cached now: every block is at the default, and free ones
    // (no content left) go to the head of the queue, to be reused first.
    for (int32_t id = 1; id < num_blocks_; ++id) set_priority(id, kPriorityDefault, 0);
  }
  if (events_ && events_->enabled()) {
    Event e;
    e.type = EventType::kAllCleared;
    events_->push(e);
  }
}

void BlockPool::enable_partial(const BlockHash& root, uint32_t block_size) {
  auto p = std::make_unique<Partial>();
  p->root = root;
  p->parent.assign(size_t(num_blocks_), BlockHash{});
  p->tokens.assign(size_t(num_blocks_) * block_size, 0);
  p->children = PrefixCache(p->parent.data(), num_blocks_);
  partial_ = std::move(p);
}

uint64_t BlockPool::partial_index_bytes() const {
  if (!partial_) return 0;
  // Per block: its parent hash, its tokens, two table slots (the table is
  // sized at 2x the blocks, rounded up) and two chain links.
  return uint64_t(partial_->parent.capacity()) * sizeof(BlockHash) +
         uint64_t(partial_->tokens.capacity()) * sizeof(int32_t) +
         uint64_t(num_blocks_) * (2 * sizeof(int32_t)) +
         partial_->children.table_slots() * sizeof(int32_t);
}

void BlockPool::enable_retention(uint64_t max_pinned) {
  auto r = std::make_unique<Retention>();
  r->prio.assign(size_t(num_blocks_), uint8_t(kPriorityDefault));
  r->dur.assign(size_t(num_blocks_), 0);
  r->arm.assign(size_t(num_blocks_), 0);
  r->released.assign(size_t(num_blocks_), 0);
  // A block has at most one live entry; stale ones are dropped by a rebuild
  // before the heap outgrows this, so a push never allocates.
  r->heap.reserve(2 * size_t(num_blocks_) + 1);
  r->max_pinned = max_pinned;
  // The queue's order stays what it was (a new pool: every block at level 0).
  FreeBlockQueue q(num_blocks_, num_blocks_, int32_t(kPriorityPinned) + 1,
                   int32_t(kPriorityPinned));
  queue_.for_each([&](int32_t id) { q.push_back(id, 0); });
  queue_ = std::move(q);
  ret_ = std::move(r);
}

void BlockPool::push_event_priority(int32_t id) noexcept {
  if (!events_ || !events_->enabled()) return;
  Event e;
  e.type = EventType::kPriority;
  e.block_id = id;
  e.block_hash = hash_[id];
  e.num_tokens = ret_->prio[id];
  e.lora_id = lora_[id];
  events_->push(e);
}

void BlockPool::set_priority(int32_t id, uint32_t p, uint64_t duration_ns) noexcept {
  if (!ret_ || id == kNullBlock) return;
  Retention& r = *ret_;
  if (hash_[id].empty()) p = kPriorityDefault, duration_ns = 0;
  const uint32_t old = r.prio[id];
  r.dur[id] = p == kPriorityDefault ? 0 : duration_ns;
  if (old != p) {
    r.pinned += (p == kPriorityPinned) - (old == kPriorityPinned);
    r.prio[id] = uint8_t(p);
    ++r.arm[id];  // an expiry armed for the old priority no longer applies
  }
  // A free block without content goes where every empty block goes, the
  // head; one whose priority ran out joins its new level where its last
  // release puts it (each level is in release order: LRU), found from the
  // tail, past the blocks freed since.
  const int32_t level = hash_[id].empty() ? 0 : int32_t(p);
  if (queue_.contains(id) && queue_.level_of(id) != level) {
    queue_.remove(id);
    if (hash_[id].empty()) {
      queue_.push_front(id, 0);
    } else {
      int32_t prev = queue_.prev_of(queue_.tail(level));
      while (prev != queue_.head(level) && r.released[prev] > r.released[id])
        prev = queue_.prev_of(prev);
      queue_.insert_after(prev, id, level);
    }
  }
  if (old != p && !hash_[id].empty()) push_event_priority(id);
}

void BlockPool::release_retained(int32_t id) noexcept {
  Retention& r = *ret_;
  if (hash_[id].empty()) {
    queue_.push_front_run(id);
    return;
  }
  queue_.push_back(id, r.prio[id]);
  r.released[id] = ++r.releases;
  // The duration counts from the moment the block is free (as TensorRT-LLM
  // counts it): a priority protects content nobody holds.
  if (r.prio[id] != kPriorityDefault && r.dur[id] > 0) {
    if (r.heap.size() + 1 >= r.heap.capacity()) {
      // Drop the entries that no longer apply (their block was touched or
      // changed priority since): at most one per block stays.
      std::vector<Expiry>& h = r.heap;
      h.erase(std::remove_if(h.begin(), h.end(),
                             [&](const Expiry& e) { return e.arm != r.arm[e.block]; }),
              h.end());
      std::make_heap(h.begin(), h.end(), std::greater<Expiry>());
    }
    ++r.arm[id];
    const uint64_t at =
        r.now_ns + r.dur[id] < r.now_ns ? UINT64_MAX : r.now_ns + r.dur[id];  // saturate
    r.heap.push_back({at, id, r.arm[id]});
    std::push_heap(r.heap.begin(), r.heap.end(), std::greater<Expiry>());
  }
}

void BlockPool::advance_clock(uint64_t now_ns) noexcept {
  if (!ret_) return;
  Retention& r = *ret_;
  if (now_ns > r.now_ns) r.now_ns = now_ns;  // a clock never runs back
  // An expiry past the clock's end saturated to UINT64_MAX: it never comes,
  // even with the clock at its last value.
  while (!r.heap.empty() && r.heap.front().at_ns <= r.now_ns &&
         r.heap.front().at_ns != UINT64_MAX) {
    const Expiry e = r.heap.front();
    std::pop_heap(r.heap.begin(), r.heap.end(), std::greater<Expiry>());
    r.heap.pop_back();
    if (e.arm == r.arm[e.block] && ref_[e.block] == 0) set_priority(e.block, kPriorityDefault, 0);
  }
}

void BlockPool::priority_counts(uint64_t* out) const {
  std::fill(out, out + kPriorityPinned + 1, 0);
  for (int32_t id = 1; id < num_blocks_; ++id)
    if (!hash_[id].empty()) ++out[ret_ ? ret_->prio[id] : kPriorityDefault];
}

std::string BlockPool::check_retention() const {
  if (!ret_) return "";
  uint64_t pinned = 0;
  for (int32_t id = 1; id < num_blocks_; ++id) {
    const uint32_t p = ret_->prio[id];
    if (p > kPriorityPinned)
      return "retention: block " + std::to_string(id) + " has priority " + std::to_string(p);
    if (hash_[id].empty() && p != kPriorityDefault)
      return "retention: block " + std::to_string(id) +
             " holds no cached content but a priority other than the default";
    pinned += p == kPriorityPinned;
    if (queue_.contains(id) && queue_.level_of(id) != (hash_[id].empty() ? 0 : int32_t(p)))
      return "retention: free block " + std::to_string(id) +
             " sits in the free queue at a level other than its priority";
  }
  if (pinned != ret_->pinned)
    return "retention: the pinned-block count disagrees with the blocks' priorities";
  return "";
}

std::string BlockPool::check() const {
  if (ref_[kNullBlock] != 0 || queue_.contains(kNullBlock) || !hash_[kNullBlock].empty())
    return "null block: block 0 was allocated, queued or cached";
  if (const char* q = queue_.check(); *q) return q;
  if (const char* c = cache_.check(); *c) return c;
  int32_t used = 0, hashed = 0;
  uint64_t filled = 0;
  for (int32_t id = 1; id < num_blocks_; ++id) {
    if (ref_[id] < 0) return "ref counts: block " + std::to_string(id) + " has a negative count";
    if (ref_[id] > 0) ++used, filled += counts_[id].fill;
    if (ref_[id] > 0 && queue_.contains(id))
      return "free queue: block " + std::to_string(id) + " is referenced and free";
    if (ref_[id] == 0 && !queue_.contains(id))
      return "free queue: block " + std::to_string(id) + " is unreferenced but not free";
    if (block_size_ && counts_[id].written > block_size_)
      return "written state: block " + std::to_string(id) + " has " +
             std::to_string(counts_[id].written) + " written slots, more than a block holds";
    if (!hash_[id].empty() && ref_[id] == 0 && !fully_written(id))
      return "written state: block " + std::to_string(id) +
             " sits cached in the free queue but its K/V was never (fully) written";
    if (!hash_[id].empty()) {
      ++hashed;
      if (!cache_.contains(id))
        return "prefix cache: block " + std::to_string(id) + " holds a hash the map lacks";
    }
  }
  if (used != num_used_) return "ref counts: the used-block count disagrees with the ref counts";
  if (filled != filled_) return "stats: the filled-slot count disagrees with the blocks' fills";
  if (hashed != cache_.num_blocks())
    return "prefix cache: the map holds blocks whose hash was cleared";
  for (const CopyPair& c : pending_)
    if (c.src <= 0 || c.dst <= 0 || c.src >= num_blocks_ || c.dst >= num_blocks_)
      return "pending copies: a copy names a block out of range";
  if (partial_) {
    if (const char* c = partial_->children.check(); *c) return std::string("partial index: ") + c;
    for (int32_t id = 1; id < num_blocks_; ++id)
      if (hash_[id].empty() != partial_->parent[id].empty() ||
          (!hash_[id].empty() && !partial_->children.contains(id)))
        return "partial index: block " + std::to_string(id) +
               " is indexed by parent but not cached, or the reverse";
  }
  return check_retention();
}

}  // namespace pagedkv
