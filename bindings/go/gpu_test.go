package pagedkv

import (
	"errors"
	"testing"
)

// CUDA pools: Go slices are host memory and are refused before reaching C;
// the Tensor variants take device pointers. Skips without a device.
func TestCUDAPoolRefusesGoMemory(t *testing.T) {
	if CUDADeviceCount() == 0 {
		t.Skip("no CUDA device")
	}
	p := newPool(t, PoolOptions{BlockSize: 16, NumBlocks: 8, NumLayers: 1, NumKVHeads: 1,
		HeadDim: 64, DType: Float16, Device: CUDA})
	kt, err := p.KVTensor(0, Key)
	ok(t, err)
	if kt.Device != CUDA || kt.Data == nil {
		t.Fatalf("kv tensor %+v", kt)
	}
	if _, err := kt.Uint16s(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("a host view of device memory: %v", err)
	}
	s := seqOf(t, p, []int32{1, 2, 3})
	b, err := p.Prepare([]Seq{s}, []int{3})
	ok(t, err)
	defer b.Close()
	kv := make([]uint16, 3*64)
	wantErr(t, b.CacheWrite16(0, kv, kv), ErrUnsupported)
	wantErr(t, p.SwapBlocks([]int32{1}, make([]byte, 1<<20), SwapOut), ErrUnsupported)
	// The pool's own device storage serves as k and v [3, 1, 64].
	k, err := NewTensor(kt.Data, Float16, CUDA, 0, []int64{3, 1, 64})
	ok(t, err)
	ok(t, b.CacheWriteTensor(0, &k, &k, nil))
}
