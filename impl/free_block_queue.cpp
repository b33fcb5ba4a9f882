#include "free_block_queue.h"

namespace pagedkv {

FreeBlockQueue::FreeBlockQueue(int32_t num_blocks, int32_t first, int32_t num_levels,
                               int32_t held_level)
    : num_blocks_(num_blocks),
      num_levels_(num_levels < 1 ? 1 : (num_levels > kMaxLevels ? kMaxLevels : num_levels)),
      held_level_(held_level < 0 || held_level > num_levels_ ? num_levels_ : held_level),
      prev_(size_t(num_blocks) + 2 * size_t(num_levels_), kNotQueued),
      next_(size_t(num_blocks) + 2 * size_t(num_levels_), kNotQueued) {
  if (num_levels_ > 1) {
    level_.assign(size_t(num_blocks), 0);
    count_.assign(size_t(num_levels_), 0);
    nonempty_[0] = nonempty_[1] = 0;
  }
  for (int32_t l = 0; l < num_levels_; ++l) {
    next_[head(l)] = tail(l);
    prev_[tail(l)] = head(l);
    prev_[head(l)] = next_[tail(l)] = kNotQueued;
  }
  for (int32_t id = first; id < num_blocks; ++id) push_back(id);
}

const char* FreeBlockQueue::check() const {
  int32_t count = 0, held = 0;
  for (int32_t l = 0; l < num_levels_; ++l) {
    if (prev_[head(l)] != kNotQueued || next_[tail(l)] != kNotQueued)
      return "free queue: a sentinel has an outer link";
    int32_t in_level = 0;
    int32_t prev = head(l);
    for (int32_t id = next_[head(l)]; id != tail(l); id = next_[id]) {
      if (id < 0 || id >= num_blocks_) return "free queue: a link points outside the block range";
      if (prev_[id] != prev)
        return "free queue: a block's prev link disagrees with its predecessor";
      if (++in_level > size_ + held_)
        return "free queue: more blocks linked than its count (or a cycle)";
      if (num_levels_ > 1 && level_[id] != l)
        return "free queue: a block is linked into a level other than its own";
      prev = id;
    }
    if (prev_[tail(l)] != prev) return "free queue: the tail sentinel's prev link is wrong";
    if (num_levels_ > 1 && in_level != count_[l])
      return "free queue: a level's count disagrees with its list";
    (l < held_level_ ? count : held) += in_level;
  }
  if (count != size_ || held != held_) return "free queue: fewer blocks linked than its count";
  int32_t queued = 0;
  for (int32_t id = 0; id < num_blocks_; ++id) queued += prev_[id] != kNotQueued;
  if (queued != size_ + held_) return "free queue: a block outside the list still has links";
  return "";
}

}  // namespace pagedkv
