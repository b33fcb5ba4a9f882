"""A third set of pagedkv-against-vLLM scenarios (opt-in).

What test_vllm_differential.py and test_vllm_differential_more.py do not
drive: block sizes that are not powers of two (the pool's division path,
not its shift), sliding windows at and below the block size (window 1, a
window of less than one block, exactly one block, one block and a token),
chunked prefill at chunk sizes of 1, under a block, exactly a block and
several blocks (with lookahead slots), the byte encodings of hash inputs
at canonical-CBOR length boundaries (token ids, text lengths, non-ASCII
text, large mm offsets), MLA groups (vLLM's MLAAttentionSpec: a full
attention group), the full-hit recompute rule at those block sizes, the
eviction-pressure, speculative-decoding and stats scenarios of
test_vllm_differential_more.py at those sizes, a one-token window next to
full attention (never hits in vLLM), and EAGLE's dropped hit block (a
documented difference).

Same opt-in as test_vllm_differential.py (PKV_VLLM_SRC; skipped without it),
whose loader, drivers and replay this file reuses.
"""

from __future__ import annotations

import random

import pytest
from vllm_opt_in import require_vllm

VLLM_SRC = require_vllm()


import test_vllm_differential as tvd  # noqa: E402

import pagedkv as pk  # noqa: E402

kcu = tvd.kcu
sha256_cbor, xxhash_cbor = tvd.sha256_cbor, tvd.xxhash_cbor
SEEDS = max(1, tvd.SEEDS // 2)


def _run(groups, bs, hybrid, seeds=SEEDS, chunk=0, keys=False, lookahead=False, caching=True, nops=tvd.NOPS):
    stats = {}
    for seed in range(seeds):
        nblocks = random.Random(seed).randrange(12, 60) * len(groups)
        ops = tvd.gen_ops(seed, bs, nops, keys=keys, lookahead=lookahead)
        err = tvd.replay(ops, groups, bs, nblocks, caching, hybrid, stats, chunk=chunk)
        assert err is None, f"seed {seed}, {nblocks} blocks: {err}"
    assert stats.get("admissions", 0) > 0
    return stats


# ------------------------------------------------ block sizes, not 2**k

NPOT = [
    ([0], 3, False),
    ([0], 5, False),
    ([0], 12, False),
    ([0], 7, False),
    ([6], 3, True),
    ([10], 5, True),
    ([0, 7], 5, False),
    ([9, 0], 6, False),
    ([0, 0], 3, False),
]


@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no-caching"])
@pytest.mark.parametrize("groups,bs,hybrid", NPOT, ids=lambda x: str(x).replace(" ", ""))
def test_non_power_of_two_block_sizes_match_vllm(groups, bs, hybrid, caching):
    """The random operations (keys and lookahead slots too) at block sizes
    3, 5, 6, 7 and 12: a pool computes block indices by division there, not
    by a shift."""
    st = _run(groups, bs, hybrid, keys=caching, lookahead=True, caching=caching)
    if caching:
        assert st.get("hit_tokens", 0) > 0


@pytest.mark.parametrize("groups,bs,hybrid", NPOT, ids=lambda x: str(x).replace(" ", ""))
def test_non_power_of_two_chunked_prefill_matches_vllm(groups, bs, hybrid):
    _run(groups, bs, hybrid, chunk=bs + 2)


@pytest.mark.parametrize("bs", [3, 5, 6, 7, 12])
def test_full_hit_recomputes_the_last_block_at_odd_block_sizes(bs):
    for n in [bs, bs + 1, 2 * bs - 1, 2 * bs, 3 * bs + 2]:
        v, p = tvd.VllmSide([0], bs, 64), tvd.PagedkvSide([0], bs, 64)
        tokens = list(range(100, 100 + n))
        assert v.admit(tokens)[1] == p.admit(tokens)[1] == 0
        vr, vh = v.admit(tokens)
        pr, ph = p.admit(tokens)
        assert vh == ph == (n - 1) // bs * bs
        assert p.seqs[pr].num_computed_tokens == n
        assert v.tables(vr) == p.tables(pr)
        assert v.events() == p.events()


# ---------------------------------------- windows at the block size

WINDOWS = [
    ([0, 1], 4, False),
    ([0, 3], 4, False),
    ([0, 4], 4, False),
    ([0, 5], 4, False),
    ([1], 2, True),
    ([3], 4, True),
    ([4], 4, True),
    ([2, 0], 1, False),
    ([1, 0, 3], 2, False),
    ([8, 16], 4, False),
]


@pytest.mark.parametrize("groups,bs,hybrid", WINDOWS, ids=lambda x: str(x).replace(" ", ""))
def test_windows_at_the_block_size_match_vllm(groups, bs, hybrid):
    """Sliding windows of 1 token, under one block, of exactly one block
    and of one block and a token (every block but the current one leaves
    the window), alone or next to full attention, and two window groups
    without a full one."""
    _run(groups, bs, hybrid, keys=True, lookahead=True)


@pytest.mark.parametrize("groups,bs,hybrid", WINDOWS[:7], ids=lambda x: str(x).replace(" ", ""))
def test_windows_at_the_block_size_chunked_match_vllm(groups, bs, hybrid):
    _run(groups, bs, hybrid, chunk=bs + 1)


# ---------------------------------------------------- chunk sizes


@pytest.mark.parametrize("chunk_of", ["1", "bs-1", "bs", "2bs"])
@pytest.mark.parametrize(
    "groups,bs,hybrid", [([0], 4, False), ([0], 1, False), ([8], 4, True), ([0, 8], 4, False)], ids=str
)
def test_chunk_sizes_with_lookahead_match_vllm(groups, bs, hybrid, chunk_of):
    """Chunked prefill a token at a time, under a block, exactly a block
    and two blocks per step, lookahead slots on every step and admission,
    keys on the admissions."""
    chunk = {"1": 1, "bs-1": max(1, bs - 1), "bs": bs, "2bs": 2 * bs}[chunk_of]
    _run(groups, bs, hybrid, chunk=chunk, keys=True, lookahead=True, nops=100)


# ------------------------------------------------------------ MLA


def test_mla_group_is_a_full_attention_group():
    """An MLA group next to a window group: vLLM's MLAAttentionSpec is a
    FullAttentionSpec, so hits, block ids and free counts are those of
    [0, W]."""

    class P(tvd.PagedkvSide):
        def __init__(self, groups, bs, nblocks, caching=True, hybrid=False):
            self.multi = True
            specs = [tvd.KVGroupSpec.window(w, 1, 1, 8) if w else pk.hybrid.KVGroupSpec.mla(1) for w in groups]
            self.p = tvd.HybridPool(
                specs,
                num_blocks=nblocks,
                block_size=bs,
                hash_seed=tvd.SEED,
                enable_prefix_caching=caching,
                tagged_keys=True,
            )
            self.seqs, self.n = {}, 0

    real = tvd.PagedkvSide
    tvd.PagedkvSide = P
    try:
        _run([0, 8], 4, False, keys=True)
    finally:
        tvd.PagedkvSide = real


# ------------------------------------------------------ hash encoding


def _both(tokens, bs=4, fn=sha256_cbor, algo="sha256_cbor", prompt_len=None, **kw):
    """(vLLM's block hashes, pagedkv's hash_prefix, a tagged pool's
    sequence hashes) for the same request."""
    vkw = {}
    if "lora_name" in kw:
        vkw["lora"] = tvd.types.SimpleNamespace(
            lora_name=kw["lora_name"], lora_path=kw.get("lora_path"), lora_int_id=1, adapter_id=1
        )
    if "cache_salt" in kw:
        vkw["salt"] = kw["cache_salt"]
    if "mm_items" in kw:
        vkw["mm"] = kw["mm_items"]
    try:
        want, seed = tvd._vllm_hashes(fn, bs, tokens, prompt_len=prompt_len, **vkw)
        got = pk.hash_prefix(tokens, block_size=bs, algo=algo, seed=seed, tagged_keys=True, **kw)
        pool = pk.Pool(
            num_blocks=4 + len(tokens) // bs, block_size=bs, hash_algo=algo, hash_seed=seed, tagged_keys=True
        )
        s = pool.create_sequence(**kw)
        s.append(tokens)
        seq = s.block_hashes()
        pool.close()
    finally:
        kcu.init_none_hash(sha256_cbor)
    return want, got, seq


CBOR_INTS = [0, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, -1, -24, -25, -256, -257, -65536, -65537, -(2**31)]


@pytest.mark.parametrize("fn,algo", tvd.ALGOS)
def test_token_ids_at_cbor_length_boundaries(fn, algo):
    """Token ids where canonical CBOR changes the length of an integer's
    head (23/24, 255/256, 65535/65536, the int32 ends), alone and mixed."""
    rng = random.Random(3)
    for bs in (1, 3, 4, 16):
        tokens = CBOR_INTS + [rng.choice(CBOR_INTS) for _ in range(5 * bs)]
        want, got, seq = _both(tokens, bs, fn, algo)
        assert got == want and seq == want


# Text whose UTF-8 length crosses CBOR's head lengths (23/24, 255/256,
# 65535/65536 bytes) while its length in characters does not, and the reverse.
TEXTS = [
    "x",
    "a" * 23,
    "a" * 24,
    "a" * 255,
    "a" * 256,
    "a" * 65535,
    "a" * 65536,
    "é" * 12,  # 24 bytes, 12 characters
    "日本" * 43,  # 258 bytes, 86 characters
    "\U0001f600" * 6,  # 24 bytes, 6 characters
    "mixé\u00e9-\u4e2d",
]


@pytest.mark.parametrize("what", ["salt", "lora_name", "lora_path", "mm"])
@pytest.mark.parametrize("text", TEXTS, ids=lambda t: f"{len(t)}ch-{len(t.encode())}b")
def test_text_keys_at_cbor_length_boundaries(what, text):
    """A cache salt, LoRA name, LoRA path or mm identifier of 1 to 65536
    bytes, ASCII and not: the same bytes as vLLM's tagged keys."""
    tokens = list(range(1000, 1021))
    kw = {
        "salt": {"cache_salt": text},
        "lora_name": {"lora_name": text, "lora_path": "/p"},
        "lora_path": {"lora_name": "a", "lora_path": text},
        "mm": {"mm_items": [(1, 3, text), (6, 9, text + "2")]},
    }[what]
    want, got, seq = _both(tokens, 4, **kw)
    assert got == want and seq == want


@pytest.mark.parametrize("bs", [4, 16, 64])
def test_long_mm_item_offsets_at_cbor_length_boundaries(bs):
    """An mm item long enough that a block far into it keys it at offset
    -24, -256, -65536 and beyond (the item starts that far before the
    block), prompt and decode blocks."""
    n = 70000 + bs
    tokens = [i % 50000 for i in range(n)]
    items = [(3, n - 10, "long-item"), (n - 5, 2, "tail")]
    for prompt_len in (None, n - 2 * bs - 1):
        want, got, seq = _both(tokens, bs, mm_items=items, prompt_len=prompt_len)
        assert len(want) == n // bs
        assert got == want and seq == want


# ------------------------------- a Pool's own window, without caching


@pytest.mark.parametrize("groups,bs", [([8], 4), ([5], 2), ([1], 4), ([4], 4), ([7], 3)], ids=str)
def test_single_group_window_pool_without_caching_matches_vllm(groups, bs):
    """A single-group Pool's sliding window differs from vLLM only in its
    prefix lookup (docs/vllm-compat.md); without prefix caching there is no
    lookup, so the window's releases (to the head of the free queue, in
    vLLM's order), block ids and free counts agree op for op, lookahead
    slots and chunked prefill included."""
    _run(groups, bs, False, caching=False, lookahead=True)
    _run(groups, bs, False, caching=False, chunk=bs + 1, seeds=max(1, SEEDS // 2))


# ------------------ the scenarios of _more at block sizes not 2**k

import test_vllm_differential_more as tvm  # noqa: E402


@pytest.mark.parametrize("bs", [3, 5, 12])
@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no-caching"])
def test_eviction_pressure_at_odd_block_sizes_matches_vllm(bs, caching):
    """test_vllm_differential_more.py's pressure traces (every admission
    evicts; BlockRemoved order; re-hits from the middle of the free queue)
    at block sizes 3, 5 and 12."""
    stats = {}
    for seed in range(SEEDS * 2):
        nblocks = random.Random(seed).randrange(8, 21)
        err = tvd.replay(tvm.gen_pressure_ops(seed, bs), [0], bs, nblocks, caching, False, stats)
        assert err is None, f"seed {seed}, {nblocks} blocks: {err}"
    if caching:
        assert stats.get("hit_tokens", 0) > 0 and stats.get("events", 0) > 0


@pytest.mark.parametrize("accept", [False, True], ids=["rejected", "accepted"])
@pytest.mark.parametrize("groups,bs,hybrid", [([0], 3, False), ([0], 5, False), ([0, 0], 6, False)], ids=str)
def test_speculative_decoding_at_odd_block_sizes_matches_vllm(groups, bs, hybrid, accept):
    for seed in range(SEEDS):
        nblocks = random.Random(seed).randrange(16, 60) * len(groups)
        err = tvm._spec_replay(seed, groups, bs, nblocks, hybrid, accept)
        assert err is None, f"seed {seed}, {nblocks} blocks: {err}"


@pytest.mark.parametrize("groups,bs", [([0], 3), ([0], 7), ([0, 6], 5)], ids=str)
def test_prefix_cache_stats_at_odd_block_sizes_match_vllm(monkeypatch, groups, bs):
    """Prefix-cache queries / hits and usage against vLLM's PrefixCacheStats
    (test_vllm_differential_more.py's check) at block sizes 3, 5 and 7."""
    tvm.test_prefix_cache_stats_and_usage_match_vllm(monkeypatch, groups, bs)


def test_one_token_window_never_hits_as_in_vllm():
    """[full, window of 1]: vLLM caches none of the window group's blocks and
    so never hits, however much the full group holds; the pool neither (it
    hit the whole prompt in null blocks, on an empty cache too: a fixed
    defect, docs/reliability.md)."""
    stats = {}
    for seed in range(SEEDS):
        nblocks = random.Random(seed).randrange(12, 40) * 2
        err = tvd.replay(tvm.gen_pressure_ops(seed, 4), [0, 1], 4, nblocks, True, False, stats)
        assert err is None, f"seed {seed}, {nblocks} blocks: {err}"
    assert stats.get("admissions", 0) > 0 and stats.get("hit_tokens", 0) == 0
    v, p = tvd.VllmSide([0, 1], 4, 40), tvd.PagedkvSide([0, 1], 4, 40)
    tokens = list(range(100, 113))
    for side in (v, p):
        side.free(side.admit(tokens)[0])
    assert v.admit(tokens)[1] == p.admit(tokens)[1] == 0
    assert p.p.stats().prefix_hit_tokens == 0
    assert v.tables("2") == p.tables("2")


# ------------------------------------------------------------ EAGLE


def test_eagle_drops_a_block_of_the_hit_in_vllm_only():
    """Documented difference (docs/vllm-compat.md): vLLM configured for EAGLE
    (KVCacheManager(use_eagle=True)) drops the last block of every prefix
    hit, since the drafter needs the tokens before the generation point
    recomputed; a pool has no such option, and hits one block more. Without
    EAGLE the two agree (the other tests)."""
    bs = 4
    tokens = list(range(100, 100 + 3 * bs + 2))
    v = tvd.VllmSide([0], bs, 32)
    cfg = v.m.kv_cache_config
    v.m = tvd.kcm.KVCacheManager(
        cfg,
        max_model_len=1 << 20,
        scheduler_block_size=bs,
        hash_block_size=bs,
        enable_caching=True,
        enable_kv_cache_events=True,
        use_eagle=True,
    )
    p = tvd.PagedkvSide([0], bs, 32)
    for side in (v, p):
        side.free(side.admit(tokens)[0])
    assert v.events() == p.events()
    assert v.admit(tokens)[1] == 2 * bs
    assert p.admit(tokens)[1] == 3 * bs
