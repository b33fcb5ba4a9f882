// libFuzzer entry point: every input is one operation sequence on a fresh pool.
#include <cstddef>
#include <cstdint>

#include "ops_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pkv_fuzz::run_one(data, size);
  return 0;
}
