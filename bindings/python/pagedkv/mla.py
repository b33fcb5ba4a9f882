"""MLA (DeepSeek-style multi-head latent attention) on a pagedkv pool.

An MLA pool (``Pool(kv_layout="mla", kv_lora_rank=512, qk_rope_head_dim=64,
...)``) stores per layer one tensor [num_blocks, block_size, kv_lora_rank +
qk_rope_head_dim]: each token's compressed latent c_kv followed by its
rotary key k_pe, no V (as vLLM's MLA backends and FlashMLA do). Per layer
call :func:`cache_write` with the step's latents, then :func:`attention`
with the absorbed query (q_nope @ W_UK) and the rotary query; apply W_UV to
the result. The same calls are :meth:`Batch.mla_cache_write` and
:meth:`Batch.mla_attention`. Tensors are numpy, torch or cupy arrays of the
pool's dtype and device, taken without copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Tuple, Union

from . import _pagedkv as _c
from ._batch import _c_float
from ._pool import _check_pool, _index
from ._tensor import describe, empty_like, stream_ptr
from ._types import DType, KvLayout

if TYPE_CHECKING:
    from ._batch import Batch
    from ._pool import Pool

__all__ = ["attention", "bytes_per_token", "cache_write", "is_mla"]


def _check_batch(batch: Any) -> None:
    # batch._pool raised AttributeError "'NoneType' object has no attribute '_pool'".
    from ._batch import Batch

    if not isinstance(batch, Batch):
        raise TypeError(f"batch: expected a pagedkv.Batch, got {type(batch).__name__}")


def is_mla(pool: Pool) -> bool:
    """Whether the pool stores MLA latents (kv_layout "mla")."""
    _check_pool(pool)
    return pool.options.kv_layout == KvLayout.MLA


def bytes_per_token(pool: Pool) -> int:
    """KV bytes one token takes over all layers (the latent plus the rotary
    key per layer on an MLA pool; K plus V on an MHA pool)."""
    _check_pool(pool)
    return pool.bytes_per_block // pool.block_size


def _latent_dims(pool: Pool) -> Tuple[int, int]:
    o = pool.options
    if o.kv_layout != KvLayout.MLA:
        raise _c.InvalidStateError(
            "the pool stores K and V (kv_layout 'mha'): use Batch.cache_write / Batch.attention",
            _c.PKV_E_INVALID_STATE,
        )
    return o.kv_lora_rank, o.qk_rope_head_dim


def cache_write(batch: Batch, layer: int, kv_c: Any, k_pe: Any, stream: Any = None) -> None:
    """Scatters the step's latents into layer: kv_c [num_tokens,
    kv_lora_rank] and k_pe [num_tokens, qk_rope_head_dim] (or [num_tokens, 1,
    qk_rope_head_dim], as vLLM passes it). The write of the last layer
    commits the step, as Batch.cache_write does."""
    _check_batch(batch)
    pool = batch._pool
    rank, rope = _latent_dims(pool)
    s = stream_ptr(stream)
    n = batch.num_tokens
    cd = batch._tensor(kv_c, "kv_c", pool.dtype, (n, rank), s)
    # The layout from the tensor itself: a k_pe behind DLPack or an array
    # interface alone need have no `shape` attribute.
    pd = describe(k_pe, "k_pe", stream=s, expect=pool.dtype)
    pshape = (n, 1, rope) if len(pd.shape) == 3 else (n, rope)
    pd = batch._tensor(pd, "k_pe", pool.dtype, pshape, s)
    dev = pool.device
    layer = _index(layer, "layer")
    batch._call(_c.pkv_mla_cache_write, layer, cd.as_c(dev), pd.as_c(dev), s)
    batch._layer_written(layer)


def attention(
    batch: Batch,
    layer: int,
    q_latent: Any,
    q_pe: Any,
    out: Any = None,
    *,
    softmax_scale: float,
    lse: Any = None,
    stream: Any = None,
) -> Union[Any, Tuple[Any, Any]]:
    """Absorbed MLA attention of every query of the plan over its sequence
    (decode, prefill and chunked prefill alike, causal).

    q_latent: [num_tokens, num_heads, kv_lora_rank] (q_nope @ W_UK); q_pe:
    [num_tokens, num_heads, qk_rope_head_dim]; out: [num_tokens, num_heads,
    kv_lora_rank] (allocated like q_latent when None). softmax_scale is the
    model's (e.g. 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)), required.
    lse: None, True (allocate) or a float32 [num_tokens, num_heads] tensor.
    Returns out, or (out, lse) when lse was asked for."""
    _check_batch(batch)
    pool = batch._pool
    rank, rope = _latent_dims(pool)
    s = stream_ptr(stream)
    n = batch.num_tokens
    qd = batch._tensor(q_latent, "q_latent", pool.dtype, (n, None, rank), s)
    heads = qd.shape[1]
    if heads == 0:
        raise _c.InvalidArgumentError("q_latent: 0 query heads", _c.PKV_E_INVALID_ARGUMENT)
    pd = batch._tensor(q_pe, "q_pe", pool.dtype, (n, heads, rope), s)
    if out is None:
        out = empty_like(q_latent)
    od = batch._tensor(out, "out", pool.dtype, (n, heads, rank), s, writable=True)
    want_lse = lse is not None and lse is not False
    ld = None
    if want_lse:
        if lse is True:
            lse = empty_like(q_latent, (n, heads), float32=True)
        ld = batch._tensor(lse, "lse", DType.F32, (n, heads), s, writable=True)
    dev = pool.device
    batch._call(
        _c.pkv_mla_attention,
        _index(layer, "layer"),
        qd.as_c(dev),
        pd.as_c(dev),
        od.as_c(dev),
        ld.as_c(dev) if ld is not None else None,
        {"softmax_scale": _c_float("softmax_scale", softmax_scale)},
        s,
    )
    return (out, lse) if want_lse else out
