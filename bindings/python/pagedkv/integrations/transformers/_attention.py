"""Attention through a pagedkv step plan, as a transformers attention function.

transformers' attention modules call ``ALL_ATTENTION_FUNCTIONS[name](module,
query, key, value, attention_mask, scaling=..., **kwargs)`` with head-major
tensors ``[batch, heads, tokens, head_dim]``; the kwargs given to the model's
forward reach it. The generator packs every scheduled token of the step into
one row (batch 1) and passes the step plan as ``pagedkv_step``: this function
writes the layer's new K/V into the paged cache (``Batch.cache_write``) and
runs paged attention over each sequence's cached tokens (``Batch.attention``).
pagedkv's tensor descriptors take any non-negative strides with a contiguous
innermost dimension, so head-major and token-major inputs both go to the
kernels as strided views, never copied.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, List, Optional, Tuple

ATTN_IMPLEMENTATION = "pagedkv"

_registered = False

# The default of pagedkv_attention_forward's sliding_window: a module that
# passes none at all (PhiMoE) is told apart from one that passes None.
_NOT_PASSED: Any = object()


class StepCalls:
    """The step plan :func:`run_step` is running the model over, and the
    layers whose attention reached it (in call order)."""

    __slots__ = ("layers", "step")

    def __init__(self, step: Any) -> None:
        self.step = step
        self.layers: List[int] = []


_active: contextvars.ContextVar = contextvars.ContextVar("pagedkv_active_step", default=None)


@contextlib.contextmanager
def active_step(step: Any) -> Iterator[StepCalls]:
    """Makes step the plan of attention calls inside the block that get no
    ``pagedkv_step`` kwarg: some models' decoder layers do not pass the
    forward's kwargs on to their attention module (StableLM)."""
    calls = StepCalls(step)
    token = _active.set(calls)
    try:
        yield calls
    finally:
        _active.reset(token)


def token_rows(x: Any, layout: str) -> Any:
    """A ``[tokens, heads, head_dim]`` view of x (no copy).

    layout: ``"bhtd"`` (transformers' head-major ``[1, heads, tokens, dim]``),
    ``"bthd"`` (token-major ``[1, tokens, heads, dim]``), ``"htd"`` or ``"thd"``
    (the same without the batch dimension)."""
    if layout in ("bhtd", "bthd"):
        if x.dim() != 4 or x.shape[0] != 1:
            raise ValueError(f"expected [1, ...] with the step's tokens packed into one row, got shape {list(x.shape)}")
        x = x[0]
        layout = layout[1:]
    if x.dim() != 3:
        raise ValueError(f"expected a 3-d tensor for layout {layout!r}, got shape {list(x.shape)}")
    if layout == "htd":
        return x.transpose(0, 1)
    if layout == "thd":
        return x
    raise ValueError(f"layout must be one of bhtd, bthd, htd, thd; got {layout!r}")


def paged_attention(
    step: Any,
    layer: int,
    query: Any,
    key: Any,
    value: Any,
    *,
    layout: str = "bhtd",
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    out: Any = None,
) -> Any:
    """Writes key/value into layer's cache slots of the step and returns the
    attention output ``[1, tokens, heads, head_dim]`` (token-major, what
    transformers reshapes to ``[1, tokens, hidden]``), or into ``out`` when
    given (any layout :func:`token_rows` takes)."""
    import torch

    q = token_rows(query, layout)
    stream = torch.cuda.current_stream(q.device) if q.is_cuda else None
    step.cache_write(layer, token_rows(key, layout), token_rows(value, layout), stream=stream)
    if out is None:
        out = torch.empty((1, q.shape[0], q.shape[1], q.shape[2]), dtype=q.dtype, device=q.device)
        rows = out[0]
    else:
        rows = token_rows(out, layout)
    step.attention(
        layer,
        q,
        rows,
        softmax_scale=float(scaling or 0.0),
        sliding_window=int(sliding_window or 0),
        logit_softcap=float(softcap or 0.0),
        stream=stream,
    )
    return out


def pagedkv_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    sliding_window: Optional[int] = _NOT_PASSED,
    softcap: Optional[float] = None,
    pagedkv_step: Any = None,
    s_aux: Any = None,
    **kwargs: Any,
) -> Tuple[Any, None]:
    """The transformers attention function (see the module docstring).

    pagedkv_step: the step plan; None takes the one :func:`active_step`
    (:func:`run_step`) set, for models whose layers drop the kwargs.

    s_aux: per-query-head attention-sink logits (gpt-oss's ``sinks``): each
    head's softmax also normalizes over one extra logit with no value, so
    the output is pagedkv's scaled by ``sigmoid(lse - sink)``."""
    active = _active.get()
    if pagedkv_step is None and active is not None:
        pagedkv_step = active.step
    if active is not None and pagedkv_step is active.step:
        active.layers.append(module.layer_idx)
    if pagedkv_step is None:
        raise RuntimeError(
            "attn_implementation 'pagedkv' needs the step plan: call the model with pagedkv_step=<pagedkv.Batch> "
            "(pagedkv.integrations.transformers.Generator does)"
        )
    if attention_mask is not None:
        raise ValueError(
            f"layer {getattr(module, 'layer_idx', None)} of {type(getattr(module, 'config', None)).__name__} "
            "got an attention mask: attn_implementation 'pagedkv' computes causal attention per sequence from "
            "the step plan and takes no mask (pass no attention_mask; a model whose attention makes a mask of its "
            "own, such as Doge's dynamic mask, cannot run on pagedkv)"
        )
    if dropout:
        raise ValueError("attn_implementation 'pagedkv' is for inference: dropout must be 0 (model.eval())")
    _check_kwargs(module, kwargs)
    _check_layer_type(module)
    if sliding_window is _NOT_PASSED:
        sliding_window = _layer_window(module, passed=False)
    elif sliding_window is None:
        sliding_window = _layer_window(module)
    if s_aux is not None:
        return _attention_with_sinks(
            pagedkv_step,
            module.layer_idx,
            query,
            key,
            value,
            s_aux,
            scaling=scaling,
            sliding_window=sliding_window,
            softcap=softcap,
        ), None
    dk, dv = key.shape[-1], value.shape[-1]
    if dv != dk:
        return _attention_padded(
            pagedkv_step, module.layer_idx, query, key, value, scaling, sliding_window, softcap
        ), None
    out = paged_attention(
        pagedkv_step,
        module.layer_idx,
        query,
        key,
        value,
        scaling=scaling,
        sliding_window=sliding_window,
        softcap=softcap,
    )
    return out, None


_LAYER_TYPES = ("full_attention", "sliding_attention")

# Arguments that some attention modules pass and that change the output,
# which pagedkv's attention cannot apply: refused rather than ignored.
_REFUSED_KWARGS = {
    "sinks": "attention sinks in a layout other than gpt-oss's s_aux",
    "position_bias": "an additive position bias (T5-style relative attention)",
    "indices": "sparse attention over indexer-selected keys",
    "block_indices": "block-sparse attention over selected blocks",
    "head_mask": "a per-head mask of the attention weights",
}
# Tensors that reach the attention function and change nothing it computes:
# position ids (for FlashAttention's packing detection) and varlen metadata
# of FlashAttention (the step plan is what separates sequences here).
_IGNORED_TENSOR_KWARGS = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "cache_position")


def _check_kwargs(module: Any, kwargs: dict) -> None:
    """Refuses attention arguments that would change the output and that
    pagedkv would otherwise ignore: a bidirectional (non-causal) layer or
    model, and the arguments of _REFUSED_KWARGS or any other tensor."""
    config = getattr(module, "config", None)
    where = f"layer {getattr(module, 'layer_idx', None)} of {type(config).__name__}"
    if (
        kwargs.get("is_causal", True) is False
        or getattr(module, "is_causal", True) is False
        or getattr(config, "is_causal", True) is False
    ):
        raise ValueError(
            f"{where} attends bidirectionally (is_causal False): attn_implementation 'pagedkv' attends causally "
            "over each sequence's cache"
        )
    for name, value in kwargs.items():
        if value is None:
            continue
        what = _REFUSED_KWARGS.get(name)
        if what is None and name not in _IGNORED_TENSOR_KWARGS and _is_tensor(value):
            what = "a tensor argument that pagedkv's attention does not know"
        if what is not None:
            raise ValueError(
                f"{where} passes {name!r} to its attention function ({what}): attn_implementation 'pagedkv' "
                "cannot apply it, and ignoring it would give other outputs"
            )


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _check_layer_type(module: Any) -> None:
    """Refuses a layer whose mask pagedkv cannot make: transformers builds
    the mask of each ``config.layer_types`` entry, and pagedkv attends
    causally over the whole context or a sliding window, nothing else (Llama
    4's "chunked_attention" layers see only their chunk of
    attention_chunk_size tokens)."""
    config = getattr(module, "config", None)
    types = getattr(config, "layer_types", None)
    layer = getattr(module, "layer_idx", None)
    if not types or layer is None or layer >= len(types) or types[layer] in _LAYER_TYPES:
        return
    chunk = getattr(config, "attention_chunk_size", None)
    raise ValueError(
        f"layer {layer} of {type(config).__name__} is {types[layer]!r}"
        + (f" (attention_chunk_size {chunk})" if chunk and "chunk" in str(types[layer]) else "")
        + ": attn_implementation 'pagedkv' attends causally over the whole context or a sliding window "
        f"({' or '.join(_LAYER_TYPES)} layers), not with that layer's mask"
    )


def _layer_window(module: Any, passed: bool = True) -> Optional[int]:
    """The sliding window of a layer whose attention module does not pass
    one (Qwen2-MoE): transformers gives a layer of ``config.layer_types``
    "sliding_attention" the mask of ``config.sliding_window``. A config
    without layer_types whose attention passes no sliding_window at all
    (PhiMoE) has transformers make every layer's mask with
    ``create_sliding_window_causal_mask`` when ``config.sliding_window`` is
    set: every layer slides."""
    config = getattr(module, "config", None)
    types = getattr(config, "layer_types", None)
    layer = getattr(module, "layer_idx", None)
    if not types and not passed and getattr(config, "use_sliding_window", True):
        return getattr(config, "sliding_window", None) or None
    if not types or layer is None or layer >= len(types) or types[layer] != "sliding_attention":
        return None
    return getattr(config, "sliding_window", None) or None


def _attention_padded(
    step: Any,
    layer: int,
    query: Any,
    key: Any,
    value: Any,
    scaling: Optional[float],
    sliding_window: Optional[int],
    softcap: Optional[float],
) -> Any:
    """Attention whose values are narrower or wider than its queries and
    keys (DeepSeek-V2/V3's MLA expanded to heads: q/k of qk_nope + qk_rope,
    v of v_head_dim). The pool holds max(dk, dv) per head (model_kv_shape):
    zeros pad q, k and v to it, which changes no dot product, and the output
    is cut back to dv. The scale stays the model's (1/sqrt(dk) if none)."""
    import torch.nn.functional as F

    dk, dv = key.shape[-1], value.shape[-1]
    d = max(dk, dv)
    out = paged_attention(
        step,
        layer,
        F.pad(query, (0, d - dk)),
        F.pad(key, (0, d - dk)),
        F.pad(value, (0, d - dv)),
        scaling=scaling or dk**-0.5,
        sliding_window=sliding_window,
        softcap=softcap,
    )
    return out[..., :dv]


def _attention_with_sinks(
    step: Any,
    layer: int,
    query: Any,
    key: Any,
    value: Any,
    sinks: Any,
    *,
    scaling: Optional[float],
    sliding_window: Optional[int],
    softcap: Optional[float],
) -> Any:
    """Attention whose softmax has one more logit per head, sinks[h], with
    no value (gpt-oss): sum_i e^{s_i} v_i / (e^{sink} + sum_i e^{s_i}) is
    the plain output times e^{lse} / (e^{lse} + e^{sink}) = sigmoid(lse - sink),
    lse being the log-sum-exp of the scaled logits that pagedkv returns."""
    import torch

    q = token_rows(query, "bhtd")
    heads = q.shape[1]
    sinks = sinks.reshape(-1)
    if sinks.numel() != heads:
        raise ValueError(f"attention sinks: {sinks.numel()} values for {heads} query heads")
    stream = torch.cuda.current_stream(q.device) if q.is_cuda else None
    step.cache_write(layer, token_rows(key, "bhtd"), token_rows(value, "bhtd"), stream=stream)
    out = torch.empty((1, q.shape[0], heads, q.shape[2]), dtype=q.dtype, device=q.device)
    _, lse = step.attention(
        layer,
        q,
        out[0],
        lse=True,
        softmax_scale=float(scaling or 0.0),
        sliding_window=int(sliding_window or 0),
        logit_softcap=float(softcap or 0.0),
        stream=stream,
    )
    gate = torch.sigmoid(lse - sinks.to(device=lse.device, dtype=torch.float32)[None, :])  # [tokens, heads]
    return (out.float() * gate[None, :, :, None]).to(q.dtype)


def pagedkv_mask(*, attention_mask: Any = None, use_vmap: bool = False, config: Any = None, **kwargs: Any) -> None:
    """The mask function transformers' mask creation (``create_causal_mask``
    and its kin) calls for attn_implementation "pagedkv": there is no mask,
    pagedkv's step plan says what each token sees (None, as for an
    implementation with no mask function, which made transformers drop the
    model's 2-d attention_mask unread). Refuses what that would silently
    ignore: a 2-d attention_mask with padding (zeros) given to the model,
    and a mask function the model lays over the causal one (``or_mask_function``
    / ``and_mask_function``, e.g. bidirectional image tokens)."""
    name = type(config).__name__
    if use_vmap:
        raise ValueError(
            f"{name}: the model lays a mask function of its own over the causal mask (or_mask_function / "
            "and_mask_function, e.g. bidirectional attention among image tokens): attn_implementation 'pagedkv' "
            "attends causally over each sequence's cache and cannot apply it"
        )
    if attention_mask is not None and getattr(attention_mask, "ndim", 0) == 2 and not bool(attention_mask.all()):
        raise ValueError(
            f"{name}: an attention_mask with padding (zeros) was given to the model: attn_implementation 'pagedkv' "
            "attends over each sequence's cached tokens as the step plan says and would ignore it; pass each "
            "sequence's own tokens, unpadded (run_step / Generator pass no attention_mask)"
        )
    return None


def register() -> str:
    """Registers ``"pagedkv"`` in transformers' attention-function registry
    (idempotent) and returns the name to pass as ``attn_implementation``."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface, AttentionMaskInterface

        AttentionInterface.register(ATTN_IMPLEMENTATION, pagedkv_attention_forward)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, pagedkv_mask)
        _registered = True
    return ATTN_IMPLEMENTATION
