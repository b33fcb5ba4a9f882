#include "step_plan_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "error.h"

namespace pagedkv {

namespace {

std::shared_ptr<PageTable> new_table(uint32_t rows, uint32_t stride) {
  auto t = std::make_shared<PageTable>();
  const size_t n = size_t(rows) * stride;
  t->kern.reset(new int32_t[n]());
  t->call.reset(new int32_t[n]());
  t->stride = stride;
  t->rows = rows;
  t->seq.assign(rows, SeqId{});
  t->version.assign(rows, 0);
  t->pages.assign(rows, 0);
  return t;
}

}  // namespace

std::shared_ptr<PageTable> persistent_page_table(std::shared_ptr<PageTable>& kept,
                                                 const SeqId* seqs, Sequence* const* live,
                                                 const uint32_t* pages, uint32_t num_seqs,
                                                 size_t* rewritten) {
  uint32_t max_pages = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) max_pages = std::max(max_pages, pages[i]);
  const uint64_t i32max = uint64_t(std::numeric_limits<int32_t>::max());
  std::shared_ptr<PageTable> t;
  if (kept && kept.use_count() == 1 && kept->stride >= max_pages && kept->rows >= num_seqs) {
    t = kept;
  } else {
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
    t = new_table(uint32_t(rows), uint32_t(stride));
    kept = t;
  }
  const size_t stride = t->stride;
  size_t n = 0;
  for (uint32_t i = 0; i < num_seqs; ++i) {
    const Sequence& s = *live[i];
    const uint32_t np = pages[i];
    if (t->seq[i] == seqs[i] && t->version[i] == s.table_version && t->pages[i] == np) continue;
    int32_t* k = t->kern.get() + i * stride;
    int32_t* c = t->call.get() + i * stride;
    // Only blocks appended since the row was written (a decode step's new
    // block): the rest of the row is still the table's prefix.
    const uint32_t from =
        t->seq[i] == seqs[i] && np >= t->pages[i] && s.table_extends(t->version[i]) ? t->pages[i]
                                                                                    : 0;
    std::memcpy(k + from, s.blocks.data() + from, (np - from) * sizeof(int32_t));
    std::memcpy(c + from, s.blocks.data() + from, (np - from) * sizeof(int32_t));
    if (t->pages[i] > np) {  // the row held more pages: back to the null block
      std::memset(k + np, 0, (t->pages[i] - np) * sizeof(int32_t));
      std::memset(c + np, 0, (t->pages[i] - np) * sizeof(int32_t));
    }
    t->seq[i] = seqs[i];
    t->version[i] = s.table_version;
    t->pages[i] = np;
    ++n;
  }
  *rewritten = n;
  return t;
}

}  // namespace pagedkv
