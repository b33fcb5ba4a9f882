package pagedkv

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// EventV2 is a KV event with what vLLM's carry: the block's token ids, the
// block size and the medium.
type EventV2 struct {
	Event
	Medium    uint32 // MediumDevice, MediumHost or MediumFile
	BlockSize uint32
	TokenIDs  []int32 // a stored block's ids; nil otherwise
}

const maxDrainV2 = 4096

// DrainEventsV2 moves up to max oldest events of every medium out of the
// pool (pkv_pool_drain_events_v2). It shares one queue with DrainEvents.
func (p *Pool) DrainEventsV2(max int) ([]EventV2, error) {
	const op = "pkv_pool_drain_events_v2"
	if max < 0 {
		return nil, argError(op, "max %d is negative", max)
	}
	if max > maxDrainV2 {
		max = maxDrainV2 // token buffers are max * block size
	}
	ptr, err := p.acquire(op)
	if err != nil {
		return nil, err
	}
	defer p.release()
	if max == 0 {
		return nil, nil
	}
	bs := int(p.opts.BlockSize)
	// C memory: the library writes into both buffers.
	evp := C.calloc(C.size_t(max), C.size_t(unsafe.Sizeof(C.pkv_event_v2{})))
	idp := C.calloc(C.size_t(max*bs), 4)
	defer C.free(evp)
	defer C.free(idp)
	if evp == nil || idp == nil { // nothing was drained
		return nil, &Error{Code: CodeOutOfMemory, Op: op,
			Msg: fmt.Sprintf("cannot allocate buffers for %d events of %d tokens", max, bs)}
	}
	evs := unsafe.Slice((*C.pkv_event_v2)(evp), max)
	ids := unsafe.Slice((*C.int32_t)(idp), max*bs)
	for i := range evs {
		evs[i].struct_size = C.uint32_t(unsafe.Sizeof(evs[i]))
	}
	var n C.uint64_t
	if err := check(op, C.pkvgo_pool_drain_events_v2(ptr, &evs[0], C.uint64_t(max), &ids[0],
		C.uint64_t(max*bs), &n)); err != nil {
		return nil, err
	}
	out := make([]EventV2, int(n))
	for i := range out {
		c := &evs[i]
		out[i] = EventV2{
			Event: Event{
				SeqNo:      uint64(c.seq_no),
				Type:       EventType(c._type),
				BlockID:    int32(c.block_id),
				BlockHash:  *(*BlockHash)(unsafe.Pointer(&c.block_hash)),
				ParentHash: *(*BlockHash)(unsafe.Pointer(&c.parent_hash)),
				HasParent:  c.has_parent != 0,
				NumTokens:  uint32(c.num_tokens),
				LoraID:     uint64(c.lora_id),
			},
			Medium:    uint32(c.medium),
			BlockSize: uint32(c.block_size),
		}
		if c.num_token_ids > 0 {
			t := make([]int32, int(c.num_token_ids))
			for k := range t {
				t[k] = int32(ids[int(c.token_offset)+k])
			}
			out[i].TokenIDs = t
		}
	}
	return out, nil
}

// Wire encodings of PublisherOptions.
const (
	EventsEncodingMap   = uint32(C.PKV_EVENTS_ENCODING_MAP)   // events as maps (vLLM after PR 42892)
	EventsEncodingArray = uint32(C.PKV_EVENTS_ENCODING_ARRAY) // tagged arrays (vLLM 0.9 to 0.23)
	EventsHashInt       = uint32(C.PKV_EVENTS_HASH_INT)       // uint64 of the digest's last 8 bytes
	EventsHashBytes     = uint32(C.PKV_EVENTS_HASH_BYTES)     // the whole digest
)

// PublisherOptions configures an EventPublisher; the zero value means the
// library's defaults (topic "", buffer 10000 batches, hwm 100000, map
// events, int hashes, medium "GPU"/"CPU" by the pool's device).
type PublisherOptions struct {
	Topic            string
	DataParallelRank uint32
	BufferSteps      uint64 // 0 = the default; NoReplayBuffer for none
	HWM              int32  // 0 = the default; NoHWM for no limit
	EventEncoding    uint32
	HashEncoding     uint32
	DeviceMedium     string
	// The C options' zero values, which the fields above cannot express
	// (their zero is the default): keep no batches for replay
	// (buffer_steps 0), and set no send high-water mark (hwm 0: ZeroMQ
	// queues without limit). Each overrides its field.
	NoReplayBuffer bool
	NoHWM          bool
	// Replay answers [topic, seq, batch] and end ["", -1, empty], as vLLM
	// 0.33 on (replay_with_topic); false: [seq, batch] and [-1, empty].
	ReplayWithTopic bool
}

// PublisherStats are an EventPublisher's counters.
type PublisherStats struct {
	BatchesPublished    uint64
	EventsPublished     uint64
	PoolEventsPublished uint64
	PoolEventsDropped   uint64 // lost to the pool's max_events since the publisher was made
	ReplayRequests      uint64
}

// EventPublisher sends a pool's KV events over ZeroMQ in vLLM's wire format
// (pkv_event_publisher_*): a router written for vLLM's KV events consumes
// them unchanged. Safe for concurrent use; Close it when done.
type EventPublisher struct {
	h *publisherHandle // shared by copies of the struct (one destroy)
}

type publisherHandle struct {
	mu  sync.RWMutex
	ptr *C.pkv_event_publisher
}

func (h *publisherHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ptr != nil {
		C.pkv_event_publisher_destroy(h.ptr)
		h.ptr = nil
		runtime.SetFinalizer(h, nil)
	}
}

// NewEventPublisher publishes pool's events on endpoint (bound if it holds
// "*" or "::" or is ipc:// or inproc://, else connected), with a replay
// socket bound at replayEndpoint unless it is "". ErrUnsupported in a build
// without PAGEDKV_EVENTS.
func NewEventPublisher(pool *Pool, endpoint, replayEndpoint string, opts *PublisherOptions) (*EventPublisher, error) {
	const op = "pkv_event_publisher_create"
	// C reads a string up to its first NUL: refuse one inside.
	strs := [][2]string{{"endpoint", endpoint}, {"replayEndpoint", replayEndpoint}}
	if opts != nil {
		strs = append(strs, [2]string{"Topic", opts.Topic}, [2]string{"DeviceMedium", opts.DeviceMedium})
	}
	for _, s := range strs {
		if err := checkCString(op, s[0], s[1]); err != nil {
			return nil, err
		}
	}
	ptr, err := pool.acquire(op)
	if err != nil {
		return nil, err
	}
	defer pool.release()
	var o C.pkv_event_publisher_options
	if err := check("pkv_event_publisher_options_init_sized", C.pkvgo_event_publisher_options_init_sized(&o, C.size_t(C.sizeof_pkv_event_publisher_options))); err != nil {
		return nil, err
	}
	var free []unsafe.Pointer
	defer func() {
		for _, f := range free {
			C.free(f)
		}
	}()
	cstr := func(s string) *C.char {
		c := C.CString(s)
		free = append(free, unsafe.Pointer(c))
		return c
	}
	if opts != nil {
		o.topic = cstr(opts.Topic)
		opts.fill(&o)
		if opts.DeviceMedium != "" {
			o.device_medium = cstr(opts.DeviceMedium)
		}
	}
	var replay *C.char
	if replayEndpoint != "" {
		replay = cstr(replayEndpoint)
	}
	var out *C.pkv_event_publisher
	if err := check(op, C.pkvgo_event_publisher_create(ptr, cstr(endpoint), replay, &o, &out)); err != nil {
		return nil, err
	}
	pub := &EventPublisher{h: &publisherHandle{ptr: out}}
	runtime.SetFinalizer(pub.h, (*publisherHandle).close)
	return pub, nil
}

// fill sets o's numeric fields from opts (o holds the library's defaults).
func (opts *PublisherOptions) fill(o *C.pkv_event_publisher_options) {
	o.data_parallel_rank = C.uint32_t(opts.DataParallelRank)
	if opts.NoReplayBuffer {
		o.buffer_steps = 0
	} else if opts.BufferSteps != 0 {
		o.buffer_steps = C.uint64_t(opts.BufferSteps)
	}
	if opts.NoHWM {
		o.hwm = 0
	} else if opts.HWM != 0 {
		o.hwm = C.int32_t(opts.HWM)
	}
	o.event_encoding = C.uint32_t(opts.EventEncoding)
	o.hash_encoding = C.uint32_t(opts.HashEncoding)
	if opts.ReplayWithTopic {
		o.replay_with_topic = 1
	}
}

// cOptionsForTest: the buffer_steps, hwm and replay_with_topic that opts
// (nil: none) gives the library, for the tests (cgo is not allowed in
// _test files).
func (opts *PublisherOptions) cOptionsForTest() (bufferSteps uint64, hwm int32, withTopic uint32, err error) {
	var o C.pkv_event_publisher_options
	if err := check("pkv_event_publisher_options_init_sized", C.pkvgo_event_publisher_options_init_sized(&o, C.size_t(C.sizeof_pkv_event_publisher_options))); err != nil {
		return 0, 0, 0, err
	}
	if opts != nil {
		opts.fill(&o)
	}
	return uint64(o.buffer_steps), int32(o.hwm), uint32(o.replay_with_topic), nil
}

func (p *EventPublisher) acquire(op string) (*C.pkv_event_publisher, error) {
	if p == nil || p.h == nil {
		return nil, closedError(op, "event publisher")
	}
	p.h.mu.RLock()
	if p.h.ptr == nil {
		p.h.mu.RUnlock()
		return nil, closedError(op, "event publisher")
	}
	return p.h.ptr, nil
}

func (p *EventPublisher) release() {
	p.h.mu.RUnlock()
	runtime.KeepAlive(p)
}

// Publish drains the pool's pending events and sends them as one batch
// (none when there are none); it returns the pool events drained. Call it
// once per engine step.
func (p *EventPublisher) Publish() (uint64, error) {
	const op = "pkv_event_publisher_publish"
	ptr, err := p.acquire(op)
	if err != nil {
		return 0, err
	}
	defer p.release()
	var n C.uint64_t
	if err := check(op, C.pkvgo_event_publisher_publish(ptr, &n)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// Stats returns the publisher's counters.
func (p *EventPublisher) Stats() (PublisherStats, error) {
	const op = "pkv_event_publisher_get_stats"
	ptr, err := p.acquire(op)
	if err != nil {
		return PublisherStats{}, err
	}
	defer p.release()
	var s C.pkv_event_publisher_stats
	if err := check("pkv_event_publisher_stats_init_sized", C.pkvgo_event_publisher_stats_init_sized(&s, C.size_t(C.sizeof_pkv_event_publisher_stats))); err != nil {
		return PublisherStats{}, err
	}
	if err := check(op, C.pkvgo_event_publisher_get_stats(ptr, &s)); err != nil {
		return PublisherStats{}, err
	}
	return PublisherStats{
		BatchesPublished:    uint64(s.batches_published),
		EventsPublished:     uint64(s.events_published),
		PoolEventsPublished: uint64(s.pool_events_published),
		PoolEventsDropped:   uint64(s.pool_events_dropped),
		ReplayRequests:      uint64(s.replay_requests),
	}, nil
}

// Endpoint is the PUB endpoint after the rank offset (a bound one as
// ZeroMQ reports it, with the port a "*" got); ReplayEndpoint likewise ("" if none).
func (p *EventPublisher) Endpoint() (string, error) { return p.endpoint(0) }

// ReplayEndpoint: see Endpoint.
func (p *EventPublisher) ReplayEndpoint() (string, error) { return p.endpoint(1) }

func (p *EventPublisher) endpoint(which uint32) (string, error) {
	const op = "pkv_event_publisher_endpoint"
	ptr, err := p.acquire(op)
	if err != nil {
		return "", err
	}
	defer p.release()
	// An endpoint has no length limit (an inproc:// name can be any
	// length): grow the buffer to what the library asks for (its length
	// without the NUL, which needs a byte too).
	buf := make([]byte, 256)
	for try := 0; ; try++ {
		var n C.uint64_t
		err := check(op, C.pkvgo_event_publisher_endpoint(ptr, C.uint32_t(which),
			(*C.char)(unsafe.Pointer(&buf[0])), C.uint64_t(len(buf)), &n))
		if err == nil {
			if uint64(n) > uint64(len(buf)) {
				return "", &Error{Code: CodeInternal, Op: op, Msg: "the library reported a length past the buffer"}
			}
			return string(buf[:n]), nil
		}
		if e, ok := err.(*Error); ok && e.Code == CodeBufferTooSmall && uint64(n) >= uint64(len(buf)) &&
			uint64(n) < 1<<31 && try < 4 {
			buf = make([]byte, int(n)+1)
			continue
		}
		return "", err
	}
}

// Close stops the publisher (undelivered messages are dropped). Idempotent.
func (p *EventPublisher) Close() error {
	if p == nil || p.h == nil {
		return nil
	}
	p.h.close()
	return nil
}
