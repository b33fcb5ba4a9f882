// Memory for the sequences' token ids, block tables and block hashes.
//
// A decode step writes the tail of every running sequence's token vector
// and reads its block table: 1024 sequences are ~2,000 small buffers spread
// over the process heap, each on its own 4 KiB page, so nearly every append
// is also a TLB miss (a nested page walk on a virtual machine). Here those
// buffers come from 2 MiB slabs advised as transparent huge pages, in
// power-of-two size classes (64 B to 256 KiB) with a free list each: the
// buffers of 1024 sequences then lie on a handful of pages
// (bench/README.md: the decode step with and without it).
//
// The heap is the process's, shared by every pool and guarded by a mutex
// (buffers are only allocated when a sequence's vectors grow, which a
// reserved sequence never does). A freed buffer goes back to its class's
// free list, not to the system: the heap keeps the most its sequences ever
// held at once (bounded by their sizes: a buffer over 256 KiB, which
// SeqTable::remove drops, is allocated and returned on its own).
// PAGEDKV_SEQ_HEAP=0 in the environment (read once) turns it off (operator
// new for every buffer); builds with AddressSanitizer never use it, so
// that ASan sees every buffer.
#pragma once

#include <cstddef>
#include <vector>

#include "source_allocator.h"

namespace pagedkv {

namespace seq_heap {
// Buffers of up to 256 KiB are 64-byte aligned (on or off).
void* allocate(size_t bytes);  // throws std::bad_alloc
void deallocate(void* p, size_t bytes) noexcept;
// What the heap holds now, for tests: bytes of slabs taken from the system,
// and bytes of buffers handed out and not yet returned.
struct Usage {
  size_t slab_bytes = 0, live_bytes = 0;
};
Usage usage();
bool enabled();
}  // namespace seq_heap

struct SeqHeapSource {
  static void* allocate(size_t bytes) { return seq_heap::allocate(bytes); }
  static void deallocate(void* p, size_t bytes) noexcept { seq_heap::deallocate(p, bytes); }
};
template <class T>
using SeqAllocator = SourceAllocator<T, SeqHeapSource>;

// A sequence's vector (tokens, block table, hashes).
template <class T>
using SeqVec = std::vector<T, SeqAllocator<T>>;

}  // namespace pagedkv
