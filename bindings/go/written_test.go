package pagedkv

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
)

// Issue 13: no request may ever read K/V that nobody wrote.

func TestSameStepAdmissionThenFreeServesNothingUnwritten(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16})
	system := []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	s1, err := p.CreateSeq(nil)
	ok(t, err)
	ok(t, s1.Append(append(append([]int32(nil), system...), 1)))
	s2, err := p.CreateSeq(nil)
	ok(t, err)
	p2 := append(append([]int32(nil), system...), 2)
	n, err := s2.MatchPrefix(p2)
	ok(t, err)
	if n != 0 {
		t.Fatalf("hit %d tokens nobody computed", n)
	}
	ok(t, s2.Append(p2))
	ok(t, s1.Free())
	_, err = p.Prepare([]Seq{s2}, []int{1})
	if !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "tokens [0, 12)") {
		t.Fatalf("plan over unwritten context: %v", err)
	}
	b, err := p.Prepare([]Seq{s2}, []int{13})
	ok(t, err)
	b.Close() // not committed: aborted
	info, err := s2.Info()
	ok(t, err)
	if info.NumComputedTokens != 0 {
		t.Fatalf("an aborted step counted: %+v", info)
	}
	compute(t, s2, 13)
	ok(t, s2.Free())
	s3, err := p.CreateSeq(nil)
	ok(t, err)
	n, err = s3.MatchPrefix(append(append([]int32(nil), system...), 3))
	ok(t, err)
	if n != 12 {
		t.Fatalf("hit %d, want s2's 12 computed tokens", n)
	}
	ok(t, p.Validate())
}

func TestCommitAndAbortAreFinal(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16})
	s := seqOf(t, p, []int32{1, 2, 3, 4, 5})
	ok(t, s.Append([]int32{6}))
	b, err := p.Prepare([]Seq{s}, []int{1})
	ok(t, err)
	ok(t, b.Abort())
	ok(t, b.Abort())
	if err := b.Commit(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("commit after abort: %v", err)
	}
	ok(t, b.Close())
	b, err = p.Prepare([]Seq{s}, []int{1})
	ok(t, err)
	ok(t, b.Commit())
	if err := b.Abort(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("abort after commit: %v", err)
	}
	ok(t, b.Close())
	info, err := s.Info()
	ok(t, err)
	if info.NumComputedTokens != 6 {
		t.Fatalf("computed %d", info.NumComputedTokens)
	}
}

type slotKey struct {
	block int32
	off   int
}

// writtenModel: per slot, the token prefix this test's committed steps
// wrote there; appending into a slot, or a block new to a table, leaves it
// unwritten. It follows the test's own calls, never the library's
// bookkeeping.
type writtenModel struct {
	bs     int
	tokens map[Seq][]int32
	slots  map[slotKey]string
}

func prefixKey(t []int32, p int) string {
	var sb strings.Builder
	for _, x := range t[:p+1] {
		sb.WriteByte(byte('0' + x))
	}
	return sb.String()
}

func (m *writtenModel) readable(tb testing.TB, s Seq, p int) bool {
	tab := table(tb, s)
	v, found := m.slots[slotKey{tab[p/m.bs], p % m.bs}]
	return found && v == prefixKey(m.tokens[s], p)
}

func (m *writtenModel) computed(tb testing.TB, s Seq) int {
	n := len(m.tokens[s])
	for p := 0; p < n; p++ {
		if !m.readable(tb, s, p) {
			return p
		}
	}
	return n
}

// Random operations against the model: the library must never hit or plan
// over a slot the model says nobody wrote, and must agree on what is
// computed.
func TestRandomOperationsNeverServeUnwrittenSlots(t *testing.T) {
	const bs = 4
	for seed := int64(1); seed <= 12; seed++ {
		r := rand.New(rand.NewSource(seed))
		p := newPool(t, PoolOptions{BlockSize: bs, NumBlocks: 24})
		m := &writtenModel{bs: bs, tokens: map[Seq][]int32{}, slots: map[slotKey]string{}}
		var live []Seq
		toks := func(n int) []int32 {
			t := make([]int32, n)
			for i := range t {
				t[i] = int32(r.Intn(2))
			}
			return t
		}
		for i := 0; i < 300; i++ {
			switch op := r.Intn(7); {
			case op == 0 || len(live) == 0:
				prompt := toks(1 + r.Intn(13))
				s, err := p.CreateSeq(nil)
				ok(t, err)
				hit, err := s.MatchPrefix(prompt)
				ok(t, err)
				m.tokens[s] = append([]int32(nil), prompt[:hit]...)
				for q := 0; q < hit; q++ {
					if !m.readable(t, s, q) {
						t.Fatalf("seed %d: prefix hit on unwritten slot %d", seed, q)
					}
				}
				live = append(live, s)
			case op <= 2:
				s := live[r.Intn(len(live))]
				add := toks(1 + r.Intn(5))
				before := table(t, s)
				if err := s.Append(add); err != nil {
					if !errors.Is(err, ErrOutOfBlocks) {
						t.Fatal(err)
					}
					continue
				}
				after := table(t, s)
				n0 := len(m.tokens[s])
				for j, b := range after {
					if j < len(before) && before[j] == b {
						continue
					}
					for o := 0; o < bs; o++ {
						k := slotKey{b, o}
						if j < len(before) && j*bs+o < n0 {
							if v, found := m.slots[slotKey{before[j], o}]; found {
								m.slots[k] = v // copy-on-write carries our tokens
								continue
							}
						}
						delete(m.slots, k)
					}
				}
				for q := n0; q < n0+len(add); q++ {
					delete(m.slots, slotKey{after[q/bs], q % bs})
				}
				m.tokens[s] = append(m.tokens[s], add...)
			case op == 3:
				s := live[r.Intn(len(live))]
				c, err := s.Fork()
				ok(t, err)
				m.tokens[c] = append([]int32(nil), m.tokens[s]...)
				live = append(live, c)
			case op == 4:
				k := r.Intn(len(live))
				s := live[k]
				if r.Intn(2) == 0 {
					ok(t, s.Free())
					delete(m.tokens, s)
					live = append(live[:k], live[k+1:]...)
				} else {
					n := r.Intn(len(m.tokens[s]) + 1)
					ok(t, s.Truncate(n))
					m.tokens[s] = m.tokens[s][:n]
				}
			default:
				s := live[r.Intn(len(live))]
				n := len(m.tokens[s])
				if n == 0 {
					continue
				}
				q := 1 + r.Intn(n)
				if r.Intn(2) == 0 {
					if q = n - m.computed(t, s); q < 1 {
						q = 1
					}
				}
				readable := true
				for x := 0; x < n-q; x++ {
					readable = readable && m.readable(t, s, x)
				}
				b, err := p.Prepare([]Seq{s}, []int{q})
				if err != nil {
					if readable || !errors.Is(err, ErrInvalidState) {
						t.Fatalf("seed %d: plan refused: %v", seed, err)
					}
					continue
				}
				if !readable {
					t.Fatalf("seed %d: a plan over unwritten context was accepted", seed)
				}
				if r.Intn(3) == 0 {
					ok(t, b.Close()) // the model failed: aborted
					continue
				}
				ok(t, b.Commit())
				ok(t, b.Close())
				tab := table(t, s)
				for x := n - q; x < n; x++ {
					m.slots[slotKey{tab[x/bs], x % bs}] = prefixKey(m.tokens[s], x)
				}
			}
			ok(t, p.Validate())
			for _, s := range live {
				info, err := s.Info()
				ok(t, err)
				if int(info.NumComputedTokens) != m.computed(t, s) {
					t.Fatalf("seed %d: %d computed, the model says %d", seed, info.NumComputedTokens,
						m.computed(t, s))
				}
			}
		}
	}
}
