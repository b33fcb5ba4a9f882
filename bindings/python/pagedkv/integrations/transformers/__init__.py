"""Hugging Face transformers decoder models on pagedkv.

    from pagedkv.integrations.transformers import Generator, SamplingParams

    gen = Generator(model, num_blocks=512, block_size=16, max_num_batched_tokens=256)
    outs = gen.generate([prompt_ids_1, prompt_ids_2], SamplingParams(max_new_tokens=32))
    outs[0][0].tokens  # the first prompt's generated ids

The model's attention goes through transformers' attention-function registry
(``attn_implementation="pagedkv"``, registered on first use): K/V live in a
pagedkv pool, and each step is one pagedkv plan whose token positions and
last-token rows feed the model's ``position_ids`` and ``logits_to_keep``.
:class:`Generator` adds continuous batching with prefix caching, chunked
prefill, preemption and fork-based parallel sampling. Needs torch and
transformers (tested with transformers 5.23 and torch 2.15: scripts/deps/models.*).
"""

from ._attention import (
    ATTN_IMPLEMENTATION,
    active_step,
    paged_attention,
    pagedkv_attention_forward,
    register,
    token_rows,
)
from ._generator import Completion, GenerationError, Generator, GeneratorStats, SamplingParams
from ._runner import model_kv_shape, pagedkv_attention, pool_for_model, run_step

__all__ = [
    "ATTN_IMPLEMENTATION",
    "Completion",
    "GenerationError",
    "Generator",
    "GeneratorStats",
    "SamplingParams",
    "active_step",
    "model_kv_shape",
    "paged_attention",
    "pagedkv_attention",
    "pagedkv_attention_forward",
    "pool_for_model",
    "register",
    "run_step",
    "token_rows",
]
