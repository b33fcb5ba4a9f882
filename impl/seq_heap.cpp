#include "seq_heap.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__unix__)
#include <pthread.h>
#endif

#include "huge_pages.h"

#if defined(__SANITIZE_ADDRESS__)
#define PKV_SEQ_HEAP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PKV_SEQ_HEAP_ASAN 1
#endif
#endif

namespace pagedkv {
namespace seq_heap {

namespace {

constexpr size_t kMinShift = 6;  // 64 B: a cache line, and room for the free-list link
constexpr size_t kClasses = 13;  // up to 256 KiB
constexpr size_t kMaxBytes = size_t(1) << (kMinShift + kClasses - 1);
constexpr size_t kSlab = huge_pages::kHugePage;
constexpr size_t kAlign = size_t(1) << kMinShift;  // every class's buffers, either way

size_t class_of(size_t bytes) {
  size_t c = 0;
  while ((size_t(1) << (kMinShift + c)) < bytes) ++c;
  return c;
}

struct FreeBuffer {
  FreeBuffer* next;
};

class Heap {
 public:
  void* take(size_t bytes) {
    const size_t c = class_of(bytes), size = size_t(1) << (kMinShift + c);
    std::lock_guard<std::mutex> lock(mu_);
    void* p;
    if (FreeBuffer* f = free_[c]) {
      free_[c] = f->next;
      p = f;
    } else {
      if (size_t(end_ - cur_) < size) new_slab();  // may throw: nothing changed yet
      p = cur_;
      cur_ += size;
    }
    live_ += size;
    return p;
  }
  void give(void* p, size_t bytes) noexcept {
    const size_t c = class_of(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    push(p, c);
    live_ -= size_t(1) << (kMinShift + c);
  }
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }
  Usage usage() {
    std::lock_guard<std::mutex> lock(mu_);
    return {slabs_ * kSlab, live_};
  }

 private:
  void push(void* p, size_t c) noexcept {
    FreeBuffer* f = static_cast<FreeBuffer*>(p);
    f->next = free_[c];
    free_[c] = f;
  }
  void new_slab() {
    char* s = static_cast<char*>(huge_pages::allocate(kSlab));
    // The old slab's rest (a multiple of 64 B) goes to the free lists in
    // power-of-two pieces, largest first: nothing is wasted.
    while (end_ - cur_ >= ptrdiff_t(size_t(1) << kMinShift)) {
      size_t c = kClasses - 1;
      while ((size_t(1) << (kMinShift + c)) > size_t(end_ - cur_)) --c;
      push(cur_, c);
      cur_ += size_t(1) << (kMinShift + c);
    }
    cur_ = s;
    end_ = s + kSlab;
    ++slabs_;
  }

  std::mutex mu_;
  FreeBuffer* free_[kClasses] = {};
  char* cur_ = nullptr;
  char* end_ = nullptr;
  size_t slabs_ = 0, live_ = 0;
};

// Never destroyed: a pool destroyed during static destruction (a user's
// global) still returns its buffers here. Held across fork() (as malloc's
// locks are), so that a child forked while another thread allocated finds
// the heap whole and unlocked.
Heap& heap() {
  static Heap* h = [] {
    Heap* x = new Heap;
#if defined(__unix__)
    pthread_atfork([] { heap().lock(); }, [] { heap().unlock(); }, [] { heap().unlock(); });
#endif
    return x;
  }();
  return *h;
}

bool read_enabled() {
#ifdef PKV_SEQ_HEAP_ASAN
  return false;
#else
  const char* env = std::getenv("PAGEDKV_SEQ_HEAP");
  return env == nullptr || std::strcmp(env, "0") != 0;
#endif
}

}  // namespace

bool enabled() {
  static const bool on = read_enabled();
  return on;
}

void* allocate(size_t bytes) {
  if (bytes > kMaxBytes) return huge_pages::allocate(bytes);
  if (!enabled()) return ::operator new(bytes, std::align_val_t(kAlign));
  return heap().take(bytes == 0 ? 1 : bytes);
}

void deallocate(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes > kMaxBytes)
    huge_pages::deallocate(p, bytes);
  else if (!enabled())
    ::operator delete(p, std::align_val_t(kAlign));
  else
    heap().give(p, bytes == 0 ? 1 : bytes);
}

Usage usage() { return enabled() ? heap().usage() : Usage{}; }

}  // namespace seq_heap
}  // namespace pagedkv
