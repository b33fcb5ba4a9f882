// Forks of the process, for objects that own threads. A child of fork()
// has the parent's objects but none of their threads (Python's
// multiprocessing forks processes that hold pools): an object made before
// the latest fork must not wait for, join or signal its threads there.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <new>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace pagedkv {

inline std::atomic<uint64_t>& fork_count() {
  static std::atomic<uint64_t> n{0};
  return n;
}

// The number of forks so far (their child side); an object records it when
// it starts its threads and is in a forked child once it differs.
inline uint64_t fork_epoch() {
#if defined(__unix__) || defined(__APPLE__)
  static const int registered = pthread_atfork(
      nullptr, nullptr, [] { fork_count().fetch_add(1, std::memory_order_relaxed); });
  (void)registered;
#endif
  return fork_count().load(std::memory_order_relaxed);
}

inline bool forked_since(uint64_t epoch) {
  return fork_count().load(std::memory_order_relaxed) != epoch;
}

// In a forked child, for a condition variable the parent's threads wait on:
// they still count as its waiters there, and destroying it would wait for
// them to leave (forever). A fresh one takes its place unused (the old one
// ends without its destructor), so its owner's destructor destroys that.
inline void abandon_in_child(std::condition_variable& cv) noexcept {
  new (&cv) std::condition_variable;
}

}  // namespace pagedkv
