"""A decode loop over pagedkv with torch tensors, on the GPU when there is one.

The same engine step as decode_numpy.py, with torch tensors handed to the
kernels without copies (DLPack) and the current CUDA stream passed along.
Runs on CUDA when torch sees a GPU and pagedkv was built with CUDA, else on
the CPU. Exits 0 with a note when torch is not installed.

    python examples/python/decode_torch.py --steps 32
"""

from __future__ import annotations

import argparse
import math
import sys

import pagedkv

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, VOCAB, BLOCK = 4, 2, 8, 128, 1000, 16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=100)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed; skipping")
        return 0

    use_cuda = torch.cuda.is_available() and pagedkv.cuda_device_count() > 0
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    dtype = torch.bfloat16
    gen = torch.Generator(device="cpu").manual_seed(0)
    emb = torch.randn(VOCAB, HEAD_DIM, generator=gen).to(device, dtype)
    wq = (torch.randn(LAYERS, HEAD_DIM, Q_HEADS * HEAD_DIM, generator=gen) / 16).to(device, dtype)
    wkv = (torch.randn(LAYERS, HEAD_DIM, 2 * KV_HEADS * HEAD_DIM, generator=gen) / 16).to(device, dtype)
    stream = torch.cuda.current_stream(device) if use_cuda else None

    num_blocks = args.batch * ((args.prompt + args.steps) // BLOCK + 2) + 1
    with pagedkv.Pool(
        num_blocks=num_blocks,
        block_size=BLOCK,
        num_layers=LAYERS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        dtype="bf16",
        device=str(device) if use_cuda else "cpu",
    ) as pool:
        seqs = [pool.create_sequence() for _ in range(args.batch)]
        prompts = torch.randint(0, VOCAB, (args.batch, args.prompt), generator=gen)
        for s, p in zip(seqs, prompts):
            s.append(p.tolist())
        tokens = prompts.reshape(-1).to(device)
        counts = [args.prompt] * args.batch
        for _ in range(args.steps + 1):
            with pool.prepare(seqs, counts, stream=stream) as step:
                x = emb[tokens]
                for layer in range(LAYERS):
                    q = (x @ wq[layer]).view(-1, Q_HEADS, HEAD_DIM)
                    k, v = (x @ wkv[layer]).view(-1, 2, KV_HEADS, HEAD_DIM).unbind(1)
                    step.cache_write(layer, k.contiguous(), v.contiguous(), stream=stream)
                    out = step.attention(layer, q, stream=stream)
                    x = x + out.view(-1, Q_HEADS, HEAD_DIM).mean(1)
                last = torch.tensor(counts, device=device).cumsum(0) - 1
                nxt = (x[last].float() @ emb.float().T).argmax(-1)
            for s, t in zip(seqs, nxt.tolist()):
                s.append([t])
            tokens, counts = nxt, [1] * args.batch

        # Check the last layer of one more decode step against SDPA on the
        # cache gathered through the block tables.
        with pool.prepare(seqs, 1, stream=stream) as step:
            q = torch.randn(args.batch, Q_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
            k = torch.randn(args.batch, KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
            step.cache_write(0, k, k.clone(), stream=stream)
            out = step.attention(0, q, stream=stream)
        kc = pool.kv_tensor(0, "k").torch()
        vc = pool.kv_tensor(0, "v").torch()
        worst = 0.0
        for i, s in enumerate(seqs):
            n, table = s.num_tokens, torch.tensor(s.block_table(), device=device)
            kk = kc[table].permute(1, 0, 2, 3).reshape(KV_HEADS, -1, HEAD_DIM)[:, :n].float()
            vv = vc[table].permute(1, 0, 2, 3).reshape(KV_HEADS, -1, HEAD_DIM)[:, :n].float()
            kk = kk.repeat_interleave(Q_HEADS // KV_HEADS, 0)
            vv = vv.repeat_interleave(Q_HEADS // KV_HEADS, 0)
            w = torch.softmax((q[i].float()[:, None] @ kk.transpose(1, 2)) / math.sqrt(HEAD_DIM), -1)
            ref = (w @ vv)[:, 0]
            worst = max(worst, (out[i].float() - ref).abs().max().item())
        stats = pool.stats()
        pool.validate()
    print(f"{args.batch} sequences x {args.steps} decode steps on {device}: {stats.num_used_blocks} blocks used")
    print(f"last step vs gathered-cache attention: max error {worst:.2g} (bf16)")
    return 0 if worst < 5e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
