/* pagedkv — paged KV-cache management and kernels for LLM inference.
 *
 * common.h: status codes, errors, versions, features and tensor descriptors
 * shared by every other public header. See docs/conventions.md for the rules
 * this ABI follows (prefixes, ownership, out-parameters last, versioned
 * option structs, fixed-width types only).
 */
#ifndef PAGEDKV_COMMON_H
#define PAGEDKV_COMMON_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(PAGEDKV_BUILDING)
#define PKV_API __declspec(dllexport)
#else
#define PKV_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define PKV_API __attribute__((visibility("default")))
#else
#define PKV_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- versions */

#define PKV_VERSION_MAJOR 0
#define PKV_VERSION_MINOR 1
#define PKV_VERSION_PATCH 0
#define PKV_VERSION_NUMBER \
  (PKV_VERSION_MAJOR * 10000 + PKV_VERSION_MINOR * 100 + PKV_VERSION_PATCH)
#define PKV_VERSION_STRING "0.1.0"

/* Bumped on any incompatible change of the stable section of the ABI.
 * Appending functions, status codes or trailing struct fields keeps it. */
#define PKV_ABI_VERSION 1

/* The library's version as "MAJOR.MINOR.PATCH"; static storage. */
PKV_API const char* pkv_version_string(void);
/* PKV_VERSION_NUMBER of the library actually loaded. */
PKV_API uint32_t pkv_version_number(void);
/* PKV_ABI_VERSION of the library actually loaded. */
PKV_API uint32_t pkv_abi_version(void);

/* --------------------------------------------------------------- features */

#define PKV_FEATURE_CUDA 0x1u     /* CUDA backend compiled in */
#define PKV_FEATURE_XXHASH 0x2u   /* PKV_HASH_XXH3_128 available */
#define PKV_FEATURE_SHA256 0x4u   /* PKV_HASH_SHA256_CBOR available */
#define PKV_FEATURE_BF16 0x8u     /* bf16 storage and kernels */

/* Bit set of PKV_FEATURE_* compiled into this build. */
PKV_API uint32_t pkv_features(void);

/* ----------------------------------------------------------------- status */

/* Every fallible call returns a pkv_status. Codes are pinned and
 * append-only: a value never changes meaning. */
typedef int32_t pkv_status;

#define PKV_OK 0
#define PKV_E_INVALID_ARGUMENT (-1) /* an argument is NULL, out of range, malformed */
#define PKV_E_NOT_FOUND (-2)        /* unknown or stale sequence id, unknown block */
#define PKV_E_OUT_OF_BLOCKS (-3)    /* not enough free KV blocks; nothing changed */
#define PKV_E_OUT_OF_MEMORY (-4)    /* a host or device allocation failed */
#define PKV_E_UNSUPPORTED (-5)      /* valid request this build/device cannot do */
#define PKV_E_CUDA (-6)             /* a CUDA runtime call failed; message has its text */
#define PKV_E_BUFFER_TOO_SMALL (-7) /* caller's output buffer too small; size reported */
#define PKV_E_INVALID_STATE (-8)    /* call not valid now (e.g. stale step plan) */
#define PKV_E_INVARIANT (-9)        /* pkv_pool_validate found a broken invariant */
#define PKV_E_INTERNAL (-10)        /* a bug in pagedkv; please report it */

/* Static text naming a status code ("PKV_E_OUT_OF_BLOCKS: ..."); never NULL. */
PKV_API const char* pkv_status_string(pkv_status status);

/* The message of the last failed call on this thread, naming what was wrong
 * with which argument. Never NULL; "" after a successful call. Valid until the
 * next pagedkv call on the same thread. */
PKV_API const char* pkv_last_error_message(void);

/* Copies the last error message of this thread into buf (NUL-terminated,
 * truncated to capacity). Returns the full message length without the NUL.
 * Lets bindings capture the message inside the same foreign call. */
PKV_API uint64_t pkv_last_error_copy(char* buf, uint64_t capacity);

/* ----------------------------------------------------------------- tensors */

/* Device types use DLPack's numbering. */
#define PKV_DEVICE_CPU 1
#define PKV_DEVICE_CUDA 2

/* Element types. */
#define PKV_DTYPE_F32 1
#define PKV_DTYPE_F16 2
#define PKV_DTYPE_BF16 3
#define PKV_DTYPE_I32 4
#define PKV_DTYPE_I64 5

#define PKV_TENSOR_MAX_DIMS 6

/* A non-owning view of caller memory with DLPack semantics. Strides and
 * byte_offset are in elements and bytes as in DLPack; if every stride in
 * [0, ndim) is 0 the tensor is dense row-major. pagedkv validates
 * descriptors and never copies or keeps the data pointer past the call. */
typedef struct pkv_tensor {
  void* data;
  uint64_t byte_offset;
  uint32_t dtype;      /* PKV_DTYPE_* */
  int32_t device_type; /* PKV_DEVICE_* */
  int32_t device_id;
  int32_t ndim;
  int64_t shape[PKV_TENSOR_MAX_DIMS];
  int64_t strides[PKV_TENSOR_MAX_DIMS];
} pkv_tensor;

/* Fills *out as a dense row-major tensor. Fails on ndim outside
 * [1, PKV_TENSOR_MAX_DIMS], a negative extent or an unknown dtype/device. */
PKV_API pkv_status pkv_tensor_init(void* data, uint32_t dtype, int32_t device_type,
                                   int32_t device_id, int32_t ndim, const int64_t* shape,
                                   pkv_tensor* out);

/* Size in bytes of one element of a PKV_DTYPE_*; 0 for an unknown dtype. */
PKV_API uint32_t pkv_dtype_size(uint32_t dtype);

/* Number of CUDA devices visible to the library: 0 when CUDA is not compiled
 * in or no device/driver is present (never an error). */
PKV_API int32_t pkv_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDKV_COMMON_H */
