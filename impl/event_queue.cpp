#include "event_queue.h"

#include <algorithm>

namespace pagedkv {

void EventQueue::grow_to(size_t want) {
  size_t cap = std::min<size_t>(capacity_, std::max<size_t>({64, ring_.size() * 2, want}));
  if (cap <= ring_.size()) return;
  std::vector<Event> grown(cap);
  for (size_t i = 0; i < size_; ++i) grown[i] = ring_[(head_ + i) % ring_.size()];
  ring_.swap(grown);
  head_ = 0;
}

void EventQueue::reserve(size_t n) {
  if (!enabled_ || size_ + n <= ring_.size() || ring_.size() >= capacity_) return;
  grow_to(size_ + n);
}

void EventQueue::push(Event e) noexcept {
  if (!enabled_) return;
  // Tier events (medium 1, 2) count in their own sequence, so the device
  // events that pkv_pool_drain_events returns stay gap-free unless some
  // were really dropped.
  e.seq_no = e.medium == 0 ? next_seq_no_++ : next_tier_seq_no_++;
  if (capacity_ == 0) {
    ++dropped_;
    return;
  }
  if (size_ == ring_.size() && size_ < capacity_) {
    try {
      grow_to(size_ + 1);
    } catch (...) {  // no memory: behave as a full ring (below)
    }
  }
  if (size_ == ring_.size()) {  // full: drop the oldest
    if (size_ == 0) {
      ++dropped_;
      return;
    }
    ring_[head_] = e;
    head_ = (head_ + 1) % ring_.size();
    ++dropped_;
    return;
  }
  ring_[(head_ + size_) % ring_.size()] = e;
  ++size_;
}

void EventQueue::shrink_to_fit() {
  std::vector<Event> exact(size_);
  for (size_t i = 0; i < size_; ++i) exact[i] = ring_[(head_ + i) % ring_.size()];
  ring_.swap(exact);
  head_ = 0;
}

size_t EventQueue::drain(Event* out, size_t max) {
  size_t n = std::min(max, size_);
  for (size_t i = 0; i < n; ++i) {
    out[i] = ring_[head_];
    head_ = (head_ + 1) % ring_.size();
  }
  size_ -= n;
  if (size_ == 0) head_ = 0;
  return n;
}

}  // namespace pagedkv
