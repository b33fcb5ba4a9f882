// KV cache events (DESIGN.md §3): a bounded FIFO the caller drains. When it
// is full the oldest event is dropped and counted; sequence numbers keep
// counting, so a consumer sees the gap.
#pragma once

#include <cstdint>
#include <vector>

#include "hash/block_hash.h"

namespace pagedkv {

// PKV_EVENT_*; kPriority carries the new retention priority in num_tokens.
enum class EventType : uint32_t { kStored = 1, kRemoved = 2, kAllCleared = 3, kPriority = 4 };

struct Event {
  uint64_t seq_no = 0;
  EventType type = EventType::kStored;
  int32_t block_id = -1;
  BlockHash block_hash;
  BlockHash parent_hash;  // empty = no parent (first block)
  uint32_t num_tokens = 0;
  uint64_t lora_id = 0;
  uint32_t medium = 0;  // 0 device, 1 host tier, 2 file tier
};

class EventQueue {
 public:
  EventQueue() = default;
  EventQueue(bool enabled, uint32_t capacity) : enabled_(enabled), capacity_(capacity) {}

  bool enabled() const { return enabled_; }
  // Grows the ring so that n more pushes store without allocating. Called
  // before an operation mutates anything (it may throw std::bad_alloc);
  // the pushes of its commit phase then cannot fail.
  void reserve(size_t n);
  // Never throws: if the ring cannot grow, the oldest event is dropped and
  // counted, as when the ring is at max_events.
  void push(Event e) noexcept;
  // Moves up to max oldest events into out; returns how many.
  size_t drain(Event* out, size_t max);
  size_t size() const { return size_; }
  // Shrinks the ring to the events it holds, so the next push must grow
  // it (tests of allocation failure).
  void shrink_to_fit();
  uint64_t dropped() const { return dropped_; }

 private:
  void grow_to(size_t want);  // ring of at least min(want, capacity_) slots

  bool enabled_ = false;
  uint32_t capacity_ = 0;
  uint64_t next_seq_no_ = 1;
  uint64_t next_tier_seq_no_ = 1;  // offload tiers' events (medium != 0)
  uint64_t dropped_ = 0;
  // Ring buffer grown by doubling up to capacity_, so an idle pool with
  // events enabled costs nothing.
  std::vector<Event> ring_;
  size_t head_ = 0, size_ = 0;
};

}  // namespace pagedkv
