// Turning CUDA runtime errors into pagedkv::Error(kCuda). Host code only.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "error.h"

namespace pagedkv {
namespace cuda {

// Every failing runtime call becomes Error(kCuda, "<call>: <CUDA's text>").
inline void check(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return;
  // Clear a non-sticky error so that it does not resurface at the next call.
  (void)cudaGetLastError();
  const Errc code = err == cudaErrorMemoryAllocation ? Errc::kOutOfMemory : Errc::kCuda;
  fail(code, std::string(call) + ": " + cudaGetErrorString(err));
}

// Makes `device` current for a scope and restores the caller's device after,
// so that the library never leaves the thread on another GPU.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_) check(cudaSetDevice(device_), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = 0;
};

}  // namespace cuda
}  // namespace pagedkv
