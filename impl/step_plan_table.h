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

// The table for a plan over seqs (live[i] their sequences, pages[i] the
// pages of each): kept itself, updated in place, when no plan holds it and
// it is large enough, else a new one (which becomes kept). Sets *rewritten
// to the rows written. Throws kInvalidArgument when num_seqs * stride does
// not fit int32, or on allocation failure, before changing anything.
std::shared_ptr<PageTable> persistent_page_table(std::shared_ptr<PageTable>& kept,
                                                 const SeqId* seqs, Sequence* const* live,
                                                 const uint32_t* pages, uint32_t num_seqs,
                                                 size_t* rewritten);

}  // namespace pagedkv
