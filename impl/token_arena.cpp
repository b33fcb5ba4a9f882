#include "token_arena.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <new>

#if defined(PKV_ARENA_ASAN)
#include <sanitizer/asan_interface.h>
// Memory the arena holds but no vector owns is poisoned, and so is each
// chunk past its array (at least kRedzone bytes): ASan reports a use after
// free or an overflow into a neighbour as it does for the heap.
#define PKV_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define PKV_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define PKV_POISON(p, n) ((void)(p), (void)(n))
#define PKV_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace pagedkv {

namespace {
// The first region stays small and on ordinary pages (a pool with a few
// short sequences should not pin 2 MiB); later ones are huge pages, up to
// 32 MiB each.
constexpr size_t kFirstRegion = size_t(256) << 10;
constexpr size_t kMaxRegion = size_t(32) << 20;
// Chunks start on cache lines: a region is at least line aligned (huge ones
// on their huge page).
constexpr std::align_val_t kLine{64};
void* region_alloc(size_t bytes) {
  return huge_pages::wants(bytes) ? huge_pages::allocate(bytes) : ::operator new(bytes, kLine);
}
void region_free(void* p, size_t bytes) noexcept {
  if (huge_pages::wants(bytes))
    huge_pages::deallocate(p, bytes);
  else
    ::operator delete(p, kLine);
}
}  // namespace

int TokenArena::class_of(size_t bytes) {
  if (bytes <= kMinBytes) return 0;
  // 2^e < bytes <= 2^(e+1); quarters of 2^e above 2^e.
  const int e = 63 - __builtin_clzll(uint64_t(bytes - 1));
  const size_t quarter = size_t(1) << (e - 2);
  const size_t k = (bytes - (size_t(1) << e) + quarter - 1) / quarter;  // 1..4
  return (e - 8) * 4 + int(k);
}

size_t TokenArena::class_bytes(int c) {
  if (c == 0) return kMinBytes;
  const int e = 8 + (c - 1) / 4;
  return (size_t(1) << e) + size_t((c - 1) % 4 + 1) * (size_t(1) << (e - 2));
}

void TokenArena::release() noexcept {
  for (Region* r : regions_) {
    PKV_UNPOISON(r->base, r->bytes);
    region_free(r->base, r->bytes);
    delete r;
  }
  regions_.clear();
  std::fill(std::begin(num_free_), std::end(num_free_), 0u);
  bump_region_ = nullptr;
  bump_ = end_ = nullptr;
  reserved_ = 0;
}

TokenArena::Region* TokenArena::region_of(const void* p) noexcept {
  const char* c = static_cast<const char*>(p);
  auto it = std::upper_bound(regions_.begin(), regions_.end(), c,
                             [](const char* x, const Region* r) { return x < r->base; });
  return *(it - 1);  // p came from this arena: some region starts at or before it
}

void TokenArena::push_free(Region& r, int c, char* p) noexcept {
  auto* f = reinterpret_cast<FreeChunk*>(p);
  f->next = r.free[c];
  r.free[c] = f;
  ++r.num_free[c];
  ++num_free_[c];
  PKV_POISON(p, class_bytes(c));
}

void TokenArena::drop_region(Region* r) noexcept {
  for (int c = 0; c < kNumClasses; ++c) num_free_[c] -= r->num_free[c];
  PKV_UNPOISON(r->base, r->bytes);
  region_free(r->base, r->bytes);
  reserved_ -= r->bytes;
  regions_.erase(std::find(regions_.begin(), regions_.end(), r));
  delete r;
}

void TokenArena::add_region(size_t at_least) {
  // As much again as the arena holds (whole huge pages, at most
  // kMaxRegion): geometric growth, and smaller regions again once emptied
  // ones went back.
  constexpr size_t kHuge = huge_pages::kHugePage;
  size_t bytes = reserved_ == 0 ? kFirstRegion
                                : (std::min(kMaxRegion, std::max(kHuge, reserved_)) + kHuge - 1) /
                                      kHuge * kHuge;
  bytes = std::max(bytes, at_least);
  // Everything that can throw first: a failure changes nothing.
  regions_.reserve(regions_.size() + 1);
  std::unique_ptr<Region> r(new Region);
  r->base = static_cast<char*>(region_alloc(bytes));
  r->bytes = bytes;
  PKV_POISON(r->base, bytes);
  Region* const old = bump_region_;
  if (old != nullptr) {
    // What is left of the last region goes to its free lists, largest
    // classes first (class sizes and the rest are multiples of 64).
    for (int c = kNumClasses - 1; c >= 0 && bump_ != end_; --c) {
      const size_t n = class_bytes(c);
      for (; size_t(end_ - bump_) >= n; bump_ += n) {
        PKV_UNPOISON(bump_, n);
        push_free(*old, c, bump_);
      }
    }
  }
  Region* const added = r.release();
  regions_.insert(
      std::upper_bound(regions_.begin(), regions_.end(), added,
                       [](const Region* a, const Region* b) { return a->base < b->base; }),
      added);
  reserved_ += bytes;
  bump_region_ = added;
  bump_ = added->base;
  end_ = added->base + bytes;
  if (old != nullptr && old->live == 0) drop_region(old);
}

void* TokenArena::allocate(size_t bytes) {
  const int c = class_of(bytes + kRedzone);
  const size_t n = class_bytes(c);
  if (num_free_[c] != 0) {
    // The bump region first, then the lowest region with one: new arrays
    // gather where the live ones are, and the others can empty.
    Region* r =
        bump_region_ != nullptr && bump_region_->free[c] != nullptr ? bump_region_ : nullptr;
    for (size_t i = 0; r == nullptr; ++i)
      if (regions_[i]->free[c] != nullptr) r = regions_[i];
    FreeChunk* f = r->free[c];
    PKV_UNPOISON(f, bytes);
    r->free[c] = f->next;
    --r->num_free[c];
    --num_free_[c];
    ++r->live;
    return f;
  }
  if (size_t(end_ - bump_) < n) add_region(n);
  char* p = bump_;
  bump_ += n;
  ++bump_region_->live;
  PKV_UNPOISON(p, bytes);
  return p;
}

void TokenArena::deallocate(void* p, size_t bytes) noexcept {
  if (p == nullptr) return;
  Region* r = region_of(p);
  push_free(*r, class_of(bytes + kRedzone), static_cast<char*>(p));
  if (--r->live == 0 && r != bump_region_) drop_region(r);
}

}  // namespace pagedkv
