// Pass 1 of a decode-lane step (step_plan_steady.cpp): each sequence's end
// and page count from the lane alone, and the few sequences the step must
// read in full. Vectorised where the CPU has AVX2 (lane_scan_avx2.cpp),
// since a lane step otherwise spends ~23 instructions per sequence here.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kv_pool.h"

namespace pagedkv {

struct LaneScan {
  uint64_t pages = 0, max_ctx = 0;
  uint32_t max_pages = 0;
  uint32_t slow = 0;  // entries of slow[]; past n: a sequence at kMaxSeqTokens
};

// For tails[0, n) (block size 2^shift): ends[i] = n + 1, page_counts[i] =
// the pages of that end; slow[] = in order, the indices that enter a
// block (slot 0), fill one (its last slot) or have no room for the token.
LaneScan scan_lane(const DecodeTail* tails, uint32_t n, int shift, uint64_t* ends,
                   uint32_t* page_counts, uint32_t* slow);
// The same, one sequence at a time (tests hold the two together).
LaneScan scan_lane_scalar(const DecodeTail* tails, uint32_t n, int shift, uint64_t* ends,
                          uint32_t* page_counts, uint32_t* slow);

namespace lane_scan_detail {

// Sequences [from, n) into r; top: the largest token count so far.
inline void scan_range(const DecodeTail* tails, uint32_t from, uint32_t n, int shift,
                       uint64_t* ends, uint32_t* page_counts, uint32_t* slow, LaneScan& r,
                       uint64_t& top) {
  const uint64_t mask = (uint64_t(1) << shift) - 1;
  for (uint32_t i = from; i < n; ++i) {
    const DecodeTail& m = tails[i];
    const uint64_t n0 = m.n, np = (n0 >> shift) + 1;
    ends[i] = n0 + 1;
    page_counts[i] = uint32_t(np);
    r.pages += np;
    top = std::max(top, n0);
    // Enters a block (slot 0), fills one (its last slot), or has no room.
    slow[r.slow] = i;
    r.slow += ((n0 + 1) & mask) <= 1 || n0 + 1 > m.cap;
  }
}

// The AVX2 loop over whole groups of 8 sequences (into r and top), or
// nullptr where the CPU lacks AVX2. Returns the sequences it scanned.
using ScanGroups = uint32_t (*)(const DecodeTail* tails, uint32_t n, int shift, uint64_t* ends,
                                uint32_t* page_counts, uint32_t* slow, LaneScan& r, uint64_t& top);
ScanGroups avx2_scan_groups();

}  // namespace lane_scan_detail
}  // namespace pagedkv
