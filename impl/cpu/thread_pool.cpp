#include "cpu/thread_pool.h"

#include <exception>
#include <string>
#include <utility>

#include "error.h"
#include "fork_epoch.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PKV_CPU_RELAX() _mm_pause()
#else
#define PKV_CPU_RELAX() ((void)0)
#endif

namespace pagedkv {
namespace {
// Set while a pool worker (or a submitting caller) runs items, so that a
// nested parallel_for runs inline instead of waiting on itself.
thread_local bool t_inside_job = false;
}  // namespace

// A pool made before the latest fork, in the child: its workers run in the
// parent only, so every job runs on the calling thread and destruction lets
// the workers' handles go instead of joining them (fork_epoch.h).
bool ThreadPool::forked() const noexcept { return forked_since(fork_epoch_); }

ThreadPool::ThreadPool(int32_t num_threads) {
  if (num_threads <= 0) {
    num_threads = static_cast<int32_t>(std::thread::hardware_concurrency());
    if (num_threads <= 0) num_threads = 1;
  }
  size_ = num_threads;
  fork_epoch_ = fork_epoch();
  threads_.reserve(size_ - 1);
  try {
    for (int32_t i = 1; i < size_; ++i) threads_.emplace_back([this, i] { worker_main(i); });
  } catch (const std::exception& e) {
    // The system refused a thread (address space, pids limit). The ones
    // started wait on this object: stop and join them before it goes (no
    // destructor runs for it, and a joinable std::thread would terminate).
    const size_t started = threads_.size();
    stop_workers();
    fail(Errc::kOutOfMemory, "cannot start CPU kernel thread " + std::to_string(started + 2) +
                                 " of " + std::to_string(size_) + " (num_threads): " + e.what());
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() noexcept {
  if (forked()) {  // the workers run in the parent only: nothing to stop here
    for (auto& t : threads_) t.detach();
    threads_.clear();
    abandon_in_child(work_cv_);
    abandon_in_child(done_cv_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    published_.store(~uint64_t(0), std::memory_order_release);
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::drain(Job* job, int32_t worker) {
  for (;;) {
    int64_t i = job->next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job->n) return;
    job->fn(job->ctx, i, worker);
  }
}

void ThreadPool::run(int64_t n, Fn fn, void* ctx) {
  if (n <= 0) return;
  if (size_ == 1 || n == 1 || t_inside_job || forked()) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i, 0);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mu_);
  Job job;
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    busy_ = size_ - 1;
    ++generation_;
    published_.store(generation_, std::memory_order_release);
  }
  work_cv_.notify_all();
  t_inside_job = true;
  drain(&job, 0);
  t_inside_job = false;
  // The job lives on this stack: wait until every worker has left it.
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
  job_ = nullptr;
}

void ThreadPool::worker_main(int32_t index) {
  t_inside_job = true;
  uint64_t seen = 0;
  for (;;) {
    // Decode steps submit many small jobs back to back; a short spin avoids
    // a sleep/wake round trip for each of them.
    for (int spin = 0; spin < 4000 && published_.load(std::memory_order_acquire) == seen; ++spin) {
      PKV_CPU_RELAX();
    }
    Job* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    drain(job, index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace pagedkv
