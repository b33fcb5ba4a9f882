#include "device_memory.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "pagedkv/pagedkv.h"

#ifdef SERVING_SIM_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sim {
namespace {

#ifdef SERVING_SIM_CUDA
void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(err));
}
#endif

}  // namespace

bool cuda_runtime_linked() {
#ifdef SERVING_SIM_CUDA
  return true;
#else
  return false;
#endif
}

DeviceBuffer::~DeviceBuffer() {
  if (!data_) return;
#ifdef SERVING_SIM_CUDA
  if (device_type_ == PKV_DEVICE_CUDA) {
    cudaFree(data_);
    return;
  }
#endif
  std::free(data_);
}

void DeviceBuffer::allocate(int32_t device_type, int32_t device_id, size_t bytes) {
  device_type_ = device_type;
  bytes_ = bytes;
  if (device_type == PKV_DEVICE_CUDA) {
#ifdef SERVING_SIM_CUDA
    cuda_check(cudaSetDevice(device_id), "cudaSetDevice");
    cuda_check(cudaMalloc(&data_, bytes), "cudaMalloc");
    return;
#else
    (void)device_id;
    throw std::runtime_error("this serving_sim was built without the CUDA runtime");
#endif
  }
  // 64-byte alignment suits vector loads in the CPU kernels.
  data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!data_) throw std::runtime_error("out of host memory");
  std::memset(data_, 0, bytes);
}

void DeviceBuffer::upload(const void* host, size_t offset, size_t bytes) {
#ifdef SERVING_SIM_CUDA
  if (device_type_ == PKV_DEVICE_CUDA) {
    cuda_check(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice),
               "cudaMemcpy");
    return;
  }
#endif
  std::memcpy(static_cast<char*>(data_) + offset, host, bytes);
}

void DeviceBuffer::download(void* host, size_t offset, size_t bytes) const {
#ifdef SERVING_SIM_CUDA
  if (device_type_ == PKV_DEVICE_CUDA) {
    cuda_check(
        cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost),
        "cudaMemcpy");
    return;
  }
#endif
  std::memcpy(host, static_cast<const char*>(data_) + offset, bytes);
}

void device_synchronize(int32_t device_type) {
#ifdef SERVING_SIM_CUDA
  if (device_type == PKV_DEVICE_CUDA) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  (void)device_type;
#endif
}

}  // namespace sim
