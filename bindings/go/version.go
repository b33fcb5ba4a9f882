package pagedkv

/*
#include "shim.h"
*/
import "C"

import "strconv"

// Versions of the headers this package was compiled against.
const (
	HeaderVersion       = C.PKV_VERSION_STRING
	HeaderVersionNumber = C.PKV_VERSION_NUMBER
	HeaderABIVersion    = C.PKV_ABI_VERSION
)

// Version is the loaded library's version, "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.pkv_version_string()) }

// VersionNumber is the loaded library's MAJOR*10000 + MINOR*100 + PATCH.
func VersionNumber() uint32 { return uint32(C.pkv_version_number()) }

// ABIVersion is the loaded library's ABI version; it must equal
// HeaderABIVersion.
func ABIVersion() uint32 { return uint32(C.pkv_abi_version()) }

// Features is a bit set of what the loaded library was built with.
type Features uint32

// Feature bits.
const (
	FeatureCUDA   Features = C.PKV_FEATURE_CUDA
	FeatureXXHash Features = C.PKV_FEATURE_XXHASH
	FeatureSHA256 Features = C.PKV_FEATURE_SHA256
	FeatureBF16   Features = C.PKV_FEATURE_BF16
	FeatureFP8    Features = C.PKV_FEATURE_FP8 // FP8 (E4M3, E5M2) KV storage and kernels
)

// SupportedFeatures reports the loaded library's features.
func SupportedFeatures() Features { return Features(C.pkv_features()) }

// Has reports whether every bit of f2 is set in f.
func (f Features) Has(f2 Features) bool { return f&f2 == f2 }

// CUDADeviceCount is the number of CUDA devices the library sees: 0 without
// CUDA support or without a device.
func CUDADeviceCount() int { return int(C.pkv_cuda_device_count()) }

// DType is an element type (PKV_DTYPE_*).
type DType uint32

// Element types.
const (
	Float32  DType = C.PKV_DTYPE_F32
	Float16  DType = C.PKV_DTYPE_F16
	BFloat16 DType = C.PKV_DTYPE_BF16
	Int32    DType = C.PKV_DTYPE_I32
	Int64    DType = C.PKV_DTYPE_I64
	// OCP FP8 KV storage (pool dtype only): E4M3 (max 448) and E5M2 (max
	// 57344); cache writes and attention then take float32 (or, through
	// the Tensor variants, f16/bf16) activations.
	Float8E4M3 DType = C.PKV_DTYPE_FP8_E4M3
	Float8E5M2 DType = C.PKV_DTYPE_FP8_E5M2
)

// Size is the size of one element in bytes, 0 for an unknown dtype.
func (d DType) Size() int { return int(C.pkv_dtype_size(C.uint32_t(d))) }

func (d DType) String() string {
	switch d {
	case Float32:
		return "f32"
	case Float16:
		return "f16"
	case BFloat16:
		return "bf16"
	case Int32:
		return "i32"
	case Int64:
		return "i64"
	case Float8E4M3:
		return "fp8_e4m3"
	case Float8E5M2:
		return "fp8_e5m2"
	}
	return "dtype(" + strconv.FormatInt(int64(d), 10) + ")"
}

// DeviceType is where memory lives, with DLPack's numbering.
type DeviceType int32

// Device types.
const (
	CPU  DeviceType = C.PKV_DEVICE_CPU
	CUDA DeviceType = C.PKV_DEVICE_CUDA
)

func (d DeviceType) String() string {
	switch d {
	case CPU:
		return "cpu"
	case CUDA:
		return "cuda"
	}
	return "device(" + strconv.FormatInt(int64(d), 10) + ")"
}
