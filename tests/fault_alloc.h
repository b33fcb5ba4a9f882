// A global operator new that throws std::bad_alloc at the g_fail_at-th
// allocation counted from g_count = 0 (g_fail_at < 0: never), for the
// allocation-failure tests. It replaces the global one for everything linked
// into the executable: include it in exactly one source file of a test
// executable of its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace {

std::atomic<long> g_count{0}, g_fail_at{-1};

void* counted_alloc(size_t n, size_t align) {
  if (g_fail_at.load(std::memory_order_relaxed) >= 0 && ++g_count == g_fail_at.load())
    throw std::bad_alloc();
  if (n == 0) n = 1;
  void* p = align > alignof(std::max_align_t)
                ? std::aligned_alloc(align, (n + align - 1) / align * align)
                : std::malloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(size_t n) { return counted_alloc(n, 0); }
void* operator new[](size_t n) { return counted_alloc(n, 0); }
void* operator new(size_t n, std::align_val_t a) { return counted_alloc(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a) { return counted_alloc(n, size_t(a)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
