// Versions, features, status codes, the error message, tensors.
#include <cstring>

#include "backend.h"
#include "capi_util.h"
#include "hash/block_hash.h"
#include "kernel_types.h"

namespace pc = pkv_capi;
using pagedkv::Errc;
using pagedkv::fail;

static_assert(int32_t(Errc::kInvalidArgument) == PKV_E_INVALID_ARGUMENT, "Errc drifted");
static_assert(int32_t(Errc::kNotFound) == PKV_E_NOT_FOUND, "Errc drifted");
static_assert(int32_t(Errc::kOutOfBlocks) == PKV_E_OUT_OF_BLOCKS, "Errc drifted");
static_assert(int32_t(Errc::kOutOfMemory) == PKV_E_OUT_OF_MEMORY, "Errc drifted");
static_assert(int32_t(Errc::kUnsupported) == PKV_E_UNSUPPORTED, "Errc drifted");
static_assert(int32_t(Errc::kCuda) == PKV_E_CUDA, "Errc drifted");
static_assert(int32_t(Errc::kBufferTooSmall) == PKV_E_BUFFER_TOO_SMALL, "Errc drifted");
static_assert(int32_t(Errc::kInvalidState) == PKV_E_INVALID_STATE, "Errc drifted");
static_assert(int32_t(Errc::kInvariant) == PKV_E_INVARIANT, "Errc drifted");
static_assert(int32_t(Errc::kInternal) == PKV_E_INTERNAL, "Errc drifted");
static_assert(uint32_t(pagedkv::DType::kF32) == PKV_DTYPE_F32, "DType drifted");
static_assert(uint32_t(pagedkv::DType::kF16) == PKV_DTYPE_F16, "DType drifted");
static_assert(uint32_t(pagedkv::DType::kBF16) == PKV_DTYPE_BF16, "DType drifted");
static_assert(uint32_t(pagedkv::DType::kI32) == PKV_DTYPE_I32, "DType drifted");
static_assert(uint32_t(pagedkv::DType::kI64) == PKV_DTYPE_I64, "DType drifted");
static_assert(uint32_t(pagedkv::DType::kFp8E4m3) == PKV_DTYPE_FP8_E4M3, "DType drifted");
static_assert(uint32_t(pagedkv::DType::kFp8E5m2) == PKV_DTYPE_FP8_E5M2, "DType drifted");
static_assert(uint32_t(pagedkv::HashAlgo::kSha256Cbor) == PKV_HASH_SHA256_CBOR, "algo drifted");
static_assert(uint32_t(pagedkv::HashAlgo::kXxh3_128) == PKV_HASH_XXH3_128, "algo drifted");
static_assert(pagedkv::kDeviceCpu == PKV_DEVICE_CPU && pagedkv::kDeviceCuda == PKV_DEVICE_CUDA,
              "device drifted");
static_assert(pagedkv::kMaxDims == PKV_TENSOR_MAX_DIMS, "dims drifted");
static_assert(PKV_HASH_MAX_BYTES == sizeof(pagedkv::BlockHash::bytes), "hash size drifted");

namespace pkv_capi {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

uint32_t flag(uint32_t v, const char* name) {
  if (v > 1)
    fail(Errc::kInvalidArgument, std::string(name) + " is " + std::to_string(v) + ", not 0 or 1");
  return v;
}

void check_struct_size(uint32_t size, uint32_t v1_size, const char* name, const char* type,
                       const char* init) {
  if (size < v1_size || size > kMaxStructSize)
    fail(Errc::kInvalidArgument, std::string(name) + "->struct_size is " + std::to_string(size) +
                                     ", not a size of " + type + " (at least " +
                                     std::to_string(v1_size) + "); call " + init + " first");
}

pagedkv::TensorArg to_arg(const pkv_tensor& t) {
  pagedkv::TensorArg a;
  a.data = t.data;
  a.byte_offset = t.byte_offset;
  a.dtype = t.dtype;
  a.device_type = t.device_type;
  a.device_id = t.device_id;
  a.ndim = t.ndim;
  for (int i = 0; i < PKV_TENSOR_MAX_DIMS; ++i) {
    a.shape[i] = t.shape[i];
    a.strides[i] = t.strides[i];
  }
  return a;
}

void from_arg(const pagedkv::TensorArg& a, pkv_tensor* out) {
  pkv_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = a.data;
  t.byte_offset = a.byte_offset;
  t.dtype = a.dtype;
  t.device_type = a.device_type;
  t.device_id = a.device_id;
  t.ndim = a.ndim;
  for (int i = 0; i < PKV_TENSOR_MAX_DIMS; ++i) {
    t.shape[i] = a.shape[i];
    t.strides[i] = a.strides[i];
  }
  *out = t;
}

void copy_hash(const pagedkv::BlockHash& h, pkv_block_hash* out) {
  std::memcpy(out->bytes, h.bytes.data(), PKV_HASH_MAX_BYTES);
}

}  // namespace pkv_capi

extern "C" {

const char* pkv_version_string(void) { return PKV_VERSION_STRING; }
uint32_t pkv_version_number(void) { return PKV_VERSION_NUMBER; }
uint32_t pkv_abi_version(void) { return PKV_ABI_VERSION; }

uint32_t pkv_features(void) {
  uint32_t f = PKV_FEATURE_XXHASH | PKV_FEATURE_SHA256 | PKV_FEATURE_BF16 | PKV_FEATURE_FP8;
  if (pagedkv::cuda_compiled_in()) f |= PKV_FEATURE_CUDA;
  return f;
}

const char* pkv_status_string(pkv_status status) {
  switch (status) {
    case PKV_OK:
      return "PKV_OK: success";
    case PKV_E_INVALID_ARGUMENT:
      return "PKV_E_INVALID_ARGUMENT: an argument is NULL, out of range or malformed";
    case PKV_E_NOT_FOUND:
      return "PKV_E_NOT_FOUND: unknown or stale sequence id";
    case PKV_E_OUT_OF_BLOCKS:
      return "PKV_E_OUT_OF_BLOCKS: not enough free KV blocks; nothing changed";
    case PKV_E_OUT_OF_MEMORY:
      return "PKV_E_OUT_OF_MEMORY: a host or device allocation failed";
    case PKV_E_UNSUPPORTED:
      return "PKV_E_UNSUPPORTED: valid request this build or device cannot do";
    case PKV_E_CUDA:
      return "PKV_E_CUDA: a CUDA runtime call failed";
    case PKV_E_BUFFER_TOO_SMALL:
      return "PKV_E_BUFFER_TOO_SMALL: output buffer too small";
    case PKV_E_INVALID_STATE:
      return "PKV_E_INVALID_STATE: call not valid now (e.g. stale step plan)";
    case PKV_E_INVARIANT:
      return "PKV_E_INVARIANT: a pool invariant is broken";
    case PKV_E_INTERNAL:
      return "PKV_E_INTERNAL: a bug in pagedkv; please report it";
    default:
      return "unknown pkv_status";
  }
}

const char* pkv_last_error_message(void) {
  try {
    return pkv_capi::last_error().c_str();
  } catch (...) {
    return "";
  }
}

uint64_t pkv_last_error_copy(char* buf, uint64_t capacity) {
  const char* msg = pkv_last_error_message();
  size_t len = std::strlen(msg);
  if (buf && capacity > 0) {
    size_t n = len < capacity - 1 ? len : size_t(capacity - 1);
    std::memcpy(buf, msg, n);
    buf[n] = '\0';
  }
  return len;
}

uint32_t pkv_dtype_size(uint32_t dtype) {
  return pagedkv::dtype_known(dtype) ? uint32_t(pagedkv::dtype_size(pagedkv::DType(dtype))) : 0;
}

pkv_status pkv_tensor_init(void* data, uint32_t dtype, int32_t device_type, int32_t device_id,
                           int32_t ndim, const int64_t* shape, pkv_tensor* out) {
  PKV_GUARD({
    pc::require(out, "out");
    if (ndim < 1 || ndim > PKV_TENSOR_MAX_DIMS)
      fail(Errc::kInvalidArgument, "ndim " + std::to_string(ndim) + " is outside [1, " +
                                       std::to_string(PKV_TENSOR_MAX_DIMS) + "]");
    pc::require(shape, "shape");
    if (!pagedkv::dtype_known(dtype))
      fail(Errc::kInvalidArgument, "dtype " + std::to_string(dtype) + " is not a PKV_DTYPE_*");
    if (device_type != PKV_DEVICE_CPU && device_type != PKV_DEVICE_CUDA)
      fail(Errc::kInvalidArgument,
           "device_type " + std::to_string(device_type) + " is not a PKV_DEVICE_*");
    if (device_id < 0)
      fail(Errc::kInvalidArgument, "device_id " + std::to_string(device_id) + " is negative");
    for (int32_t i = 0; i < ndim; ++i)
      if (shape[i] < 0)
        fail(Errc::kInvalidArgument,
             "shape[" + std::to_string(i) + "] = " + std::to_string(shape[i]) + " is negative");
    pkv_tensor t;
    std::memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device_type = device_type;
    t.device_id = device_id;
    t.ndim = ndim;
    int64_t stride = 1;
    for (int32_t i = ndim - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.strides[i] = stride;
      // The element count must fit int64 (as the kernels' checks require):
      // a product that overflows would leave wrapped strides.
      if (__builtin_mul_overflow(stride, shape[i] > 0 ? shape[i] : 1, &stride))
        fail(Errc::kInvalidArgument, "shape has more elements than fit in int64 (from shape[" +
                                         std::to_string(i) + "] = " + std::to_string(shape[i]) +
                                         " on)");
    }
    *out = t;
  });
}

int32_t pkv_cuda_device_count(void) { return pagedkv::cuda_device_count(); }

}  // extern "C"
