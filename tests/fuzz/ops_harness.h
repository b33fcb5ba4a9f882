// The operation-sequence harness shared by the libFuzzer target (fuzz_ops)
// and the corpus replay test (fuzz_replay): decodes bytes into pool
// operations, runs them through the C ABI against a reference model and
// aborts on the first disagreement or broken invariant.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pkv_fuzz {

struct Counters {
  uint64_t inputs = 0;
  uint64_t ops = 0;                // operations decoded and executed
  uint64_t failed_calls = 0;       // calls that returned an expected error status
  uint64_t attention_checked = 0;  // attention outputs compared with the reference
  uint64_t validates = 0;          // pkv_pool_validate calls (all returned PKV_OK)
  uint64_t unwritten_refused = 0;  // plans refused because their context was never written
  uint64_t fused_decodes = 0;      // pkv_batch_prepare_decode steps accepted
  uint64_t fused_repeats = 0;      // of which over the previous fused step's ids (steady)
};

// Runs one input. Returns normally when every check passed; prints what
// disagreed and aborts otherwise (so libFuzzer records a crash).
void run_one(const uint8_t* data, size_t size);

// Totals over every run_one of this process.
const Counters& counters();

}  // namespace pkv_fuzz
