// Persistent page tables (pkv_batch_prepare_ex with
// PKV_PREPARE_PERSISTENT_TABLE): a plan's page table as padded rows of a
// fixed stride, kept by the pool across steps, so that a decode step
// rewrites only the rows whose block table changed (a sequence gains a
// block every block_size tokens) instead of the ~64k page ids of a
// 1024-sequence CSR table. Row i belongs to the plan's i-th sequence; page
// j of it is at i * stride + j; entries past a row's pages are 0 (the null
// block), so a row is also a valid CSR row of stride pages.
//
// A table is updated in place only when no live plan holds it; otherwise
// the next plan builds a new one, so a plan's arrays never change under it.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "sequence.h"

namespace pagedkv {

struct PageTable {
  uint32_t stride = 0;  // pages per row
  uint32_t rows = 0;    // row capacity
  // The kernels' copy and the callers' copy (plan_tensor), each
  // rows * stride, updated together.
  std::unique_ptr<int32_t[]> kern, call;
  // What each row holds: the sequence, its table version, and the pages
  // written (entries past them are 0).
  std::vector<SeqId> seq;
  std::vector<uint32_t> version;
  std::vector<uint32_t> pages;
};

// The table for a plan of num_seqs rows of up to max_pages pages: kept
// itself (to be updated in place) when no plan holds it and it is large
// enough, else a new one (which becomes kept). Throws kInvalidArgument when
// num_seqs * max_pages does not fit int32, or on allocation failure, before
// changing anything.
std::shared_ptr<PageTable> page_table_for(std::shared_ptr<PageTable>& kept, uint32_t max_pages,
                                          uint32_t num_seqs);

// Brings row i of t to sequence s (id) with np pages; returns whether it
// was rewritten (false: the row already holds it). t has room (page_table_for).
inline bool update_page_row(PageTable& t, uint32_t i, SeqId id, const Sequence& s,
                            uint32_t np) noexcept {
  if (t.seq[i] == id && t.version[i] == s.table_version && t.pages[i] == np) return false;
  const size_t stride = t.stride;
  int32_t* k = t.kern.get() + i * stride;
  int32_t* c = t.call.get() + i * stride;
  // Only blocks appended since the row was written (a decode step's new
  // block): the rest of the row is still the table's prefix.
  const uint32_t from =
      t.seq[i] == id && np >= t.pages[i] && s.table_extends(t.version[i]) ? t.pages[i] : 0;
  if (np - from == 1) {  // a decode step's new block: two stores, no calls
    k[from] = c[from] = s.blocks[from];
  } else {
    std::memcpy(k + from, s.blocks.data() + from, (np - from) * sizeof(int32_t));
    std::memcpy(c + from, s.blocks.data() + from, (np - from) * sizeof(int32_t));
  }
  if (t.pages[i] > np) {  // the row held more pages: back to the null block
    std::memset(k + np, 0, (t.pages[i] - np) * sizeof(int32_t));
    std::memset(c + np, 0, (t.pages[i] - np) * sizeof(int32_t));
  }
  t.seq[i] = id;
  t.version[i] = s.table_version;
  t.pages[i] = np;
  return true;
}

}  // namespace pagedkv
