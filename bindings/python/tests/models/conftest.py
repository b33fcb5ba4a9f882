"""Tiny random-weight transformers models built from configs (no downloads)
for the pagedkv.integrations.transformers tests. Skips the directory when
torch or transformers is missing (scripts/deps/models.sh installs them)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_model(kind: str, dtype=None, seed: int = 0, attn: str = "sdpa"):
    """A Llama-like GQA model (8 query heads, 2 KV heads) or a Qwen2-like
    one (q/k/v biases, tied embeddings, 6 query heads, 2 KV heads)."""
    torch.manual_seed(seed)
    common = dict(
        vocab_size=384,
        num_hidden_layers=3,
        max_position_embeddings=1024,
        initializer_range=0.08,  # wider than the default: fewer near-ties in argmax
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    if kind == "llama":
        cfg = transformers.LlamaConfig(
            hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=2, **common
        )
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(
            hidden_size=96,
            intermediate_size=192,
            num_attention_heads=6,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            **common,
        )
        cls = transformers.Qwen2ForCausalLM
    else:
        raise ValueError(kind)
    cfg._attn_implementation = attn
    model = cls(cfg).eval()
    if dtype is not None:
        model = model.to(dtype)
    return model


def _family_configs():
    """Tiny configs of other decoder families: (config, model class, the
    attn_implementation generate() runs with). Windows of 8 tokens, shorter
    than the prompts the tests use, so that the window matters."""
    t = transformers
    c = dict(
        vocab_size=384,
        max_position_embeddings=1024,
        initializer_range=0.08,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
    )
    alt = ["sliding_attention", "full_attention", "sliding_attention"]
    mlp = dict(intermediate_size=128)
    four = dict(num_hidden_layers=4, head_dim=32)
    alt4 = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    return {
        # Through the attention-function registry, as they are: greedy equals generate().
        "mistral": lambda: (t.MistralConfig(**c, **mlp, sliding_window=8), t.MistralForCausalLM, "sdpa"),
        "gemma": lambda: (
            t.GemmaConfig(**{**c, "num_key_value_heads": 1}, **mlp, head_dim=32),
            t.GemmaForCausalLM,
            "sdpa",
        ),
        "gemma2": lambda: (  # alternating sliding/global layers, logit softcapping, query_pre_attn_scalar
            t.Gemma2Config(
                **{**c, **four},
                **mlp,
                sliding_window=8,
                query_pre_attn_scalar=20,
                attn_logit_softcapping=5.0,
                final_logit_softcapping=30.0,
                layer_types=alt4,
            ),
            t.Gemma2ForCausalLM,
            "eager",
        ),
        "gemma3": lambda: (
            t.Gemma3TextConfig(**{**c, **four}, **mlp, sliding_window=8, query_pre_attn_scalar=20, layer_types=alt4),
            t.Gemma3ForCausalLM,
            "sdpa",
        ),
        "qwen3": lambda: (t.Qwen3Config(**c, **mlp, head_dim=32), t.Qwen3ForCausalLM, "sdpa"),
        "qwen2_sliding": lambda: (
            t.Qwen2Config(
                **c,
                **mlp,
                use_sliding_window=True,
                sliding_window=8,
                layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            ),
            t.Qwen2ForCausalLM,
            "sdpa",
        ),
        "phi3": lambda: (t.Phi3Config(**c, **mlp, sliding_window=8), t.Phi3ForCausalLM, "sdpa"),
        "olmo2": lambda: (t.Olmo2Config(**c, **mlp), t.Olmo2ForCausalLM, "sdpa"),
        "granite": lambda: (
            t.GraniteConfig(
                **c,
                **mlp,
                attention_multiplier=0.3,
                embedding_multiplier=2.0,
                residual_multiplier=0.5,
                logits_scaling=2.0,
            ),
            t.GraniteForCausalLM,
            "sdpa",
        ),
        "cohere": lambda: (t.CohereConfig(**c, **mlp, logit_scale=0.5), t.CohereForCausalLM, "sdpa"),
        "cohere2": lambda: (
            t.Cohere2Config(
                **c,
                **mlp,
                sliding_window=8,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            ),
            t.Cohere2ForCausalLM,
            "sdpa",
        ),
        "starcoder2": lambda: (t.Starcoder2Config(**c, **mlp, sliding_window=8), t.Starcoder2ForCausalLM, "sdpa"),
        "gpt_neox": lambda: (
            t.GPTNeoXConfig(**{k: v for k, v in c.items() if k != "num_key_value_heads"}, **mlp, rotary_pct=0.25),
            t.GPTNeoXForCausalLM,
            "sdpa",
        ),
        "mixtral": lambda: (
            t.MixtralConfig(**c, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
            t.MixtralForCausalLM,
            "sdpa",
        ),
        "qwen3_moe": lambda: (
            t.Qwen3MoeConfig(
                **c, intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, head_dim=16
            ),
            t.Qwen3MoeForCausalLM,
            "sdpa",
        ),
        "phi": lambda: (
            t.PhiConfig(**c, **mlp, partial_rotary_factor=0.5, qk_layernorm=True),
            t.PhiForCausalLM,
            "sdpa",
        ),
        "gpt2": lambda: (
            t.GPT2Config(
                n_embd=64,
                n_head=4,
                n_layer=3,
                n_positions=1024,
                vocab_size=384,
                initializer_range=0.08,
                eos_token_id=None,
                bos_token_id=None,
            ),
            t.GPT2LMHeadModel,
            "sdpa",
        ),
        "gpt_bigcode": lambda: (  # multi-query
            t.GPTBigCodeConfig(
                n_embd=64,
                n_head=4,
                n_layer=3,
                n_positions=1024,
                vocab_size=384,
                initializer_range=0.08,
                multi_query=True,
                eos_token_id=None,
                bos_token_id=None,
            ),
            t.GPTBigCodeForCausalLM,
            "sdpa",
        ),
        "opt": lambda: (
            t.OPTConfig(
                hidden_size=64,
                ffn_dim=128,
                num_attention_heads=4,
                num_hidden_layers=3,
                word_embed_proj_dim=64,
                vocab_size=384,
                max_position_embeddings=1024,
                eos_token_id=None,
                bos_token_id=None,
                pad_token_id=1,
            ),
            t.OPTForCausalLM,
            "sdpa",
        ),
        # Needing the fixes of docs/reliability.md.
        "qwen2_moe": lambda: (
            t.Qwen2MoeConfig(
                **c,
                intermediate_size=96,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
                num_experts=4,
                num_experts_per_tok=2,
                use_sliding_window=True,
                sliding_window=8,
                max_window_layers=3,  # layers 0 and 2 slide
            ),
            t.Qwen2MoeForCausalLM,
            "sdpa",
        ),
        "stablelm": lambda: (t.StableLmConfig(**c, intermediate_size=128), t.StableLmForCausalLM, "sdpa"),
        "phimoe": lambda: (  # every layer slides, by the mask alone: no layer_types, no sliding_window kwarg
            t.PhimoeConfig(**c, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
            t.PhimoeForCausalLM,
            "sdpa",
        ),
        # Attention of their own, not through the registry: refused.
        "lfm2": lambda: (  # hybrid: convolution layers with a state of their own
            t.Lfm2Config(**c, intermediate_size=128, layer_types=["conv", "full_attention", "conv"]),
            t.Lfm2ForCausalLM,
            "sdpa",
        ),
        "falcon": lambda: (
            t.FalconConfig(**{**c, "num_kv_heads": 2}, new_decoder_architecture=True),
            t.FalconForCausalLM,
            "sdpa",
        ),
        "gptj": lambda: (
            t.GPTJConfig(
                n_embd=64,
                n_head=4,
                n_layer=3,
                rotary_dim=8,
                vocab_size=384,
                initializer_range=0.08,
                eos_token_id=None,
                bos_token_id=None,
            ),
            t.GPTJForCausalLM,
            "eager",
        ),
        "bloom": lambda: (
            t.BloomConfig(
                hidden_size=64,
                n_head=4,
                n_layer=3,
                vocab_size=384,
                initializer_range=0.08,
                eos_token_id=None,
                bos_token_id=None,
            ),
            t.BloomForCausalLM,
            "eager",
        ),
        "llama4": lambda: (
            t.Llama4TextConfig(
                **c,
                intermediate_size=128,
                intermediate_size_mlp=128,
                head_dim=16,
                num_local_experts=2,
                num_experts_per_tok=1,
                attention_chunk_size=8,
                layer_types=["chunked_attention", "full_attention", "chunked_attention"],
                no_rope_layers=[1, 0, 1],
            ),
            t.Llama4ForCausalLM,
            "sdpa",
        ),
        "phi3_longrope": lambda: (
            t.Phi3Config(
                **c,
                intermediate_size=128,
                original_max_position_embeddings=16,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "short_factor": [1.0] * 8,
                    "long_factor": [1.0 + i for i in range(8)],
                    "original_max_position_embeddings": 16,
                },
            ),
            t.Phi3ForCausalLM,
            "sdpa",
        ),
        "deepseek_v3": lambda: (  # MLA, expanded to heads: q/k of 16 + 8, v of 16
            t.DeepseekV3Config(
                **{**c, "num_key_value_heads": 4},
                intermediate_size=128,
                moe_intermediate_size=32,
                n_routed_experts=4,
                num_experts_per_tok=2,
                n_group=1,
                topk_group=1,
                first_k_dense_replace=1,
                kv_lora_rank=16,
                q_lora_rank=None,
                qk_rope_head_dim=8,
                qk_nope_head_dim=16,
                v_head_dim=16,
            ),
            t.DeepseekV3ForCausalLM,
            "sdpa",
        ),
        "gpt_oss": lambda: (
            t.GptOssConfig(
                **{**c, "num_hidden_layers": 2, "max_position_embeddings": 131072},  # YaRN's 4096 x 32
                intermediate_size=64,
                head_dim=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=8,
                layer_types=alt[:2],
            ),
            t.GptOssForCausalLM,
            "eager",
        ),
    }


def family_model(name: str, seed: int = 0):
    """A tiny random-weight model of decoder family name (_family_configs)."""
    torch.manual_seed(seed)
    cfg, cls, attn = _family_configs()[name]()
    cfg._attn_implementation = attn
    return cls(cfg).eval()


def random_prompts(seed: int, lengths, vocab: int = 384):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def reference_greedy(model, prompt, max_new_tokens):
    """transformers' own generate(), greedy, for one prompt."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def full_logits(model, tokens, attn: str):
    """Logits of a whole-sequence forward with attn_implementation attn."""
    before = model.config._attn_implementation
    model.config._attn_implementation = attn
    try:
        with torch.inference_mode():
            return model(torch.tensor([tokens]), use_cache=False).logits[0].float()
    finally:
        model.config._attn_implementation = before
