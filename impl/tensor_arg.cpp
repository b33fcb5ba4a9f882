#include "tensor_arg.h"

#include "error.h"

namespace pagedkv {

const char* dtype_name(uint32_t dtype) {
  switch (dtype) {
    case 1:
      return "f32";
    case 2:
      return "f16";
    case 3:
      return "bf16";
    case 4:
      return "i32";
    case 5:
      return "i64";
    default:
      return "unknown";
  }
}

bool dtype_known(uint32_t dtype) { return dtype >= 1 && dtype <= 5; }

namespace {

std::string str(int64_t v) { return std::to_string(v); }

void effective_strides(const TensorArg& t, int64_t* s) {
  bool dense = true;
  for (int i = 0; i < t.ndim; ++i) dense = dense && t.strides[i] == 0;
  if (!dense) {
    for (int i = 0; i < t.ndim; ++i) s[i] = t.strides[i];
    return;
  }
  int64_t acc = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= t.shape[i];
  }
}

void check_common(const TensorArg* t, const char* name, uint32_t dtype, int32_t device_type,
                  int32_t device_id, int ndim) {
  if (!t) fail(Errc::kInvalidArgument, std::string(name) + " is NULL");
  if (!t->data) fail(Errc::kInvalidArgument, std::string(name) + "->data is NULL");
  if (t->dtype != dtype)
    fail(Errc::kInvalidArgument, std::string(name) + " has dtype " + dtype_name(t->dtype) + " (" +
                                     str(t->dtype) + "), expected " + dtype_name(dtype));
  if (t->device_type != device_type || t->device_id != device_id)
    fail(Errc::kInvalidArgument, std::string(name) + " is on device (" + str(t->device_type) +
                                     ", " + str(t->device_id) + "), the pool on (" +
                                     str(device_type) + ", " + str(device_id) + ")");
  if (t->ndim != ndim)
    fail(Errc::kInvalidArgument,
         std::string(name) + " has ndim " + str(t->ndim) + ", expected " + str(ndim));
}

}  // namespace

Tensor3 check_rows(const TensorArg* t, const char* name, const RowsSpec& spec) {
  check_common(t, name, uint32_t(spec.dtype), spec.device_type, spec.device_id, 3);
  const int64_t* sh = t->shape;
  bool n1_ok = spec.n1 >= 0 ? sh[1] == spec.n1 : (sh[1] > 0 && sh[1] % -spec.n1 == 0);
  if (sh[0] != spec.n0 || !n1_ok || sh[2] != spec.n2) {
    std::string want = "[" + str(spec.n0) + ", " +
                       (spec.n1 >= 0 ? str(spec.n1) : "a multiple of " + str(-spec.n1)) + ", " +
                       str(spec.n2) + "]";
    fail(Errc::kInvalidArgument, std::string(name) + " has shape [" + str(sh[0]) + ", " +
                                     str(sh[1]) + ", " + str(sh[2]) + "], expected " + want);
  }
  int64_t s[3];
  effective_strides(*t, s);
  if (s[2] != 1)
    fail(Errc::kInvalidArgument,
         std::string(name) + " has innermost stride " + str(s[2]) + ", expected 1");
  if (s[0] < 0 || s[1] < 0)
    fail(Errc::kInvalidArgument, std::string(name) + " has a negative stride");
  Tensor3 v;
  v.data = static_cast<char*>(t->data) + t->byte_offset;
  v.dtype = spec.dtype;
  v.n0 = sh[0];
  v.n1 = sh[1];
  v.n2 = sh[2];
  v.s0 = s[0];
  v.s1 = s[1];
  return v;
}

float* check_lse(const TensorArg* t, int32_t device_type, int32_t device_id, int64_t n0, int64_t n1,
                 int64_t* stride0) {
  check_common(t, "lse", uint32_t(DType::kF32), device_type, device_id, 2);
  if (t->shape[0] != n0 || t->shape[1] != n1)
    fail(Errc::kInvalidArgument, "lse has shape [" + str(t->shape[0]) + ", " + str(t->shape[1]) +
                                     "], expected [" + str(n0) + ", " + str(n1) + "]");
  int64_t s[2];
  effective_strides(*t, s);
  if (s[1] != 1) fail(Errc::kInvalidArgument, "lse has head stride " + str(s[1]) + ", expected 1");
  if (s[0] < 0) fail(Errc::kInvalidArgument, "lse has a negative stride");
  *stride0 = s[0];
  return reinterpret_cast<float*>(static_cast<char*>(t->data) + t->byte_offset);
}

}  // namespace pagedkv
