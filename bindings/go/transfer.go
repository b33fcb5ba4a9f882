package pagedkv

/*
#include "transfer_shim.h"
*/
import "C"

import (
	"errors"
	"runtime"
	"sync"
	"unsafe"
)

// TransferAvailable tells whether this build has the UCX transport
// (pagedkv/transfer.h); without it NewTransferEngine returns ErrUnsupported.
func TransferAvailable() bool { return C.pkv_transfer_available() != 0 }

// Transfer states (Transfer.Poll).
const (
	TransferRunning   = C.PKV_TRANSFER_RUNNING
	TransferDone      = C.PKV_TRANSFER_DONE
	TransferFailed    = C.PKV_TRANSFER_FAILED
	TransferCancelled = C.PKV_TRANSFER_CANCELLED
)

// TransferOptions configures a TransferEngine; the zero value is the default
// (UCX's transports, 30 s import timeout, exports until released).
type TransferOptions struct {
	Transports  string // UCX_TLS list ("shm", "tcp", ...); "" = UCX's choice
	TimeoutMs   uint32 // 0 = 30000; an import not done by then fails
	NoTimeout   bool   // imports never time out
	ExportTTLMs uint32 // 0 = exports live until released
}

// TransferEngine moves sequences between pools over UCX (one UCP context
// and worker). Safe for concurrent use; Close is idempotent.
type TransferEngine struct {
	h *engineHandle // shared by copies of the struct (one destroy)
}

type engineHandle struct {
	mu  sync.RWMutex
	ptr *C.pkv_transfer_engine
}

func (h *engineHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ptr != nil {
		C.pkv_transfer_engine_destroy(h.ptr)
		h.ptr = nil
		runtime.SetFinalizer(h, nil)
	}
}

// NewTransferEngine creates an engine; opts may be nil.
func NewTransferEngine(opts *TransferOptions) (*TransferEngine, error) {
	const op = "pkv_transfer_engine_create"
	var co C.pkv_transfer_options
	if err := check("pkv_transfer_options_init_sized", C.pkvgo_transfer_options_init_sized(&co, C.size_t(C.sizeof_pkv_transfer_options))); err != nil {
		return nil, err
	}
	var arena cArena
	defer arena.free()
	if opts != nil {
		if err := checkCString(op, "Transports", opts.Transports); err != nil {
			return nil, err
		}
		if opts.Transports != "" {
			co.transports = arena.str(opts.Transports)
		}
		if opts.TimeoutMs != 0 {
			co.timeout_ms = C.uint32_t(opts.TimeoutMs)
		}
		if opts.NoTimeout {
			co.timeout_ms = 0
		}
		co.export_ttl_ms = C.uint32_t(opts.ExportTTLMs)
	}
	var ptr *C.pkv_transfer_engine
	if err := check(op, C.pkvgo_transfer_engine_create(&co, &ptr)); err != nil {
		return nil, err
	}
	e := &TransferEngine{h: &engineHandle{ptr: ptr}}
	// As Pool, Batch and EventPublisher: an engine dropped without Close
	// is destroyed by the collector (its exports released), not leaked.
	runtime.SetFinalizer(e.h, (*engineHandle).close)
	return e, nil
}

func (e *TransferEngine) acquire(op string) (*C.pkv_transfer_engine, error) {
	if e == nil || e.h == nil {
		return nil, closedError(op, "transfer engine")
	}
	e.h.mu.RLock()
	if e.h.ptr == nil {
		e.h.mu.RUnlock()
		return nil, closedError(op, "transfer engine")
	}
	return e.h.ptr, nil
}

func (e *TransferEngine) release() {
	e.h.mu.RUnlock()
	runtime.KeepAlive(e)
}

// Close releases every export and the engine. Imports still running keep
// the transport alive until they are closed.
func (e *TransferEngine) Close() error {
	if e == nil || e.h == nil {
		return nil
	}
	e.h.close()
	return nil
}

// Progress serves peers' reads (TCP needs the exporter's progress) and
// expires exports past their TTL. Never blocks.
func (e *TransferEngine) Progress() error {
	const op = "pkv_transfer_engine_progress"
	ptr, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	return check(op, C.pkvgo_transfer_engine_progress(ptr))
}

// NumExports is the number of exports held.
func (e *TransferEngine) NumExports() (int, error) {
	const op = "pkv_transfer_engine_num_exports"
	ptr, err := e.acquire(op)
	if err != nil {
		return 0, err
	}
	defer e.release()
	var n C.uint64_t
	if err := check(op, C.pkvgo_transfer_engine_num_exports(ptr, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Export pins the computed tokens of s and returns the export's id and its
// descriptor, the bytes an importer needs.
func (e *TransferEngine) Export(s Seq) (uint64, []byte, error) {
	const op = "pkv_transfer_export"
	ptr, err := e.acquire(op)
	if err != nil {
		return 0, nil, err
	}
	defer e.release()
	pp, err := s.pool.acquire(op)
	if err != nil {
		return 0, nil, err
	}
	defer s.pool.release()
	var id C.uint64_t
	if err := check(op, C.pkvgo_transfer_export(ptr, pp, C.pkv_seq_id(s.id), &id)); err != nil {
		return 0, nil, err
	}
	// The size query (capacity 0) answers PKV_E_BUFFER_TOO_SMALL with the
	// size; its result goes through check all the same, which frees the
	// message copy the C side made, and any other error is the export's.
	const dop = "pkv_transfer_export_descriptor"
	var size C.uint64_t
	err = check(dop, C.pkvgo_transfer_export_descriptor(ptr, id, nil, 0, &size))
	if err != nil && !errors.Is(err, ErrBufferTooSmall) {
		C.pkv_transfer_export_release(ptr, id)
		return 0, nil, err
	}
	buf := make([]byte, int(size))
	if size > 0 {
		r := C.pkvgo_transfer_export_descriptor(ptr, id, (*C.uint8_t)(unsafe.Pointer(&buf[0])), size, &size)
		if err := check(dop, r); err != nil {
			C.pkv_transfer_export_release(ptr, id)
			return 0, nil, err
		}
	}
	return uint64(id), buf, nil
}

// ReleaseExport unpins an export (ErrNotFound if unknown, released or expired).
func (e *TransferEngine) ReleaseExport(id uint64) error {
	const op = "pkv_transfer_export_release"
	ptr, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	return check(op, C.pkvgo_transfer_export_release(ptr, C.uint64_t(id)))
}

// Transfer is an import in flight. Safe for concurrent use; Close is
// idempotent and cancels a running transfer.
type Transfer struct {
	h *transferHandle // shared by copies of the struct (one destroy)
}

type transferHandle struct {
	mu   sync.Mutex
	ptr  *C.pkv_transfer
	pool *Pool
}

func (h *transferHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ptr != nil {
		C.pkv_transfer_destroy(h.ptr)
		h.ptr = nil
		runtime.SetFinalizer(h, nil)
	}
}

// lock locks the transfer for one call; nil when it is closed (or a nil
// or zero Transfer), with nothing held.
func (t *Transfer) lock() *transferHandle {
	if t == nil || t.h == nil {
		return nil
	}
	t.h.mu.Lock()
	if t.h.ptr == nil {
		t.h.mu.Unlock()
		return nil
	}
	return t.h
}

// Import starts pulling descriptor's sequence into p (opts may be nil).
// The layout must match (ErrInvalidArgument) and the blocks fit
// (ErrOutOfBlocks); on error nothing changed.
func (e *TransferEngine) Import(p *Pool, opts *SeqOptions, descriptor []byte) (*Transfer, error) {
	const op = "pkv_transfer_import"
	if len(descriptor) == 0 {
		return nil, argError(op, "descriptor is empty")
	}
	ptr, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.release()
	var arena cArena
	defer arena.free()
	var co C.pkv_seq_options
	if err := fillSeqOptions(op, opts, &co, &arena); err != nil {
		return nil, err
	}
	pp, err := p.acquire(op)
	if err != nil {
		return nil, err
	}
	defer p.release()
	// The descriptor is copied to C memory: C keeps no Go pointer.
	cd := C.CBytes(descriptor)
	defer C.free(cd)
	var t *C.pkv_transfer
	r := C.pkvgo_transfer_import(ptr, pp, &co, (*C.uint8_t)(cd), C.uint64_t(len(descriptor)), &t)
	if err := check(op, r); err != nil {
		return nil, err
	}
	tr := &Transfer{h: &transferHandle{ptr: t, pool: p}}
	// A transfer dropped without Close is cancelled and freed by the
	// collector: its blocks go back to the pool instead of staying held.
	runtime.SetFinalizer(tr.h, (*transferHandle).close)
	return tr, nil
}

// Poll drives the transfer without blocking: its state and, once
// TransferDone, the new sequence (the caller's). A failed transfer returns
// its error.
func (t *Transfer) Poll() (int, Seq, error) {
	const op = "pkv_transfer_poll"
	h := t.lock()
	if h == nil {
		return 0, Seq{}, closedError(op, "transfer")
	}
	defer h.mu.Unlock()
	var state C.uint32_t
	var id C.pkv_seq_id
	if err := check(op, C.pkvgo_transfer_poll(h.ptr, &state, &id)); err != nil {
		return int(state), Seq{}, err
	}
	if state == TransferDone {
		return int(state), Seq{pool: h.pool, id: SeqID(id)}, nil
	}
	return int(state), Seq{}, nil
}

// Cancel stops the reads and frees the blocks (ErrInvalidState once done).
func (t *Transfer) Cancel() error {
	const op = "pkv_transfer_cancel"
	h := t.lock()
	if h == nil {
		return closedError(op, "transfer")
	}
	defer h.mu.Unlock()
	return check(op, C.pkvgo_transfer_cancel(h.ptr))
}

// Bytes is the number of K/V bytes the transfer reads (fixed when it
// starts).
func (t *Transfer) Bytes() (uint64, error) {
	const op = "pkv_transfer_bytes"
	h := t.lock()
	if h == nil {
		return 0, closedError(op, "transfer")
	}
	defer h.mu.Unlock()
	var n C.uint64_t
	if err := check(op, C.pkvgo_transfer_bytes(h.ptr, &n)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// Close cancels a running transfer and frees it.
func (t *Transfer) Close() error {
	if t == nil || t.h == nil {
		return nil
	}
	t.h.close()
	return nil
}
