#include "step_plan_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "error.h"
#include "huge_pages.h"

namespace pagedkv {

namespace {

std::shared_ptr<PageTable> new_table(uint32_t rows, uint32_t stride) {
  auto t = std::make_shared<PageTable>();
  const size_t n = size_t(rows) * stride;
  // Every entry is written now (zeros, then each row): the pages are
  // populated at once rather than faulted in one by one (huge_pages.h).
  for (std::unique_ptr<int32_t[]>* a : {&t->kern, &t->call}) {
    a->reset(new int32_t[n]);
    huge_pages::populate(a->get(), n * sizeof(int32_t));
    std::memset(a->get(), 0, n * sizeof(int32_t));
  }
  t->stride = stride;
  t->rows = rows;
  t->seq.assign(rows, SeqId{});
  t->version.assign(rows, 0);
  t->pages.assign(rows, 0);
  return t;
}

}  // namespace

std::shared_ptr<PageTable> page_table_for(std::shared_ptr<PageTable>& kept, uint32_t max_pages,
                                          uint32_t num_seqs) {
  if (kept && kept.use_count() == 1 && kept->stride >= max_pages && kept->rows >= num_seqs)
    return kept;
  const uint64_t i32max = uint64_t(std::numeric_limits<int32_t>::max());
  // Headroom, so that decode steps rarely outgrow the table: a new table
  // rewrites every row once.
  uint64_t stride = uint64_t(max_pages) + max_pages / 4 + 16;
  uint64_t rows = uint64_t(num_seqs) + num_seqs / 8 + 16;
  if (kept) {
    stride = std::max<uint64_t>(stride, kept->stride);
    rows = std::max<uint64_t>(rows, kept->rows);
  }
  if (uint64_t(num_seqs) * max_pages > i32max)
    fail(Errc::kInvalidArgument, "the persistent page table of " + std::to_string(num_seqs) +
                                     " sequences of up to " + std::to_string(max_pages) +
                                     " pages would exceed 2^31 - 1 entries");
  // No headroom rather than entries the plan's int32 offsets cannot reach.
  if (rows * stride > i32max) rows = num_seqs, stride = max_pages;
  std::shared_ptr<PageTable> t = new_table(uint32_t(rows), uint32_t(stride));
  kept = t;
  return t;
}

}  // namespace pagedkv
