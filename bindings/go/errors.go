package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
)

// Code is a pkv_status: 0 for success, negative for errors. Codes are
// pinned by the C ABI and never change meaning.
type Code int32

// The status codes of the C ABI.
const (
	CodeOK              Code = C.PKV_OK
	CodeInvalidArgument Code = C.PKV_E_INVALID_ARGUMENT
	CodeNotFound        Code = C.PKV_E_NOT_FOUND
	CodeOutOfBlocks     Code = C.PKV_E_OUT_OF_BLOCKS
	CodeOutOfMemory     Code = C.PKV_E_OUT_OF_MEMORY
	CodeUnsupported     Code = C.PKV_E_UNSUPPORTED
	CodeCuda            Code = C.PKV_E_CUDA
	CodeBufferTooSmall  Code = C.PKV_E_BUFFER_TOO_SMALL
	CodeInvalidState    Code = C.PKV_E_INVALID_STATE
	CodeInvariant       Code = C.PKV_E_INVARIANT
	CodeInternal        Code = C.PKV_E_INTERNAL
)

// String is the library's static text for the code
// ("PKV_E_OUT_OF_BLOCKS: ...").
func (c Code) String() string {
	return C.GoString(C.pkv_status_string(C.pkv_status(c)))
}

// name is the code's macro name, e.g. "PKV_E_OUT_OF_BLOCKS".
func (c Code) name() string {
	s := c.String()
	if i := strings.IndexByte(s, ':'); i > 0 {
		return s[:i]
	}
	return s
}

// Error is a failed call. Code is the status, Op the C function (or Go
// method) that failed, Msg the library's description of what was wrong with
// which argument.
type Error struct {
	Code Code
	Op   string
	Msg  string

	cause error // set for Go-side conditions with their own sentinel
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("pagedkv: ")
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	b.WriteString(e.Code.name())
	if e.Msg != "" {
		b.WriteString(": ")
		b.WriteString(e.Msg)
	}
	return b.String()
}

// Is reports whether target is the sentinel of e's code, so that
// errors.Is(err, ErrOutOfBlocks) works for any *Error with that code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Op == "" && t.Msg == "" && t.Code == e.Code
}

// Unwrap returns the Go-side cause (ErrClosed) where there is one.
func (e *Error) Unwrap() error { return e.cause }

// Sentinels for errors.Is, one per status code.
var (
	ErrInvalidArgument = &Error{Code: CodeInvalidArgument}
	ErrNotFound        = &Error{Code: CodeNotFound}
	ErrOutOfBlocks     = &Error{Code: CodeOutOfBlocks}
	ErrOutOfMemory     = &Error{Code: CodeOutOfMemory}
	ErrUnsupported     = &Error{Code: CodeUnsupported}
	ErrCuda            = &Error{Code: CodeCuda}
	ErrBufferTooSmall  = &Error{Code: CodeBufferTooSmall}
	ErrInvalidState    = &Error{Code: CodeInvalidState}
	ErrInvariant       = &Error{Code: CodeInvariant}
	ErrInternal        = &Error{Code: CodeInternal}
)

// ErrClosed is the cause of errors from a closed Pool or Batch (which are
// also ErrInvalidState).
var ErrClosed = errors.New("pagedkv: use of a closed object")

func closedError(op, what string) error {
	return &Error{Code: CodeInvalidState, Op: op, Msg: what + " is closed", cause: ErrClosed}
}

// argError is an invalid argument found on the Go side, before any call
// into C.
func argError(op, format string, args ...interface{}) error {
	return &Error{Code: CodeInvalidArgument, Op: op, Msg: fmt.Sprintf(format, args...)}
}
