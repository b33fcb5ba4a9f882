package pagedkv

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

func TestSentinelsMatchTheirCodeOnly(t *testing.T) {
	sentinels := []*Error{ErrInvalidArgument, ErrNotFound, ErrOutOfBlocks, ErrOutOfMemory,
		ErrUnsupported, ErrCuda, ErrBufferTooSmall, ErrInvalidState, ErrInvariant, ErrInternal}
	codes := []Code{CodeInvalidArgument, CodeNotFound, CodeOutOfBlocks, CodeOutOfMemory,
		CodeUnsupported, CodeCuda, CodeBufferTooSmall, CodeInvalidState, CodeInvariant,
		CodeInternal}
	for i, s := range sentinels {
		if s.Code != codes[i] || int32(codes[i]) != int32(-1-i) {
			t.Fatalf("sentinel %d has code %d", i, s.Code)
		}
		e := &Error{Code: codes[i], Op: "pkv_x", Msg: "m"}
		wrapped := fmt.Errorf("context: %w", e)
		for j, s2 := range sentinels {
			if got := errors.Is(wrapped, s2); got != (i == j) {
				t.Errorf("errors.Is(%v, %v) = %v", e, s2.Code.name(), got)
			}
		}
		if !strings.HasPrefix(codes[i].String(), "PKV_E_") {
			t.Errorf("status string of %d: %q", codes[i], codes[i].String())
		}
		if want := "pagedkv: pkv_x: " + codes[i].name() + ": m"; e.Error() != want {
			t.Errorf("Error() = %q, want %q", e.Error(), want)
		}
	}
	if CodeOK.String() == "" || Code(-1000).String() == "" {
		t.Fatal("status strings must never be empty")
	}
	if errors.Is(ErrNotFound, ErrClosed) || errors.Is(errors.New("x"), ErrNotFound) {
		t.Fatal("unrelated errors matched")
	}
}

func TestLibraryErrorsCarryMessageAndOp(t *testing.T) {
	_, err := NewPool(&PoolOptions{NumBlocks: 1, BlockSize: 16})
	e := wantErr(t, err, ErrInvalidArgument)
	if e.Op != "pkv_pool_create" {
		t.Fatalf("Op = %q", e.Op)
	}
	if !strings.Contains(e.Msg, "PoolOptions.NumBlocks") {
		t.Fatalf("message %q does not name PoolOptions.NumBlocks", e.Msg)
	}
	p := managerPool(t, 8)
	_, err = p.Seq(12345).Info()
	e = wantErr(t, err, ErrNotFound)
	if e.Op != "pkv_seq_get_info" {
		t.Fatalf("Op = %q", e.Op)
	}
	// The operation is named once (Op), the id as everywhere: "seq 0x...".
	if strings.Count(e.Error(), "pkv_seq_get_info") != 1 || strings.HasPrefix(e.Msg, "pkv_") {
		t.Fatalf("Error() = %q repeats the operation", e.Error())
	}
	if want := SeqID(12345).String(); want != "seq 0x0000000000003039" ||
		!strings.Contains(e.Msg, want) {
		t.Fatalf("message %q does not name %q", e.Msg, want)
	}
	// A success after a failure carries nothing over.
	_, err = p.Stats()
	ok(t, err)
}

func TestClosedObjects(t *testing.T) {
	p, err := NewPool(&PoolOptions{BlockSize: 8, NumBlocks: 8, NumLayers: 1, NumKVHeads: 1,
		HeadDim: 64, DType: Float32, NumThreads: 1})
	ok(t, err)
	s := seqOf(t, p, []int32{1, 2, 3, 4, 5})
	b, err := p.Prepare([]Seq{s}, []int{5})
	ok(t, err)
	ok(t, p.Close())
	ok(t, p.Close()) // idempotent
	checks := map[string]error{}
	_, checks["Stats"] = p.Stats()
	_, checks["Events"] = p.Events()
	checks["Validate"] = p.Validate()
	checks["Append"] = s.Append([]int32{1})
	_, checks["Info"] = s.Info()
	_, checks["CreateSeq"] = p.CreateSeq(nil)
	_, checks["Prepare"] = p.Prepare([]Seq{s}, []int{1})
	for name, err := range checks {
		if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrInvalidState) {
			t.Errorf("%s on a closed pool: %v", name, err)
		}
	}
	// The plan outlives its pool: calls fail cleanly.
	kv := make([]float32, 5*64)
	wantErr(t, b.CacheWrite(0, kv, kv), ErrInvalidState)
	ok(t, b.Close())
	ok(t, b.Close())
	_, err = b.Info()
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Info on a closed batch: %v", err)
	}
	var nilPool *Pool
	if _, err := nilPool.Stats(); !errors.Is(err, ErrClosed) {
		t.Fatalf("nil pool: %v", err)
	}
	ok(t, nilPool.Close())
	var zero Seq
	if err := zero.Free(); !errors.Is(err, ErrClosed) {
		t.Fatalf("zero Seq: %v", err)
	}
}

// The library's messages name C arguments and option fields
// ("opts->block_size 2000 is outside [1, 1024]", "k_scales[0] ...",
// "groups[0].kind ...", "options->transports ..."); a Go caller set
// PoolOptions.BlockSize, SetKVScales' k, GroupSpec.Kind. Errors name what
// the Go API calls them.
func TestLibraryMessagesNameGoArguments(t *testing.T) {
	fp8 := newPool(t, PoolOptions{NumBlocks: 10, NumLayers: 1, NumKVHeads: 1, HeadDim: 8,
		DType: Float8E4M3, NumThreads: 1})
	mgr := managerPool(t, 16)
	s, err := mgr.CreateSeq(nil)
	ok(t, err)
	cases := []struct {
		name string
		err  func() error
		want string
	}{
		{"NewPool BlockSize", func() error { _, err := NewPool(&PoolOptions{BlockSize: 2000}); return err },
			"PoolOptions.BlockSize 2000"},
		{"NewPool KScales", func() error {
			_, err := NewPool(&PoolOptions{NumBlocks: 10, NumLayers: 1, NumKVHeads: 1, HeadDim: 8,
				DType: Float8E4M3, KScales: []float32{-1}, VScales: []float32{1}})
			return err
		}, "PoolOptions.KScales[0]"},
		{"SetKVScales value", func() error { return fp8.SetKVScales([]float32{-1}, []float32{1}) }, "k[0] = "},
		{"SetKVScales count", func() error { return fp8.SetKVScales([]float32{1, 2}, []float32{1, 2}) }, "len(k) is 2"},
		{"NewGroupPool Kind", func() error {
			_, err := NewGroupPool(&PoolOptions{NumBlocks: 10}, []GroupSpec{{Kind: 77}})
			return err
		}, "groups[0].Kind 77"},
		{"HashPrefix MMItems", func() error {
			_, err := HashPrefix(&HashOptions{MMItems: []MMItem{{Offset: 5, Hash: "x"}}}, []int32{1, 2})
			return err
		}, "HashOptions.MMItems[0].Length"},
		{"CreateSeq MMItems", func() error {
			_, err := mgr.CreateSeq(&SeqOptions{MMItems: []MMItem{{Offset: 5, Length: 2, Hash: "x"},
				{Offset: 1, Length: 2, Hash: "y"}}})
			return err
		}, "SeqOptions.MMItems[1]"},
		{"AttachTiers HostBytes", func() error { return fp8.AttachTiers(TierOptions{HostBytes: 1}) },
			"TierOptions.HostBytes 1"},
		{"SetRetention", func() error { return s.SetRetention([]RetentionRange{{Begin: 0, End: 4}}) },
			"PoolOptions.EnableRetention"},
		{"CacheWrite on an MLA pool", func() error {
			m := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16, NumLayers: 1, DType: Float32,
				KVLayout: LayoutMLA, KVLoRARank: 8, QKRopeHeadDim: 4, NumThreads: 1})
			ms, err := m.CreateSeq(nil)
			ok(t, err)
			ok(t, ms.Append([]int32{1, 2}))
			b, err := m.Prepare([]Seq{ms}, []int{2})
			ok(t, err)
			defer b.Close()
			return b.CacheWrite(0, make([]float32, 24), make([]float32, 24))
		}, "use Batch.MLACacheWrite / Batch.MLAAttention"},
	}
	if TransferAvailable() {
		cases = append(cases, struct {
			name string
			err  func() error
			want string
		}{"NewTransferEngine Transports", func() error {
			_, err := NewTransferEngine(&TransferOptions{Transports: "tcpp"})
			return err
		}, "TransferOptions.Transports \"tcpp\""})
	}
	for _, c := range cases {
		sentinel := ErrInvalidArgument
		if c.name == "SetRetention" || c.name == "CacheWrite on an MLA pool" {
			sentinel = ErrInvalidState
		}
		e := wantErr(t, c.err(), sentinel)
		if !strings.Contains(e.Msg, c.want) || strings.Contains(e.Msg, "opts->") ||
			strings.Contains(e.Msg, "options->") {
			t.Errorf("%s: %q does not name %q", c.name, e.Msg, c.want)
		}
	}
}

// NewGroupPool's base options ("base->block_size"), the group count,
// plan, sequence and prefix-lookup counts ("num_seqs", "num_tokens",
// "num_hashes"), the attention params ("params->softmax_scale") and
// PrepareDecode's advice ("pkv_batch_prepare and query_counts[0]") were
// left in the library's names: the renaming knew opts-> only and no
// arguments of these calls. Each error names what the Go call passed.
func TestMessagesOfGroupPoolsPlansSequencesAndParamsNameGoArguments(t *testing.T) {
	mgr := managerPool(t, 16)
	s, err := mgr.CreateSeq(nil)
	ok(t, err)
	sp := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8, NumLayers: 1, NumKVHeads: 1, HeadDim: 8,
		DType: Float32, NumThreads: 1})
	ss := seqOf(t, sp, []int32{1, 2, 3})
	ok(t, ss.Append([]int32{4}))
	b, err := sp.Prepare([]Seq{ss}, []int{1})
	ok(t, err)
	defer b.Close()
	full := []GroupSpec{{Kind: GroupFull, NumKVHeads: 1, HeadDim: 8}}
	hashes := make([]BlockHash, 5)
	mla := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16, NumLayers: 1, DType: Float32,
		KVLayout: LayoutMLA, KVLoRARank: 8, QKRopeHeadDim: 4, NumThreads: 1})
	ms := seqOf(t, mla, []int32{1, 2})
	ok(t, ms.Append([]int32{3}))
	mlaBatch, err := mla.Prepare([]Seq{ms}, []int{1})
	ok(t, err)
	defer mlaBatch.Close()
	// Memory outside Go for the Tensor form: another pool's storage.
	kv, err := sp.KVTensor(0, 0)
	ok(t, err)
	cases := []struct {
		name string
		err  error
		want string
		c    []string // C names that must not appear
	}{
		{"NewGroupPool BlockSize", func() error {
			_, err := NewGroupPool(&PoolOptions{BlockSize: 2000, NumBlocks: 8}, full)
			return err
		}(), "PoolOptions.BlockSize 2000", []string{"base->"}},
		{"NewGroupPool NumBlocks", func() error { _, err := NewGroupPool(&PoolOptions{BlockSize: 4}, full); return err }(),
			"PoolOptions.NumBlocks and PoolOptions.MemoryBudgetBytes", []string{"base->"}},
		{"NewGroupPool retention", func() error {
			_, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 8, EnableRetention: true}, full)
			return err
		}(), "PoolOptions.EnableRetention", []string{"base->", "enable_retention"}},
		{"NewGroupPool groups", func() error {
			_, err := NewGroupPool(&PoolOptions{BlockSize: 4, NumBlocks: 8}, nil)
			return err
		}(), "len(groups) is 0", []string{"num_groups"}},
		{"Prepare", func() error { _, err := mgr.Prepare(nil, nil); return err }(), "len(seqs) is 0",
			[]string{"num_seqs"}},
		{"PrepareEx", func() error { _, err := mgr.PrepareEx(nil, nil, PreparePersistentTable, nil); return err }(),
			"len(seqs) is 0", []string{"num_seqs"}},
		{"Truncate", s.Truncate(100), "numTokens 100", []string{"num_tokens"}},
		{"Reserve", s.Reserve(1 << 31), "numTokens 2147483648", []string{"num_tokens"}},
		{"MatchPrefixHashes", func() error { _, err := s.MatchPrefixHashes([]int32{1, 2}, hashes); return err }(),
			"len(hashes) 5 exceeds the 0 full blocks of len(tokens) 2", []string{"num_hashes", "num_tokens"}},
		{"MatchPrefixHashesTiered", func() error {
			_, err := s.MatchPrefixHashesTiered([]int32{1, 2}, hashes)
			return err
		}(), "len(hashes) 5 exceeds", []string{"num_hashes", "num_tokens"}},
		{"AdmitHashes", func() error { _, _, err := mgr.AdmitHashes(nil, []int32{1, 2}, hashes, 0); return err }(),
			"len(hashes) 5 exceeds", []string{"num_hashes", "num_tokens"}},
		{"AdmitTiered", func() error { _, _, err := mgr.AdmitTiered(nil, []int32{1, 2}, hashes, 0); return err }(),
			"len(hashes) 5 exceeds", []string{"num_hashes", "num_tokens"}},
		{"Attention params", b.Attention(0, make([]float32, 8), make([]float32, 8), nil,
			&AttentionParams{SoftmaxScale: -1}), "AttentionParams.SoftmaxScale", []string{"params->"}},
		{"SwapBlocks", sp.SwapBlocks([]int32{1}, make([]byte, 4), SwapOut),
			"len(buf) 4 is below len(blocks) * ", []string{"host_bytes", "num_blocks"}},
		{"SwapBlocksPinned", sp.SwapBlocksPinned([]int32{1}, nil, 4, SwapOut, nil), "host is NULL",
			[]string{"host_buffer"}},
		{"SetRetention", func() error {
			rp := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 8, EnableRetention: true})
			rs, err := rp.CreateSeq(nil)
			ok(t, err)
			return rs.SetRetention([]RetentionRange{{Begin: 5, End: 2}})
		}(), "ranges[0].Begin 5 is not below its End 2", []string{"token_end"}},
		{"MLAAttention", mlaBatch.MLAAttention(0, make([]float32, 8), make([]float32, 4),
			make([]float32, 8), nil, -1), "softmaxScale -1 must be finite and > 0", []string{"params->"}},
		{"MLAAttentionTensor", func() error {
			q, err := NewTensor(unsafe.Add(kv.Data, 0), Float32, CPU, 0, []int64{1, 1, 8})
			ok(t, err)
			pe, err := NewTensor(unsafe.Add(kv.Data, 32), Float32, CPU, 0, []int64{1, 1, 4})
			ok(t, err)
			out, err := NewTensor(unsafe.Add(kv.Data, 64), Float32, CPU, 0, []int64{1, 1, 8})
			ok(t, err)
			return mlaBatch.MLAAttentionTensor(0, &q, &pe, &out, nil, &AttentionParams{SoftmaxScale: -1}, nil)
		}(), "AttentionParams.SoftmaxScale must be finite and > 0", []string{"params->"}},
		{"PrepareDecode of an uncomputed context", func() error {
			u, err := mgr.CreateSeq(nil)
			ok(t, err)
			ok(t, u.Append([]int32{1, 2, 3}))
			_, err = mgr.PrepareDecode([]SeqID{u.ID()}, []int32{4})
			return err
		}(), "compute them with Pool.Prepare and queryCounts[0] >= 4",
			[]string{"pkv_batch_prepare ", "query_counts"}},
	}
	for _, c := range cases {
		sentinel := ErrInvalidArgument
		switch c.name {
		case "NewGroupPool retention":
			sentinel = ErrUnsupported
		case "PrepareDecode of an uncomputed context":
			sentinel = ErrInvalidState
		}
		e := wantErr(t, c.err, sentinel)
		if !strings.Contains(e.Msg, c.want) {
			t.Errorf("%s: %q does not name %q", c.name, e.Msg, c.want)
		}
		for _, name := range c.c {
			if strings.Contains(e.Msg, name) {
				t.Errorf("%s: %q names the library's %q", c.name, e.Msg, name)
			}
		}
	}
}

// Messages quoting the caller's strings (a tier directory, an endpoint)
// keep them verbatim: only the library's argument names are rewritten.
func TestGoNamesLeaveQuotedCallerStringsAlone(t *testing.T) {
	p := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16, NumLayers: 1, NumKVHeads: 1, HeadDim: 8,
		DType: Float32, NumThreads: 1})
	dir := "/nonexistent-pkv-review/host_bytes/file_dir"
	err := p.AttachTiers(TierOptions{FileDir: dir, FileBytes: 1 << 20})
	e := wantErr(t, err, ErrInvalidArgument)
	if !strings.Contains(e.Msg, dir) {
		t.Errorf("message %q does not quote FileDir %q verbatim", e.Msg, dir)
	}

	// A quote inside the caller's string does not end the quoted span.
	dir = `/nonexistent-pkv-review/a"b/host_bytes`
	e = wantErr(t, p.AttachTiers(TierOptions{FileDir: dir, FileBytes: 1 << 20}), ErrInvalidArgument)
	if !strings.Contains(e.Msg, dir) {
		t.Errorf("message %q does not quote FileDir %q verbatim", e.Msg, dir)
	}

	ep := newPool(t, PoolOptions{BlockSize: 4, NumBlocks: 16, EnableEvents: true})
	endpoint := "ipc:///tmp/replay_endpoint"
	_, err = NewEventPublisher(ep, endpoint, "", &PublisherOptions{DataParallelRank: 1})
	if errors.Is(err, ErrUnsupported) {
		return
	}
	e = wantErr(t, err, ErrInvalidArgument)
	if !strings.Contains(e.Msg, endpoint) {
		t.Errorf("message %q does not quote the endpoint %q verbatim", e.Msg, endpoint)
	}
}
