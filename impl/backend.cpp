// Backend's host-memory defaults for the offload tiers (backend.h): plain
// page-aligned host memory, which the CPU backend's copies read and write
// directly. The CUDA backend overrides them with page-locked memory.
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "backend.h"

namespace pagedkv {

void* Backend::host_alloc_pinned(size_t bytes) {
  void* p = nullptr;
  // Page-aligned: whole blocks are copied in and out.
  if (posix_memalign(&p, 4096, bytes == 0 ? 1 : bytes) != 0)
    fail(Errc::kOutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  return p;
}

void Backend::host_free_pinned(void* p) noexcept { std::free(p); }

std::shared_ptr<void> Backend::hold(void* ptr, const std::shared_ptr<Backend>& self) {
  try {
    return std::shared_ptr<void>(ptr, [self](void* m) { self->deallocate(m); });
  } catch (const std::bad_alloc&) {  // the control block: shared_ptr called the deleter
    fail(Errc::kOutOfMemory, "out of host memory");
  }
}

}  // namespace pagedkv
