// The pool's mutex, counting the times it was taken. A decode step that
// finds the count one past where the last steady step (and its commit and
// destroy) left it knows that no other call ran in between, so every
// sequence of that step is exactly as the step left it
// (step_plan_steady.cpp, Pool::DecodeMemo). A count is cheaper and safer
// than marking each mutating call: a call added later cannot forget it.
#pragma once

#include <cstdint>
#include <mutex>

namespace pagedkv {

class OpMutex {
 public:
  void lock() {
    mu_.lock();
    ++ops_;
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    ++ops_;
    return true;
  }
  void unlock() { mu_.unlock(); }
  // Read by the holder only.
  uint64_t ops() const { return ops_; }

  // Holds the mutex without counting, for the pool's const calls
  // (seq_info, stats, block_table, ...): they change no sequence, so an
  // engine that reads its pool between two steps keeps the step's lane.
  class ConstGuard {
   public:
    explicit ConstGuard(OpMutex& m) : m_(m) { m_.mu_.lock(); }
    ~ConstGuard() { m_.mu_.unlock(); }
    ConstGuard(const ConstGuard&) = delete;
    ConstGuard& operator=(const ConstGuard&) = delete;

   private:
    OpMutex& m_;
  };

 private:
  std::mutex mu_;
  uint64_t ops_ = 0;
};

}  // namespace pagedkv
