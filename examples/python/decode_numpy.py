"""A minimal serving loop over pagedkv with numpy tensors (CPU).

Requests share a system prompt, so later ones hit the prefix cache. Each
engine step appends one token per running sequence, builds one step plan,
and per layer writes the new K/V into the paged cache and runs paged
attention. When the pool runs out of blocks, the newest request is
preempted (freed) and re-queued, as vLLM does. A toy "model" (random
projections) stands in for the transformer; every step's last layer is
checked against plain numpy attention over the cache gathered through the
block tables.

    python examples/python/decode_numpy.py --steps 32
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import pagedkv

try:  # bfloat16 numpy arrays; float32 without it
    import ml_dtypes

    DTYPE, DTYPE_NAME = np.dtype(ml_dtypes.bfloat16), "bf16"
except ImportError:
    DTYPE, DTYPE_NAME = np.dtype(np.float32), "f32"

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, VOCAB = 2, 2, 4, 64, 500


class ToyModel:
    """Random projections from token ids to q, k, v; 'sampling' picks the
    token whose embedding best matches the attention output."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.emb = rng.standard_normal((VOCAB, HEAD_DIM)).astype(np.float32)
        self.wq = rng.standard_normal((LAYERS, HEAD_DIM, Q_HEADS * HEAD_DIM)).astype(np.float32) / 8
        self.wk = rng.standard_normal((LAYERS, HEAD_DIM, KV_HEADS * HEAD_DIM)).astype(np.float32) / 8
        self.wv = rng.standard_normal((LAYERS, HEAD_DIM, KV_HEADS * HEAD_DIM)).astype(np.float32) / 8

    def qkv(self, layer: int, tokens: np.ndarray):
        x = self.emb[tokens]
        q = (x @ self.wq[layer]).reshape(-1, Q_HEADS, HEAD_DIM)
        k = (x @ self.wk[layer]).reshape(-1, KV_HEADS, HEAD_DIM)
        v = (x @ self.wv[layer]).reshape(-1, KV_HEADS, HEAD_DIM)
        return q.astype(DTYPE), k.astype(DTYPE), v.astype(DTYPE)

    def sample(self, hidden: np.ndarray) -> np.ndarray:
        return np.argmax(hidden.astype(np.float32).mean(axis=1) @ self.emb.T, axis=-1).astype(np.int32)


def run_step(pool, model, running, new_tokens):
    """One engine step: new_tokens[i] were appended to running[i]."""
    counts = [len(t) for t in new_tokens]
    with pool.prepare(running, counts) as step:
        tokens = np.concatenate(new_tokens).astype(np.int32)
        for layer in range(LAYERS):
            q, k, v = model.qkv(layer, tokens)
            step.cache_write(layer, k, v)
            out = step.attention(layer, q)
        # The last query of each sequence picks its next token.
        last = np.cumsum(counts) - 1
        return model.sample(out[last]), (q, out, step.plan_arrays())


def check_last_layer(pool, running, q, out, plan):
    """Gathers each sequence's cache through its block table and compares
    the kernel's output with plain attention in float64."""
    k_cache = pool.kv_tensor(LAYERS - 1, "k").numpy().astype(np.float64)
    v_cache = pool.kv_tensor(LAYERS - 1, "v").numpy().astype(np.float64)
    qptr = plan["query_indptr"].numpy()
    worst = 0.0
    for i, seq in enumerate(running):
        n = seq.num_tokens
        table = seq.block_table()
        k = np.concatenate([k_cache[b].transpose(1, 0, 2) for b in table])[:n]  # [n, Hkv, D]
        v = np.concatenate([v_cache[b].transpose(1, 0, 2) for b in table])[:n]
        rows = slice(qptr[i], qptr[i + 1])
        qq = q[rows].astype(np.float64)
        group = Q_HEADS // KV_HEADS
        kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        logits = np.einsum("qhd,lhd->hql", qq, kk) / math.sqrt(HEAD_DIM)
        pos = np.arange(n - qq.shape[0], n)[:, None] >= np.arange(n)[None, :]
        logits = np.where(pos[None], logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        ref = np.einsum("hql,lhd->qhd", w / w.sum(-1, keepdims=True), vv)
        worst = max(worst, float(np.abs(out[rows].astype(np.float64) - ref).max()))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--num-blocks", type=int, default=40)
    args = ap.parse_args()

    rng = np.random.default_rng(1)
    model = ToyModel()
    system = rng.integers(0, VOCAB, 40).tolist()
    queue = [system + rng.integers(0, VOCAB, int(rng.integers(5, 30))).tolist() for _ in range(args.requests)]

    with pagedkv.Pool(
        num_blocks=args.num_blocks,
        block_size=16,
        num_layers=LAYERS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        dtype=DTYPE_NAME,
    ) as pool:
        running = []  # [(seq, prompt, next_token)]
        preemptions, err = 0, 0.0
        for _ in range(args.steps):
            # Decode: one new slot per running sequence, oldest first; when the
            # pool is full, preempt the newest request and re-queue it.
            batch, new_tokens = [], []
            i = 0
            while i < len(running):
                seq, prompt, tok = running[i]
                try:
                    seq.append([tok])
                except pagedkv.OutOfBlocksError:
                    victim, victim_prompt, _ = running.pop()
                    victim.free()
                    queue.insert(0, victim_prompt)
                    preemptions += 1
                    continue  # retry (or the victim was this one)
                batch.append(seq)
                new_tokens.append(np.array([tok], np.int32))
                i += 1
            # Admit queued requests: prefix-cache lookup, the rest as prefill,
            # keeping a block of headroom per running sequence.
            admitted = []
            while queue:
                prompt = queue[0]
                seq = pool.create_sequence()
                cached = seq.match_prefix(prompt)
                headroom = len(running) + len(admitted)
                if seq.blocks_needed(len(prompt) - cached) > pool.stats().num_free_blocks - headroom:
                    seq.free()
                    break
                seq.append(prompt[cached:])
                admitted.append((seq, queue.pop(0)))
                batch.append(seq)
                new_tokens.append(np.array(prompt[cached:], np.int32))
            if not batch:
                break
            next_tokens, last = run_step(pool, model, batch, new_tokens)
            # The batch is the running sequences, then the admitted ones.
            order = [(s, p) for s, p, _ in running] + admitted
            running = [(s, p, int(t)) for (s, p), t in zip(order, next_tokens)]
            err = max(err, check_last_layer(pool, batch, *last))
        tol = 3e-2 if DTYPE_NAME == "bf16" else 1e-4
        if err > tol:
            print(f"attention mismatch: max error {err:.3g}")
            return 1
        st = pool.stats()
        pool.validate()
        print(f"{len(running)} running, {len(queue)} queued, {preemptions} preemptions after {args.steps} steps")
        print(
            f"blocks used {st.num_used_blocks}/{st.num_blocks - 1} (usage {st.usage:.0%}), "
            f"prefix cache hit rate {st.prefix_hit_rate:.0%}, KV bytes wasted {st.kv_bytes_wasted}"
        )
        print(f"every step checked against numpy: max error {err:.2g} ({DTYPE_NAME})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
