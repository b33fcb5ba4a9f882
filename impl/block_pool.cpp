#include "block_pool.h"

#include <algorithm>

namespace pagedkv {

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching, EventQueue* events)
    : num_blocks_(num_blocks),
      caching_(enable_caching),
      ref_(num_blocks, 0),
      hash_(num_blocks),
      lora_(num_blocks, 0),
      fill_(num_blocks, 0),
      written_(num_blocks, 0),
      queue_(num_blocks, 1),
      cache_(&hash_, num_blocks),
      events_(events) {}

int32_t BlockPool::lookup_written(const BlockHash& h) const {
  if (!caching_) return -1;
  for (int32_t b = cache_.find(h); b >= 0; b = cache_.next_duplicate(b))
    if (fully_written(b)) return b;
  return -1;
}

void BlockPool::evict(int32_t id) noexcept {
  uncache_block(id);
  ++num_evictions_;
}

void BlockPool::cache_block(int32_t id, const BlockHash& h, const BlockHash* parent,
                            uint32_t num_tokens, uint64_t lora_id) noexcept {
  if (!caching_ || id == kNullBlock || !hash_[id].empty()) return;
  hash_[id] = h;
  lora_[id] = lora_id;
  cache_.insert(id);
  if (events_ && events_->enabled()) {
    Event e;
    e.type = EventType::kStored;
    e.block_id = id;
    e.block_hash = h;
    if (parent) e.parent_hash = *parent;
    e.num_tokens = num_tokens;
    e.lora_id = lora_id;
    events_->push(e);
  }
}

void BlockPool::uncache_block(int32_t id) noexcept {
  if (hash_[id].empty()) return;
  cache_.erase(id);
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
}

void BlockPool::reset_cache() noexcept {
  cache_.clear();
  for (auto& h : hash_) h = BlockHash{};
  std::fill(lora_.begin(), lora_.end(), 0);
  if (events_ && events_->enabled()) {
    Event e;
    e.type = EventType::kAllCleared;
    events_->push(e);
  }
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
    if (ref_[id] > 0) ++used, filled += fill_[id];
    if (ref_[id] > 0 && queue_.contains(id))
      return "free queue: block " + std::to_string(id) + " is referenced and free";
    if (ref_[id] == 0 && !queue_.contains(id))
      return "free queue: block " + std::to_string(id) + " is unreferenced but not free";
    if (block_size_ && written_[id] > block_size_)
      return "written state: block " + std::to_string(id) + " has " + std::to_string(written_[id]) +
             " written slots, more than a block holds";
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
  return "";
}

}  // namespace pagedkv
