package pagedkv

import (
	"errors"
	"testing"
	"unsafe"
)

// Tensor's host views on a malformed descriptor (a negative extent, nil
// data, a nil *Tensor) are argument errors, never a runtime panic.
func TestTensorHostViewsOfBadDescriptorsAreErrors(t *testing.T) {
	var x [4]int64
	good := unsafe.Pointer(&x[0])
	cases := []*Tensor{
		{Data: good, DType: Int32, Device: CPU, Shape: []int64{-3}},
		{Data: good, DType: Int32, Device: CPU, Shape: []int64{-2, -2}},
		{Data: nil, DType: Int32, Device: CPU, Shape: []int64{4}},
		{Data: good, DType: Int32, Device: CPU, Shape: []int64{1 << 62, 1 << 62}},
	}
	for i, c := range cases {
		for _, f := range []func() error{
			func() error { _, err := c.Int32s(); return err },
			func() error { c2 := *c; c2.DType = Int64; _, err := c2.Int64s(); return err },
			func() error { c2 := *c; c2.DType = Float32; _, err := c2.Float32s(); return err },
			func() error { c2 := *c; c2.DType = Float16; _, err := c2.Uint16s(); return err },
			func() error { c2 := *c; c2.DType = Float8E4M3; _, err := c2.Codes(); return err },
		} {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("case %d: panic %v", i, r)
					}
				}()
				wantErr(t, f(), ErrInvalidArgument)
			}()
		}
	}
	var nilT *Tensor
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("nil tensor: panic %v", r)
			}
		}()
		_, err := nilT.Int32s()
		wantErr(t, err, ErrInvalidArgument)
		_, err = nilT.Float32s()
		wantErr(t, err, ErrInvalidArgument)
	}()
	// A zero extent is an empty view, not an error.
	z := &Tensor{Data: nil, DType: Int32, Device: CPU, Shape: []int64{0, 5}}
	got, err := z.Int32s()
	ok(t, err)
	if len(got) != 0 {
		t.Fatalf("got %v", got)
	}
}

// The MLA host calls of a closed Batch are ErrClosed like every other
// Batch method (they read the pool's options through the batch, which
// Close clears: a nil dereference).
func TestMLAHostCallsAfterBatchCloseAreErrClosed(t *testing.T) {
	for _, layout := range []KVLayout{LayoutMLA, LayoutMHA} {
		o := PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, DType: Float32, NumThreads: 1}
		if layout == LayoutMLA {
			o.KVLayout, o.KVLoRARank, o.QKRopeHeadDim = LayoutMLA, 16, 8
		} else {
			o.NumKVHeads, o.HeadDim = 1, 8
		}
		p := newPool(t, o)
		s, err := p.CreateSeq(nil)
		ok(t, err)
		ok(t, s.Append([]int32{1, 2}))
		b, err := p.Prepare([]Seq{s}, []int{2})
		ok(t, err)
		ok(t, b.Close())
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%v: panic %v", layout, r)
				}
			}()
			// An MHA pool's batch refuses MLA calls before it looks at
			// being closed: either error, never a panic.
			want := func(err error) bool {
				return errors.Is(err, ErrClosed) || layout == LayoutMHA && errors.Is(err, ErrInvalidState)
			}
			err := b.MLACacheWrite(0, make([]float32, 2*16), make([]float32, 2*8))
			if !want(err) {
				t.Fatalf("%v: MLACacheWrite after Close: %v", layout, err)
			}
			err = b.MLAAttention(0, make([]float32, 2*16), make([]float32, 2*8), make([]float32, 2*16), nil, 0.1)
			if !want(err) {
				t.Fatalf("%v: MLAAttention after Close: %v", layout, err)
			}
		}()
	}
}
