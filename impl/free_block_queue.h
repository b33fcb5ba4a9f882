// The free block queue (DESIGN.md §3): an intrusive doubly linked list over
// block ids with head/tail sentinels. Links live in two arrays indexed by
// block id, so every operation is O(1) and none allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pagedkv {

class FreeBlockQueue {
 public:
  static constexpr int32_t kNotQueued = -1;

  FreeBlockQueue() = default;
  // Queue over ids [0, num_blocks); initially holds first..num_blocks-1 in
  // id order (block 0, the null block, is never queued by the pool).
  explicit FreeBlockQueue(int32_t num_blocks, int32_t first = 1);

  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool contains(int32_t id) const { return prev_[id] != kNotQueued; }

  int32_t front() const { return next_[head()]; }  // head sentinel if empty
  int32_t back() const { return prev_[tail()]; }

  // Pops the head; the queue must not be empty.
  int32_t pop_front() {
    int32_t id = next_[head()];
    unlink(id);
    return id;
  }
  void push_front(int32_t id) { link_after(head(), id); }
  void push_back(int32_t id) { link_after(prev_[tail()], id); }
  // Removes id from anywhere in the queue; id must be queued.
  void remove(int32_t id) { unlink(id); }

  // Walks the queue; returns "" when links, sentinels and count agree,
  // otherwise a description of the first inconsistency.
  const char* check() const;

  // Iteration head -> tail, for tests and validation.
  template <class F>
  void for_each(F&& f) const {
    for (int32_t id = next_[head()]; id != tail(); id = next_[id]) f(id);
  }
  int32_t next_of(int32_t id) const { return next_[id]; }
  int32_t head() const { return num_blocks_; }
  int32_t tail() const { return num_blocks_ + 1; }

 private:
  void unlink(int32_t id) {
    int32_t p = prev_[id], n = next_[id];
    next_[p] = n;
    prev_[n] = p;
    prev_[id] = next_[id] = kNotQueued;
    --size_;
  }
  void link_after(int32_t p, int32_t id) {
    int32_t n = next_[p];
    prev_[id] = p;
    next_[id] = n;
    next_[p] = id;
    prev_[n] = id;
    ++size_;
  }

  int32_t num_blocks_ = 0;
  int32_t size_ = 0;
  std::vector<int32_t> prev_, next_;  // [num_blocks + 2]; sentinels at the end
};

}  // namespace pagedkv
