package pagedkv

import (
	"errors"
	"strings"
	"testing"
)

func reusePool(t *testing.T, o PoolOptions) *Pool {
	t.Helper()
	o.BlockSize, o.NumBlocks, o.EnableEvents = 4, 8, true
	p, err := NewPool(&o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// computed appends tokens and commits a step over every uncomputed one.
func computed(t *testing.T, p *Pool, s Seq, tokens []int32) {
	t.Helper()
	if err := s.Append(tokens); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info()
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Prepare([]Seq{s}, []int{int(info.NumTokens - info.NumComputedTokens)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b.Close()
}

func TestPartialHitReusesFirstTokensOfACachedBlock(t *testing.T) {
	p := reusePool(t, PoolOptions{EnablePartialReuse: true})
	if !p.Options().EnablePartialReuse {
		t.Fatal("option not reported")
	}
	a, _ := p.CreateSeq(nil)
	computed(t, p, a, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	b, _ := p.CreateSeq(nil)
	m, err := b.MatchPrefixPartial([]int32{0, 1, 2, 3, 4, 5, 6, 42})
	if err != nil {
		t.Fatal(err)
	}
	ta, _ := a.BlockTable()
	tb, _ := b.BlockTable()
	if m.NumCached != 7 || m.PartialTokens != 3 || m.CopySrc != ta[1] || len(tb) != 2 ||
		tb[0] != ta[0] || tb[1] != m.CopyDst {
		t.Fatalf("match %+v, tables %v %v", m, ta, tb)
	}
	st, _ := p.Stats()
	if st.NumPartialHits != 1 || st.PartialHitTokens != 3 || st.PrefixHitTokens != 7 {
		t.Fatalf("stats %+v", st)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestRetentionPinsPrioritiesAndClock(t *testing.T) {
	p := reusePool(t, PoolOptions{EnableRetention: true, MaxPinnedBlocks: 1})
	if err := p.SetClock(1000); err != nil {
		t.Fatal(err)
	}
	a, _ := p.CreateSeq(nil)
	err := a.SetRetention([]RetentionRange{
		{Begin: 0, End: 4, Priority: PriorityPinned},
		{Begin: 4, End: TokenEnd, Priority: 70, DurationNs: 500},
	})
	if err != nil {
		t.Fatal(err)
	}
	computed(t, p, a, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8})
	c, err := p.PriorityCounts()
	if err != nil || len(c) != 101 || c[PriorityPinned] != 1 || c[70] != 1 {
		t.Fatalf("counts %v %v", c, err)
	}
	if err := a.Free(); err != nil {
		t.Fatal(err)
	}
	if st, _ := p.Stats(); st.NumPinnedBlocks != 1 || st.NumFreeBlocks != 6 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := p.Events(); err != nil {
		t.Fatal(err)
	}
	if err := p.SetClock(1500); err != nil {
		t.Fatal(err)
	}
	if c, _ := p.PriorityCounts(); c[70] != 0 || c[PriorityDefault] != 1 {
		t.Fatalf("after expiry %v", c)
	}
	ev, _ := p.Events()
	if len(ev) != 1 || ev[0].Type != EventBlockPriority || ev[0].NumTokens != PriorityDefault {
		t.Fatalf("events %+v", ev)
	}
	b, _ := p.CreateSeq(nil)
	computed(t, p, b, []int32{50, 51, 52, 53, 54})
	err = b.SetRetention([]RetentionRange{{Begin: 0, End: 4, Priority: PriorityPinned}})
	if !errors.Is(err, ErrOutOfBlocks) || !strings.Contains(err.Error(), "PoolOptions.MaxPinnedBlocks") {
		t.Fatalf("pin over budget: %v", err)
	}
	err = b.SetRetention([]RetentionRange{{Begin: 0, End: 4, Priority: 101}})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("priority 101: %v", err)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestRetentionNeedsThePoolOption(t *testing.T) {
	p := reusePool(t, PoolOptions{})
	s, _ := p.CreateSeq(nil)
	err := s.SetRetention([]RetentionRange{{Begin: 0, End: 8, Priority: 90}})
	if !errors.Is(err, ErrInvalidState) {
		t.Fatalf("got %v", err)
	}
}
