"""pagedkv.integrations.transformers on decoder families beyond Llama and
Qwen2 (tiny random-weight configs, conftest._family_configs): greedy tokens
equal generate() in f32 through chunked prefill and prefix hits with prompts
longer than any sliding window; models whose attention pagedkv cannot run
are refused with an error that says why."""

import pytest
import torch

from conftest import family_model, random_prompts, reference_greedy
from pagedkv.integrations.transformers import Generator, SamplingParams, model_kv_shape, run_step

NEW = 6


def greedy_matches_generate(model, *, preempt=False):
    first = random_prompts(11, [5, 21, 30], 384)
    second = [[*first[1][:16], 3, 4], first[2] + [9]]  # whole blocks of first's prompts are prefix hits
    with Generator(model, num_blocks=200, block_size=4, max_num_batched_tokens=16) as gen:
        outs = gen.generate(first, SamplingParams(max_new_tokens=NEW))
        outs += gen.generate(second, SamplingParams(max_new_tokens=NEW))
        assert gen.stats.chunked_prefills > 0
        assert gen.stats.prefix_hit_tokens >= 16 + 28
    for prompt, (c,) in zip(first + second, outs):
        assert c.tokens == reference_greedy(model, prompt, NEW), (len(prompt), c.tokens)
    if preempt:  # 9 blocks of 4 tokens for sequences that grow to 4, 4, 5 and 3 blocks
        prompts = random_prompts(12, [10, 7, 11, 5], 384)
        with Generator(model, num_blocks=9, block_size=4, max_num_batched_tokens=64) as gen:
            outs = gen.generate(prompts, SamplingParams(max_new_tokens=NEW))
            assert gen.stats.preemptions > 0
            gen.pool.validate()
        for prompt, (c,) in zip(prompts, outs):
            assert c.tokens == reference_greedy(model, prompt, NEW), ("preempted", len(prompt), c.tokens)


SUPPORTED = [
    "mistral",
    "gemma",
    "gemma2",
    "gemma3",
    "qwen3",
    "qwen2_sliding",
    "phi3",
    "olmo2",
    "granite",
    "cohere",
    "cohere2",
    "starcoder2",
    "gpt_neox",
    "mixtral",
    "qwen3_moe",
    "phi",
    "gpt2",
    "gpt_bigcode",
    "opt",
]


@pytest.mark.parametrize("name", SUPPORTED)
def test_greedy_equals_generate(name):
    """The families the README lists as tested (sliding windows of 8 tokens
    under prompts of up to 31, Gemma 2's softcapping and query scalar,
    Granite's multipliers, q/k norms, partial rotary, MoE, MQA), also
    under preemption."""
    greedy_matches_generate(family_model(name), preempt=True)


def test_gpt_oss_attention_sinks():
    """gpt-oss's attention has a learned sink logit per head (s_aux): the
    softmax also normalizes over it. Ignoring it gave other tokens."""
    model = family_model("gpt_oss")
    g = torch.Generator().manual_seed(1)
    for layer in model.model.layers:  # trained sinks are logits of a few units, not ~0 as initialized
        layer.self_attn.sinks.data = torch.rand(layer.self_attn.sinks.shape, generator=g) * 4
    greedy_matches_generate(model)


def test_qwen2_moe_sliding_layers_whose_attention_passes_no_window():
    """Qwen2-MoE's sliding layers get their window only from the mask
    (config.layer_types), not as the attention function's sliding_window:
    they attended over the whole context, other tokens past 8."""
    model = family_model("qwen2_moe")
    assert model.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    greedy_matches_generate(model)


def test_phimoe_whose_window_is_only_in_the_mask():
    """PhiMoE has no layer_types and its attention passes no sliding_window:
    transformers windows every layer through the mask
    (create_sliding_window_causal_mask when config.sliding_window is set),
    which pagedkv does not get. Its layers attended over the whole context,
    other tokens past 8."""
    model = family_model("phimoe")
    assert getattr(model.config, "layer_types", None) is None and model.config.sliding_window == 8
    prompts = random_prompts(11, [21, 30], 384)
    with Generator(model, num_blocks=64, block_size=4, max_num_batched_tokens=16) as gen:
        outs = gen.generate(prompts, SamplingParams(max_new_tokens=4))
        assert gen.stats.chunked_prefills > 0
    for prompt, (c,) in zip(prompts, outs):
        assert c.tokens == reference_greedy(model, prompt, 4), len(prompt)


def test_deepseek_v3_values_narrower_than_keys():
    """DeepSeek-V3's attention (MLA expanded to heads) has keys of
    qk_nope + qk_rope = 24 and values of v_head_dim = 16: the pool was made
    with head_dim = qk_rope_head_dim (8) and the first cache_write failed
    with "k: expected shape [16, 4, 8], got [16, 4, 24]"."""
    model = family_model("deepseek_v3")
    assert model_kv_shape(model.config) == (3, 4, 24)
    greedy_matches_generate(model)


def test_stablelm_whose_layers_drop_the_kwargs():
    """StableLM's decoder layers call their attention without the forward's
    kwargs, so pagedkv_step never reached it: "needs the step plan", from
    Generator itself. run_step also makes the plan the active one."""
    greedy_matches_generate(family_model("stablelm"))


@pytest.mark.parametrize("name", ["falcon", "gptj", "bloom"])
def test_models_with_attention_of_their_own_are_refused(name):
    """Falcon, GPT-J and BLOOM attend in their own code, not through the
    attention-function registry: the step wrote no K/V and saw no cache
    (Falcon raised a TypeError inside the model, GPT-J and BLOOM returned
    their first token, then failed at the next step's plan). Refused at the
    first step, naming why, with nothing computed."""
    model = family_model(name)
    with Generator(model, num_blocks=32, block_size=4) as gen:
        with pytest.raises(ValueError, match="attention-function registry"):
            gen.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=2))
        s = gen.pool.create_sequence()
        s.append([1, 2, 3])
        with pytest.raises(ValueError, match=type(model).__name__):
            run_step(model, gen.pool, [s], [3], torch.tensor([1, 2, 3]), torch.tensor([0]))
        assert s.num_computed_tokens == 0


def test_llama4_chunked_attention_layers_are_refused():
    """Llama 4's "chunked_attention" layers see only their chunk of
    attention_chunk_size tokens (a mask pagedkv does not make): they
    attended over the whole context, other tokens once a sequence crossed a
    chunk, with no error. Refused at the first step, naming the layer."""
    model = family_model("llama4")
    with Generator(model, num_blocks=32, block_size=4) as gen:
        with pytest.raises(ValueError, match="layer 0 of Llama4TextConfig is 'chunked_attention'"):
            gen.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=2))
        gen.pool.validate()


def test_longrope_past_the_original_length_is_refused():
    """A longrope RoPE (Phi-3 128k) takes the long factors for every token
    of a forward whose longest position passes original_max_position_embeddings:
    a short sequence packed with a long one got them too (other tokens than
    its own generate(), with no error). Within the original length the
    tokens equal generate(); a step that passes it is refused."""
    model = family_model("phi3_longrope")
    short = random_prompts(12, [5, 7], 384)
    with Generator(model, num_blocks=64, block_size=4, max_num_batched_tokens=8) as gen:
        outs = gen.generate(short, SamplingParams(max_new_tokens=6))  # at most 13 tokens < 16
        for prompt, (c,) in zip(short, outs):
            assert c.tokens == reference_greedy(model, prompt, 6)
        with pytest.raises(ValueError, match="rope_type 'longrope' changes its frequencies past 16 tokens"):
            gen.generate([*short, random_prompts(13, [20], 384)[0]], SamplingParams(max_new_tokens=2))


def test_sub_configs_keep_their_own_attn_implementation():
    """A composite model (Gemma 3 with a vision tower) loaded with an
    attn_implementation per sub-config: after a step the vision tower's
    "eager" had become the top config's "sdpa" (transformers sets the top
    value on every sub-config, and only the top one was put back)."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    text = t.Gemma3TextConfig(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, num_hidden_layers=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        initializer_range=0.08, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    vision = t.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    cfg = t.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=380,
        boi_token_index=381, eoi_token_index=382, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    attn = {"text_config": "sdpa", "vision_config": "eager"}
    model = t.Gemma3ForConditionalGeneration._from_config(cfg, attn_implementation=attn).eval()
    prompt = random_prompts(14, [21], 300)[0]
    with Generator(model, num_blocks=64, block_size=4, max_num_batched_tokens=16) as gen:
        ((c,),) = gen.generate([prompt], SamplingParams(max_new_tokens=NEW))
    assert model.config.text_config._attn_implementation == "sdpa"
    assert model.config.vision_config._attn_implementation == "eager"
    assert c.tokens == reference_greedy(model, prompt, NEW)


def test_hybrid_models_are_refused_naming_the_other_layers():
    """LFM2's convolution layers (like Qwen3-Next's linear attention or a
    Mamba layer) keep a state of their own that use_cache=False throws
    away (the step is never committed: the next one failed with "K/V no
    committed step wrote"). Refused at the first step, naming the layers
    that did not attend through pagedkv and their layer type."""
    model = family_model("lfm2")
    with Generator(model, num_blocks=32, block_size=4) as gen:
        with pytest.raises(ValueError, match=r"layers \[0, 2\] of 3 did not go through pagedkv \(layer_types conv\)"):
            gen.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=2))


def test_attention_arguments_pagedkv_cannot_apply_are_refused():
    """Attention arguments that change the output were ignored: T5-style
    position_bias, sparse attention's indices / block_indices, sinks of a
    layout other than gpt-oss's s_aux, head_mask, any other tensor, and
    is_causal=False (bidirectional layers, or config.is_causal False, which
    transformers runs bidirectionally): pagedkv attended causally and
    densely, with no error. Each is refused, naming the layer and the
    argument; position ids and is_causal=True are not."""
    from pagedkv.integrations.transformers import pagedkv_attention_forward, pool_for_model

    model = family_model("mistral")
    module = model.model.layers[1].self_attn
    q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    pool = pool_for_model(model, num_blocks=8, block_size=4)
    s = pool.create_sequence()
    s.append([1, 2, 3])
    refused = {
        "position_bias": torch.zeros(1, 4, 3, 3),
        "indices": torch.zeros(1, 3, 2, dtype=torch.long),
        "block_indices": torch.zeros(1, 3, 1, dtype=torch.long),
        "sinks": torch.zeros(1, 4, 1, 1),
        "head_mask": torch.ones(4),
        "attention_bias": torch.zeros(1, 4, 3, 3),
    }
    with pool.prepare([s], [3]) as step:
        for name, value in refused.items():
            with pytest.raises(ValueError, match=f"layer 1 of MistralConfig passes '{name}'"):
                pagedkv_attention_forward(module, q, k, v, None, pagedkv_step=step, **{name: value})
        with pytest.raises(ValueError, match="layer 1 of MistralConfig attends bidirectionally"):
            pagedkv_attention_forward(module, q, k, v, None, pagedkv_step=step, is_causal=False)
        out, _ = pagedkv_attention_forward(
            module, q, k, v, None, pagedkv_step=step, is_causal=True, position_ids=torch.arange(3)[None]
        )
        assert out.shape == (1, 3, 4, 16)
    pool.close()
    model.config.is_causal = False  # transformers' bidirectional decoder: the first token sees the last
    with Generator(model, num_blocks=32, block_size=4) as gen:
        with pytest.raises(ValueError, match="attends bidirectionally"):
            gen.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=2))
        st = gen.pool.stats()
        assert (st.num_seqs, st.num_used_blocks) == (0, 0)


def test_doge_whose_attention_makes_its_own_mask_is_refused_saying_so():
    """Doge's attention adds a dynamic mask of its own (computed from the
    values) to the weights: it reached pagedkv as attention_mask and was
    refused as "pass no attention_mask", which the caller never passed.
    The error names the layer and the model's own mask."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = t.DogeConfig(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=2, sliding_window=8, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    model = t.DogeForCausalLM(cfg).eval()
    with Generator(model, num_blocks=32, block_size=4) as gen:
        with pytest.raises(ValueError, match=r"layer 0 of DogeConfig got an attention mask.*Doge's dynamic mask"):
            gen.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=2))
        gen.pool.validate()
