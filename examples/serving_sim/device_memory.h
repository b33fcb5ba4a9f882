// Buffers for the step's queries, keys, values, outputs and LSE on the
// pool's device. A real engine owns its activations; pagedkv only takes
// descriptors of them. For CUDA this file is the program's only use of the
// CUDA runtime (allocation and copies), compiled in when the library was
// built with CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sim {

// True if this program was built with the CUDA runtime.
bool cuda_runtime_linked();

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  // Throws std::runtime_error when the allocation fails.
  void allocate(int32_t device_type, int32_t device_id, size_t bytes);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Host <-> buffer copies at byte offsets (synchronous).
  void upload(const void* host, size_t offset, size_t bytes);
  void download(void* host, size_t offset, size_t bytes) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int32_t device_type_ = 1;
};

// Waits for the device's queued work (CPU: nothing), so that step times
// measure the kernels.
void device_synchronize(int32_t device_type);

}  // namespace sim
