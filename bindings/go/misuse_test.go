package pagedkv

import (
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
