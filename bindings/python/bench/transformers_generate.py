"""Generated tokens/s: transformers' own generate() against
pagedkv.integrations.transformers.Generator on the same random-weight
Llama-like model (GQA), greedy, at batch 1 and batch 16, on the CPU.
Informative: end-to-end time (prefill + decode), the best of --repeat runs
each (alternating, after a warm-up), both on the same torch threads (and
pagedkv's attention on as many).

    PYTHONPATH=<build>/bindings/python python3 bindings/python/bench/transformers_generate.py --threads 1

(--threads 1 keeps the figures steady on a machine shared with other jobs.)

--quick shrinks everything for a smoke run.
"""

from __future__ import annotations

import argparse
import os
import platform
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("--new", type=int, default=64, help="generated tokens per sequence")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the best counts")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.prompt, args.new, args.batches = 16, 4, "1,2"

    import torch
    import transformers

    from pagedkv.integrations.transformers import Generator, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=8192,
        hidden_size=512 if not args.quick else 64,
        intermediate_size=1408 if not args.quick else 128,
        num_hidden_layers=8 if not args.quick else 2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    dtype = getattr(torch, args.dtype)
    model = transformers.LlamaForCausalLM(cfg).eval().to(dtype)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Llama-like, {params / 1e6:.1f}M params, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"8 q / 2 kv heads, {args.dtype}; prompt {args.prompt}, {args.new} new tokens, greedy"
    )
    print(
        f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}, torch {torch.__version__}, transformers {transformers.__version__}"
    )

    def hf(batch: int) -> float:
        ids = torch.randint(0, cfg.vocab_size, (batch, args.prompt))
        with torch.inference_mode():
            t = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                do_sample=False,
                pad_token_id=0,
            )
            dt = time.perf_counter() - t
        assert out.shape == (batch, args.prompt + args.new)
        return batch * args.new / dt

    def paged(batch: int) -> float:
        prompts = torch.randint(0, cfg.vocab_size, (batch, args.prompt)).tolist()
        num_blocks = batch * ((args.prompt + args.new) // 16 + 2) + 8
        with Generator(
            model,
            num_blocks=num_blocks,
            block_size=16,
            max_num_batched_tokens=2048,
            max_num_seqs=batch,
            num_threads=torch.get_num_threads(),
        ) as gen:
            t = time.perf_counter()
            outs = gen.generate(prompts, SamplingParams(max_new_tokens=args.new, ignore_eos=True))
            dt = time.perf_counter() - t
        assert all(len(o[0].tokens) == args.new for o in outs)
        return batch * args.new / dt

    hf(1), paged(1)  # warm-up
    print(f"{'batch':>5}  {'transformers generate':>22}  {'pagedkv Generator':>18}  {'ratio':>6}")
    for b in (int(x) for x in args.batches.split(",")):
        a = p = 0.0
        for _ in range(args.repeat):
            a, p = max(a, hf(b)), max(p, paged(b))
        print(f"{b:>5}  {a:>17.1f} tok/s  {p:>13.1f} tok/s  {p / a:>5.2f}x")


if __name__ == "__main__":
    main()
