#include "huge_pages.h"

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace pagedkv {
namespace huge_pages {

namespace {
size_t rounded(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
}  // namespace

void* allocate(size_t bytes) {
  if (!wants(bytes)) return ::operator new(bytes);
  if (bytes > size_t(-1) - kHugePage) throw std::bad_alloc();
  const size_t size = rounded(bytes);
  // Through operator new, so that tests replacing it (fault injection) see
  // these allocations too.
  void* p = ::operator new(size, std::align_val_t(kHugePage));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, size, MADV_HUGEPAGE);  // advisory: EINVAL where THP is off changes nothing
#endif
  return p;
}

void populate(void* p, size_t bytes) noexcept {
#if defined(__linux__)
#if !defined(MADV_POPULATE_WRITE)
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older headers lack it
#endif
  static const uintptr_t page = [] {  // 4, 16 or 64 KiB
    const long size = sysconf(_SC_PAGESIZE);
    return size > 0 ? uintptr_t(size) : uintptr_t(4096);
  }();
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

void deallocate(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (wants(bytes))
    ::operator delete(p, std::align_val_t(kHugePage));
  else
    ::operator delete(p);
}

}  // namespace huge_pages
}  // namespace pagedkv
