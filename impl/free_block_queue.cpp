#include "free_block_queue.h"

namespace pagedkv {

FreeBlockQueue::FreeBlockQueue(int32_t num_blocks, int32_t first)
    : num_blocks_(num_blocks),
      prev_(size_t(num_blocks) + 2, kNotQueued),
      next_(size_t(num_blocks) + 2, kNotQueued) {
  next_[head()] = tail();
  prev_[tail()] = head();
  prev_[head()] = next_[tail()] = kNotQueued;
  for (int32_t id = first; id < num_blocks; ++id) push_back(id);
}

const char* FreeBlockQueue::check() const {
  if (prev_[head()] != kNotQueued || next_[tail()] != kNotQueued)
    return "free queue: a sentinel has an outer link";
  int32_t count = 0;
  int32_t prev = head();
  for (int32_t id = next_[head()]; id != tail(); id = next_[id]) {
    if (id < 0 || id >= num_blocks_) return "free queue: a link points outside the block range";
    if (prev_[id] != prev) return "free queue: a block's prev link disagrees with its predecessor";
    if (++count > size_) return "free queue: more blocks linked than its count (or a cycle)";
    prev = id;
  }
  if (prev_[tail()] != prev) return "free queue: the tail sentinel's prev link is wrong";
  if (count != size_) return "free queue: fewer blocks linked than its count";
  int32_t queued = 0;
  for (int32_t id = 0; id < num_blocks_; ++id) queued += prev_[id] != kNotQueued;
  if (queued != size_) return "free queue: a block outside the list still has links";
  return "";
}

}  // namespace pagedkv
