// Stands in for cuda/ when the library is built without CUDA.
#include "backend.h"

namespace pagedkv {

std::unique_ptr<Backend> make_cuda_backend(int32_t) {
  fail(Errc::kUnsupported, "this build of pagedkv has no CUDA backend (built without nvcc)");
}
int32_t cuda_device_count() noexcept { return 0; }
bool cuda_compiled_in() noexcept { return false; }

}  // namespace pagedkv
