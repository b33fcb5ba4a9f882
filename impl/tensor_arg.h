// The C ABI's tensor descriptor, mirrored for impl/ (which never includes a
// C header), and the checks that turn one into a kernel view.
#pragma once

#include <cstdint>
#include <string>

#include "kernel_types.h"

namespace pagedkv {

inline constexpr int32_t kDeviceCpu = 1;   // PKV_DEVICE_CPU
inline constexpr int32_t kDeviceCuda = 2;  // PKV_DEVICE_CUDA
inline constexpr int kMaxDims = 6;         // PKV_TENSOR_MAX_DIMS

struct TensorArg {
  void* data = nullptr;
  uint64_t byte_offset = 0;
  uint32_t dtype = 0;
  int32_t device_type = 0;
  int32_t device_id = 0;
  int32_t ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // all 0 = dense row-major
};

const char* dtype_name(uint32_t dtype);  // "bf16", ... or "unknown"
bool dtype_known(uint32_t dtype);

// What a tensor argument must be. n1 < 0 means "any multiple of -n1".
// output: the kernels write it, so no two of its elements may share memory.
struct RowsSpec {
  DType dtype;
  int32_t device_type, device_id;
  int64_t n0, n1, n2;
  bool output = false;
};

// The bytes [begin, end) a checked descriptor spans; a descriptor's whole
// extent is known to fit the address space once it is checked.
struct ByteSpan {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const ByteSpan& o) const { return begin < o.end && o.begin < end; }
};

// Checks t against spec and returns the [n0, n1, n2] view; Error
// kInvalidArgument naming `name` for a wrong dtype, device, shape or
// stride, an extent (byte_offset + the last element) that overflows or
// wraps the address space, a data pointer not aligned to the dtype, sizes
// beyond the kernels' int32 indices, and (outputs) rows or heads that
// overlap. span (nullable) receives the bytes it covers. 2-d tensors (lse)
// are checked by check_lse.
Tensor3 check_rows(const TensorArg* t, const char* name, const RowsSpec& spec,
                   ByteSpan* span = nullptr);
// lse: f32 [n0, n1], unit head stride, an output (same checks); returns the
// data pointer and row stride.
float* check_lse(const TensorArg* t, int32_t device_type, int32_t device_id, int64_t n0, int64_t n1,
                 int64_t* stride0, ByteSpan* span = nullptr);
// Error kInvalidArgument "<a> overlaps <b>" when the spans share a byte.
void check_disjoint(const ByteSpan& a, const char* a_name, const ByteSpan& b, const char* b_name);

}  // namespace pagedkv
