// Package pagedkv is the Go binding of pagedkv, a paged KV-cache library for
// LLM inference engines: a block pool with prefix caching, per-sequence block
// tables, step plans, and the kernels that write keys and values into the
// pool and attend over it (CPU, and CUDA where the library was built with it).
//
// The package is a thin, idiomatic layer over the library's C ABI
// (libpagedkv, found with pkg-config):
//
//   - Errors are values. Every failure is an *Error carrying the status Code,
//     the C function that failed and the library's message naming the bad
//     argument. Compare with errors.Is against the sentinels (ErrOutOfBlocks,
//     ErrNotFound, ...). The message is captured inside the same cgo call as
//     the failing function, so goroutines moving between OS threads never
//     see each other's messages.
//   - Pool and Batch own C objects. Close releases them; it is idempotent and
//     waits for calls in flight on other goroutines. A finalizer closes
//     objects that were forgotten, but do not rely on it: KV storage can be
//     large.
//   - A Pool is safe for concurrent use by many goroutines (the library
//     serialises pool operations). A Batch serialises its own calls.
//   - C never keeps a Go pointer. Token slices and CPU tensor data are passed
//     to C without copying, for the duration of the call only.
//
// CPU tensors are Go slices: []float32 for PKV_DTYPE_F32 pools and []uint16
// holding IEEE half (f16) or bfloat16 bit patterns for F16 and BF16 pools
// (see Float32ToBF16, Float32ToF16 and friends). Shapes are checked against
// the step plan before any pointer crosses into C.
//
// GPU (CUDA) memory is described by Tensor values whose Data is an
// unsafe.Pointer to device (or pinned host) memory that the caller allocated
// outside Go, e.g. with the CUDA runtime; streams are unsafe.Pointers holding
// a cudaStream_t (nil for the default stream). Never put a pointer to Go
// memory in a Tensor: the cgo pointer rules forbid a Go struct passed to C
// from holding Go pointers, and cgo's runtime checks will panic.
package pagedkv
