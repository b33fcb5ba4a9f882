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
#include <utility>
#include <vector>

#include "sequence.h"

namespace pagedkv {

// Slots [lo, hi) of a block that a step writes (Batch::commit).
struct WrittenRange {
  int32_t block;
  uint32_t lo, hi;
};

// The slots a plan's queries write, one range per (sequence, block): seq is
// the sequence's index in the plan, index the block's in its table.
struct QueryRange {
  uint32_t seq;
  uint32_t index;
  WrittenRange r;
};

struct PlanHost {
  std::unique_ptr<int64_t[]> data;  // not zeroed: prepare writes every element read
  size_t words = 0;                 // capacity in int64
  // The plan's sequences and what the page rows were built from (the
  // next plan's memo, see fill_page_rows).
  std::vector<SeqId> seqs;
  std::vector<uint32_t> table_versions;
  size_t page_indptr_off = 0, page_indices_off = 0;  // byte offsets (kernel copy)
  // The plan's own state per sequence (Batch), kept here so that a
  // steady-state plan allocates nothing: each freed vector of a
  // 1024-sequence plan would otherwise be returned to the heap's top, and
  // the next plan's pages faulted in again.
  std::vector<Sequence*> live;     // as resolved at prepare (commit reuses them, see Batch)
  std::vector<uint32_t> versions;  // Sequence::version at prepare
  std::vector<uint32_t> epochs;    // Sequence::writes_epoch at prepare
  std::vector<uint32_t> pages;     // page count of each sequence
  std::vector<uint64_t> ends;      // token count at prepare
  std::vector<QueryRange> ranges;
  // prepare: sequences whose context may be unwritten; the decode commit
  // (commit_decode_locked): sequences whose computed count may still move
  std::vector<uint32_t> unsure;
  // The steady decode path (step_plan_steady.cpp): sequences that open or
  // fill a block, and their hash count before the step.
  std::vector<std::pair<uint32_t, uint32_t>> special;
  // A lane step's sequences that enter or fill a block or need room (read
  // in full after the lane pass).
  std::vector<uint32_t> slow;
  // commit: the ranges still valid, in blocks possibly shared / held alone
  std::vector<WrittenRange> written, exclusive;
};

// The pool's spare plan memory (taken), or a new one; its data is sized
// later (reserve_plan_words). May throw (allocation).
std::shared_ptr<PlanHost> take_plan_host(std::shared_ptr<PlanHost>& spare);

// Room for at least `words` int64 in h.data (contents not kept). May throw
// (allocation) before changing h.
void reserve_plan_words(PlanHost& h, size_t words);

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
