// A stateless standard allocator over a memory source: a type with static
// allocate(bytes) (throws std::bad_alloc) and deallocate(p, bytes). The
// sized deallocate tells the source which of its paths the memory took.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>

namespace pagedkv {

template <class T, class Source>
struct SourceAllocator {
  // Sources give operator new's alignment (huge_pages: 2 MiB for large
  // arrays, but not for small ones): no over-aligned elements.
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "over-aligned element type");
  using value_type = T;
  using is_always_equal = std::true_type;
  template <class U>
  struct rebind {
    using other = SourceAllocator<U, Source>;
  };
  SourceAllocator() noexcept = default;
  template <class U>
  SourceAllocator(const SourceAllocator<U, Source>&) noexcept {}
  T* allocate(size_t n) {
    if (n > size_t(-1) / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(Source::allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept { Source::deallocate(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const SourceAllocator<U, Source>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const SourceAllocator<U, Source>&) const noexcept {
    return false;
  }
};

}  // namespace pagedkv
