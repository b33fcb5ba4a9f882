package pagedkv

import "testing"

func TestVersionsAndFeatures(t *testing.T) {
	if Version() != HeaderVersion {
		t.Fatalf("library %s, headers %s", Version(), HeaderVersion)
	}
	if VersionNumber() != HeaderVersionNumber || ABIVersion() != HeaderABIVersion {
		t.Fatalf("version %d abi %d", VersionNumber(), ABIVersion())
	}
	f := SupportedFeatures()
	if !f.Has(FeatureSHA256) || !f.Has(FeatureXXHash) {
		t.Fatalf("features %#x lack the hash functions", uint32(f))
	}
	// An FP8 pool can be created exactly when the library reports FP8.
	fp8, err := NewPool(&PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, NumKVHeads: 1,
		HeadDim: 8, DType: Float8E4M3, NumThreads: 1})
	if (err == nil) != f.Has(FeatureFP8) {
		t.Fatalf("an FP8 pool: %v, with features %#x", err, uint32(f))
	}
	fp8.Close()
	n := CUDADeviceCount()
	if n < 0 || (!f.Has(FeatureCUDA) && n != 0) {
		t.Fatalf("CUDADeviceCount = %d with features %#x", n, uint32(f))
	}
	sizes := map[DType]int{Float32: 4, Float16: 2, BFloat16: 2, Int32: 4, Int64: 8, 99: 0}
	for d, want := range sizes {
		if d.Size() != want {
			t.Errorf("%v.Size() = %d, want %d", d, d.Size(), want)
		}
	}
	if SHA256CBOR.Size() != 32 || XXH3128.Size() != 16 || HashAlgo(9).Size() != 0 {
		t.Fatal("hash sizes")
	}
}
