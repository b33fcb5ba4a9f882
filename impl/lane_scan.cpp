#include "lane_scan.h"

#include "seq_util.h"

namespace pagedkv {

namespace {
LaneScan finish(LaneScan r, uint64_t top, uint32_t n, int shift) {
  if (top >= seq_util::kMaxSeqTokens) r.slow = n + 1;
  r.max_ctx = top + 1;
  r.max_pages = uint32_t((top >> shift) + 1);
  return r;
}
}  // namespace

LaneScan scan_lane_scalar(const DecodeTail* tails, uint32_t n, int shift, uint64_t* ends,
                          uint32_t* page_counts, uint32_t* slow) {
  LaneScan r;
  uint64_t top = 0;
  lane_scan_detail::scan_range(tails, 0, n, shift, ends, page_counts, slow, r, top);
  return finish(r, top, n, shift);
}

LaneScan scan_lane(const DecodeTail* tails, uint32_t n, int shift, uint64_t* ends,
                   uint32_t* page_counts, uint32_t* slow) {
  static const lane_scan_detail::ScanGroups groups = lane_scan_detail::avx2_scan_groups();
  LaneScan r;
  uint64_t top = 0;
  const uint32_t done = groups ? groups(tails, n, shift, ends, page_counts, slow, r, top) : 0;
  lane_scan_detail::scan_range(tails, done, n, shift, ends, page_counts, slow, r, top);
  return finish(r, top, n, shift);
}

}  // namespace pagedkv
