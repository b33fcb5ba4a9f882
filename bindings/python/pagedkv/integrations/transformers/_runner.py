"""One engine step of a transformers decoder model over a pagedkv pool.

The step's tokens of every scheduled sequence are packed into one row
(``input_ids [1, tokens]``); the plan gives their positions (the model's
``position_ids``, zero-copy) and each sequence's last row (``logits_to_keep``,
so the LM head runs only for the sequences that sample). The model runs with
``use_cache=False`` (pagedkv is the cache) and its attention routed through
``attn_implementation="pagedkv"`` only for the duration of the call, so the
same model object still works with ``generate()`` around it.
"""

from __future__ import annotations

import contextlib
import operator
import warnings
from typing import Any, Iterator, Optional, Sequence

import pagedkv

from ._attention import active_step, register

_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def model_kv_shape(config: Any) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a decoder config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    v_head_dim = getattr(text, "v_head_dim", None)
    if v_head_dim and getattr(text, "qk_nope_head_dim", None) is not None:
        # MLA (DeepSeek-V2/V3) as transformers runs it: K/V expanded to heads,
        # k of qk_nope + qk_rope, v of v_head_dim; the pool holds the wider.
        head_dim = max(text.qk_nope_head_dim + text.qk_rope_head_dim, v_head_dim)
    return text.num_hidden_layers, kv_heads, head_dim


def pool_for_model(
    model: Any,
    *,
    num_blocks: int,
    block_size: int = 16,
    enable_prefix_caching: bool = True,
    num_threads: Optional[int] = None,
) -> pagedkv.Pool:
    """A CPU pool with storage shaped for model's K/V (its dtype, every layer)."""
    import torch

    _check_model(model)
    layers, kv_heads, head_dim = model_kv_shape(model.config)
    dtype = _DTYPES.get(str(model.dtype).replace("torch.", ""))
    if dtype is None:
        raise ValueError(f"model dtype {model.dtype}: pagedkv stores f32, bf16 or f16")
    device = next(model.parameters()).device
    if device.type != "cpu":
        if not torch.cuda.is_available() or pagedkv.cuda_device_count() == 0:
            raise ValueError(f"model on {device}: this pagedkv build has no CUDA device")
    return pagedkv.Pool(
        num_blocks=num_blocks,
        block_size=block_size,
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device="cpu" if device.type == "cpu" else f"cuda:{device.index or 0}",
        enable_prefix_caching=enable_prefix_caching,
        num_threads=num_threads,
    )


def _check_model(model: Any) -> None:
    """Refuses what is not a transformers decoder-only model, before any
    pool is made: anything else (a torch module, a pipeline, a tokenizer)
    failed with an AttributeError about ``config`` or ``dtype``, and an
    encoder-decoder model at its first step inside its forward."""
    import torch

    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise TypeError(
            f"model: expected a transformers causal LM (a PreTrainedModel such as LlamaForCausalLM), "
            f"got {type(model).__name__}"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"{type(model).__name__} is an encoder-decoder model: pagedkv runs decoder-only causal LMs (*ForCausalLM)"
        )


@contextlib.contextmanager
def pagedkv_attention(model: Any) -> Iterator[None]:
    """Routes model's attention through pagedkv inside the block."""
    name = register()
    config = model.config
    # transformers sets the top config's value on every sub-config too
    # (text, vision, ...): each one's own value is put back, parents first.
    before = [(c, c._attn_implementation) for c in _configs(config)]
    config._attn_implementation = name
    try:
        yield
    finally:
        for c, value in before:
            c._attn_implementation = value


def _configs(config: Any) -> list:
    """config and its sub-configs, recursively, each before its own."""
    out = [config]
    for key in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            out += _configs(sub)
    return out


def as_torch_i64(view: pagedkv.TensorView, device: Any) -> Any:
    """A torch tensor over a read-only int64 plan view, without a copy on
    the CPU. torch has no read-only tensors and warns about that; the model
    only reads position ids and logits indices, and the library never reads
    these arrays back, so nothing can be misled."""
    import torch

    if view.device.type == pagedkv.DeviceType.CPU:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(view.numpy())
        return t if device.type == "cpu" else t.to(device)
    return view.torch()


_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def _check_rope_length(config: Any, positions: Any) -> None:
    """Refuses a step that would reach the length at which a dynamic or
    longrope RoPE changes its frequencies. transformers picks them from the
    longest position in the forward (``max(position_ids) + 1`` past the
    original context length: longrope's long factors, dynamic NTK's larger
    base) for every token of it, so in a packed step every sequence would get
    the longest one's, and a prompt prefilled in chunks other frequencies than
    generate()'s one forward. Below that length they are the fixed ones."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    if not isinstance(params, dict) or positions.numel() == 0:
        return
    for p in params.values() if all(isinstance(v, dict) for v in params.values()) else [params]:
        kind = p.get("rope_type", p.get("type"))
        if kind not in _LENGTH_DEPENDENT_ROPE:
            continue
        # dynamic grows past the rotary's cached length, max_position_embeddings;
        # longrope switches to its long factors past the original length.
        limit = (
            text.max_position_embeddings
            if kind == "dynamic"
            else p.get("original_max_position_embeddings")
            or getattr(text, "original_max_position_embeddings", None)
            or text.max_position_embeddings
        )
        longest = int(positions.max()) + 1
        if longest > limit:
            raise ValueError(
                f"{type(text).__name__}: rope_type {kind!r} changes its frequencies past {limit} tokens "
                f"from the longest sequence of a forward; this step reaches "
                f"{longest} tokens. pagedkv packs sequences and prefills in chunks, which would give other "
                f"tokens than generate(): it runs such models within their first {limit} tokens"
            )


def run_step(
    model: Any,
    pool: pagedkv.Pool,
    seqs: Sequence[pagedkv.Sequence],
    counts: Sequence[int],
    input_ids: Any,
    sample_rows: Any,
) -> Any:
    """Runs the model over the last counts[i] tokens of each seqs[i]
    (input_ids: their ids, packed, int64 [tokens]); returns the logits
    ``[len(sample_rows), vocab]`` of the sequences listed in sample_rows
    (indices into seqs). The step commits when every layer's cache write
    succeeded; on an exception nothing of it counts as computed."""
    import torch

    _check_step_inputs(torch, seqs, counts, input_ids, sample_rows)
    device = input_ids.device
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    with pool.prepare(seqs, counts, stream) as step, torch.inference_mode(), pagedkv_attention(model):
        with active_step(step) as calls:
            positions = as_torch_i64(step.token_positions(), device)
            last = as_torch_i64(step.last_token_indices(), device)
            keep = last.index_select(0, sample_rows.to(device))
            _check_rope_length(model.config, positions)
            try:
                out = model(
                    input_ids=input_ids[None],
                    position_ids=positions[None],
                    logits_to_keep=keep,
                    use_cache=False,
                    pagedkv_step=step,
                )
            except Exception as e:
                if calls.layers or getattr(model, "_supports_attention_backend", True):
                    raise
                raise ValueError(_not_routed(model, calls.layers, pool.num_layers, e)) from e
            # Before the step commits: layers that attended some other way
            # wrote no K/V here, and their output did not see the cache.
            if sorted(calls.layers) != list(range(pool.num_layers)):
                raise ValueError(_not_routed(model, calls.layers, pool.num_layers))
    return out.logits[0]


def _check_step_inputs(
    torch: Any, seqs: Sequence[Any], counts: Sequence[int], input_ids: Any, sample_rows: Any
) -> None:
    """Refuses inputs that failed deep inside the model with messages that
    named neither: input_ids in transformers' usual [1, tokens] shape (a
    size mismatch in the rotary embedding), too many or too few ids for
    counts, float ids; sample_rows that is not a tensor or names no
    sequence (an IndexError "index out of range in self")."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1 or input_ids.is_floating_point():
        shape = list(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids: expected a 1-d integer tensor of the step's tokens, packed; got {shape}")
    try:
        total = sum(operator.index(c) for c in counts)
    except TypeError:
        total = None  # the plan refuses such counts, naming them
    if total is not None and input_ids.shape[0] != total:
        raise ValueError(f"input_ids: {input_ids.shape[0]} ids for counts that sum to {total}")
    if not isinstance(sample_rows, torch.Tensor) or sample_rows.dim() != 1 or sample_rows.is_floating_point():
        raise TypeError("sample_rows: expected a 1-d integer tensor of indices into seqs")
    if sample_rows.numel() and not (0 <= int(sample_rows.min()) and int(sample_rows.max()) < len(seqs)):
        raise IndexError(f"sample_rows: indices must be in [0, {len(seqs)}), got {sample_rows.tolist()}")


def _not_routed(model: Any, layers: Sequence[int], num_layers: int, error: Optional[BaseException] = None) -> str:
    """Why a model cannot run on pagedkv: its attention does not go
    through transformers' attention-function registry (Falcon, GPT-J,
    BLOOM, MPT: their own attention code), or not in every layer (hybrids:
    linear attention, convolutions, Mamba keep a state of their own)."""
    name = type(model).__name__
    if error is not None:
        what = f"its forward raised ({type(error).__name__}: {error}) before any layer's attention reached pagedkv"
    else:
        missing = [i for i in range(num_layers) if i not in set(layers)]
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        types = getattr(text, "layer_types", None)
        kinds = sorted({str(types[i]) for i in missing if types and i < len(types)})
        what = (
            f"the attention of layers {missing} of {num_layers} did not go through pagedkv"
            + (f" (layer_types {', '.join(kinds)})" if kinds else "")
            + (f"; {len(layers)} calls reached it for layers {sorted(set(layers))}" if layers else "")
        )
    return (
        f"{name}: {what}. pagedkv runs models whose every layer attends through transformers' "
        f"attention-function registry (attn_implementation) once per step, e.g. Llama, Qwen2, Mistral, Gemma; "
        f"layers with attention code of their own (Falcon, GPT-J, BLOOM) or a state of their own (linear "
        f"attention, convolutions, Mamba) cannot use a paged KV cache (_supports_attention_backend = "
        f"{getattr(model, '_supports_attention_backend', None)})"
    )
