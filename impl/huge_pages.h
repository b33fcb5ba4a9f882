// Memory for the pool's per-block arrays (ref counts, hashes, fill counts,
// the free queue's links, the prefix cache's table): a pool of 300k blocks
// spreads them over ~30 MB, and a decode step reaches them at random block
// ids. On 4 KiB pages nearly every such access is also a TLB miss, which a
// virtual machine's nested page walk makes several memory reads long
// (bench/README.md: a 1024-sequence decode step). Arrays of at least half a
// huge page are therefore 2 MiB aligned and advised to the kernel as
// transparent huge pages (granted where THP is "madvise" or "always";
// advisory only); smaller ones come from operator new as before.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <vector>

namespace pagedkv {

namespace huge_pages {
constexpr size_t kHugePage = size_t(2) << 20;
// Whether an array of this many bytes gets huge pages (then its memory is
// rounded up to whole huge pages, at most doubling an array of 1 MiB).
inline bool wants(size_t bytes) { return bytes >= kHugePage / 2; }
void* allocate(size_t bytes);  // throws std::bad_alloc
void deallocate(void* p, size_t bytes) noexcept;
// Asks the kernel to back the whole pages of [p, p + bytes) now, in one
// call, for memory about to be written in full: first touches of fresh
// pages one by one cost a fault each (~2 us under this project's VMs,
// against ~0.2 us a page populated at once). Advisory: where the kernel
// lacks MADV_POPULATE_WRITE (before Linux 5.14) nothing happens.
void populate(void* p, size_t bytes) noexcept;
}  // namespace huge_pages

template <class T>
struct HugePageAllocator {
  // operator new's alignment (2 MiB for large arrays, not for small ones):
  // no over-aligned elements.
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "over-aligned element type");
  using value_type = T;
  using is_always_equal = std::true_type;
  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > size_t(-1) / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(huge_pages::allocate(n * sizeof(T)));
  }
  // The size picks the path the memory took.
  void deallocate(T* p, size_t n) noexcept { huge_pages::deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept {
    return false;
  }
};

// A per-block array: one element per block of a pool, sized once.
template <class T>
using BlockArray = std::vector<T, HugePageAllocator<T>>;

}  // namespace pagedkv
