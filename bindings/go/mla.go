package pagedkv

/*
#include "shim.h"
*/
import "C"

import (
	"math"
	"runtime"
	"unsafe"
)

// KVLayout is a pool's KV page layout (PoolOptions.KVLayout).
type KVLayout uint32

const (
	// LayoutMHA stores K and V per layer (the default).
	LayoutMHA KVLayout = C.PKV_KV_LAYOUT_MHA
	// LayoutMLA stores one latent tensor per layer (DeepSeek V2/V3, Kimi):
	// each token's compressed latent c_kv followed by its rotary key k_pe.
	LayoutMLA KVLayout = C.PKV_KV_LAYOUT_MLA
)

// mlaDims returns the MLA pool's latent and rotary widths.
func (b *Batch) mlaDims(op string) (int, int, error) {
	if b.kvLayout != LayoutMLA {
		return 0, 0, &Error{Code: CodeInvalidState, Op: op,
			Msg: "the pool stores K and V (KVLayout LayoutMHA): use CacheWrite / Attention"}
	}
	return b.kvLoRARank, b.qkRopeDim, nil
}

// mlaHost checks a host (f32 CPU) MLA call and returns the pool's latent
// and rotary widths.
func (b *Batch) mlaHost(op string, layer int) (int, int, error) {
	if b == nil {
		return 0, 0, closedError(op, "batch")
	}
	if err := b.hostCheck(op, layer, false); err != nil {
		return 0, 0, err
	}
	return b.mlaDims(op)
}

// MLACacheWrite scatters the step's latents into layer of an f32 CPU MLA
// pool: kvC [NumTokens, KVLoRARank] and kPe [NumTokens, QKRopeHeadDim],
// row-major. The write of the last layer commits the step, as CacheWrite
// does.
func (b *Batch) MLACacheWrite(layer int, kvC, kPe []float32) error {
	const op = "pkv_mla_cache_write"
	rank, rope, err := b.mlaHost(op, layer)
	if err != nil {
		return err
	}
	n := b.NumTokens()
	if len(kvC) != n*rank {
		return argError(op, "kvC has %d elements, want %d = [%d tokens, %d rank]", len(kvC), n*rank, n, rank)
	}
	if len(kPe) != n*rope {
		return argError(op, "kPe has %d elements, want %d = [%d tokens, %d rope]", len(kPe), n*rope, n, rope)
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	r := C.pkvgo_mla_cache_write_host(ptr, C.uint32_t(layer), C.uint32_t(Float32), f32Ptr(kvC),
		f32Ptr(kPe), C.int64_t(n), C.int64_t(rank), C.int64_t(rope))
	runtime.KeepAlive(kvC)
	runtime.KeepAlive(kPe)
	return check(op, r)
}

// MLAAttention runs absorbed MLA attention for every query of the plan on
// an f32 CPU MLA pool: qLatent [NumTokens, heads, KVLoRARank] (q_nope times
// W_UK), qPe [NumTokens, heads, QKRopeHeadDim], out like qLatent (the
// latent output; apply W_UV), lse nil or [NumTokens, heads]. softmaxScale
// is the model's (> 0; e.g. 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)).
func (b *Batch) MLAAttention(layer int, qLatent, qPe, out, lse []float32, softmaxScale float32) error {
	const op = "pkv_mla_attention"
	rank, rope, err := b.mlaHost(op, layer)
	if err != nil {
		return err
	}
	n := b.NumTokens()
	if n == 0 || rank == 0 || len(qLatent)%(n*rank) != 0 || len(qLatent) == 0 {
		return argError(op, "qLatent has %d elements, not a multiple of %d = [%d tokens, %d rank]",
			len(qLatent), n*rank, n, rank)
	}
	// The library's check, here to name this call's argument (the params
	// of MLAAttentionTensor are AttentionParams).
	if !(softmaxScale > 0) || math.IsInf(float64(softmaxScale), 1) {
		return argError(op, "softmaxScale %v must be finite and > 0 for MLA (the model's scale, e.g. "+
			"1/sqrt(qk_nope_head_dim + qk_rope_head_dim); the latent width does not give it)", softmaxScale)
	}
	heads := len(qLatent) / (n * rank)
	if len(qPe) != n*heads*rope {
		return argError(op, "qPe has %d elements, want %d = [%d tokens, %d heads, %d rope]",
			len(qPe), n*heads*rope, n, heads, rope)
	}
	if len(out) != len(qLatent) {
		return argError(op, "out has %d elements, want %d (as qLatent)", len(out), len(qLatent))
	}
	if lse != nil && len(lse) != n*heads {
		return argError(op, "lse has %d elements, want %d = [%d tokens, %d heads]", len(lse), n*heads, n, heads)
	}
	var cp C.pkv_attention_params
	if err := check("pkv_attention_params_init_sized", C.pkvgo_attention_params_init_sized(&cp, C.size_t(C.sizeof_pkv_attention_params))); err != nil {
		return err
	}
	cp.softmax_scale = C.float(softmaxScale)
	var lp *C.float
	if len(lse) > 0 {
		lp = (*C.float)(unsafe.Pointer(&lse[0]))
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	r := C.pkvgo_mla_attention_host(ptr, C.uint32_t(layer), C.uint32_t(Float32), f32Ptr(qLatent),
		f32Ptr(qPe), f32Ptr(out), lp, C.int64_t(n), C.int64_t(heads), C.int64_t(rank),
		C.int64_t(rope), &cp)
	runtime.KeepAlive(qLatent)
	runtime.KeepAlive(qPe)
	runtime.KeepAlive(out)
	runtime.KeepAlive(lse)
	return check(op, r)
}

// MLACacheWriteTensor is MLACacheWrite for memory outside Go (any dtype the
// pool stores; CUDA device memory for CUDA pools), on stream.
func (b *Batch) MLACacheWriteTensor(layer int, kvC, kPe *Tensor, stream unsafe.Pointer) error {
	const op = "pkv_mla_cache_write"
	if layer < 0 || int64(layer) > 1<<32-1 {
		return argError(op, "layer %d out of range", layer)
	}
	var cc, cpe C.pkv_tensor
	if err := kvC.toC(op, "kvC", &cc); err != nil {
		return err
	}
	var pp *C.pkv_tensor
	if kPe != nil {
		if err := kPe.toC(op, "kPe", &cpe); err != nil {
			return err
		}
		pp = &cpe
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	done, err := holdKernelOperands(op, []string{"kvC", "kPe"}, kvC, kPe)
	if err != nil {
		return err
	}
	defer done()
	return callChecked(op, []pointerArg{{"kvC", unsafe.Pointer(&cc), true}, {"kPe", unsafe.Pointer(pp), true},
		{"stream", stream, false}}, func() C.pkvgo_result {
		return C.pkvgo_mla_cache_write(ptr, C.uint32_t(layer), &cc, pp, stream)
	})
}

// MLAAttentionTensor is MLAAttention for memory outside Go, on stream;
// params must set SoftmaxScale (> 0) and nothing else. lse may be nil.
func (b *Batch) MLAAttentionTensor(layer int, qLatent, qPe, out, lse *Tensor, params *AttentionParams,
	stream unsafe.Pointer) error {
	const op = "pkv_mla_attention"
	if layer < 0 || int64(layer) > 1<<32-1 {
		return argError(op, "layer %d out of range", layer)
	}
	var cq, cp, co, cl C.pkv_tensor
	if err := qLatent.toC(op, "qLatent", &cq); err != nil {
		return err
	}
	var pp *C.pkv_tensor
	if qPe != nil {
		if err := qPe.toC(op, "qPe", &cp); err != nil {
			return err
		}
		pp = &cp
	}
	if err := out.toC(op, "out", &co); err != nil {
		return err
	}
	var lp *C.pkv_tensor
	if lse != nil {
		if err := lse.toC(op, "lse", &cl); err != nil {
			return err
		}
		lp = &cl
	}
	var cparams C.pkv_attention_params
	if err := params.toC(&cparams); err != nil {
		return err
	}
	ptr, err := b.acquire(op)
	if err != nil {
		return err
	}
	defer b.release()
	done, err := holdKernelOperands(op, []string{"qLatent", "qPe", "out", "lse"}, qLatent, qPe, out, lse)
	if err != nil {
		return err
	}
	defer done()
	return callChecked(op, []pointerArg{{"qLatent", unsafe.Pointer(&cq), true}, {"qPe", unsafe.Pointer(pp), true},
		{"out", unsafe.Pointer(&co), true}, {"lse", unsafe.Pointer(lp), true}, {"stream", stream, false}},
		func() C.pkvgo_result {
			return C.pkvgo_mla_attention(ptr, C.uint32_t(layer), &cq, pp, &co, lp, &cparams, stream)
		})
}
