// libFuzzer entry point of both harnesses (ops_harness.cpp, tensor_harness.cpp):
// every input runs on a fresh pool.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "ops_harness.h"

namespace {

// libFuzzer ends a -max_total_time run with exit(): report what was executed.
void print_totals() {
  const pkv_fuzz::Counters& c = pkv_fuzz::counters();
  std::fprintf(stderr,
               "pkv_fuzz totals: %llu inputs, %llu operations, %llu expected error statuses, "
               "%llu validates, %llu results checked (attention rows; accepted tensor calls), "
               "%llu plans over unwritten context refused, %llu fused decode steps (%llu over "
               "the previous one's ids)\n",
               (unsigned long long)c.inputs, (unsigned long long)c.ops,
               (unsigned long long)c.failed_calls, (unsigned long long)c.validates,
               (unsigned long long)c.attention_checked, (unsigned long long)c.unwritten_refused,
               (unsigned long long)c.fused_decodes, (unsigned long long)c.fused_repeats);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(print_totals);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pkv_fuzz::run_one(data, size);
  return 0;
}
