package pagedkv

import (
	"errors"
	"strings"
	"testing"
)

func TestDrainEventsV2CarriesTokens(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 32, EnableEvents: true})
	s, err := p.CreateSeq(nil)
	ok(t, err)
	tokens := []int32{5, 9, 2, 7, 11, 3, 8, 1, 4}
	ok(t, s.Append(tokens))
	evs, err := p.DrainEventsV2(16)
	ok(t, err)
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	hashes, err := HashPrefix(&HashOptions{BlockSize: 4}, tokens)
	ok(t, err)
	for i, e := range evs {
		if e.Type != EventBlockStored || e.Medium != MediumDevice || e.BlockSize != 4 ||
			e.BlockHash != hashes[i] || e.HasParent != (i > 0) || e.SeqNo != uint64(i+1) {
			t.Fatalf("event %d: %+v", i, e)
		}
		for k := 0; k < 4; k++ {
			if e.TokenIDs[k] != tokens[4*i+k] {
				t.Fatalf("event %d token %d: %d, want %d", i, k, e.TokenIDs[k], tokens[4*i+k])
			}
		}
	}
	if evs[1].ParentHash != hashes[0] {
		t.Fatal("second block's parent is not the first block")
	}
	if _, err := p.DrainEventsV2(-1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("negative max: %v", err)
	}
}

func TestEventPublisher(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 32, EnableEvents: true, MaxEvents: 2})
	pub, err := NewEventPublisher(p, "inproc://pkv-go-test", "", &PublisherOptions{Topic: "kv", DataParallelRank: 1})
	if errors.Is(err, ErrUnsupported) {
		t.Skip("built without PAGEDKV_EVENTS")
	}
	ok(t, err)
	defer pub.Close()
	ep, err := pub.Endpoint()
	ok(t, err)
	if ep != "inproc://pkv-go-test_dp1" {
		t.Fatalf("endpoint %q", ep)
	}
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append(make([]int32, 20))) // 5 stored events; the pool keeps 2
	n, err := pub.Publish()
	ok(t, err)
	st, err := pub.Stats()
	ok(t, err)
	if n != 2 || st.PoolEventsDropped != 3 || st.BatchesPublished != 1 || st.EventsPublished != 1 {
		t.Fatalf("published %d, stats %+v", n, st)
	}
	ok(t, pub.Close())
	ok(t, pub.Close())
	if _, err := pub.Publish(); !errors.Is(err, ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
	np := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8})
	if _, err := NewEventPublisher(np, "inproc://x", "", nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("pool without events: %v", err)
	}
}

// The C options' zero values (no replay buffer, no high-water mark) are
// reachable through NoReplayBuffer and NoHWM; the fields' zero stays the
// library's default.
func TestPublisherOptionsReachTheLibrary(t *testing.T) {
	for _, c := range []struct {
		opts      *PublisherOptions
		buffer    uint64
		hwm       int32
		withTopic uint32
	}{
		{nil, 10000, 100000, 0},
		{&PublisherOptions{}, 10000, 100000, 0},
		{&PublisherOptions{BufferSteps: 5, HWM: 7}, 5, 7, 0},
		{&PublisherOptions{NoReplayBuffer: true}, 0, 100000, 0},
		{&PublisherOptions{NoHWM: true}, 10000, 0, 0},
		{&PublisherOptions{BufferSteps: 5, HWM: 7, NoReplayBuffer: true, NoHWM: true}, 0, 0, 0},
		{&PublisherOptions{ReplayWithTopic: true}, 10000, 100000, 1},
	} {
		buffer, hwm, withTopic, err := c.opts.cOptionsForTest()
		ok(t, err)
		if buffer != c.buffer || hwm != c.hwm || withTopic != c.withTopic {
			t.Fatalf("%+v: buffer_steps %d hwm %d replay_with_topic %d, want %d %d %d", c.opts, buffer, hwm,
				withTopic, c.buffer, c.hwm, c.withTopic)
		}
	}
	withTopic, err := NewEventPublisher(newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8, EnableEvents: true}),
		"inproc://pkv-go-with-topic", "inproc://pkv-go-with-topic-replay", &PublisherOptions{ReplayWithTopic: true})
	if err == nil {
		withTopic.Close()
	} else if !errors.Is(err, ErrUnsupported) {
		t.Fatal(err)
	}
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 32, EnableEvents: true})
	pub, err := NewEventPublisher(p, "inproc://pkv-go-zero-opts", "inproc://pkv-go-zero-opts-replay",
		&PublisherOptions{NoReplayBuffer: true, NoHWM: true})
	if errors.Is(err, ErrUnsupported) {
		t.Skip("built without PAGEDKV_EVENTS")
	}
	ok(t, err)
	defer pub.Close()
	s, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s.Append(make([]int32, 8)))
	n, err := pub.Publish()
	ok(t, err)
	if n != 2 {
		t.Fatalf("published %d pool events, want 2", n)
	}
}

// An endpoint has no length limit: one past the first buffer (a long
// inproc:// name, the replay endpoint too) is read whole, not refused with
// ErrBufferTooSmall.
func TestEventPublisherLongEndpoint(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8, EnableEvents: true})
	for _, n := range []int{200, 255, 256, 1023, 1024, 3000} {
		name := "inproc://" + strings.Repeat("e", n)
		replay := "inproc://r" + strings.Repeat("r", n)
		pub, err := NewEventPublisher(p, name, replay, nil)
		if errors.Is(err, ErrUnsupported) {
			t.Skip("built without PAGEDKV_EVENTS")
		}
		ok(t, err)
		ep, err := pub.Endpoint()
		ok(t, err)
		if ep != name {
			t.Fatalf("endpoint of %d bytes: got %d bytes %.40q", len(name), len(ep), ep)
		}
		rep, err := pub.ReplayEndpoint()
		ok(t, err)
		if rep != replay {
			t.Fatalf("replay endpoint of %d bytes: got %d bytes", len(replay), len(rep))
		}
		ok(t, pub.Close())
	}
}

// A tcp port that the data-parallel rank pushes past 65535 was refused as
// "endpoint ... has no numeric port to offset": the port is numeric, and
// the message named neither the rank nor the sum. It names both now.
func TestPublisherRankPastTheLastPortIsNamed(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8, EnableEvents: true})
	pub, err := NewEventPublisher(p, "tcp://127.0.0.1:65000", "", &PublisherOptions{DataParallelRank: 1000})
	if errors.Is(err, ErrUnsupported) {
		t.Skip("built without PAGEDKV_EVENTS")
	}
	if pub != nil {
		pub.Close()
		t.Fatal("a publisher on port 66000 was made")
	}
	e := wantErr(t, err, ErrInvalidArgument)
	if !strings.Contains(e.Msg, "66000") || !strings.Contains(e.Msg, "data_parallel_rank") {
		t.Fatalf("%v: want the offset port 66000 and the rank named", err)
	}
	if evs, err := p.DrainEventsV2(8); err != nil || len(evs) != 0 {
		t.Fatalf("the refused publisher drained or failed: %v %v", evs, err)
	}
}
