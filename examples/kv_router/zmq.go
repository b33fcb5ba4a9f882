package main

// The few libzmq calls a KV-event subscriber needs, over cgo (Debian ships
// no Go ZeroMQ package). Each socket is used by one goroutine at a time.

/*
#cgo pkg-config: libzmq
#include <errno.h>
#include <stdlib.h>
#include <zmq.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

type zctx struct{ p unsafe.Pointer }
type zsock struct{ p unsafe.Pointer }

func newContext() *zctx { return &zctx{C.zmq_ctx_new()} }

func (c *zctx) close() { C.zmq_ctx_term(c.p) }

func zerr(what string) error {
	return fmt.Errorf("%s: %s", what, C.GoString(C.zmq_strerror(C.zmq_errno())))
}

func (c *zctx) socket(kind C.int, endpoint string) (*zsock, error) {
	s := C.zmq_socket(c.p, kind)
	if s == nil {
		return nil, zerr("zmq_socket")
	}
	linger := C.int(0)
	C.zmq_setsockopt(s, C.ZMQ_LINGER, unsafe.Pointer(&linger), C.size_t(unsafe.Sizeof(linger)))
	ep := C.CString(endpoint)
	defer C.free(unsafe.Pointer(ep))
	if C.zmq_connect(s, ep) != 0 {
		C.zmq_close(s)
		return nil, zerr("connect " + endpoint)
	}
	return &zsock{s}, nil
}

// subscriber connects a SUB socket to endpoint for messages whose first
// frame starts with topic.
func (c *zctx) subscriber(endpoint, topic string) (*zsock, error) {
	s, err := c.socket(C.ZMQ_SUB, endpoint)
	if err != nil {
		return nil, err
	}
	t := C.CString(topic)
	defer C.free(unsafe.Pointer(t))
	C.zmq_setsockopt(s.p, C.ZMQ_SUBSCRIBE, unsafe.Pointer(t), C.size_t(len(topic)))
	return s, nil
}

// requester connects a DEALER socket for replay requests: a REQ socket
// (vLLM's example subscriber uses one) receives only the first reply.
func (c *zctx) requester(endpoint string) (*zsock, error) { return c.socket(C.ZMQ_DEALER, endpoint) }

func (s *zsock) close() { C.zmq_close(s.p) }

// interrupted: the Go runtime's signals interrupt blocking ZeroMQ calls
// (EINTR); those are retried.
func interrupted() bool { return C.zmq_errno() == C.EINTR }

// poll waits up to ms milliseconds for a message.
func (s *zsock) poll(ms int) bool {
	item := C.zmq_pollitem_t{socket: s.p, events: C.ZMQ_POLLIN}
	rc := C.zmq_poll(&item, 1, C.long(ms))
	for rc < 0 && interrupted() {
		rc = C.zmq_poll(&item, 1, C.long(ms))
	}
	return rc > 0 && item.revents&C.ZMQ_POLLIN != 0
}

func (s *zsock) recvMultipart() ([][]byte, error) {
	var frames [][]byte
	for {
		var m C.zmq_msg_t
		C.zmq_msg_init(&m)
		rc := C.zmq_msg_recv(&m, s.p, 0)
		for rc < 0 && interrupted() {
			rc = C.zmq_msg_recv(&m, s.p, 0)
		}
		if rc < 0 {
			C.zmq_msg_close(&m)
			return nil, zerr("zmq_msg_recv")
		}
		frames = append(frames, C.GoBytes(C.zmq_msg_data(&m), C.int(C.zmq_msg_size(&m))))
		more := C.zmq_msg_more(&m)
		C.zmq_msg_close(&m)
		if more == 0 {
			return frames, nil
		}
	}
}

// sendMultipart sends one message of several frames.
func (s *zsock) sendMultipart(frames ...[]byte) error {
	for i, b := range frames {
		flags := C.int(0)
		if i+1 < len(frames) {
			flags = C.ZMQ_SNDMORE
		}
		p := C.CBytes(b)
		rc := C.zmq_send(s.p, p, C.size_t(len(b)), flags)
		for rc < 0 && interrupted() {
			rc = C.zmq_send(s.p, p, C.size_t(len(b)), flags)
		}
		C.free(p)
		if rc < 0 {
			return zerr("zmq_send")
		}
	}
	return nil
}
