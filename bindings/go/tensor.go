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

// Host views of a dense CPU tensor's memory, for the three element types
// of KV storage:
//
//   - float32: f32 tensors (Float32s and the other *Float32s methods),
//   - uint16: the bit patterns of f16 and bf16 tensors (*Uint16s),
//   - uint8: the codes of FP8 tensors (*Codes; their values are code * the
//     pool's K or V scale).
//
// The copying forms, ReadFloat32s / WriteFloat32s (and the Uint16s and
// Codes ones), and the scoped form, WithFloat32s (WithUint16s, WithCodes),
// cannot outlive the memory: on a Tensor whose Pool is closed they are
// ErrClosed. Float32s, Uint16s and Codes (and their Unsafe names) return a
// slice over the memory that nothing ties to its owner.
//
// None of them takes the pool's KV lock: reading or writing the storage
// while a step on another goroutine writes it (CacheWrite, CopyBlocks, a
// swap-in, the copy-on-write copies of Prepare) is the caller's race, as
// with any view of the storage (docs/threading.md). Pool.SwapBlocks copies
// whole blocks under that lock.

// hostElem is the element type of a host view.
type hostElem interface{ float32 | uint16 | uint8 }

// hostViewOf checks t as a host view of E's dtypes and returns its element
// count (hostView; the owner is not checked).
func hostViewOf[E hostElem](t *Tensor, op string) (int, error) {
	if t == nil {
		return 0, argError(op, "the tensor is nil")
	}
	var zero E
	switch any(zero).(type) {
	case uint16:
		if t.DType != Float16 && t.DType != BFloat16 {
			return 0, argError(op, "tensor dtype is %v, not f16 or bf16", t.DType)
		}
		return t.hostView(op, t.DType)
	case uint8:
		if !isFP8(t.DType) {
			return 0, argError(op, "tensor dtype is %v, not fp8", t.DType)
		}
		return t.hostView(op, t.DType)
	}
	return t.hostView(op, Float32)
}

// rawHostSlice is the slice over t's n elements (nil for none); t was
// checked by hostViewOf.
func rawHostSlice[E hostElem](t *Tensor, n int) []E {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*E)(unsafe.Add(t.Data, t.ByteOffset)), n)
}

// unsafeHostView is Float32s, Uint16s and Codes: the checks, ErrClosed if
// the owner is closed now, and a slice nothing keeps valid.
func unsafeHostView[E hostElem](t *Tensor, op string) ([]E, error) {
	n, err := hostViewOf[E](t, op)
	if err != nil {
		return nil, err
	}
	done, err := t.holdOwner(op)
	if err != nil {
		return nil, err
	}
	done()
	return rawHostSlice[E](t, n), nil
}

// refuseReadOnly refuses writing a step plan's array through a host view
// (the plan arrays are i32/i64, so only a Tensor whose DType was changed
// gets here).
func (t *Tensor) refuseReadOnly(op string) error {
	if _, ok := t.owner.(*Batch); ok {
		return argError(op, "the tensor is a step plan's array (read-only)")
	}
	return nil
}

// readHost copies elements [offset, offset+len(dst)) of t, or as many as
// it has from offset on, into dst.
func readHost[E hostElem](t *Tensor, op string, dst []E, offset int) (int, error) {
	n, err := hostViewOf[E](t, op)
	if err != nil {
		return 0, err
	}
	if offset < 0 || offset > n {
		return 0, argError(op, "offset %d is outside the tensor's %d elements", offset, n)
	}
	done, err := t.holdOwner(op)
	if err != nil {
		return 0, err
	}
	defer done()
	m := n - offset
	if len(dst) < m {
		m = len(dst)
	}
	if m == 0 {
		return 0, nil
	}
	return copy(dst[:m], rawHostSlice[E](t, n)[offset:offset+m]), nil
}

// writeHost copies src into elements [offset, offset+len(src)) of t, all
// of them or (an error) none.
func writeHost[E hostElem](t *Tensor, op string, offset int, src []E) (int, error) {
	n, err := hostViewOf[E](t, op)
	if err != nil {
		return 0, err
	}
	if err := t.refuseReadOnly(op); err != nil {
		return 0, err
	}
	if offset < 0 || offset > n || len(src) > n-offset {
		return 0, argError(op, "%d elements at offset %d do not fit in the tensor's %d elements",
			len(src), offset, n)
	}
	done, err := t.holdOwner(op)
	if err != nil {
		return 0, err
	}
	defer done()
	if len(src) == 0 {
		return 0, nil
	}
	return copy(rawHostSlice[E](t, n)[offset:], src), nil
}

// withHost lends fn a slice over t's memory, keeping a Pool's storage
// allocated until fn returns (Pool.pinStorage: no lock is held while fn
// runs).
func withHost[E hostElem](t *Tensor, op string, fn func([]E) error) error {
	if fn == nil {
		return argError(op, "the callback is nil")
	}
	n, err := hostViewOf[E](t, op)
	if err != nil {
		return err
	}
	if err := t.refuseReadOnly(op); err != nil {
		return err
	}
	if p, ok := t.owner.(*Pool); ok {
		unpin, err := p.pinStorage(op)
		if err != nil {
			return err
		}
		defer unpin() // also when fn panics
	}
	return fn(rawHostSlice[E](t, n))
}

// ReadFloat32s copies elements of a dense CPU f32 tensor, from element
// offset on (offsets in elements of the dense row-major tensor), into dst:
// min(len(dst), elements-offset) of them, returning how many. offset may
// be 0..the element count; outside that it is ErrInvalidArgument. On a
// Tensor whose Pool (or Batch) is closed it is ErrClosed. The copy is
// made while holding the pool, so Close waits for it.
func (t *Tensor) ReadFloat32s(dst []float32, offset int) (int, error) {
	return readHost(t, "Tensor.ReadFloat32s", dst, offset)
}

// WriteFloat32s copies src into a dense CPU f32 tensor at element offset
// and returns len(src). All of src must fit (offset+len(src) <= the
// element count); otherwise it is ErrInvalidArgument and nothing is
// written. ErrClosed once the Tensor's Pool is closed.
func (t *Tensor) WriteFloat32s(offset int, src []float32) (int, error) {
	return writeHost(t, "Tensor.WriteFloat32s", offset, src)
}

// WithFloat32s calls fn with a []float32 over a dense CPU f32 tensor's
// memory (no copy; nil for a tensor of no elements) and returns fn's
// error. Writes through the slice reach the tensor. A Pool's storage stays
// allocated until fn returns, even if the pool is closed meanwhile (Close
// then returns without waiting, and the last such callback to return
// destroys the pool); fn may call the pool, including Close. On a Tensor
// whose Pool is already closed it is ErrClosed and fn is not called.
//
// The slice must not be used after fn returns (kept in a variable, a
// struct, a goroutine or a closure that outlives the call): like an
// unsafe.Pointer into the storage, it is then valid only as long as the
// pool is open.
func (t *Tensor) WithFloat32s(fn func(s []float32) error) error {
	return withHost(t, "Tensor.WithFloat32s", fn)
}

// UnsafeFloat32s is a []float32 over a dense CPU f32 tensor's memory,
// without copying, that nothing ties to the memory's owner: for pool
// storage it is valid until the pool is closed, and a read or write
// through it after Pool.Close, or after the Pool and the Tensor became
// unreachable and the pool's finalizer closed it, touches freed memory (a
// fatal fault, or silent corruption of whatever reuses it). Keep the
// Tensor (or its Pool) reachable, e.g. with runtime.KeepAlive, and do not
// close the pool while the slice is in use. On a Tensor whose Pool or
// Batch is already closed it is ErrClosed. Prefer WithFloat32s (scoped)
// or ReadFloat32s / WriteFloat32s (copies).
func (t *Tensor) UnsafeFloat32s() ([]float32, error) {
	return unsafeHostView[float32](t, "Tensor.UnsafeFloat32s")
}

// Float32s is UnsafeFloat32s, under its old name: a []float32 over a
// dense CPU f32 tensor's memory, without copying. It is valid as long as
// the memory is (for pool storage: until the pool is closed); on a Tensor
// whose Pool or Batch is already closed it is ErrClosed.
// The slice does not keep the Pool or Batch alive: keep the Tensor (or
// its owner) reachable while you use it, e.g. with runtime.KeepAlive.
// Used after Pool.Close, or after the pool's finalizer closed it, the
// slice reads and writes freed memory (a fatal fault): nothing in the
// binding can know when the slice is no longer referenced.
//
// Deprecated: the slice can outlive the pool's storage. Use WithFloat32s
// (a slice scoped to a callback, during which Close cannot free the
// storage) or ReadFloat32s / WriteFloat32s (copies); UnsafeFloat32s is
// this method under a name that says what it is.
func (t *Tensor) Float32s() ([]float32, error) {
	return unsafeHostView[float32](t, "Tensor.Float32s")
}

// ReadUint16s is ReadFloat32s for a dense CPU f16 or bf16 tensor: it
// copies the elements' bit patterns (FromF16, FromBF16).
func (t *Tensor) ReadUint16s(dst []uint16, offset int) (int, error) {
	return readHost(t, "Tensor.ReadUint16s", dst, offset)
}

// WriteUint16s is WriteFloat32s for a dense CPU f16 or bf16 tensor: src
// holds bit patterns (ToF16, ToBF16).
func (t *Tensor) WriteUint16s(offset int, src []uint16) (int, error) {
	return writeHost(t, "Tensor.WriteUint16s", offset, src)
}

// WithUint16s is WithFloat32s for a dense CPU f16 or bf16 tensor: fn gets
// a []uint16 of bit patterns over its memory, which must not be used
// after fn returns.
func (t *Tensor) WithUint16s(fn func(s []uint16) error) error {
	return withHost(t, "Tensor.WithUint16s", fn)
}

// UnsafeUint16s is UnsafeFloat32s for a dense CPU f16 or bf16 tensor: a
// []uint16 over its memory that is valid only until the pool is closed.
func (t *Tensor) UnsafeUint16s() ([]uint16, error) {
	return unsafeHostView[uint16](t, "Tensor.UnsafeUint16s")
}

// Uint16s is a []uint16 over a dense CPU f16 or bf16 tensor's memory
// (UnsafeUint16s under its old name): used after Pool.Close, or after the
// pool's finalizer closed it, it reads and writes freed memory.
//
// Deprecated: the slice can outlive the pool's storage. Use WithUint16s
// or ReadUint16s / WriteUint16s; UnsafeUint16s is this method under a name
// that says what it is.
func (t *Tensor) Uint16s() ([]uint16, error) {
	return unsafeHostView[uint16](t, "Tensor.Uint16s")
}

// ReadCodes is ReadFloat32s for a dense CPU FP8 tensor: it copies the
// stored codes (their values are code * the pool's K or V scale).
func (t *Tensor) ReadCodes(dst []uint8, offset int) (int, error) {
	return readHost(t, "Tensor.ReadCodes", dst, offset)
}

// WriteCodes is WriteFloat32s for a dense CPU FP8 tensor: src holds codes.
func (t *Tensor) WriteCodes(offset int, src []uint8) (int, error) {
	return writeHost(t, "Tensor.WriteCodes", offset, src)
}

// WithCodes is WithFloat32s for a dense CPU FP8 tensor: fn gets a []uint8
// of the codes in its memory, which must not be used after fn returns.
func (t *Tensor) WithCodes(fn func(s []uint8) error) error {
	return withHost(t, "Tensor.WithCodes", fn)
}

// UnsafeCodes is UnsafeFloat32s for a dense CPU FP8 tensor: a []uint8 over
// its codes that is valid only until the pool is closed.
func (t *Tensor) UnsafeCodes() ([]uint8, error) {
	return unsafeHostView[uint8](t, "Tensor.UnsafeCodes")
}

// Codes is a []uint8 over a dense CPU FP8 tensor's memory (the stored
// codes; their values are code * the pool's K or V scale), UnsafeCodes
// under its old name: used after Pool.Close, or after the pool's
// finalizer closed it, it reads and writes freed memory.
//
// Deprecated: the slice can outlive the pool's storage. Use WithCodes or
// ReadCodes / WriteCodes; UnsafeCodes is this method under a name that
// says what it is.
func (t *Tensor) Codes() ([]uint8, error) {
	return unsafeHostView[uint8](t, "Tensor.Codes")
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
