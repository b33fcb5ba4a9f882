#include "huge_pages.h"

#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
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
  void* p = std::aligned_alloc(kHugePage, size);  // a size multiple of the alignment
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, size, MADV_HUGEPAGE);  // advisory: EINVAL where THP is off changes nothing
#endif
  return p;
}

void deallocate(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  if (wants(bytes))
    std::free(p);
  else
    ::operator delete(p);
}

}  // namespace huge_pages
}  // namespace pagedkv
