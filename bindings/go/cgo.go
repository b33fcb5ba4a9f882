package pagedkv

// Which libpagedkv is linked: link_shared.go / link_static.go.

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"strings"
	"unsafe"
)

// check turns a wrapped call's result into an error, freeing the message
// copy the C side allocated.
func check(op string, r C.pkvgo_result) error {
	if r.status == C.PKV_OK {
		return nil
	}
	msg := ""
	if r.msg != nil {
		msg = C.GoString(r.msg)
		C.free(unsafe.Pointer(r.msg))
	}
	// The C message starts with the function's name, which Op already holds.
	msg = strings.TrimPrefix(msg, op+": ")
	return &Error{Code: Code(r.status), Op: op, Msg: goNames(op, msg)}
}

// cArena collects C allocations made for one call (strings, multimodal
// item arrays) and frees them together.
type cArena struct{ ptrs []unsafe.Pointer }

func (a *cArena) str(s string) *C.char {
	p := C.CString(s)
	a.ptrs = append(a.ptrs, unsafe.Pointer(p))
	return p
}

func (a *cArena) mmItems(items []MMItem) *C.pkv_mm_item {
	if len(items) == 0 {
		return nil
	}
	size := C.size_t(len(items)) * C.size_t(unsafe.Sizeof(C.pkv_mm_item{}))
	p := C.calloc(1, size)
	if p == nil {
		panic("pagedkv: out of C memory")
	}
	a.ptrs = append(a.ptrs, p)
	arr := unsafe.Slice((*C.pkv_mm_item)(p), len(items))
	for i, it := range items {
		arr[i].offset = C.uint64_t(it.Offset)
		arr[i].length = C.uint64_t(it.Length)
		arr[i].hash = a.str(it.Hash)
	}
	return (*C.pkv_mm_item)(p)
}

// cCopy copies s into C memory owned by the arena (nil for an empty s), so
// that a C struct may point at it without holding a Go pointer.
func cCopy[T uint32 | float32](a *cArena, s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	p := C.calloc(C.size_t(len(s)), C.size_t(unsafe.Sizeof(s[0])))
	if p == nil {
		panic("pagedkv: out of C memory")
	}
	a.ptrs = append(a.ptrs, p)
	copy(unsafe.Slice((*T)(p), len(s)), s)
	return p
}

// uint32s copies s into C memory owned by the arena (nil for an empty s).
func (a *cArena) uint32s(s []uint32) *C.uint32_t { return (*C.uint32_t)(cCopy(a, s)) }

func (a *cArena) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
	a.ptrs = nil
}

// int32Ptr returns the address of a slice's first element, or nil for an
// empty slice.
func int32Ptr(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

// pointerArg is one caller-supplied pointer of a C call and the name the
// Go API gives it: a Tensor's descriptor (tensor true), a stream, a host
// buffer.
type pointerArg struct {
	name   string
	p      unsafe.Pointer
	tensor bool
}

// isCgoPointerPanic reports whether r is the panic of cgo's pointer check,
// which runs before a C call (cgocheck, on by default).
func isCgoPointerPanic(r interface{}) bool {
	e, ok := r.(runtime.Error)
	return ok && strings.Contains(e.Error(), "cgo argument has Go pointer")
}

// callChecked makes the C call f, whose arguments include the caller's
// pointers args. cgo checks them before C runs and panics on a Tensor whose
// Data points into Go memory (its descriptor, in Go memory, then holds a Go
// pointer) or on a stream or buffer pointing at Go memory that holds Go
// pointers: that becomes an ErrInvalidArgument naming the argument, and C
// never ran.
func callChecked(op string, args []pointerArg, f func() C.pkvgo_result) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if !isCgoPointerPanic(r) {
				panic(r)
			}
			err = refusedPointer(op, args)
		}
	}()
	return check(op, f())
}

// refusedPointer is the error of a call whose pointer arguments cgo
// refused, naming the first one it refuses alone.
func refusedPointer(op string, args []pointerArg) error {
	for _, a := range args {
		if a.p == nil || !probeRefused(a.p) {
			continue
		}
		if a.tensor {
			return argError(op, "%s.Data points into Go memory: a Tensor describes memory outside Go "+
				"(C, pinned or device memory); pass Go slices to the slice forms (cgo's pointer rules)", a.name)
		}
		return argError(op, "%s points into Go memory that holds Go pointers (cgo's pointer rules)", a.name)
	}
	return argError(op, "an argument holds a Go pointer that cgo's pointer rules refuse")
}

// probeRefused reports whether cgo's pointer check refuses p as an
// argument.
func probeRefused(p unsafe.Pointer) (refused bool) {
	defer func() {
		if r := recover(); r != nil {
			if !isCgoPointerPanic(r) {
				panic(r)
			}
			refused = true
		}
	}()
	C.pkvgoshim_probe(p)
	return false
}
