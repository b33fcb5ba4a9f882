package pagedkv

import (
	"math"
	"testing"
)

// Every 16-bit pattern widens and narrows back to itself (NaNs stay NaN).
func TestHalfRoundTripsEveryPattern(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := F16ToFloat32(h)
		if f != f {
			if g := F16ToFloat32(Float32ToF16(f)); g == g {
				t.Fatalf("f16 NaN %#04x lost", h)
			}
		} else if Float32ToF16(f) != h {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, Float32ToF16(f))
		}
		b := BF16ToFloat32(h)
		if b != b {
			if g := BF16ToFloat32(Float32ToBF16(b)); g == g {
				t.Fatalf("bf16 NaN %#04x lost", h)
			}
		} else if Float32ToBF16(b) != h {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, b, Float32ToBF16(b))
		}
	}
}

// Narrowing picks the nearest representable value, ties to even.
func TestHalfRoundsToNearest(t *testing.T) {
	nearest := func(f float32, widen func(uint16) float32, narrow func(float32) uint16) {
		h := narrow(f)
		got := float64(widen(h))
		if math.IsInf(got, 0) {
			return
		}
		for _, n := range []uint16{h - 1, h + 1} {
			alt := float64(widen(n))
			if alt != alt || math.Signbit(alt) != math.Signbit(got) {
				continue
			}
			d0, d1 := math.Abs(got-float64(f)), math.Abs(alt-float64(f))
			if d1 < d0 || (d1 == d0 && h&1 == 1) {
				t.Fatalf("%v narrowed to %v, but %v is nearer/even", f, got, alt)
			}
		}
	}
	r := uint32(12345)
	for i := 0; i < 200000; i++ {
		r = r*1664525 + 1013904223
		f := math.Float32frombits(r)
		if f != f || math.Abs(float64(f)) > 60000 {
			continue
		}
		nearest(f, F16ToFloat32, Float32ToF16)
		nearest(f, BF16ToFloat32, Float32ToBF16)
		// Values in f16's normal and subnormal range too.
		g := float32(math.Ldexp(float64(r&0xffff)/65536, int(r>>16)%40-30))
		nearest(g, F16ToFloat32, Float32ToF16)
	}
	if Float32ToF16(70000) != 0x7c00 || Float32ToF16(-70000) != 0xfc00 {
		t.Fatal("f16 overflow must give infinity")
	}
	got := FromBF16(ToBF16([]float32{1, -2.5, 0.15625}))
	if got[0] != 1 || got[1] != -2.5 || got[2] != 0.15625 {
		t.Fatalf("bf16 slice round trip %v", got)
	}
	got = FromF16(ToF16([]float32{1, -2.5, 0.15625}))
	if got[0] != 1 || got[1] != -2.5 || got[2] != 0.15625 {
		t.Fatalf("f16 slice round trip %v", got)
	}
}
