package pagedkv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A string with a NUL byte is refused, not cut at the NUL: C would read
// "dir\x00x" as "dir" (another directory than the one named) and a
// publisher's "inproc://a\x00b" as "inproc://a".
func TestStringsWithNULAreRefused(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 6, NumLayers: 1, NumKVHeads: 1,
		HeadDim: 8, DType: Float32, NumThreads: 1})
	bpb, err := p.BytesPerBlock()
	ok(t, err)
	dir := t.TempDir()
	sub := filepath.Join(dir, "tier")
	ok(t, os.Mkdir(sub, 0o700))
	err = p.AttachTiers(TierOptions{FileDir: sub + "\x00/elsewhere", FileBytes: 4 * bpb})
	wantErr(t, err, ErrInvalidArgument)
	if _, err := p.TierStats(MediumFile); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("a refused attach attached a tier: %v", err)
	}
	ok(t, p.AttachTiers(TierOptions{FileDir: sub, FileBytes: 4 * bpb})) // still attachable

	ep := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8, EnableEvents: true})
	for _, c := range []struct {
		endpoint, replay string
		opts             *PublisherOptions
	}{
		{"inproc://pkv-nul\x00x", "", nil},
		{"inproc://pkv-nul", "inproc://r\x00x", nil},
		{"inproc://pkv-nul", "", &PublisherOptions{Topic: "kv\x00x"}},
		{"inproc://pkv-nul", "", &PublisherOptions{DeviceMedium: "GPU\x00x"}},
	} {
		pub, err := NewEventPublisher(ep, c.endpoint, c.replay, c.opts)
		if err == nil {
			pub.Close()
		}
		wantErr(t, err, ErrInvalidArgument)
	}
}
