"""pagedkv.integrations.transformers against transformers itself, on tiny
random-weight Llama-like (GQA) and Qwen2-like models: greedy tokens equal
generate() in f32 through chunked prefill, prefix-cache hits, preemption and
forked parallel samples; bf16 logits stay within transformers' own
eager-vs-sdpa spread."""

import dataclasses
import re

import pytest
import torch

import pagedkv
from conftest import full_logits, random_prompts, reference_greedy, tiny_model
from pagedkv.integrations.transformers import Generator, SamplingParams, register, run_step

KINDS = ["llama", "qwen2"]
NEW = 10


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_generate_with_chunked_prefill_and_prefix_hits(kind):
    model = tiny_model(kind)
    first = random_prompts(1, [3, 21, 40, 9])
    # Second wave: prompts sharing the first wave's prefixes (whole blocks
    # of them are prefix-cache hits) plus fresh ones.
    second = [[*first[1][:17], 5, 6, 7], first[2] + [11], random_prompts(2, [30])[0]]
    with Generator(model, num_blocks=200, block_size=4, max_num_batched_tokens=24) as gen:
        outs = gen.generate(first, SamplingParams(max_new_tokens=NEW))
        assert gen.stats.chunked_prefills > 0  # 73 prompt tokens through a 24-token budget
        assert gen.stats.prefix_hit_tokens == 0
        outs += gen.generate(second, SamplingParams(max_new_tokens=NEW))
        assert gen.stats.prefix_hit_tokens >= 16 + 40
        assert gen.stats.max_batch_seqs >= 3
        gen.pool.validate()
    for prompt, (c,) in zip(first + second, outs):
        assert c.finish_reason == "length"
        assert c.prompt == prompt
        assert c.tokens == reference_greedy(model, prompt, NEW), prompt


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_generate_under_preemption(kind):
    model = tiny_model(kind, seed=3)
    prompts = random_prompts(3, [14, 7, 19, 11, 5, 16])
    # 24 blocks of 4 tokens: the six sequences need up to 9 blocks each.
    with Generator(model, num_blocks=24, block_size=4, max_num_batched_tokens=64) as gen:
        outs = gen.generate(prompts, SamplingParams(max_new_tokens=20))
        assert gen.stats.preemptions > 0
        gen.pool.validate()
        assert gen.pool.stats().num_used_blocks == 0  # every sequence freed
    for prompt, (c,) in zip(prompts, outs):
        assert c.tokens == reference_greedy(model, prompt, 20), prompt


def test_stop_token_ends_a_sample():
    model = tiny_model("llama", seed=4)
    prompt = random_prompts(4, [12])[0]
    ref = reference_greedy(model, prompt, 8)
    stop = ref[3]
    with Generator(model, num_blocks=64, block_size=4) as gen:
        ((c,),) = gen.generate([prompt], SamplingParams(max_new_tokens=8, stop_token_ids=[stop]))
    assert c.finish_reason == "stop"
    assert c.tokens == ref[: ref.index(stop) + 1]


def test_stop_token_ids_given_as_a_tensor_stop():
    """stop_token_ids=torch.tensor([...]) (or a list of its elements) made
    a set of 0-d tensors, which hash by identity: no sampled id ever
    matched, every sample ran to max_new_tokens with no error. Ids are read
    as ints (tensor and numpy elements too); a string id is refused."""
    np = pytest.importorskip("numpy")
    model = tiny_model("llama", seed=4)
    prompt = random_prompts(4, [12])[0]
    ref = reference_greedy(model, prompt, 8)
    stop = ref[3]
    with Generator(model, num_blocks=64, block_size=4) as gen:
        for ids in (torch.tensor([stop]), list(torch.tensor([stop, 383])), np.array([stop])):
            ((c,),) = gen.generate([prompt], SamplingParams(max_new_tokens=8, stop_token_ids=ids))
            assert (c.finish_reason, c.tokens) == ("stop", ref[: ref.index(stop) + 1]), ids
        with pytest.raises(TypeError, match="stop_token_ids\\[0\\]: expected an int, got str"):
            gen.generate([prompt], SamplingParams(max_new_tokens=8, stop_token_ids=[str(stop)]))
        assert not gen.has_unfinished()


@pytest.mark.parametrize("kind", KINDS)
def test_forked_samples_see_their_own_tokens(kind):
    """n samples share the prompt's blocks (fork, copy-on-write). Each
    sample's logits at every step must equal a whole-sequence forward over
    the prompt and that sample's own tokens: a child reading a sibling's K/V
    would show here."""
    model = tiny_model(kind, seed=5)
    prompts = random_prompts(5, [10, 6])  # 10: the fork happens mid-block (block_size 4)
    params = SamplingParams(max_new_tokens=8, n=3, temperature=1.5, seed=7)
    with Generator(model, num_blocks=96, block_size=4, keep_logits=True) as gen:
        outs = gen.generate(prompts, params)
        assert gen.stats.forks == 2 * len(prompts)
    for prompt, samples in zip(prompts, outs):
        assert [c.index for c in samples] == [0, 1, 2]
        assert len({tuple(c.tokens) for c in samples}) > 1  # they did diverge
        for c in samples:
            ref = full_logits(model, prompt + c.tokens, "eager")[len(prompt) - 1 : -1]
            torch.testing.assert_close(c.logits, ref, atol=2e-4, rtol=1e-4)
    # Greedy n=2: both samples are generate()'s tokens.
    with Generator(model, num_blocks=96, block_size=4) as gen:
        ((a, b),) = gen.generate([prompts[0]], SamplingParams(max_new_tokens=6, n=2))
    assert a.tokens == b.tokens == reference_greedy(model, prompts[0], 6)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_logits_within_eager_vs_sdpa_spread(kind):
    """bf16 on every path rounds differently; pagedkv's logits (chunked
    prefill, then decode steps) must be as close to an f32 forward as
    transformers' own bf16 eager and sdpa are, with a margin of the spread
    between those two."""
    model = tiny_model(kind, dtype=torch.bfloat16, seed=6)
    ref32 = tiny_model(kind, dtype=torch.float32, seed=6)
    ref32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    prompts = random_prompts(6, [23, 8, 35])
    with Generator(model, num_blocks=128, block_size=4, max_num_batched_tokens=16, keep_logits=True) as gen:
        outs = gen.generate(prompts, SamplingParams(max_new_tokens=8))
    for prompt, (c,) in zip(prompts, outs):
        seq = prompt + c.tokens
        rows = slice(len(prompt) - 1, len(seq) - 1)
        truth = full_logits(ref32, seq, "eager")[rows]
        eager = full_logits(model, seq, "eager")[rows]
        sdpa = full_logits(model, seq, "sdpa")[rows]
        spread = (eager - sdpa).abs().max().item()
        theirs = max((eager - truth).abs().max().item(), (sdpa - truth).abs().max().item())
        ours = (c.logits - truth).abs().max().item()
        assert spread > 0  # the two really differ in bf16
        print(f"{kind}: ours {ours:.4g} theirs {theirs:.4g} spread {spread:.4g}")
        assert ours <= theirs + spread, (ours, theirs, spread)


def test_head_major_and_token_major_inputs_are_not_copied():
    """paged_attention takes transformers' head-major [1, H, T, D] and a
    token-major [1, T, H, D] as strided views: the descriptors handed to the
    library point at the caller's memory, and both give the same output as
    a causal softmax attention computed here."""
    from pagedkv._tensor import describe
    from pagedkv.integrations.transformers import paged_attention, token_rows

    g = torch.Generator().manual_seed(9)
    T, H, KV, D = 7, 4, 2, 16
    q = torch.randn(1, H, T, D, generator=g)
    k = torch.randn(1, KV, T, D, generator=g)
    v = torch.randn(1, KV, T, D, generator=g)
    rows = token_rows(q, "bhtd")
    d = describe(rows, "q")
    assert d.data + d.byte_offset == q.data_ptr()
    assert rows.data_ptr() == q.data_ptr() and rows.stride() == (D, T * D, 1)
    assert list(d.strides) == [D, T * D, 1]
    outs = []
    for layout, conv in (("bhtd", lambda x: x), ("bthd", lambda x: x.transpose(1, 2).contiguous())):
        with pagedkv.Pool(num_blocks=8, block_size=4, num_layers=1, num_kv_heads=KV, head_dim=D, dtype="f32") as pool:
            s = pool.create_sequence()
            s.append(list(range(T)))
            with pool.prepare([s], T) as step:
                outs.append(paged_attention(step, 0, conv(q), conv(k), conv(v), layout=layout))
    torch.testing.assert_close(outs[0], outs[1])
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1), is_causal=True
    )
    torch.testing.assert_close(outs[0], ref.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_model_without_a_step_plan_is_an_error():
    model = tiny_model("llama")
    model.config._attn_implementation = register()
    with pytest.raises(RuntimeError, match="pagedkv_step"):
        model(torch.tensor([[1, 2, 3]]), use_cache=False)


def test_run_step_failure_counts_nothing():
    """A model that raises mid-step leaves the step uncommitted: the tokens
    are still to compute, and a retry gives the right logits."""
    model = tiny_model("llama", seed=8)
    with Generator(model, num_blocks=32, block_size=4) as gen:
        s = gen.pool.create_sequence()
        prompt = random_prompts(8, [9])[0]
        s.append(prompt)
        bad = torch.tensor([len(model.model.embed_tokens.weight) + 5] * 9)  # out of the vocabulary
        with pytest.raises(IndexError):
            run_step(model, gen.pool, [s], [9], bad, torch.tensor([0]))
        assert s.num_computed_tokens == 0
        logits = run_step(model, gen.pool, [s], [9], torch.tensor(prompt), torch.tensor([0]))
        assert s.num_computed_tokens == 9
        torch.testing.assert_close(logits[0], full_logits(model, prompt, "eager")[-1], atol=2e-4, rtol=1e-4)


def test_run_step_inputs_of_the_wrong_shape_are_refused_naming_them():
    """input_ids in transformers' usual [1, tokens] shape failed in the
    rotary embedding ("The size of tensor a (8) must match the size of
    tensor b (6)"), as did more or fewer ids than counts; a list of sample
    rows failed with "'list' object has no attribute 'to'" and a row past
    seqs with "index out of range in self". Each now names the argument,
    before the step (nothing computed)."""
    model = tiny_model("llama")
    prompt = random_prompts(8, [6])[0]
    with Generator(model, num_blocks=16, block_size=4) as gen:
        s = gen.pool.create_sequence()
        s.append(prompt)
        ids, row = torch.tensor(prompt), torch.tensor([0])
        bad = [
            (ValueError, r"input_ids: expected a 1-d integer tensor .* got \[1, 6\]", ids[None], row),
            (ValueError, "input_ids: 7 ids for counts that sum to 6", torch.tensor([*prompt, 1]), row),
            (ValueError, "input_ids: expected a 1-d integer tensor", ids.float(), row),
            (TypeError, "sample_rows: expected a 1-d integer tensor", ids, [0]),
            (IndexError, r"sample_rows: indices must be in \[0, 1\), got \[3\]", ids, torch.tensor([3])),
        ]
        for exc, match, x, rows in bad:
            with pytest.raises(exc, match=match):
                run_step(model, gen.pool, [s], [6], x, rows)
            assert s.num_computed_tokens == 0
        logits = run_step(model, gen.pool, [s], [6], ids.int(), row)
        torch.testing.assert_close(logits[0], full_logits(model, prompt, "eager")[-1], atol=2e-4, rtol=1e-4)


def test_requests_that_cannot_run_are_errors():
    model = tiny_model("llama")
    with Generator(model, num_blocks=4, block_size=4) as gen:  # 3 usable blocks: 12 tokens
        with pytest.raises(ValueError, match="empty"):
            gen.add_request([])
        with pytest.raises(ValueError, match="n and max_new_tokens"):
            gen.add_request([1, 2], SamplingParams(n=0))
        with pytest.raises(RuntimeError, match="more blocks than the pool has"):
            gen.generate([list(range(20))])


def test_negative_or_nan_temperature_and_negative_top_k_are_refused():
    """temperature -1 or NaN is not > 0: the request was sampled greedily;
    top_k -3 is not > 0: sampled from every token; both with no error
    (transformers' TemperatureLogitsWarper and TopKLogitsWarper refuse
    them). A seed that is not an int failed inside torch at admission."""
    model = tiny_model("llama")
    with Generator(model, num_blocks=16, block_size=4) as gen:
        for t in (-1.0, float("nan"), -1e-9):
            with pytest.raises(ValueError, match="temperature must be 0 \\(greedy\\) or positive"):
                gen.add_request([1, 2], SamplingParams(temperature=t))
        with pytest.raises(TypeError, match="temperature: expected a float, got str"):
            gen.add_request([1, 2], SamplingParams(temperature="0.5"))
        with pytest.raises(ValueError, match="top_k must be 0"):
            gen.add_request([1, 2], SamplingParams(temperature=1.0, top_k=-3))
        with pytest.raises(TypeError, match="seed: expected an int, got float"):
            gen.add_request([1, 2], SamplingParams(temperature=1.0, seed=1.5))
        assert not gen.has_unfinished()
        ((c,),) = gen.generate([[1, 2]], SamplingParams(max_new_tokens=2, temperature=float("inf"), seed=3))
        assert len(c.tokens) == 2  # infinite temperature: uniform, as transformers' warper


def test_a_request_that_fails_to_sample_does_not_wedge_the_generator():
    """A temperature of 1e-40 makes the scaled logits infinite and
    torch.multinomial raises. The sequence had all its tokens computed and
    no new one: left running, every later step() scheduled it for 0 tokens
    and failed with "query_counts[1] = 0 is outside [1, 9]", the other
    requests never finished. Now the request fails alone: step() returns
    its samples with finish_reason "error" and the error naming it (its
    blocks freed); the others finish as they would have."""
    model = tiny_model("llama")
    prompt = random_prompts(1, [9])[0]
    with Generator(model, num_blocks=32, block_size=4) as gen:
        good = gen.add_request(prompt, SamplingParams(max_new_tokens=3))
        bad = gen.add_request(prompt, SamplingParams(max_new_tokens=3, temperature=1e-40, n=2))
        failed = gen.step()
        assert [(c.request_id, c.index, c.finish_reason, c.tokens) for c in failed] == [
            (bad, 0, "error", []),
            (bad, 1, "error", []),
        ]
        assert isinstance(failed[0].error, RuntimeError)
        assert str(failed[0].error).startswith(f"request {bad}: sampling failed (RuntimeError: ")
        done = []
        while gen.has_unfinished():
            done += gen.step()
        assert [(c.request_id, c.tokens) for c in done] == [(good, reference_greedy(model, prompt, 3))]
        st = gen.pool.stats()
        assert (st.num_seqs, st.num_used_blocks) == (0, 0)


def test_fractional_or_string_ids_and_counts_are_refused_not_truncated():
    """Prompt ids were read with int(): 2.7 was token 2 and "5" token 5; a
    fractional n, max_new_tokens or top_k was queued and failed (or
    generated one token more) steps later. Each is a TypeError naming it,
    and nothing is queued; ids outside the vocabulary, which the model's
    embedding refused at every later step, are a ValueError."""
    model = tiny_model("llama")
    with Generator(model, num_blocks=16, block_size=4) as gen:
        for prompt, where in (
            ([1, 2.7, 3], r"prompt\[1\]"),
            (["5", 6], r"prompt\[0\]"),
            (torch.tensor([1.0, 2.0]), r"prompt\[0\]"),
        ):
            with pytest.raises(TypeError, match=where):
                gen.add_request(prompt)
        for kw in ({"n": 1.5}, {"max_new_tokens": 2.5}, {"top_k": 2.5, "temperature": 1.0}):
            with pytest.raises(TypeError, match=next(iter(kw))):
                gen.add_request([1, 2], SamplingParams(**kw))
        for prompt in ([1, 384], [-1, 2]):  # vocab_size 384
            with pytest.raises(ValueError, match=r"prompt\[[01]\] = -?\d+ is outside the vocabulary \[0, 384\)"):
                gen.add_request(prompt)
        assert not gen.has_unfinished()
        out = gen.generate([range(1, 4), torch.tensor([4, 5])], SamplingParams(max_new_tokens=2))
        assert [c[0].prompt for c in out] == [[1, 2, 3], [4, 5]]
        assert [len(c[0].tokens) for c in out] == [2, 2]
    for name in ("max_num_batched_tokens", "max_num_seqs"):
        with pytest.raises(TypeError, match=name):
            Generator(model, num_blocks=16, **{name: 1.5})


def test_a_generate_call_that_fails_leaves_none_of_its_requests_behind(monkeypatch):
    """generate() raising (a prompt that can never fit, a bad prompt after
    good ones, an interrupt mid-step) left its requests queued or running:
    every later generate() raised the same error again (or ran the stale
    requests first), and their sequences held pool blocks."""
    model = tiny_model("llama")
    with Generator(model, num_blocks=4, block_size=4) as gen:  # 3 usable blocks: 12 tokens
        with pytest.raises(RuntimeError, match="more blocks than the pool has"):
            gen.generate([[1, 2, 3], list(range(20))], SamplingParams(max_new_tokens=2))
        assert not gen.has_unfinished() and gen.pool.stats().num_seqs == 0
        with pytest.raises(TypeError, match=r"prompt\[0\]"):
            gen.generate([[1, 2, 3], ["x"]])
        assert not gen.has_unfinished()
        out = gen.generate([[4, 5, 6]], SamplingParams(max_new_tokens=2))
        assert len(out[0][0].tokens) == 2
        forward, calls = model.forward, []

        def interrupted(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return forward(*args, **kwargs)

        monkeypatch.setattr(model, "forward", interrupted)
        with pytest.raises(KeyboardInterrupt):
            gen.generate([[7, 8, 9], [1, 2]], SamplingParams(max_new_tokens=4, n=2))
        assert not gen.has_unfinished() and gen.pool.stats().num_seqs == 0
        gen.pool.validate()
        monkeypatch.setattr(model, "forward", forward)
        out = gen.generate([[7, 8, 9]], SamplingParams(max_new_tokens=2))
        assert len(out[0][0].tokens) == 2


def test_a_request_that_can_never_run_does_not_block_later_steps():
    """A request queued with add_request whose first chunk needs more blocks
    than the pool has (raised by step() once nothing else runs) stayed at
    the head of the queue: every later step() raised the same error and no
    other request could run (step() users have no call to remove it). It
    fails alone: step() returns it with finish_reason "error"."""
    model = tiny_model("llama")
    with Generator(model, num_blocks=4, block_size=4) as gen:  # 3 usable blocks: 12 tokens
        rid = gen.add_request(list(range(20)))
        ((c,),) = [gen.step()]
        assert (c.request_id, c.finish_reason, c.tokens) == (rid, "error", [])
        assert re.match(f"request {rid}: .*more blocks than the pool has", str(c.error))
        assert not gen.has_unfinished() and gen.pool.stats().num_seqs == 0
        gen.add_request([1, 2, 3], SamplingParams(max_new_tokens=2))
        done = []
        while gen.has_unfinished():
            done += gen.step()
        assert len(done) == 1 and len(done[0].tokens) == 2


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_sequence_that_outgrows_the_pool_is_an_error_not_a_loop(prefix_caching):
    """A sequence the pool cannot hold, alone, in chunks of the budget (a
    prompt of 20 tokens, or 10 that grow past 12 while decoding, with 12
    tokens of blocks): its append preempted itself and readmission
    recomputed it from the start. Without prefix caching that went on for
    ever (generate() never returned); with it, it ended in "its first 4
    tokens need more blocks", the token budget, not what did not fit. Now
    the request fails at once (finish_reason "error", step() returns it),
    naming the tokens it needed, with the tokens it had generated."""
    model = tiny_model("llama")
    with Generator(
        model, num_blocks=4, block_size=4, max_num_batched_tokens=4, enable_prefix_caching=prefix_caching
    ) as gen:  # 3 usable blocks: 12 tokens
        for prompt, new, needed, generated in (
            (list(range(20)), 2, "16 tokens \\(of prompt 20\\)", 0),
            (list(range(10)), 10, "13 tokens \\(of prompt 10 \\+ 3 generated\\)", 3),
        ):
            rid = gen.add_request(prompt, SamplingParams(max_new_tokens=new))
            done = []
            for _ in range(40):
                done += gen.step()
                if done:
                    break
            ((c,),) = [done]
            assert (c.request_id, c.finish_reason, len(c.tokens)) == (rid, "error", generated)
            assert re.match(f"request {rid}: its first {needed} need more blocks", str(c.error))
            assert not gen.has_unfinished()
            st = gen.pool.stats()
            assert (st.num_seqs, st.num_used_blocks) == (0, 0)
        ((c,),) = gen.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))
        assert len(c.tokens) == 2


def test_padding_masks_and_mask_functions_given_to_the_model_are_refused():
    """With attn_implementation "pagedkv" (no mask function registered),
    transformers' mask creation dropped the model's 2-d attention_mask
    unread and the mask functions a model lays over the causal one: a
    caller's own step with padding (zeros) in its attention_mask, or a
    model's or_mask_function (bidirectional image tokens), ran as plain
    causal attention, with no error. Refused; an all-ones mask still runs."""
    from transformers.masking_utils import create_causal_mask

    from pagedkv.integrations.transformers import pagedkv_attention, pool_for_model

    model = tiny_model("llama")
    prompt = random_prompts(3, [6])[0]
    ids, pos = torch.tensor([prompt]), torch.arange(6)[None]
    pool = pool_for_model(model, num_blocks=8, block_size=4)
    s = pool.create_sequence()
    s.append(prompt)
    with pool.prepare([s], [6]) as step, torch.inference_mode(), pagedkv_attention(model):
        padded = torch.tensor([[0, 1, 1, 1, 1, 1]])
        with pytest.raises(ValueError, match="LlamaConfig: an attention_mask with padding"):
            model(input_ids=ids, attention_mask=padded, position_ids=pos, use_cache=False, pagedkv_step=step)
        with pytest.raises(ValueError, match="a mask function of its own"):
            create_causal_mask(
                config=model.config,
                inputs_embeds=torch.zeros(1, 6, 8),
                attention_mask=None,
                past_key_values=None,
                position_ids=pos,
                or_mask_function=lambda b, h, q, kv: kv < 2,
            )
        ones = torch.ones_like(ids)
        out = model(input_ids=ids, attention_mask=ones, position_ids=pos, use_cache=False, pagedkv_step=step)
    torch.testing.assert_close(out.logits[0, -1].float(), full_logits(model, prompt, "eager")[-1], atol=2e-4, rtol=1e-4)
    assert s.num_computed_tokens == 6
    pool.close()


def test_what_is_not_a_decoder_only_model_is_refused_at_construction():
    """A torch module that is no transformers model failed with
    "AttributeError: 'Linear' object has no attribute 'config'", and an
    encoder-decoder model was accepted and failed at its first step inside
    its forward ("You must specify exactly one of input_ids or
    inputs_embeds"). Both are refused before a pool is made."""
    import transformers

    with pytest.raises(TypeError, match=r"model: expected a transformers causal LM .*got Linear"):
        Generator(torch.nn.Linear(3, 3), num_blocks=8)
    with pytest.raises(TypeError, match="got str"):
        Generator("meta-llama/Llama-3.2-1B", num_blocks=8)
    t5 = transformers.T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=64)
    with pytest.raises(ValueError, match="T5ForConditionalGeneration is an encoder-decoder model"):
        Generator(transformers.T5ForConditionalGeneration(t5), num_blocks=8)


def test_one_prompt_given_where_a_list_of_prompts_is_expected_says_so():
    """generate([1, 2, 3]) (one prompt, not a list of them) failed with
    "TypeError: 'int' object is not iterable", naming nothing; the error
    names the prompt and the expected shape, and nothing stays queued."""
    model = tiny_model("llama")
    with Generator(model, num_blocks=16, block_size=4) as gen:
        for bad in ([1, 2, 3], ["abc"], [torch.tensor(5)]):
            with pytest.raises(TypeError, match=r"prompt: expected a sequence of token ids.*list of prompts"):
                gen.generate(bad, SamplingParams(max_new_tokens=2))
        with pytest.raises(TypeError, match="prompt: expected a sequence of token ids, got int"):
            gen.add_request(7)
        assert not gen.has_unfinished()
        ((c,),) = gen.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))
        assert len(c.tokens) == 2


def test_a_pool_too_small_says_how_many_tokens_it_holds():
    """Block 0 is the null block: a Generator of 2 blocks of 4 tokens holds
    4 tokens, and a 5-token prompt was refused with "its first 5 tokens ...
    need more blocks than the pool has (2 of 4 tokens)", which read as room
    for 8. The error counts the usable blocks and tokens."""
    model = tiny_model("llama")
    with Generator(model, num_blocks=2, block_size=4) as gen:
        ((c,),) = gen.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=1))  # 4 tokens fit
        assert len(c.tokens) == 1
        msg = (
            r"first 5 tokens \(of prompt 5\) need more blocks than the pool has \(1 usable blocks of 4 tokens, 4 tokens"
        )
        with pytest.raises(RuntimeError, match=msg):
            gen.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=1))
        with pytest.raises(RuntimeError, match=r"first 5 tokens \(of prompt 4 \+ 1 generated\).*1 usable blocks"):
            gen.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=3))


def test_top_p_equals_transformers_warpers():
    """The scores a sample is drawn from equal transformers' own warper
    chain (temperature, then top_k, then top_p), exactly, token for token."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    from pagedkv.integrations.transformers._generator import _warp

    g = torch.Generator().manual_seed(11)
    for temperature, top_k, top_p in ((1.0, 0, 0.9), (0.7, 0, 0.5), (1.3, 20, 0.8), (0.5, 5, 0.99), (2.0, 0, 0.05)):
        logits = torch.randn(4, 97, generator=g) * 3
        ref = TemperatureLogitsWarper(temperature)(None, logits)
        if top_k:
            ref = TopKLogitsWarper(top_k)(None, ref)
        ref = TopPLogitsWarper(top_p)(None, ref)
        ours = torch.stack([_warp(row, temperature, top_k, top_p) for row in logits])
        assert torch.equal(ours, ref), (temperature, top_k, top_p)
        assert (ours > float("-inf")).any(-1).all()  # at least one token left


def test_top_p_samples_only_the_nucleus():
    """A 6-token distribution: top_p 0.7 keeps the 3 most likely tokens
    (0.4 + 0.25 + 0.15 >= 0.7), sampled in their renormalized proportions;
    a top_p below the most likely token's probability keeps that token
    alone; top_p 1 is every token."""
    from pagedkv.integrations.transformers._generator import _warp

    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    logits = probs.log()[[2, 0, 5, 1, 4, 3]]  # shuffled: token ids are not ranks
    ranks = [2, 0, 5, 1, 4, 3]
    for top_p, kept in ((0.7, 3), (0.3, 1), (0.9, 4), (1.0, 6)):
        scores = _warp(logits, 1.0, 0, top_p)
        g = torch.Generator().manual_seed(5)
        draws = torch.multinomial(torch.softmax(scores, -1), 20000, replacement=True, generator=g)
        counts = torch.bincount(draws, minlength=6).double() / 20000
        nucleus = {i for i in range(6) if ranks[i] < kept}
        assert {int(t) for t in draws.unique()} == nucleus, top_p
        expected = torch.tensor([probs[r] if r < kept else 0.0 for r in ranks]).double()
        torch.testing.assert_close(counts, expected / expected.sum(), atol=0.015, rtol=0)


def test_top_p_in_the_generator():
    """Through the Generator: every sampled token lies in the top_p nucleus
    of the logits it was sampled from; top_p 1.0 gives exactly the tokens of
    no top_p for the same seed; a top_p too small for any second token is
    greedy decoding. Out-of-range top_p is refused."""
    from transformers.generation.logits_process import TopPLogitsWarper

    model = tiny_model("llama", seed=12)
    prompts = random_prompts(12, [9, 5])
    with Generator(model, num_blocks=64, block_size=4, keep_logits=True) as gen:
        outs = gen.generate(prompts, SamplingParams(max_new_tokens=8, n=2, temperature=1.0, top_p=0.3, seed=3))
        for samples in outs:
            for c in samples:
                nucleus = TopPLogitsWarper(0.3)(None, c.logits) > float("-inf")
                assert nucleus.sum(-1).max() < c.logits.shape[-1]  # it did filter
                assert all(nucleus[i, t] for i, t in enumerate(c.tokens)), c.tokens
        plain = gen.generate(prompts, SamplingParams(max_new_tokens=8, n=2, temperature=1.2, seed=4))
        off = gen.generate(prompts, SamplingParams(max_new_tokens=8, n=2, temperature=1.2, seed=4, top_p=1.0))
        assert [[c.tokens for c in s] for s in plain] == [[c.tokens for c in s] for s in off]
        ((c,),) = gen.generate([prompts[0]], SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1e-6, seed=1))
        assert c.tokens == reference_greedy(model, prompts[0], 6)
        for bad in (0.0, -0.1, 1.5, float("nan")):
            with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
                gen.add_request([1, 2], SamplingParams(temperature=1.0, top_p=bad))
        with pytest.raises(TypeError, match="top_p: expected a float, got str"):
            gen.add_request([1, 2], SamplingParams(temperature=1.0, top_p="0.9"))
        assert not gen.has_unfinished()


def test_seed_none_is_fresh_randomness_and_a_seed_reproduces():
    """seed=None seeded each request with its request id: two Generators
    (or two runs of a program) gave the same "random" samples, request 0 of
    each the same tokens. It now draws from torch's global generator
    (seeded from the OS; torch.manual_seed makes it repeat, as
    transformers' generate()). An explicit seed gives the same samples
    alone, batched with other requests and under preemption."""
    model = tiny_model("llama", seed=13)
    prompt = random_prompts(13, [7])[0]
    hot = SamplingParams(max_new_tokens=8, n=2, temperature=2.0)

    def sample(params, others=True, **kw):
        with Generator(model, block_size=4, **{"num_blocks": 64, **kw}) as gen:
            rid = gen.add_request(prompt, params)
            for p in random_prompts(15, [13, 17, 9]) if others else []:
                gen.add_request(p, SamplingParams(max_new_tokens=12, temperature=1.0))
            done = []
            while gen.has_unfinished():
                done += gen.step()
            mine = sorted((c for c in done if c.request_id == rid), key=lambda c: c.index)
            return [c.tokens for c in mine], gen.stats.preemptions

    a, _ = sample(hot, others=False)
    b, _ = sample(hot, others=False)
    assert a != b  # 2 samples of 8 tokens at temperature 2 over 384 tokens: equal only by a bug
    torch.manual_seed(1)
    c, _ = sample(hot, others=False)
    torch.manual_seed(1)
    d, _ = sample(hot, others=False)
    assert c == d
    seeded = dataclasses.replace(hot, seed=21)
    alone, _ = sample(seeded, others=False)
    assert sample(seeded)[0] == alone
    # 12 blocks of 4 tokens for four requests growing to 15-29 tokens: preempted
    squeezed, preemptions = sample(seeded, num_blocks=13, max_num_batched_tokens=16)
    assert preemptions > 0
    assert squeezed == alone


def test_forked_samples_stay_within_max_num_seqs():
    """Admission counted only the running sequences: with max_num_seqs 4,
    three requests of n=3 were admitted in one step and forked to 9 running
    sequences, all scheduled together. A request now takes n seats from its
    admission; n above max_num_seqs can never run and is refused."""
    model = tiny_model("qwen2", seed=17)
    prompts = random_prompts(17, [5, 8, 6])
    with Generator(model, num_blocks=96, block_size=4, max_num_seqs=4) as gen:
        running = []
        rids = [gen.add_request(p, SamplingParams(max_new_tokens=3, n=3)) for p in prompts]
        done = []
        while gen.has_unfinished():
            done += gen.step()
            running.append(len(gen._running))
        assert max(running) <= 4 and gen.stats.max_batch_seqs <= 4
        assert gen.stats.forks == 6
        for rid, prompt in zip(rids, prompts):
            assert [c.tokens for c in done if c.request_id == rid] == [reference_greedy(model, prompt, 3)] * 3
        with pytest.raises(ValueError, match="n = 5 samples is more than max_num_seqs = 4"):
            gen.add_request([1, 2], SamplingParams(n=5))
        assert not gen.has_unfinished()


def test_abort_request_frees_its_samples_and_the_others_go_on():
    """abort_request: the request's sequences (its forks too) are freed and
    leave the running set and the queue; it returns a Completion
    ("abort", the tokens so far) per unfinished sample; the other requests
    finish as they would have. A finished or aborted id is a no-op, an id
    never returned a ValueError."""
    model = tiny_model("llama", seed=16)
    prompts = random_prompts(16, [9, 6, 11])
    with Generator(model, num_blocks=64, block_size=4, max_num_seqs=5, keep_logits=True) as gen:
        short = gen.add_request(prompts[0], SamplingParams(max_new_tokens=3))
        forked = gen.add_request(prompts[1], SamplingParams(max_new_tokens=8, n=3, temperature=1.0, seed=2))
        good = gen.add_request(prompts[2], SamplingParams(max_new_tokens=6))
        queued = gen.add_request(prompts[0], SamplingParams(max_new_tokens=6))  # 1 + 3 + 1 seats taken: waits
        done = gen.step() + gen.step() + gen.step()
        assert [c.request_id for c in done] == [short]
        assert gen.stats.forks == 2
        used = gen.pool.stats().num_used_blocks
        aborted = gen.abort_request(forked)
        assert [(c.request_id, c.index, c.finish_reason, len(c.tokens)) for c in aborted] == [
            (forked, i, "abort", 3) for i in range(3)
        ]
        assert all(c.logits.shape == (3, 384) for c in aborted)
        assert gen.pool.stats().num_used_blocks < used
        assert gen.pool.stats().num_seqs == 1  # good alone
        ((q,),) = [gen.abort_request(queued)]
        assert (q.index, q.finish_reason, q.tokens, q.logits) == (0, "abort", [], None)
        assert gen.abort_request(forked) == [] and gen.abort_request(short) == []
        with pytest.raises(ValueError, match="request_id 4: no such request"):
            gen.abort_request(4)
        with pytest.raises(TypeError, match="request_id"):
            gen.abort_request("0")
        while gen.has_unfinished():
            done += gen.step()
        assert [(c.request_id, c.tokens) for c in done[1:]] == [(good, reference_greedy(model, prompts[2], 6))]
        gen.pool.validate()
        st = gen.pool.stats()
        assert (st.num_seqs, st.num_used_blocks) == (0, 0)


def test_a_request_the_model_refuses_fails_alone(monkeypatch):
    """A forward that raises for one request's tokens (a model-specific
    refusal) made every step that batched it raise, so no request of the
    Generator finished; generate() dropped them all. The failed step is run
    again sequence by sequence: the refused request fails alone (its
    Completion has finish_reason "error" and the model's exception), the
    others finish with generate()'s tokens, and generate() raises the
    model's exception after they did, their results on it."""
    model = tiny_model("qwen2", seed=18)
    good = random_prompts(18, [7, 12, 5])
    refs = [reference_greedy(model, p, 5) for p in good]
    poison = next(t for t in range(384) if all(t not in p + r for p, r in zip(good, refs)))
    bad = [*random_prompts(19, [6])[0], poison]
    forward = model.forward

    def refusing(*args, **kwargs):
        if (kwargs["input_ids"] == poison).any():
            raise ValueError(f"token {poison} refused")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", refusing)
    with Generator(model, num_blocks=64, block_size=4) as gen:
        rids = [gen.add_request(p, SamplingParams(max_new_tokens=5)) for p in good[:2]]
        rbad = gen.add_request(bad, SamplingParams(max_new_tokens=5, n=2))
        done = []
        while gen.has_unfinished():
            done += gen.step()  # never raises
        failed = [c for c in done if c.finish_reason == "error"]
        assert [(c.request_id, c.index, c.tokens) for c in failed] == [(rbad, 0, []), (rbad, 1, [])]
        assert isinstance(failed[0].error, ValueError) and str(failed[0].error) == f"token {poison} refused"
        ok = {c.request_id: c.tokens for c in done if c.finish_reason == "length"}
        assert ok == {rids[0]: refs[0], rids[1]: refs[1]}

        with pytest.raises(ValueError, match=f"token {poison} refused") as info:
            gen.generate([good[0], bad, good[2]], SamplingParams(max_new_tokens=5))
        results = info.value.results
        assert [[c.finish_reason for c in r] for r in results] == [["length"], ["error"], ["length"]]
        assert results[0][0].tokens == refs[0] and results[2][0].tokens == refs[2]
        assert results[1][0].error is info.value
        assert "1 of 3 requests failed" in "".join(getattr(info.value, "__notes__", []))
        gen.pool.validate()
        st = gen.pool.stats()
        assert (st.num_seqs, st.num_used_blocks) == (0, 0)


def test_a_failed_request_does_not_hide_what_else_finished_in_its_step():
    """A request failing in a step raised from step(): the Completions of
    other requests that finished in that same step were never returned.
    Both come back now; generate() with a prompt too long for the pool
    raises after the others finished, with their results."""
    model = tiny_model("llama", seed=19)
    prompt = random_prompts(20, [6])[0]
    with Generator(model, num_blocks=8, block_size=4) as gen:  # 7 usable blocks: 28 tokens
        good = gen.add_request(prompt, SamplingParams(max_new_tokens=1))
        bad = gen.add_request(prompt, SamplingParams(max_new_tokens=3, temperature=1e-40))
        out = gen.step()
        assert sorted((c.request_id, c.finish_reason) for c in out) == [(good, "length"), (bad, "error")]
        assert not gen.has_unfinished()
        with pytest.raises(RuntimeError, match="more blocks than the pool has") as info:
            gen.generate([prompt, list(range(40)), prompt[:3]], SamplingParams(max_new_tokens=4))
        (a,), (b,), (c,) = info.value.results
        assert (a.tokens, c.tokens) == (reference_greedy(model, prompt, 4), reference_greedy(model, prompt[:3], 4))
        assert (b.finish_reason, b.tokens, b.error) == ("error", [], info.value)
        assert gen.pool.stats().num_seqs == 0


def test_an_interrupt_while_a_failed_step_reruns_fails_no_other_request(monkeypatch):
    """A step whose batched forward raised is run again sequence by
    sequence. A KeyboardInterrupt in one of those forwards left the
    sequences that had already run alone computed but never sampled: the
    next step planned them for 0 tokens, which the pool refuses, so a good
    request ended with finish_reason "error" (InvalidArgumentError
    "query_counts[0] = 0"). They sample before the interrupt propagates
    now; what had not run yet runs at the next step, and what finished in
    the interrupted step comes back from the next step()."""
    model = tiny_model("llama", seed=21)
    good = random_prompts(21, [7, 9, 5])
    refs = [reference_greedy(model, p, 4) for p in good]
    one = reference_greedy(model, good[0], 1)
    poison = next(t for t in range(384) if all(t not in p + r for p, r in zip(good, refs)))
    bad = [*random_prompts(22, [4])[0], poison]
    forward = model.forward
    calls = {"alone": 0, "armed": True}

    def hooked(*args, **kwargs):
        ids = kwargs["input_ids"]
        if calls["armed"]:
            if (ids == poison).any() and ids.shape[1] > len(bad):
                raise ValueError("batched step refused")
            calls["alone"] += 1
            if calls["alone"] == 2:  # the second sequence run alone
                calls["armed"] = False
                raise KeyboardInterrupt
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", hooked)
    with Generator(model, num_blocks=64, block_size=4) as gen:
        first = gen.add_request(good[0], SamplingParams(max_new_tokens=1))
        rids = [gen.add_request(p, SamplingParams(max_new_tokens=4)) for p in good]
        rbad = gen.add_request(bad, SamplingParams(max_new_tokens=4))
        with pytest.raises(KeyboardInterrupt):
            gen.step()
        done = []
        while gen.has_unfinished():
            done += gen.step()
        got = {(c.request_id, c.finish_reason): c.tokens for c in done}
        assert got == {
            (first, "length"): one,
            **{(r, "length"): ref for r, ref in zip(rids, refs)},
            (rbad, "length"): reference_greedy(model, bad, 4),
        }
        gen.pool.validate()
        st = gen.pool.stats()
        assert (st.num_seqs, st.num_used_blocks) == (0, 0)


def test_a_seed_torch_cannot_take_is_refused_naming_it():
    """SamplingParams(seed=2**64) raised torch's ValueError "Overflow when
    unpacking long long", naming no argument, and the request had taken an
    id first (the next request got the one after). It is refused with the
    others' checks now; seeds torch takes (negative ones too) still work."""
    model = tiny_model("llama", seed=23)
    with Generator(model, num_blocks=16, block_size=4) as gen:
        for seed in (2**64, -(2**63) - 1):
            with pytest.raises(ValueError, match=r"seed must be an int in \[-2\^63, 2\^64 - 1\]"):
                gen.add_request([1, 2, 3], SamplingParams(temperature=1.0, seed=seed))
        assert not gen.has_unfinished()
        assert gen.add_request([1, 2, 3], SamplingParams(temperature=1.0, seed=-1)) == 0
        assert gen.add_request([1, 2, 3], SamplingParams(temperature=1.0, seed=2**64 - 1)) == 1
