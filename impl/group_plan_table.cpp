// group_page_table (group_plan_table.h).
#include "group_plan_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "error.h"

namespace pagedkv {

std::shared_ptr<GroupPageTable> group_page_table(std::shared_ptr<GroupPageTable>& kept,
                                                 const std::vector<GroupRow>& rows, bool headroom,
                                                 size_t* rewritten) {
  const uint32_t num = uint32_t(rows.size());
  uint32_t max_pages = 1;
  for (const GroupRow& r : rows) max_pages = std::max(max_pages, r.pages);
  const uint64_t i32max = uint64_t(std::numeric_limits<int32_t>::max());
  std::shared_ptr<GroupPageTable> t;
  if (kept && kept.use_count() == 1 && kept->stride >= max_pages && kept->rows >= num) {
    t = kept;
  } else {
    if (uint64_t(num) * max_pages > i32max)
      fail(Errc::kInvalidArgument, "the persistent page table of " + std::to_string(num) +
                                       " sequences of up to " + std::to_string(max_pages) +
                                       " pages would exceed 2^31 - 1 entries");
    // Headroom, so that decode steps rarely outgrow the table: a new table
    // rewrites every row once.
    uint64_t stride = headroom ? uint64_t(max_pages) + max_pages / 4 + 16 : max_pages;
    uint64_t nrows = uint64_t(num) + num / 8 + 16;
    if (kept) {
      stride = std::max<uint64_t>(stride, kept->stride);
      nrows = std::max<uint64_t>(nrows, kept->rows);
    }
    if (nrows * stride > i32max) nrows = num, stride = max_pages;
    auto fresh = std::make_shared<GroupPageTable>();
    fresh->ids.reset(new int32_t[size_t(nrows * stride)]());
    fresh->stride = uint32_t(stride);
    fresh->rows = uint32_t(nrows);
    fresh->seq.assign(nrows, SeqId{});
    fresh->version.assign(nrows, 0);
    fresh->pages.assign(nrows, 0);
    fresh->nulls.assign(nrows, 0);
    t = fresh;
    kept = t;
  }
  const size_t stride = t->stride;
  size_t n = 0;
  for (uint32_t i = 0; i < num; ++i) {
    const GroupRow& r = rows[i];
    const bool same = t->seq[i] == r.seq && t->version[i] == r.version;
    if (same && t->pages[i] == r.pages && t->nulls[i] == r.nulls) continue;
    int32_t* row = t->ids.get() + i * stride;
    if (same && r.pages >= t->pages[i] && r.nulls >= t->nulls[i]) {
      // Only appends and window releases since the row was written: the new
      // pages, and the leading entries released since (0 in the table).
      std::memcpy(row + t->pages[i], r.blocks + t->pages[i],
                  (r.pages - t->pages[i]) * sizeof(int32_t));
      const uint32_t end = std::min(r.nulls, t->pages[i]);
      if (end > t->nulls[i])
        std::memset(row + t->nulls[i], 0, (end - t->nulls[i]) * sizeof(int32_t));
    } else {
      std::memcpy(row, r.blocks, r.pages * sizeof(int32_t));
      if (t->pages[i] > r.pages)  // the row held more pages: back to the null block
        std::memset(row + r.pages, 0, (t->pages[i] - r.pages) * sizeof(int32_t));
    }
    t->seq[i] = r.seq;
    t->version[i] = r.version;
    t->pages[i] = r.pages;
    t->nulls[i] = r.nulls;
    ++n;
  }
  *rewritten = n;
  return t;
}

}  // namespace pagedkv
