// Incremental step plans: the host memory of a plan, recycled between
// plans, and the page-table rows a plan copies from the previous one
// instead of reading them from the sequences again.
//
// A decode step changes few block tables (a sequence gains a block every
// block_size tokens), but a 1024-sequence plan holds ~64k page ids. The
// pool keeps its last plan's memory (PlanHost) and, per sequence, the table
// version it was built from; the next plan copies the rows of sequences at
// the same index whose table version and page count did not change (in
// contiguous runs), and reads the others from their tables. Plan memory
// comes back to the pool when a plan is destroyed, so steady-state plans
// allocate nothing and touch no fresh pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "sequence.h"

namespace pagedkv {

struct PlanHost {
  std::unique_ptr<int64_t[]> data;  // not zeroed: prepare writes every element read
  size_t words = 0;                 // capacity in int64
  // What the page rows were built from, for the next plan.
  std::vector<SeqId> seqs;
  std::vector<uint32_t> table_versions;
  size_t page_indptr_off = 0, page_indices_off = 0;  // byte offsets (kernel copy)
};

// A buffer of at least `words` int64: the pool's spare one if large enough
// (taken), else a new one. May throw (allocation).
std::shared_ptr<PlanHost> take_plan_host(std::shared_ptr<PlanHost>& spare, size_t words);

// Writes the page ids of seqs[i] at pidx[pptr[i]] for every i (pptr filled):
// copied from prev for sequences at the same index with the same table
// version and page count, read from live[i]->blocks otherwise. Records the
// ids and versions in now. Returns how many rows were copied. No throw once
// now's vectors are sized (num_seqs).
size_t fill_page_rows(const PlanHost* prev, PlanHost& now, const SeqId* seqs, Sequence* const* live,
                      const int32_t* pptr, int32_t* pidx, uint32_t num_seqs) noexcept;

// now becomes the pool's last plan; the previous one's memory becomes the
// spare when no plan holds it any more.
void remember_plan(std::shared_ptr<PlanHost>& last, std::shared_ptr<PlanHost>& spare,
                   std::shared_ptr<PlanHost> now) noexcept;

// A destroyed plan's memory: the spare if nobody else holds it.
void recycle_plan_host(std::shared_ptr<PlanHost>& spare, std::shared_ptr<PlanHost> host) noexcept;

}  // namespace pagedkv
