// A fixed set of worker threads owned by the CPU backend. Kernels hand it
// independent work items; threads are created once, never per call.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace pagedkv {

class ThreadPool {
 public:
  // num_threads counts the calling thread; 0 = hardware concurrency.
  explicit ThreadPool(int32_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t size() const { return size_; }

  // Calls fn(i, worker) for every i in [0, n), items handed out dynamically;
  // worker in [0, size()) names the thread (for per-thread scratch). The
  // calling thread takes part and returns when all items are done. Callers
  // from several threads are served one job at a time; fn must not throw.
  template <class F>
  void parallel_for(int64_t n, F&& fn) {
    run(
        n, [](void* ctx, int64_t i, int32_t w) { (*static_cast<F*>(ctx))(i, w); }, &fn);
  }

 private:
  using Fn = void (*)(void* ctx, int64_t i, int32_t worker);
  struct Job {
    Fn fn;
    void* ctx;
    int64_t n;
    std::atomic<int64_t> next{0};
  };

  void run(int64_t n, Fn fn, void* ctx);
  void worker_main(int32_t index);
  void stop_workers() noexcept;  // stops and joins every started worker
  bool forked() const noexcept;  // this process was forked since the pool was made
  static void drain(Job* job, int32_t worker);

  int32_t size_;
  uint64_t fork_epoch_ = 0;  // forks of the process before this pool was made
  std::vector<std::thread> threads_;
  std::mutex submit_mu_;  // one job at a time
  std::mutex mu_;
  // Abandoned in a forked child (fork_epoch.h).
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, readable without mu_ for spinning
  int32_t busy_ = 0;                    // workers still inside the current job
  bool stop_ = false;
};

}  // namespace pagedkv
