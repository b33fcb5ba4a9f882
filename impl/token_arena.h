// Per-pool memory for the sequences' token ids (and their block hashes,
// which grow with them a block at a time).
//
// A decode step appends one token to each of ~1000 sequences, and each
// token vector from the general heap sits on 4 KiB pages of its own: a
// step touches more pages than the TLB maps, and under a hypervisor each
// miss is a two-level page walk (issue 16: about a quarter of a
// 1024-sequence step waited on the token tails). Here the vectors share
// regions advised as transparent huge pages, so a thousand tails need a
// handful of TLB entries.
//
// Size classes (four per doubling, 256 B to 256 KiB: at most a quarter
// more than asked) with a free list per class and region. A region whose
// chunks are all free again goes back to the system at once, so memory
// held for one mix of lengths is not kept for good when the mix changes;
// the pool's close gives back the rest. Smaller and larger vectors come
// from the heap (operator new, as std::allocator). Not thread safe: the
// pool's lock guards every use. Under ASan each array gets a 64-byte
// poisoned redzone after it and free memory is poisoned, so overflows and
// uses after free are reported as on the heap (LeakSanitizer, though, sees
// the regions, not the arrays in them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "huge_pages.h"

#if defined(__SANITIZE_ADDRESS__)
#define PKV_ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PKV_ARENA_ASAN 1
#endif
#endif

namespace pagedkv {

class TokenArena {
 public:
#if defined(PKV_ARENA_ASAN)
  static constexpr size_t kRedzone = 64;
#else
  static constexpr size_t kRedzone = 0;
#endif
  static constexpr size_t kMinBytes = 256;
  // 64k tokens: SeqTable::remove drops a longer sequence's vector, which
  // then goes back to the heap rather than into a free list here.
  static constexpr size_t kMaxBytes = size_t(256) << 10;
  static constexpr int kNumClasses = 1 + 4 * 10;  // 256 B, then (2^8, 2^18] in quarters

  TokenArena() = default;
  TokenArena(const TokenArena&) = delete;
  TokenArena& operator=(const TokenArena&) = delete;
  ~TokenArena() { release(); }

  // Whether an array of this many bytes comes from the arena (the same
  // answer for allocate and deallocate of one array).
  static bool holds(size_t bytes) { return bytes >= kMinBytes && bytes <= kMaxBytes - kRedzone; }
  // bytes must be holds(); throws std::bad_alloc.
  void* allocate(size_t bytes);
  // p from allocate(bytes) of this arena.
  void deallocate(void* p, size_t bytes) noexcept;
  // Gives every region back; no array from the arena may still be live.
  void release() noexcept;

  // Memory taken from the system and not given back, and its regions.
  size_t bytes_reserved() const { return reserved_; }
  size_t num_regions() const { return regions_.size(); }
  // The size class of an array of bytes (holds(bytes)), and its size.
  static int class_of(size_t bytes);
  static size_t class_bytes(int c);

 private:
  struct FreeChunk {
    FreeChunk* next;
  };
  struct Region {
    char* base;
    size_t bytes;
    size_t live = 0;  // chunks handed out and not yet returned
    FreeChunk* free[kNumClasses] = {};
    uint32_t num_free[kNumClasses] = {};
  };
  Region* region_of(const void* p) noexcept;
  void add_region(size_t at_least);
  void drop_region(Region* r) noexcept;
  void push_free(Region& r, int c, char* p) noexcept;

  // By base address; each on the heap so that Region* stay valid.
  std::vector<Region*> regions_;
  Region* bump_region_ = nullptr;  // where bump_ points; never dropped
  char* bump_ = nullptr;
  char* end_ = nullptr;
  uint32_t num_free_[kNumClasses] = {};  // over all regions
  size_t reserved_ = 0;
};

// std::vector's allocator over a pool's TokenArena. A default-constructed
// one (no arena) uses the heap, as std::allocator does.
template <class T>
struct ArenaAllocator {
  using value_type = T;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  using is_always_equal = std::false_type;

  TokenArena* arena = nullptr;

  ArenaAllocator() = default;
  explicit ArenaAllocator(TokenArena* a) : arena(a) {}
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>& o) : arena(o.arena) {}

  T* allocate(size_t n) {
    if (n > size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (arena != nullptr && TokenArena::holds(bytes))
      return static_cast<T*>(arena->allocate(bytes));
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (arena != nullptr && TokenArena::holds(bytes))
      arena->deallocate(p, bytes);
    else
      ::operator delete(p);
  }
  template <class U>
  bool operator==(const ArenaAllocator<U>& o) const {
    return arena == o.arena;
  }
  template <class U>
  bool operator!=(const ArenaAllocator<U>& o) const {
    return arena != o.arena;
  }
};

using TokenVector = std::vector<int32_t, ArenaAllocator<int32_t>>;

}  // namespace pagedkv
