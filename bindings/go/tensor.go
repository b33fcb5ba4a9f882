package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"sort"
	"unsafe"
)

// MaxDims is the most dimensions a Tensor may have.
const MaxDims = C.PKV_TENSOR_MAX_DIMS

// Tensor describes memory outside the Go heap with DLPack semantics: CUDA
// device memory, pinned host memory, or the library's own storage and plan
// arrays. Data must never point into Go memory (use the []float32 and
// []uint16 methods for Go slices): cgo's pointer check refuses such a
// Tensor, and the calls taking it return ErrInvalidArgument naming it.
// Strides are in elements; nil means dense row-major.
type Tensor struct {
	Data       unsafe.Pointer
	ByteOffset uint64
	DType      DType
	Device     DeviceType
	DeviceID   int32
	Shape      []int64
	Strides    []int64

	// owner is the Batch or Pool whose memory a Tensor the library handed
	// out describes: it stays reachable (its finalizer cannot free that
	// memory) as long as the Tensor or a copy of it is.
	owner any
	// lo and hi bound the bytes [lo, hi) the library described when it
	// handed the Tensor out (owner != nil): the exported fields may be
	// changed (a reshaped view of a few slots is fine), but a host view or
	// kernel call never reaches past the owner's memory.
	lo, hi uintptr
}

// holdKernelOperands checks the Tensors a kernel call (CacheWriteTensor,
// AttentionTensor, the MLA forms) is given, nil ones skipped: a pool's
// storage view (KVTensor) holds its Pool for the call, so it is ErrClosed
// once that pool is closed and Close waits while the call reads it; a plan
// array (PlanTensor and the like: read-only i32/i64 views of a Batch) is
// no operand, refused before anything reads it. The returned function
// lets the pools go.
//
// The pools are held in the order they were created, the same in every
// call: two calls holding each other's pool (views of pools A and B given
// as A, B to one and B, A to the other) would otherwise deadlock once a
// Close of each waited, as a waiting Close blocks new readers.
func holdKernelOperands(op string, names []string, ts ...*Tensor) (func(), error) {
	var pools []*Pool
	for i, t := range ts {
		if t == nil {
			continue
		}
		switch o := t.owner.(type) {
		case *Batch:
			return nil, argError(op, "%s is a step plan's array (read-only), not a kernel operand", names[i])
		case *Pool:
			if err := t.checkBounds(op, names[i]); err != nil {
				return nil, err
			}
			// Copies of a Pool value (`cp := *pool`) share its handle: one
			// pool, read-locked once (a Close waiting between two read
			// locks of one handle would block the second for ever).
			dup := false
			for _, p := range pools {
				dup = dup || p == o || p.h == o.h
			}
			if !dup {
				pools = append(pools, o)
			}
		}
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].serial < pools[j].serial })
	var held []*Pool
	done := func() {
		for _, p := range held {
			p.release()
		}
	}
	for _, p := range pools {
		if _, err := p.acquire(op); err != nil {
			done()
			return nil, err
		}
		held = append(held, p)
		if holdOperandHook != nil {
			holdOperandHook()
		}
	}
	return done, nil
}

// holdOperandHook, when set (tests only), runs after each pool
// holdKernelOperands takes.
var holdOperandHook func()

// ownedBy returns t keeping owner reachable, and bounded by the bytes it
// describes now (checkBounds).
func ownedBy(t Tensor, owner any) Tensor {
	t.owner = owner
	if lo, hi, ok := t.span(); ok {
		t.lo, t.hi = lo, hi
	}
	return t
}

// span returns the bytes [lo, hi) t describes (its strides, nil meaning
// dense row-major, and its dtype's size), lo == hi when it holds no
// element; ok is false for a descriptor whose extent cannot be computed
// (negative extents, an unknown dtype, offsets past the address space).
func (t *Tensor) span() (lo, hi uintptr, ok bool) {
	sz := int64(t.DType.Size())
	if sz <= 0 || len(t.Shape) == 0 || len(t.Shape) > MaxDims ||
		(t.Strides != nil && len(t.Strides) != len(t.Shape)) {
		return 0, 0, false
	}
	const limit = int64(1) << 62
	for _, e := range t.Shape {
		if e < 0 || e >= limit {
			return 0, 0, false
		}
		if e == 0 {
			return 0, 0, true
		}
	}
	// Element offsets of the first and the last element in memory.
	var minOff, maxOff int64
	dense := int64(1)
	for i := len(t.Shape) - 1; i >= 0; i-- {
		e := t.Shape[i]
		s := dense
		if t.Strides != nil {
			s = t.Strides[i]
		}
		if s <= -limit || s >= limit || (e > 1 && (s > limit/(e-1) || s < -limit/(e-1))) {
			return 0, 0, false
		}
		if s > 0 {
			maxOff += (e - 1) * s
		} else {
			minOff += (e - 1) * s
		}
		if maxOff >= limit || minOff <= -limit {
			return 0, 0, false
		}
		if t.Strides == nil {
			if dense > limit/e {
				return 0, 0, false
			}
			dense *= e
		}
	}
	if maxOff+1 > limit/sz || -minOff > limit/sz || t.ByteOffset >= uint64(limit) {
		return 0, 0, false
	}
	base := uint64(uintptr(t.Data)) + t.ByteOffset
	if base < t.ByteOffset { // wrapped
		return 0, 0, false
	}
	first, end := base-uint64(-minOff*sz), base+uint64((maxOff+1)*sz)
	if first > base || end < base || uint64(uintptr(end)) != end {
		return 0, 0, false
	}
	return uintptr(first), uintptr(end), true
}

// checkBounds refuses a Tensor the library handed out (a Pool's storage, a
// plan array) whose exported fields were changed to describe bytes outside
// what the library described: its host views and kernel uses would read
// or write past the owner's memory. Tensors the caller made (NewTensor, a
// literal) describe the caller's memory and are not checked.
func (t *Tensor) checkBounds(op, name string) error {
	if t.owner == nil {
		return nil
	}
	lo, hi, ok := t.span()
	if !ok {
		return argError(op, "%s has a malformed descriptor (shape %v, strides %v, dtype %v)",
			name, t.Shape, t.Strides, t.DType)
	}
	if lo == hi {
		return nil
	}
	if lo < t.lo || hi > t.hi {
		return argError(op, "%s (shape %v, strides %v, byte offset %d, dtype %v) reaches outside "+
			"the %d bytes of memory the library handed it out for", name, t.Shape, t.Strides,
			t.ByteOffset, t.DType, t.hi-t.lo)
	}
	return nil
}

// holdOwner holds the Pool or Batch whose memory t describes (as its own
// calls do) so that Close cannot free that memory while a host view reads
// it: after Close the view is ErrClosed, never a read of freed memory. The
// returned function lets go. Tensors without an owner (NewTensor) describe
// the caller's memory and need nothing.
func (t *Tensor) holdOwner(op string) (func(), error) {
	switch o := t.owner.(type) {
	case *Pool:
		if _, err := o.acquire(op); err != nil {
			return nil, err
		}
		return o.release, nil
	case *Batch:
		if _, err := o.acquire(op); err != nil {
			return nil, err
		}
		return o.release, nil
	}
	return func() {}, nil
}

// NewTensor describes dense row-major memory at data, checked by the
// library (pkv_tensor_init): ndim in [1, MaxDims], no negative extent, known
// dtype and device.
func NewTensor(data unsafe.Pointer, dtype DType, device DeviceType, deviceID int32,
	shape []int64) (Tensor, error) {
	const op = "pkv_tensor_init"
	if len(shape) == 0 || len(shape) > MaxDims {
		return Tensor{}, argError(op, "shape has %d dimensions, want 1..%d", len(shape), MaxDims)
	}
	var shp [MaxDims]C.int64_t
	for i, s := range shape {
		shp[i] = C.int64_t(s)
	}
	var t C.pkv_tensor
	if err := callChecked(op, []pointerArg{{"data", data, false}}, func() C.pkvgo_result {
		return C.pkvgo_tensor_init(data, C.uint32_t(dtype), C.int32_t(device), C.int32_t(deviceID),
			C.int32_t(len(shape)), &shp[0], &t)
	}); err != nil {
		return Tensor{}, err
	}
	return fromC(&t), nil
}

// NumElements is the product of the extents.
func (t *Tensor) NumElements() int64 {
	if t == nil {
		return 0
	}
	n := int64(1)
	for _, s := range t.Shape {
		n *= s
	}
	return n
}

// toC fills a descriptor. The result lives in Go memory and holds only
// t.Data, which must not be a Go pointer.
func (t *Tensor) toC(op, name string, out *C.pkv_tensor) error {
	if t == nil {
		return argError(op, "%s is nil", name)
	}
	if len(t.Shape) == 0 || len(t.Shape) > MaxDims {
		return argError(op, "%s has %d dimensions, want 1..%d", name, len(t.Shape), MaxDims)
	}
	if t.Strides != nil && len(t.Strides) != len(t.Shape) {
		return argError(op, "%s has %d strides for %d dimensions", name, len(t.Strides),
			len(t.Shape))
	}
	*out = C.pkv_tensor{}
	out.data = t.Data
	out.byte_offset = C.uint64_t(t.ByteOffset)
	out.dtype = C.uint32_t(t.DType)
	out.device_type = C.int32_t(t.Device)
	out.device_id = C.int32_t(t.DeviceID)
	out.ndim = C.int32_t(len(t.Shape))
	for i, s := range t.Shape {
		out.shape[i] = C.int64_t(s)
	}
	for i, s := range t.Strides {
		out.strides[i] = C.int64_t(s)
	}
	return nil
}

func fromC(t *C.pkv_tensor) Tensor {
	n := int(t.ndim)
	if n < 0 || n > MaxDims {
		n = 0
	}
	out := Tensor{
		Data:       t.data,
		ByteOffset: uint64(t.byte_offset),
		DType:      DType(t.dtype),
		Device:     DeviceType(t.device_type),
		DeviceID:   int32(t.device_id),
		Shape:      make([]int64, n),
	}
	dense := true
	for i := 0; i < n; i++ {
		out.Shape[i] = int64(t.shape[i])
		if t.strides[i] != 0 {
			dense = false
		}
	}
	if !dense {
		out.Strides = make([]int64, n)
		for i := 0; i < n; i++ {
			out.Strides[i] = int64(t.strides[i])
		}
	}
	return out
}

// hostView checks that t is dense CPU memory of dtype and returns its
// element count.
func (t *Tensor) hostView(op string, dtype DType) (int, error) {
	if t == nil {
		return 0, argError(op, "the tensor is nil")
	}
	if t.Device != CPU {
		return 0, &Error{Code: CodeUnsupported, Op: op, Msg: "tensor lives on " + t.Device.String() +
			", not host memory"}
	}
	if t.DType != dtype {
		return 0, argError(op, "tensor dtype is %v, not %v", t.DType, dtype)
	}
	if t.Strides != nil && len(t.Strides) != len(t.Shape) {
		// The library refuses such a descriptor (toC); indexing Strides by
		// the dimensions of Shape would panic.
		return 0, argError(op, "tensor has %d strides for %d dimensions", len(t.Strides), len(t.Shape))
	}
	if t.Strides != nil {
		expect := int64(1)
		for i := len(t.Shape) - 1; i >= 0; i-- {
			if t.Shape[i] != 1 && t.Strides[i] != expect {
				return 0, argError(op, "tensor is not dense row-major")
			}
			expect *= t.Shape[i]
		}
	}
	// A malformed descriptor (a negative extent, more bytes than any host
	// memory holds, no data) would make the slice below, or the copy's make,
	// panic. Go allocates at most 1<<48 bytes (its maxAlloc on 64-bit
	// hosts), and no host address range is larger.
	const maxBytes = int64(1) << 48
	maxElems := maxBytes
	if sz := dtype.Size(); sz > 0 {
		maxElems /= int64(sz)
	}
	n := int64(1)
	for i, e := range t.Shape {
		if e < 0 {
			return 0, argError(op, "tensor extent %d is %d", i, e)
		}
		if e != 0 && n > maxElems/e {
			return 0, argError(op, "tensor shape %v holds more bytes than host memory can", t.Shape)
		}
		n *= e
	}
	if n > 0 && t.Data == nil {
		return 0, argError(op, "tensor data is nil but its shape %v holds %d elements", t.Shape, n)
	}
	if err := t.checkBounds(op, "the tensor"); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Float32s is a []float32 over a dense CPU f32 tensor's memory, without
// copying. It is valid as long as the memory is (for pool storage: until
// the pool is closed); on a Tensor whose Pool or Batch is already closed
// it is ErrClosed.
// The slice does not keep the Pool or Batch alive: keep the Tensor (or
// its owner) reachable while you use it, e.g. with runtime.KeepAlive.
func (t *Tensor) Float32s() ([]float32, error) {
	n, err := t.liveHostView("Tensor.Float32s", Float32)
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*float32)(unsafe.Add(t.Data, t.ByteOffset)), n), nil
}

// liveHostView is hostView for a zero-copy view: it also checks that the
// Tensor's owner is not closed (a later Close still ends the view's
// validity, as documented on each view).
func (t *Tensor) liveHostView(op string, dtype DType) (int, error) {
	n, err := t.hostView(op, dtype)
	if err != nil {
		return 0, err
	}
	done, err := t.holdOwner(op)
	if err != nil {
		return 0, err
	}
	done()
	return n, nil
}

// Uint16s is a []uint16 over a dense CPU f16 or bf16 tensor's memory.
func (t *Tensor) Uint16s() ([]uint16, error) {
	if t == nil {
		return nil, argError("Tensor.Uint16s", "the tensor is nil")
	}
	dt := t.DType
	if dt != Float16 && dt != BFloat16 {
		return nil, argError("Tensor.Uint16s", "tensor dtype is %v, not f16 or bf16", dt)
	}
	n, err := t.liveHostView("Tensor.Uint16s", dt)
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*uint16)(unsafe.Add(t.Data, t.ByteOffset)), n), nil
}

// Codes is a []uint8 over a dense CPU FP8 tensor's memory (the stored
// codes; their values are code * the pool's K or V scale).
func (t *Tensor) Codes() ([]uint8, error) {
	if t == nil {
		return nil, argError("Tensor.Codes", "the tensor is nil")
	}
	dt := t.DType
	if !isFP8(dt) {
		return nil, argError("Tensor.Codes", "tensor dtype is %v, not fp8", dt)
	}
	n, err := t.liveHostView("Tensor.Codes", dt)
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*uint8)(unsafe.Add(t.Data, t.ByteOffset)), n), nil
}

// Int32s copies a dense CPU i32 tensor into a new slice (ErrClosed once
// the Pool or Batch that handed the Tensor out is closed).
func (t *Tensor) Int32s() ([]int32, error) {
	n, err := t.hostView("Tensor.Int32s", Int32)
	if err != nil {
		return nil, err
	}
	done, err := t.holdOwner("Tensor.Int32s")
	if err != nil {
		return nil, err
	}
	defer done()
	if n == 0 {
		return []int32{}, nil
	}
	out := make([]int32, n)
	copy(out, unsafe.Slice((*int32)(unsafe.Add(t.Data, t.ByteOffset)), n))
	return out, nil
}

// Int64s copies a dense CPU i64 tensor into a new slice (ErrClosed once
// the Pool or Batch that handed the Tensor out is closed).
func (t *Tensor) Int64s() ([]int64, error) {
	n, err := t.hostView("Tensor.Int64s", Int64)
	if err != nil {
		return nil, err
	}
	done, err := t.holdOwner("Tensor.Int64s")
	if err != nil {
		return nil, err
	}
	defer done()
	if n == 0 {
		return []int64{}, nil
	}
	out := make([]int64, n)
	copy(out, unsafe.Slice((*int64)(unsafe.Add(t.Data, t.ByteOffset)), n))
	return out, nil
}
