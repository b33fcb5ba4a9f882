#include "tensor_arg.h"

#include <algorithm>
#include <limits>
#include <utility>

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
    case 6:
      return "fp8_e4m3";
    case 7:
      return "fp8_e5m2";
    default:
      return "unknown";
  }
}

bool dtype_known(uint32_t dtype) { return dtype >= 1 && dtype <= 7; }

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Strides as the kernels use them (all zero = dense row-major); a dense
// tensor whose element count overflows int64 is rejected here.
void effective_strides(const TensorArg& t, const char* name, int64_t* s) {
  bool dense = true;
  for (int i = 0; i < t.ndim; ++i) dense = dense && t.strides[i] == 0;
  if (!dense) {
    for (int i = 0; i < t.ndim; ++i) s[i] = t.strides[i];
    return;
  }
  int64_t acc = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    s[i] = acc;
    if (__builtin_mul_overflow(acc, t.shape[i], &acc))
      fail(Errc::kInvalidArgument, std::string(name) + " has more elements than fit in int64");
  }
}

// What a checked descriptor must also be before a kernel sees it: its last
// element's byte offset, byte_offset and the data pointer added together fit
// int64 and the address space; the first element is aligned to the dtype;
// an output has no two elements at one address. Shapes are positive and
// strides non-negative here.
ByteSpan check_extent(const TensorArg& t, const char* name, size_t elem, const int64_t* s,
                      bool output) {
  const std::string n(name);
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  uintptr_t begin;
  if (__builtin_add_overflow(base, t.byte_offset, &begin))
    fail(Errc::kInvalidArgument,
         n + "->byte_offset " + std::to_string(t.byte_offset) + " wraps the address space");
  if (begin % elem != 0)
    fail(Errc::kInvalidArgument, n + "->data + byte_offset is not aligned to " +
                                     dtype_name(t.dtype) + " (" + std::to_string(elem) + " bytes)");
  int64_t last = 0;  // element offset of the last element
  for (int i = 0; i < t.ndim; ++i) {
    int64_t term;
    if (t.shape[i] == 0) return ByteSpan{begin, begin};
    if (__builtin_mul_overflow(t.shape[i] - 1, s[i], &term) ||
        __builtin_add_overflow(last, term, &last))
      fail(Errc::kInvalidArgument, n + "'s extent overflows int64 (dimension " + str(i) +
                                       ": size " + str(t.shape[i]) + ", stride " + str(s[i]) + ")");
  }
  int64_t bytes;
  uintptr_t end;
  if (__builtin_add_overflow(last, 1, &bytes) ||
      __builtin_mul_overflow(bytes, int64_t(elem), &bytes) ||
      __builtin_add_overflow(begin, uintptr_t(bytes), &end))
    fail(Errc::kInvalidArgument, n + "'s extent (" + str(last) +
                                     " elements past its start) overflows int64 or wraps the "
                                     "address space");
  // The documented bound (batch.h): the whole extent, data + byte_offset
  // included, fits int64; no buffer a caller owns lies beyond it.
  if (end > uintptr_t(std::numeric_limits<int64_t>::max()))
    fail(Errc::kInvalidArgument, n +
                                     "'s extent (data + byte_offset up to its last element) ends "
                                     "past 2^63 - 1 (byte_offset " +
                                     std::to_string(t.byte_offset) + ")");
  if (output) {
    // Sufficient for no overlap: ordered by stride, each dimension's stride
    // steps past everything the dimensions inside it span.
    int order[kMaxDims], m = 0;
    for (int i = 0; i < t.ndim; ++i)
      if (t.shape[i] > 1) order[m++] = i;
    for (int a = 1; a < m; ++a)
      for (int b = a; b > 0 && s[order[b]] < s[order[b - 1]]; --b)
        std::swap(order[b], order[b - 1]);
    int64_t inner = 1;  // elements spanned by the dimensions seen so far
    for (int a = 0; a < m; ++a) {
      const int i = order[a];
      if (s[i] < inner)
        fail(Errc::kInvalidArgument, n + " is an output whose elements overlap (dimension " +
                                         str(i) + " has stride " + str(s[i]) + ", below the " +
                                         str(inner) + " elements inside it)");
      inner += (t.shape[i] - 1) * s[i];  // cannot overflow: bounded by last
    }
  }
  return ByteSpan{begin, end};
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

Tensor3 check_rows(const TensorArg* t, const char* name, const RowsSpec& spec, ByteSpan* span) {
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
  // The kernels index tokens, heads and dims with int32.
  for (int i = 0; i < 3; ++i)
    if (sh[i] > std::numeric_limits<int32_t>::max())
      fail(Errc::kInvalidArgument, std::string(name) + " has " + str(sh[i]) + " " +
                                       (i == 0   ? "rows"
                                        : i == 1 ? "heads"
                                                 : "dims") +
                                       ", more than 2^31 - 1");
  int64_t s[3];
  effective_strides(*t, name, s);
  if (s[2] != 1)
    fail(Errc::kInvalidArgument,
         std::string(name) + " has innermost stride " + str(s[2]) + ", expected 1");
  if (s[0] < 0 || s[1] < 0)
    fail(Errc::kInvalidArgument, std::string(name) + " has a negative stride");
  const ByteSpan bs = check_extent(*t, name, dtype_size(spec.dtype), s, spec.output);
  if (span) *span = bs;
  Tensor3 v;
  v.data = reinterpret_cast<void*>(bs.begin);
  v.dtype = spec.dtype;
  v.n0 = sh[0];
  v.n1 = sh[1];
  v.n2 = sh[2];
  v.s0 = s[0];
  v.s1 = s[1];
  return v;
}

float* check_lse(const TensorArg* t, int32_t device_type, int32_t device_id, int64_t n0, int64_t n1,
                 int64_t* stride0, ByteSpan* span) {
  check_common(t, "lse", uint32_t(DType::kF32), device_type, device_id, 2);
  if (t->shape[0] != n0 || t->shape[1] != n1)
    fail(Errc::kInvalidArgument, "lse has shape [" + str(t->shape[0]) + ", " + str(t->shape[1]) +
                                     "], expected [" + str(n0) + ", " + str(n1) + "]");
  int64_t s[2];
  effective_strides(*t, "lse", s);
  if (s[1] != 1) fail(Errc::kInvalidArgument, "lse has head stride " + str(s[1]) + ", expected 1");
  if (s[0] < 0) fail(Errc::kInvalidArgument, "lse has a negative stride");
  const ByteSpan bs = check_extent(*t, "lse", 4, s, true);
  if (span) *span = bs;
  *stride0 = s[0];
  return reinterpret_cast<float*>(bs.begin);
}

void check_disjoint(const ByteSpan& a, const char* a_name, const ByteSpan& b, const char* b_name) {
  if (a.overlaps(b)) fail(Errc::kInvalidArgument, std::string(a_name) + " overlaps " + b_name);
}

}  // namespace pagedkv
