#include "huge_pages.h"

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
  // Through operator new, so that tests replacing it (fault injection) see
  // these allocations too.
  void* p = ::operator new(size, std::align_val_t(kHugePage));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, size, MADV_HUGEPAGE);  // advisory: EINVAL where THP is off changes nothing
#endif
  return p;
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
