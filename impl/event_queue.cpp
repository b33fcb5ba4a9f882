#include "event_queue.h"

#include <algorithm>

namespace pagedkv {

void EventQueue::rebuild(size_t cap) {
  std::vector<Event> ring(cap);
  std::vector<int32_t> tokens(cap * block_size_);
  const size_t bs = block_size_;
  for (size_t i = 0; i < size_; ++i) {
    const size_t from = (head_ + i) % ring_.size();
    ring[i] = ring_[from];
    std::copy_n(tokens_.begin() + from * bs, bs, tokens.begin() + i * bs);
  }
  ring_.swap(ring);
  tokens_.swap(tokens);
  head_ = 0;
}

void EventQueue::grow_to(size_t want) {
  size_t cap = std::min<size_t>(capacity_, std::max<size_t>({64, ring_.size() * 2, want}));
  if (cap > ring_.size()) rebuild(cap);
}

void EventQueue::reserve(size_t n) {
  if (!enabled_ || size_ + n <= ring_.size() || ring_.size() >= capacity_) return;
  grow_to(size_ + n);
}

void EventQueue::push(Event e, const int32_t* tokens) noexcept {
  if (!enabled_) return;
  // Tier events (medium 1, 2) count in their own sequence, so the device
  // events that pkv_pool_drain_events returns stay gap-free unless some
  // were really dropped.
  e.seq_no = e.medium == 0 ? next_seq_no_++ : next_tier_seq_no_++;
  e.has_tokens = tokens && block_size_ > 0;
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
  size_t slot;
  if (size_ == ring_.size()) {  // full: drop the oldest
    if (size_ == 0) {
      ++dropped_;
      return;
    }
    slot = head_;
    head_ = (head_ + 1) % ring_.size();
    ++dropped_;
  } else {
    slot = (head_ + size_) % ring_.size();
    ++size_;
  }
  ring_[slot] = e;
  if (e.has_tokens) std::copy_n(tokens, block_size_, tokens_.begin() + slot * block_size_);
}

void EventQueue::shrink_to_fit() { rebuild(size_); }

size_t EventQueue::drain(Event* out, size_t max, int32_t* tokens) {
  size_t n = std::min(max, size_);
  const size_t bs = block_size_;
  for (size_t i = 0; i < n; ++i) {
    out[i] = ring_[head_];
    if (tokens && out[i].has_tokens) std::copy_n(tokens_.begin() + head_ * bs, bs, tokens + i * bs);
    head_ = (head_ + 1) % ring_.size();
  }
  size_ -= n;
  if (size_ == 0) head_ = 0;
  return n;
}

int EventQueue::drain_one(Event* out, int32_t* tokens, bool tokens_room) {
  if (size_ == 0) return 0;
  if (ring_[head_].has_tokens && !tokens_room) return -1;
  return drain(out, 1, tokens) == 1 ? 1 : 0;
}

}  // namespace pagedkv
