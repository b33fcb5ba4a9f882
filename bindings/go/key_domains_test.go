package pagedkv

import (
	"reflect"
	"strings"
	"testing"
)

// commitPrompt appends tokens to a new sequence of p and commits them as one
// step, so their full blocks can be hit.
func commitPrompt(t *testing.T, p *Pool, o *SeqOptions, tokens []int32) Seq {
	t.Helper()
	s, err := p.CreateSeq(o)
	ok(t, err)
	ok(t, s.Append(tokens))
	step, err := p.Prepare([]Seq{s}, []int{len(tokens)})
	ok(t, err)
	ok(t, step.Commit())
	ok(t, step.Close())
	return s
}

// VLLMTaggedKeys (vLLM 0.33's tagged keys): the pool reports the mode, its
// block hashes are HashPrefix's with the same mode and LoRA name and path,
// the path keys blocks there only, and an adapter name never reads like a
// salt. Setting it with StrictKeyDomains is refused.
func TestVLLMTaggedKeys(t *testing.T) {
	prompt := []int32{300, 301, 302, 303, 304, 305, 306, 307, 308}
	lora := func(path string) *SeqOptions { return &SeqOptions{LoraName: "sql", LoraPath: path} }
	lib := func(path string, tagged bool) []BlockHash {
		h, err := HashPrefix(&HashOptions{BlockSize: 4, LoraName: "sql", LoraPath: path,
			VLLMTaggedKeys: tagged}, prompt[:8])
		ok(t, err)
		return h
	}
	for _, tagged := range []bool{false, true} {
		p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16, VLLMTaggedKeys: tagged})
		if o := p.Options(); o.VLLMTaggedKeys != tagged || o.StrictKeyDomains {
			t.Fatalf("tagged %v: options %+v", tagged, o)
		}
		holder := commitPrompt(t, p, lora("/adapters/sql-v1"), prompt[:8])
		own, err := holder.BlockHashes()
		ok(t, err)
		if len(own) != 2 || !reflect.DeepEqual(lib("/adapters/sql-v1", tagged), own) {
			t.Fatalf("tagged %v: HashPrefix %v, pool %v", tagged, lib("/adapters/sql-v1", tagged), own)
		}
		// The name pointed at another adapter: other hashes (and no hit) on
		// a tagged pool only.
		if moved := lib("/adapters/sql-v2", tagged); reflect.DeepEqual(moved, own) != !tagged {
			t.Fatalf("tagged %v: another path gives %v, pool %v", tagged, moved, own)
		}
		probe, err := p.CreateSeq(lora("/adapters/sql-v2"))
		ok(t, err)
		hit, err := probe.MatchPrefix(prompt)
		ok(t, err)
		want := 8
		if tagged {
			want = 0
		}
		if hit != want {
			t.Fatalf("tagged %v: hit %d, want %d", tagged, hit, want)
		}
		// The tagged format differs from the untagged one for a LoRA.
		if reflect.DeepEqual(lib("/adapters/sql-v1", !tagged), own) {
			t.Fatalf("tagged %v: both formats hash alike", tagged)
		}
	}

	// A salted request's first block is not hit by an unsalted request whose
	// LoRA name equals the salt (the default encoding lets it: see
	// TestStrictKeyDomains).
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16, VLLMTaggedKeys: true})
	salted := &SeqOptions{CacheSalt: "tenant-a-salt"}
	holder := commitPrompt(t, p, salted, prompt[:8])
	for _, c := range []struct {
		o    *SeqOptions
		want int
	}{{&SeqOptions{LoraName: "tenant-a-salt"}, 0}, {salted, 8}} {
		s, err := p.CreateSeq(c.o)
		ok(t, err)
		hit, err := s.MatchPrefix(prompt)
		ok(t, err)
		if hit != c.want {
			t.Fatalf("%+v: hit %d, want %d", *c.o, hit, c.want)
		}
	}
	saltedLib, err := HashPrefix(&HashOptions{BlockSize: 4, CacheSalt: "tenant-a-salt", VLLMTaggedKeys: true}, prompt[:8])
	ok(t, err)
	got, err := holder.BlockHashes()
	ok(t, err)
	if !reflect.DeepEqual(saltedLib, got) {
		t.Fatalf("salted: HashPrefix %v, pool %v", saltedLib, got)
	}

	// Both modes at once is an error, not one silently winning.
	_, err = NewPool(&PoolOptions{BlockSize: 4, NumBlocks: 16, StrictKeyDomains: true, VLLMTaggedKeys: true})
	if e := wantErr(t, err, ErrInvalidArgument); !strings.Contains(e.Msg, "VLLMTaggedKeys") {
		t.Fatalf("message %q does not name VLLMTaggedKeys", e.Msg)
	}
	_, err = HashPrefix(&HashOptions{BlockSize: 4, StrictKeyDomains: true, VLLMTaggedKeys: true}, prompt)
	if e := wantErr(t, err, ErrInvalidArgument); !strings.Contains(e.Msg, "VLLMTaggedKeys") {
		t.Fatalf("message %q does not name VLLMTaggedKeys", e.Msg)
	}
	// LoraPath is checked for NUL bytes like LoraName.
	_, err = p.CreateSeq(lora("/a\x00b"))
	if e := wantErr(t, err, ErrInvalidArgument); !strings.Contains(e.Msg, "LoraPath") {
		t.Fatalf("message %q does not name LoraPath", e.Msg)
	}
	_, err = HashPrefix(&HashOptions{BlockSize: 4, LoraPath: "a\x00"}, prompt)
	if e := wantErr(t, err, ErrInvalidArgument); !strings.Contains(e.Msg, "LoraPath") {
		t.Fatalf("message %q does not name LoraPath", e.Msg)
	}
}
