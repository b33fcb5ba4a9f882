// The free block queue (DESIGN.md §3): an intrusive doubly linked list over
// block ids with head/tail sentinels. Links live in two arrays indexed by
// block id, so every operation is O(1) and none allocates.
//
// Retention priorities (pool.h, pkv_seq_set_retention) split the queue into
// levels, one list per priority, each with its own sentinels in the same
// arrays: the queue's order is the levels' lists concatenated, lowest level
// first, so eviction takes the lowest priority first and LRU within it. A
// queue of one level (every pool without retention) is the plain list. The
// levels from held_level() on are kept, not popped: they are not counted in
// size() (pinned blocks, which allocation never takes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "huge_pages.h"

namespace pagedkv {

class FreeBlockQueue {
 public:
  static constexpr int32_t kNotQueued = -1;
  static constexpr int32_t kMaxLevels = 128;

  FreeBlockQueue() = default;
  // Queue over ids [0, num_blocks); initially holds first..num_blocks-1 in
  // id order at level 0 (block 0, the null block, is never queued by the
  // pool). held_level: levels >= it are kept (num_levels = none).
  explicit FreeBlockQueue(int32_t num_blocks, int32_t first = 1, int32_t num_levels = 1,
                          int32_t held_level = -1);

  // Blocks that pop_front may take (the held levels excluded).
  int32_t size() const { return size_; }
  // Every queued block, held ones included.
  int32_t size_all() const { return size_ + held_; }
  bool empty() const { return size_ == 0; }
  bool contains(int32_t id) const { return prev_[id] != kNotQueued; }
  int32_t num_levels() const { return num_levels_; }
  int32_t held_level() const { return held_level_; }
  int32_t level_of(int32_t id) const { return num_levels_ == 1 ? 0 : level_[id]; }
  int32_t level_size(int32_t level) const { return count_[level]; }

  int32_t front() const { return next_[head(lowest())]; }  // a head sentinel if empty
  int32_t back() const { return prev_[tail()]; }           // of level 0

  // Pops the head of the lowest non-empty level below the held ones; the
  // queue must not be empty.
  int32_t pop_front() {
    int32_t id = next_[head(num_levels_ == 1 ? 0 : lowest())];
    unlink(id);
    return id;
  }
  void push_front(int32_t id, int32_t level = 0) { link_after(head(level), id, level); }
  // While a FrontRun lives, the blocks pushed by push_front_run go to the
  // head of level 0 as one run in push order (the first pushed is popped
  // first), as vLLM's free_blocks prepends one free's uncached blocks;
  // otherwise push_front_run is push_front. Nothing but pushes may change
  // the queue while the run lives.
  class FrontRun {
   public:
    explicit FrontRun(FreeBlockQueue& q) noexcept : q_(q) { q_.run_end_ = q_.head(0); }
    ~FrontRun() { q_.run_end_ = kNotQueued; }
    FrontRun(const FrontRun&) = delete;
    FrontRun& operator=(const FrontRun&) = delete;

   private:
    FreeBlockQueue& q_;
  };
  void push_front_run(int32_t id) {
    if (run_end_ == kNotQueued) return push_front(id, 0);
    link_after(run_end_, id, 0);
    run_end_ = id;
  }
  void push_back(int32_t id, int32_t level = 0) { link_after(prev_[tail(level)], id, level); }
  // Removes id from anywhere in the queue; id must be queued.
  void remove(int32_t id) { unlink(id); }
  // Links id right after prev (a block of level, or the level's head).
  void insert_after(int32_t prev, int32_t id, int32_t level) { link_after(prev, id, level); }

  // Walks the queue; returns "" when links, sentinels and count agree,
  // otherwise a description of the first inconsistency.
  const char* check() const;

  // Iteration head -> tail, lowest level first (held levels included), for
  // tests and validation.
  template <class F>
  void for_each(F&& f) const {
    for (int32_t l = 0; l < num_levels_; ++l)
      for (int32_t id = next_[head(l)]; id != tail(l); id = next_[id]) f(id);
  }
  int32_t next_of(int32_t id) const { return next_[id]; }
  // Starts loading id's links (which unlinking it reads and its neighbours'
  // updates write).
  void prefetch_links(int32_t id) const {
    __builtin_prefetch(&prev_[id], 1);
    __builtin_prefetch(&next_[id], 1);
  }
  int32_t prev_of(int32_t id) const { return prev_[id]; }
  int32_t head(int32_t level = 0) const { return num_blocks_ + 2 * level; }
  int32_t tail(int32_t level = 0) const { return num_blocks_ + 2 * level + 1; }

 private:
  // The lowest non-empty level below the held ones (0 when all are empty).
  int32_t lowest() const {
    for (int w = 0; w < 2; ++w)
      if (nonempty_[w]) return 64 * w + __builtin_ctzll(nonempty_[w]);
    return 0;
  }
  void unlink(int32_t id) {
    int32_t p = prev_[id], n = next_[id];
    next_[p] = n;
    prev_[n] = p;
    prev_[id] = next_[id] = kNotQueued;
    if (num_levels_ == 1) {
      --size_;
      return;
    }
    const int32_t l = level_[id];
    if (--count_[l] == 0 && l < held_level_) nonempty_[l / 64] &= ~(uint64_t(1) << (l % 64));
    (l < held_level_ ? size_ : held_) -= 1;
  }
  void link_after(int32_t p, int32_t id, int32_t level) {
    int32_t n = next_[p];
    prev_[id] = p;
    next_[id] = n;
    next_[p] = id;
    prev_[n] = id;
    if (num_levels_ == 1) {
      ++size_;
      return;
    }
    level_[id] = uint8_t(level);
    if (count_[level]++ == 0 && level < held_level_)
      nonempty_[level / 64] |= uint64_t(1) << (level % 64);
    (level < held_level_ ? size_ : held_) += 1;
  }

  int32_t num_blocks_ = 0;
  int32_t run_end_ = kNotQueued;  // within a FrontRun: its last block (the head at first)
  int32_t num_levels_ = 1;
  int32_t held_level_ = 1;
  int32_t size_ = 0;
  int32_t held_ = 0;
  BlockArray<int32_t> prev_, next_;  // [num_blocks + 2 * levels]; sentinels at the end
  BlockArray<uint8_t> level_;        // per block, with several levels
  std::vector<int32_t> count_;       // per level
  uint64_t nonempty_[2] = {1, 0};    // levels below held_level_ holding blocks
};

}  // namespace pagedkv
