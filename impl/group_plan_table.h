// Persistent page tables of multi-group step plans (pkv_batch_prepare_ex
// with PKV_PREPARE_PERSISTENT_TABLE on a pool from pkv_pool_create_groups):
// per group, the plan's page table as padded rows of a fixed stride, kept
// by the pool across steps, as step_plan_table.h does for single-group
// pools. Its own code because a group's table is a plain vector per
// sequence (GroupPool::Seq), not a Sequence with its version history.
//
// Row i belongs to the plan's i-th sequence; page j of it is at
// i * stride + j; entries past a row's pages are 0 (the null block), as are
// the pages a sliding window released. A recurrent group's row is its one
// live state slot. A row is rewritten only from the first entry that can
// have changed: nothing when the sequence, its table version and page count
// are those the row was written with; the new pages and newly released
// leading entries when only appends and window releases happened since;
// the whole row otherwise (another sequence, a copy-on-write or state move,
// a truncate, a hit).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "sequence.h"

namespace pagedkv {

struct GroupPageTable {
  uint32_t stride = 0;             // pages per row
  uint32_t rows = 0;               // row capacity
  std::unique_ptr<int32_t[]> ids;  // rows * stride
  // What each row holds: the sequence, its table version, the pages and
  // the leading released (null) entries written.
  std::vector<SeqId> seq;
  std::vector<uint32_t> version, pages, nulls;
};

// One row of a plan: the sequence's table of the group (pages entries
// read), its leading released entries and its table version.
struct GroupRow {
  SeqId seq;
  const int32_t* blocks;
  uint32_t pages, nulls, version;
};

// The table for a plan: `kept` itself, updated in place, when no plan holds
// it and it is large enough; else a new one (which becomes kept). headroom:
// spare pages and rows in a new table (not for recurrent groups, whose rows
// are one page). Sets *rewritten to the rows written. Throws
// kInvalidArgument when rows * stride does not fit int32, or on allocation
// failure, before changing anything.
std::shared_ptr<GroupPageTable> group_page_table(std::shared_ptr<GroupPageTable>& kept,
                                                 const std::vector<GroupRow>& rows, bool headroom,
                                                 size_t* rewritten);

}  // namespace pagedkv
