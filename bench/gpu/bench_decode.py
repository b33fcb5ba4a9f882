#!/usr/bin/env python3
"""pagedkv CUDA benchmark: one run, one table (DESIGN.md section 8).

Loads libpagedkv through ctypes over the C ABI (no binding needed) and, on
the first CUDA device, in one run:
  * calibrates read and copy bandwidth (and pinned host<->device bandwidth)
    at the start and at the end;
  * for each cell of the sweep (heads Hq/Hkv/D x (batch, context), page 16,
    bf16) times our paged decode against torch SDPA on a contiguous cache
    (best backend per cell) and torch FlexAttention's paged attention;
  * times paged prefill against contiguous causal SDPA on the small-batch
    cells, and write / block copy / swap against their bandwidth floors;
  * flushes L2 between repetitions; cells whose KV is under 4x L2 are
    reported as latency only;
  * times decode over FP8 (E4M3) pages against the same cell on bf16 pages
    (half the bytes read), with the FP8 output's error against bf16's.
Prints markdown and writes it to --out (default bench/results/<device>.md).

`--selftest` needs no GPU and no torch: it checks the ctypes mirror of the
C structs against the library and runs one tiny step on a CPU pool.
"""
import argparse
import ctypes as C
import math
import os
import re
import statistics
import sys
import time

# ------------------------------------------------------------------ C ABI

PKV_OK = 0
PKV_DTYPE_F32, PKV_DTYPE_BF16, PKV_DTYPE_I32, PKV_DTYPE_FP8_E4M3 = 1, 3, 4, 6
PKV_DEVICE_CPU, PKV_DEVICE_CUDA = 1, 2
PKV_SWAP_OUT, PKV_SWAP_IN = 0, 1


class PoolOptions(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("block_size", C.c_uint32),
        ("num_blocks", C.c_uint64), ("memory_budget_bytes", C.c_uint64),
        ("hash_algo", C.c_uint32), ("enable_prefix_caching", C.c_uint32),
        ("hash_seed", C.c_char_p), ("sliding_window", C.c_uint32),
        ("enable_events", C.c_uint32), ("max_events", C.c_uint32),
        ("num_layers", C.c_uint32), ("num_kv_heads", C.c_uint32),
        ("head_dim", C.c_uint32), ("dtype", C.c_uint32),
        ("device_type", C.c_int32), ("device_id", C.c_int32),
        ("num_threads", C.c_uint32), ("strict_key_domains", C.c_uint32),
        ("kv_scale_granularity", C.c_uint32), ("num_kv_scales", C.c_uint32),
        ("k_scales", C.POINTER(C.c_float)), ("v_scales", C.POINTER(C.c_float)),
        ("enable_partial_reuse", C.c_uint32), ("enable_retention", C.c_uint32),
        ("max_pinned_blocks", C.c_uint64),
        ("kv_layout", C.c_uint32), ("kv_lora_rank", C.c_uint32),
        ("qk_rope_head_dim", C.c_uint32),
    ]


class Tensor(C.Structure):
    _fields_ = [
        ("data", C.c_void_p), ("byte_offset", C.c_uint64), ("dtype", C.c_uint32),
        ("device_type", C.c_int32), ("device_id", C.c_int32), ("ndim", C.c_int32),
        ("shape", C.c_int64 * 6), ("strides", C.c_int64 * 6),
    ]


class AttentionParams(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("softmax_scale", C.c_float),
        ("sliding_window", C.c_uint32), ("logit_softcap", C.c_float),
    ]


def load_library(path):
    lib = C.CDLL(path)
    P, U32, U64, I32 = C.c_void_p, C.c_uint32, C.c_uint64, C.c_int32
    sig = {
        "pkv_last_error_message": ([], C.c_char_p),
        "pkv_pool_options_init": ([C.POINTER(PoolOptions)], None),
        "pkv_pool_create": ([C.POINTER(PoolOptions), C.POINTER(P)], I32),
        "pkv_pool_destroy": ([P], None),
        "pkv_pool_bytes_per_block": ([P, C.POINTER(U64)], I32),
        "pkv_seq_create": ([P, P, C.POINTER(U64)], I32),
        "pkv_seq_append": ([P, U64, C.POINTER(C.c_int32), U64, U32], I32),
        "pkv_seq_get_block_table": ([P, U64, C.POINTER(C.c_int32), U64, C.POINTER(U64)], I32),
        "pkv_batch_prepare": ([P, C.POINTER(U64), C.POINTER(U32), U32, P, C.POINTER(P)], I32),
        "pkv_batch_destroy": ([P], None),
        "pkv_cache_write": ([P, U32, C.POINTER(Tensor), C.POINTER(Tensor), P], I32),
        "pkv_attention_params_init": ([C.POINTER(AttentionParams)], None),
        "pkv_attention_forward": ([P, U32, C.POINTER(Tensor), C.POINTER(Tensor),
                                   C.POINTER(Tensor), C.POINTER(AttentionParams), P], I32),
        "pkv_pool_copy_blocks": ([P, C.POINTER(C.c_int32), C.POINTER(C.c_int32), U64, P], I32),
        "pkv_pool_swap_blocks": ([P, C.POINTER(C.c_int32), U64, P, U64, U32, P], I32),
        "pkv_tensor_init": ([P, U32, I32, I32, I32, C.POINTER(C.c_int64), C.POINTER(Tensor)], I32),
        "pkv_cuda_device_count": ([], I32),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


class Lib:
    """Thin checked wrappers: every failing call raises with the C message."""

    def __init__(self, path):
        self.c = load_library(path)

    def ok(self, status, what):
        if status != PKV_OK:
            msg = self.c.pkv_last_error_message().decode(errors="replace")
            raise RuntimeError(f"{what}: status {status}: {msg}")

    def tensor(self, ptr, dtype, device_type, shape, device_id=0):
        t = Tensor()
        arr = (C.c_int64 * len(shape))(*shape)
        self.ok(self.c.pkv_tensor_init(C.c_void_p(ptr), dtype, device_type, device_id,
                                       len(shape), arr, C.byref(t)), "pkv_tensor_init")
        return t

    def pool(self, *, block_size, num_blocks, num_kv_heads, head_dim, dtype, device_type,
             num_layers=1):
        o = PoolOptions()
        self.c.pkv_pool_options_init(C.byref(o))
        o.block_size, o.num_blocks = block_size, num_blocks
        o.num_layers, o.num_kv_heads, o.head_dim, o.dtype = num_layers, num_kv_heads, head_dim, dtype
        o.device_type, o.device_id = device_type, 0
        o.enable_prefix_caching = 0  # hashing is not what is measured here
        p = C.c_void_p()
        self.ok(self.c.pkv_pool_create(C.byref(o), C.byref(p)), "pkv_pool_create")
        return p

    def seqs(self, pool, n, length):
        ids = (C.c_uint64 * n)()
        toks = (C.c_int32 * length)(*[(7 * i) % 32000 for i in range(length)])
        for i in range(n):
            sid = C.c_uint64()
            self.ok(self.c.pkv_seq_create(pool, None, C.byref(sid)), "pkv_seq_create")
            ids[i] = sid.value
            self.ok(self.c.pkv_seq_append(pool, ids[i], toks, length, 0), "pkv_seq_append")
        return ids

    def append_all(self, pool, ids, n_tokens):
        toks = (C.c_int32 * n_tokens)(*range(n_tokens))
        for i in range(len(ids)):
            self.ok(self.c.pkv_seq_append(pool, ids[i], toks, n_tokens, 0), "pkv_seq_append")

    def prepare(self, pool, ids, counts, stream):
        cnt = (C.c_uint32 * len(ids))(*counts)
        b = C.c_void_p()
        self.ok(self.c.pkv_batch_prepare(pool, ids, cnt, len(ids), C.c_void_p(stream), C.byref(b)),
                "pkv_batch_prepare")
        return b

    def block_table(self, pool, seq):
        n = C.c_uint64()
        buf = (C.c_int32 * 1)()
        self.c.pkv_seq_get_block_table(pool, seq, buf, 0, C.byref(n))  # asks the size
        buf = (C.c_int32 * n.value)()
        self.ok(self.c.pkv_seq_get_block_table(pool, seq, buf, n.value, C.byref(n)),
                "pkv_seq_get_block_table")
        return list(buf)


# ------------------------------------------------------------------ table helpers

HEADS = [(32, 32, 128), (32, 8, 128), (64, 8, 128), (32, 4, 128), (16, 8, 256)]
CELLS = [(1, 32768), (8, 4096), (64, 4096), (256, 1024), (64, 256)]
# (Hq, Hkv, D), (batch, ctx): decode on FP8 E4M3 pages vs bf16 pages.
FP8_CELLS = [((32, 8, 128), (64, 4096)), ((32, 8, 128), (256, 1024)), ((16, 8, 256), (8, 4096)),
             ((32, 32, 128), (1, 32768))]
PAGE = 16


def kv_bytes(batch, ctx, hkv, d, elt=2):
    return 2 * batch * ctx * hkv * d * elt


def fmt_us(s):
    return "n/a" if s is None else f"{s * 1e6:.1f}"


def fmt_ratio(a, b):
    return "n/a" if a is None or b is None else f"{a / b:.2f}"


def device_slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def decode_table(rows, read_bw):
    out = ["| Hq/Hkv/D | batch x ctx | KV MiB | ours us | ours GB/s | % read BW | SDPA best us (backend) | "
           "ours / SDPA | Flex paged us | ours / Flex |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kv = r["bytes"]
        ours = r.get("ours")
        if r["latency_only"] or ours is None:
            gbs, pct = "latency", "latency"
        else:
            gbs = f"{kv / ours / 1e9:.0f}"
            pct = f"{100 * kv / ours / read_bw:.0f}%"
        sdpa = r.get("sdpa")
        sdpa_s = "n/a" if sdpa is None else f"{sdpa * 1e6:.1f} ({r.get('sdpa_backend')})"
        out.append(f"| {r['heads']} | {r['batch']} x {r['ctx']} | {kv / 2**20:.0f} | {fmt_us(ours)} | {gbs} | "
                   f"{pct} | {sdpa_s} | {fmt_ratio(ours, sdpa)} | {fmt_us(r.get('flex'))} | "
                   f"{fmt_ratio(ours, r.get('flex'))} |" + (f" {r['note']}" if r.get("note") else ""))
    return "\n".join(out)


# ------------------------------------------------------------------ selftest (no GPU, no torch)

def selftest(lib_path):
    lib = Lib(lib_path)
    o = PoolOptions()
    lib.c.pkv_pool_options_init(C.byref(o))
    assert o.struct_size == C.sizeof(PoolOptions), (o.struct_size, C.sizeof(PoolOptions))
    a = AttentionParams()
    lib.c.pkv_attention_params_init(C.byref(a))
    assert a.struct_size == C.sizeof(AttentionParams), (a.struct_size, C.sizeof(AttentionParams))
    hkv, hq, d = 2, 4, 64
    pool = lib.pool(block_size=16, num_blocks=16, num_kv_heads=hkv, head_dim=d,
                    dtype=PKV_DTYPE_F32, device_type=PKV_DEVICE_CPU)
    ids = lib.seqs(pool, 2, 20)
    batch = lib.prepare(pool, ids, [20, 20], 0)
    n = 40
    import random
    rnd = random.Random(1)
    mk = lambda count: (C.c_float * count)(*[rnd.uniform(-1, 1) for _ in range(count)])
    k, v, q, out = mk(n * hkv * d), mk(n * hkv * d), mk(n * hq * d), (C.c_float * (n * hq * d))()
    t = lambda buf, shape: lib.tensor(C.addressof(buf), PKV_DTYPE_F32, PKV_DEVICE_CPU, shape)
    kt, vt, qt, ot = t(k, [n, hkv, d]), t(v, [n, hkv, d]), t(q, [n, hq, d]), t(out, [n, hq, d])
    lib.ok(lib.c.pkv_cache_write(batch, 0, C.byref(kt), C.byref(vt), None), "pkv_cache_write")
    lib.ok(lib.c.pkv_attention_forward(batch, 0, C.byref(qt), C.byref(ot), None, None, None),
           "pkv_attention_forward")
    # Query 0 of a sequence sees only key 0: its output is v[0] exactly.
    for h in range(hq):
        for j in range(d):
            assert abs(out[h * d + j] - v[(h // (hq // hkv)) * d + j]) < 1e-6
    assert all(math.isfinite(x) for x in out)
    blocks = lib.block_table(pool, ids[0])
    assert len(blocks) == 2, blocks
    lib.c.pkv_batch_destroy(batch)
    lib.c.pkv_pool_destroy(pool)
    fake = [dict(heads="32/8/128", batch=8, ctx=4096, bytes=kv_bytes(8, 4096, 8, 128), latency_only=False,
                 ours=0.0004, sdpa=0.00042, sdpa_backend="flash", flex=0.0006),
            dict(heads="32/8/128", batch=64, ctx=256, bytes=kv_bytes(64, 256, 8, 128), latency_only=True,
                 ours=0.00003, sdpa=None, flex=None, note="")]
    print(decode_table(fake, 3.0e12))
    print("selftest: ok")


# ------------------------------------------------------------------ GPU benchmark

def run(args):
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))
    lib = Lib(args.lib)
    deadline = time.time() + args.time_budget
    stream = torch.cuda.current_stream().cuda_stream
    flush_buf = torch.empty(2 * l2 // 4 + 1024, dtype=torch.float32, device=dev)

    def timeit(fn, reps=args.reps, flush=True):
        times = []
        fn()  # warm-up
        torch.cuda.synchronize()
        for _ in range(reps):
            if flush:
                flush_buf.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        return statistics.median(times)

    def calibrate():
        n = max(16 * l2, 1 << 30)
        x = torch.randn(n // 4, dtype=torch.float32, device=dev)
        y = torch.empty_like(x)
        read = max(n / timeit(lambda: x.sum()), n / timeit(lambda: x.amax()))
        copy = 2 * n / timeit(lambda: y.copy_(x))
        h = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
        g = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        h2d = h.numel() / timeit(lambda: g.copy_(h, non_blocking=True), reps=5, flush=False)
        d2h = h.numel() / timeit(lambda: h.copy_(g, non_blocking=True), reps=5, flush=False)
        del x, y, h, g
        torch.cuda.empty_cache()
        return dict(read=read, copy=copy, h2d=h2d, d2h=d2h)

    cal0 = calibrate()
    print(f"calibration (start): {cal0}", flush=True)

    flex_attention = create_block_mask = PagedAttention = None
    try:
        from torch.nn.attention.flex_attention import flex_attention as _fa, create_block_mask as _cbm
        from torch.nn.attention.experimental._paged_attention import PagedAttention as _PA
        flex_attention = torch.compile(_fa, dynamic=False)
        create_block_mask, PagedAttention = _cbm, _PA
    except Exception as e:  # noqa: BLE001
        print(f"FlexAttention unavailable: {e}", flush=True)
    flex_deadline = time.time() + args.flex_budget
    if args.skip_flex:
        flex_attention = None

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]

    def best_sdpa(q, k, v, causal, gqa):
        best = (None, None)
        for name, be in backends:
            if name == "math" and best[0] is not None:
                continue  # the math backend only where nothing else runs
            try:
                with sdpa_kernel([be]):
                    f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                    t = timeit(f)
                if best[0] is None or t < best[0]:
                    best = (t, name)
            except Exception:  # noqa: BLE001  (backend cannot run this shape)
                pass
        return best

    heads_sel = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")] if args.heads else HEADS
    cells_sel = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")] if args.cells else CELLS
    decode_rows, prefill_rows, move_rows = [], [], []
    for hq, hkv, d in heads_sel:
        for batch, ctx in cells_sel:
            heads = f"{hq}/{hkv}/{d}"
            kvb = kv_bytes(batch, ctx + 1, hkv, d)
            row = dict(heads=heads, batch=batch, ctx=ctx, bytes=kvb, latency_only=kvb < 4 * l2)
            decode_rows.append(row)
            if time.time() > deadline:
                row["note"] = "(not run: time budget)"
                continue
            try:
                bench_cell(torch, F, lib, dev, stream, timeit, best_sdpa, row, hq, hkv, d, batch, ctx,
                           prefill_rows, move_rows, cal0, flex_attention, create_block_mask, PagedAttention,
                           flex_deadline, args)
            except Exception as e:  # noqa: BLE001
                row["note"] = f"(error: {str(e)[:80]})"
            torch.cuda.empty_cache()
            print(f"{heads} {batch}x{ctx}: ours {fmt_us(row.get('ours'))} us, sdpa {fmt_us(row.get('sdpa'))} us, "
                  f"flex {fmt_us(row.get('flex'))} us {row.get('note', '')}", flush=True)

    fp8_rows = []
    for (hq, hkv, d), (batch, ctx) in ([] if args.skip_fp8 else FP8_CELLS):
        r = dict(heads=f"{hq}/{hkv}/{d}", batch=batch, ctx=ctx)
        fp8_rows.append(r)
        if time.time() > deadline:
            r["note"] = "(not run: time budget)"
            continue
        try:
            bench_fp8_cell(torch, lib, dev, stream, timeit, r, hq, hkv, d, batch, ctx)
        except Exception as e:  # noqa: BLE001
            r["note"] = f"(error: {str(e)[:80]})"
        torch.cuda.empty_cache()
        print(f"fp8 {r['heads']} {batch}x{ctx}: bf16 {fmt_us(r.get('bf16'))} us, fp8 {fmt_us(r.get('fp8'))} us "
              f"{r.get('note', '')}", flush=True)

    cal1 = calibrate()
    print(f"calibration (end): {cal1}", flush=True)
    read_bw = max(cal0["read"], cal1["read"])
    copy_bw = max(cal0["copy"], cal1["copy"])
    name = torch.cuda.get_device_name(dev)
    md = [f"# pagedkv CUDA benchmark: {name}", "",
          f"torch {torch.__version__}, {props.multi_processor_count} SMs, L2 {l2 >> 20} MiB, bf16, page {PAGE}, "
          f"median of {args.reps} after a warm-up, L2 flushed before each repetition.", "",
          "Calibration (GB/s; copy counts bytes read + written): "
          f"read {cal0['read'] / 1e9:.0f} -> {cal1['read'] / 1e9:.0f}, copy {cal0['copy'] / 1e9:.0f} -> "
          f"{cal1['copy'] / 1e9:.0f}, host->device {cal0['h2d'] / 1e9:.1f} -> {cal1['h2d'] / 1e9:.1f}, "
          f"device->host {cal0['d2h'] / 1e9:.1f} -> {cal1['d2h'] / 1e9:.1f} (start -> end). "
          "Ratios use the larger of each pair.", "",
          "## Decode (one query token per sequence)", "",
          f"KV under 4x L2 ({4 * l2 >> 20} MiB) is reported as latency only. % read BW = KV bytes / time / read BW.",
          "", decode_table(decode_rows, read_bw), "",
          "## Paged prefill vs contiguous causal SDPA", "",
          "Causal FLOPs counted as 4 * batch * Hq * D * ctx * (ctx + 1) / 2. Error: max |ours - SDPA| over every "
          "output element (NaN if any element was left unwritten).", "",
          "| Hq/Hkv/D | batch x ctx | ours ms | ours TFLOP/s | SDPA best ms (backend) | SDPA / ours | max abs err |",
          "|---|---|---|---|---|---|---|"]
    for r in prefill_rows:
        hq_, _, d_ = (int(x) for x in r["heads"].split("/"))
        flops = 4 * r["batch"] * hq_ * d_ * r["ctx"] * (r["ctx"] + 1) / 2
        md.append(f"| {r['heads']} | {r['batch']} x {r['ctx']} | {r['ours'] * 1e3:.2f} | {flops / r['ours'] / 1e12:.0f} | "
                  + ("n/a" if r["sdpa"] is None else f"{r['sdpa'] * 1e3:.2f} ({r['sdpa_backend']})")
                  + f" | {fmt_ratio(r['sdpa'], r['ours'])} | {r.get('err', float('nan')):.3g} |")
    md += ["", "## Decode on FP8 (E4M3) pages vs bf16 pages", "",
           "Same cell, same random bf16 K/V and queries; FP8 pages are written by the quantising "
           "pkv_cache_write (scale 1.0) and read half the bytes. Error: max |fp8 - bf16| over the outputs.", "",
           "| Hq/Hkv/D | batch x ctx | bf16 us | fp8 us | bf16 / fp8 | fp8 GB/s | max abs err |",
           "|---|---|---|---|---|---|---|"]
    for r in fp8_rows:
        kv8 = kv_bytes(r["batch"], r["ctx"] + 1, int(r["heads"].split("/")[1]), int(r["heads"].split("/")[2]), 1)
        gbs = "n/a" if r.get("fp8") is None else f"{kv8 / r['fp8'] / 1e9:.0f}"
        err = "n/a" if r.get("err") is None else f"{r['err']:.3g}"
        md.append(f"| {r['heads']} | {r['batch']} x {r['ctx']} | {fmt_us(r.get('bf16'))} | {fmt_us(r.get('fp8'))} | "
                  f"{fmt_ratio(r.get('bf16'), r.get('fp8'))} | {gbs} | {err} |" + (f" {r['note']}" if r.get("note") else ""))
    md += ["", "## Write, block copy, swap vs bandwidth floors", "",
           "Floor = bytes / calibrated bandwidth (copy BW for device moves, pinned host BW for swap); "
           "efficiency = floor / time.", "",
           "| op | Hq/Hkv/D | MiB moved | us | floor us | efficiency |", "|---|---|---|---|---|---|"]
    for r in move_rows:
        bw = {"write": copy_bw, "copy": copy_bw, "swap out": max(cal0["d2h"], cal1["d2h"]),
              "swap in": max(cal0["h2d"], cal1["h2d"])}[r["op"]]
        floor = r["bytes"] / bw
        md.append(f"| {r['op']} | {r['heads']} | {r['bytes'] / 2**20:.0f} | {r['time'] * 1e6:.0f} | "
                  f"{floor * 1e6:.0f} | {100 * floor / r['time']:.0f}% |")
    text = "\n".join(md) + "\n"
    print(text)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results",
                                   device_slug(name) + ".md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print(f"wrote {out}")


def bench_cell(torch, F, lib, dev, stream, timeit, best_sdpa, row, hq, hkv, d, batch, ctx, prefill_rows,
               move_rows, cal, flex_attention, create_block_mask, PagedAttention, flex_deadline, args):
    bf16 = torch.bfloat16
    pages_per_seq = (ctx + 1 + PAGE - 1) // PAGE
    used = batch * pages_per_seq
    big = (batch, ctx) == (64, 4096)  # the cell that also measures copy and swap
    spare = min(used // 2, 4096) if big else 0
    pool = lib.pool(block_size=PAGE, num_blocks=used + spare + 2, num_kv_heads=hkv, head_dim=d,
                    dtype=PKV_DTYPE_BF16, device_type=PKV_DEVICE_CUDA)
    try:
        ids = lib.seqs(pool, batch, ctx)
        # Prefill the cache through the library (timed as the bulk write).
        n = batch * ctx
        k = torch.randn(n, hkv, d, device=dev, dtype=bf16)
        v = torch.randn(n, hkv, d, device=dev, dtype=bf16)
        kt = lib.tensor(k.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [n, hkv, d])
        vt = lib.tensor(v.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [n, hkv, d])
        b = lib.prepare(pool, ids, [ctx] * batch, stream)
        t_write = timeit(lambda: lib.ok(lib.c.pkv_cache_write(b, 0, C.byref(kt), C.byref(vt), C.c_void_p(stream)),
                                        "pkv_cache_write"), reps=5)
        if not row["latency_only"]:
            move_rows.append(dict(op="write", heads=row["heads"], bytes=2 * 2 * n * hkv * d * 2, time=t_write))
        if batch * ctx <= 32768:  # paged prefill vs contiguous causal SDPA
            q = torch.randn(n, hq, d, device=dev, dtype=bf16)
            o = torch.empty_like(q)
            qt = lib.tensor(q.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [n, hq, d])
            ot = lib.tensor(o.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [n, hq, d])
            ours = timeit(lambda: lib.ok(lib.c.pkv_attention_forward(b, 0, C.byref(qt), C.byref(ot), None, None,
                                                                     C.c_void_p(stream)), "attention"), reps=5)
            qc = q.view(batch, ctx, hq, d).transpose(1, 2)
            kc = k.view(batch, ctx, hkv, d).transpose(1, 2).contiguous()
            vc = v.view(batch, ctx, hkv, d).transpose(1, 2).contiguous()
            sd, sb = best_sdpa(qc, kc, vc, True, hq != hkv)
            # Our output against SDPA's on the same inputs (every element).
            o.fill_(float("nan"))
            lib.ok(lib.c.pkv_attention_forward(b, 0, C.byref(qt), C.byref(ot), None, None, C.c_void_p(stream)),
                   "attention")
            ref = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True, enable_gqa=hq != hkv)
            mine = o.view(batch, ctx, hq, d).transpose(1, 2)
            err = (mine.float() - ref.float()).abs().max().item()
            prefill_rows.append(dict(heads=row["heads"], batch=batch, ctx=ctx, ours=ours, sdpa=sd, sdpa_backend=sb,
                                     err=err))
            del ref, mine
            del q, o, qc, kc, vc
        lib.c.pkv_batch_destroy(b)
        # Contiguous copy of the same keys for SDPA / Flex, with the new token.
        kc = torch.empty(batch, hkv, ctx + 1, d, device=dev, dtype=bf16)
        vc = torch.empty_like(kc)
        kc[:, :, :ctx] = k.view(batch, ctx, hkv, d).transpose(1, 2)
        vc[:, :, :ctx] = v.view(batch, ctx, hkv, d).transpose(1, 2)
        del k, v

        # Decode step: one new token per sequence.
        lib.append_all(pool, ids, 1)
        b = lib.prepare(pool, ids, [1] * batch, stream)
        k1 = torch.randn(batch, hkv, d, device=dev, dtype=bf16)
        v1 = torch.randn(batch, hkv, d, device=dev, dtype=bf16)
        kc[:, :, ctx] = k1
        vc[:, :, ctx] = v1
        k1t = lib.tensor(k1.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [batch, hkv, d])
        v1t = lib.tensor(v1.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [batch, hkv, d])
        lib.ok(lib.c.pkv_cache_write(b, 0, C.byref(k1t), C.byref(v1t), C.c_void_p(stream)), "pkv_cache_write")
        q = torch.randn(batch, hq, d, device=dev, dtype=bf16)
        o = torch.empty_like(q)
        qt = lib.tensor(q.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [batch, hq, d])
        ot = lib.tensor(o.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [batch, hq, d])
        row["ours"] = timeit(lambda: lib.ok(lib.c.pkv_attention_forward(
            b, 0, C.byref(qt), C.byref(ot), None, None, C.c_void_p(stream)), "pkv_attention_forward"))
        # Correctness spot check against SDPA on the contiguous copy.
        ref = F.scaled_dot_product_attention(q.view(batch, hq, 1, d), kc, vc, enable_gqa=hq != hkv)
        err = (o.float() - ref.view(batch, hq, d).float()).abs().max().item()
        if not err < 2e-2:
            row["note"] = f"(max |ours - SDPA| = {err:.3g})"
        row["sdpa"], row["sdpa_backend"] = best_sdpa(q.view(batch, hq, 1, d), kc, vc, False, hq != hkv)
        lib.c.pkv_batch_destroy(b)

        if flex_attention is not None and time.time() < flex_deadline:
            try:
                row["flex"] = flex_paged(torch, dev, timeit, flex_attention, create_block_mask, PagedAttention,
                                         q, kc, vc, batch, hq, hkv, d, ctx + 1)
            except Exception as e:  # noqa: BLE001  (reported, the cell goes on)
                print(f"  flex paged failed: {str(e)[:200]}", flush=True)
        elif flex_attention is not None:
            row["note"] = (row.get("note", "") + " (flex: compile budget spent)").strip()
        del kc, vc

        if big:  # block copy and swap, half the used blocks
            table = [blk for i in range(batch) for blk in lib.block_table(pool, ids[i])]
            free = sorted(set(range(1, used + spare + 2)) - set(table))[:spare]
            src = (C.c_int32 * len(free))(*table[:len(free)])
            dst = (C.c_int32 * len(free))(*free)
            bpb = C.c_uint64()
            lib.ok(lib.c.pkv_pool_bytes_per_block(pool, C.byref(bpb)), "bytes_per_block")
            nbytes = len(free) * bpb.value
            t = timeit(lambda: lib.ok(lib.c.pkv_pool_copy_blocks(pool, src, dst, len(free), C.c_void_p(stream)),
                                      "copy_blocks"), reps=5)
            move_rows.append(dict(op="copy", heads=row["heads"], bytes=2 * nbytes, time=t))
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            for op, direction in (("swap out", PKV_SWAP_OUT), ("swap in", PKV_SWAP_IN)):
                t = timeit(lambda: lib.ok(lib.c.pkv_pool_swap_blocks(
                    pool, dst, len(free), C.c_void_p(host.data_ptr()), nbytes, direction, C.c_void_p(stream)),
                    "swap_blocks"), reps=3, flush=False)
                move_rows.append(dict(op=op, heads=row["heads"], bytes=nbytes, time=t))
            del host
    finally:
        lib.c.pkv_pool_destroy(pool)


def bench_fp8_cell(torch, lib, dev, stream, timeit, row, hq, hkv, d, batch, ctx):
    """Decode (one token per sequence over ctx cached keys) on a bf16 pool and an FP8 E4M3 pool."""
    bf16 = torch.bfloat16
    n = batch * ctx
    k = torch.randn(n, hkv, d, device=dev, dtype=bf16)
    v = torch.randn(n, hkv, d, device=dev, dtype=bf16)
    k1 = torch.randn(batch, hkv, d, device=dev, dtype=bf16)
    v1 = torch.randn(batch, hkv, d, device=dev, dtype=bf16)
    q = torch.randn(batch, hq, d, device=dev, dtype=bf16)
    outs = {}
    for name, dtype in (("bf16", PKV_DTYPE_BF16), ("fp8", PKV_DTYPE_FP8_E4M3)):
        pages = (ctx + 1 + PAGE - 1) // PAGE
        pool = lib.pool(block_size=PAGE, num_blocks=batch * pages + 2, num_kv_heads=hkv, head_dim=d,
                        dtype=dtype, device_type=PKV_DEVICE_CUDA)
        try:
            ids = lib.seqs(pool, batch, ctx)
            kt = lib.tensor(k.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [n, hkv, d])
            vt = lib.tensor(v.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [n, hkv, d])
            b = lib.prepare(pool, ids, [ctx] * batch, stream)
            lib.ok(lib.c.pkv_cache_write(b, 0, C.byref(kt), C.byref(vt), C.c_void_p(stream)), "pkv_cache_write")
            lib.c.pkv_batch_destroy(b)
            lib.append_all(pool, ids, 1)
            b = lib.prepare(pool, ids, [1] * batch, stream)
            k1t = lib.tensor(k1.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [batch, hkv, d])
            v1t = lib.tensor(v1.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [batch, hkv, d])
            lib.ok(lib.c.pkv_cache_write(b, 0, C.byref(k1t), C.byref(v1t), C.c_void_p(stream)), "pkv_cache_write")
            o = torch.empty_like(q)
            qt = lib.tensor(q.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [batch, hq, d])
            ot = lib.tensor(o.data_ptr(), PKV_DTYPE_BF16, PKV_DEVICE_CUDA, [batch, hq, d])
            row[name] = timeit(lambda: lib.ok(lib.c.pkv_attention_forward(
                b, 0, C.byref(qt), C.byref(ot), None, None, C.c_void_p(stream)), "pkv_attention_forward"))
            outs[name] = o
            lib.c.pkv_batch_destroy(b)
        finally:
            lib.c.pkv_pool_destroy(pool)
    row["err"] = (outs["fp8"].float() - outs["bf16"].float()).abs().max().item()


def flex_paged(torch, dev, timeit, flex_attention, create_block_mask, PagedAttention, q, kc, vc, batch, hq, hkv,
               d, length):
    """torch's FlexAttention PagedAttention over a shuffled physical cache."""
    n_pages = batch * ((length + PAGE - 1) // PAGE)
    pa = PagedAttention(n_pages, PAGE, batch, device=dev)
    for bi in range(batch):
        pa.reserve(torch.tensor(bi, device=dev), torch.tensor(length, device=dev))
    k_cache = torch.zeros(1, hkv, n_pages * PAGE, d, device=dev, dtype=kc.dtype)
    v_cache = torch.zeros_like(k_cache)
    pos = torch.arange(length, device=dev).unsqueeze(0).expand(batch, -1)
    pa.assign(torch.arange(batch, device=dev), pos, kc, vc, k_cache, v_cache)
    mask = create_block_mask(lambda b, h, qi, kv: kv >= 0, batch, None, 1, length, device=dev,
                             BLOCK_SIZE=(128, PAGE))
    paged_mask = pa.convert_logical_block_mask(mask)
    qf = q.view(batch, hq, 1, d)
    fn = lambda: flex_attention(qf, k_cache, v_cache, block_mask=paged_mask, enable_gqa=hq != hkv)
    ref = torch.nn.functional.scaled_dot_product_attention(qf, kc, vc, enable_gqa=hq != hkv)
    err = (fn().float() - ref.float()).abs().max().item()
    if not err < 2e-2:
        print(f"  flex paged differs from SDPA by {err:.3g}", flush=True)
    return timeit(fn)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("PAGEDKV_LIB", "build/capi/libpagedkv.so"))
    ap.add_argument("--out", default=None, help="markdown output (default bench/results/<device>.md)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--time-budget", type=float, default=240, help="seconds; later cells are skipped")
    ap.add_argument("--flex-budget", type=float, default=150, help="seconds of FlexAttention compiles")
    ap.add_argument("--heads", default="", help="comma-separated Hq/Hkv/D subset of the sweep (default: all)")
    ap.add_argument("--cells", default="", help="comma-separated BATCHxCTX subset of the sweep (default: all)")
    ap.add_argument("--skip-flex", action="store_true", help="no FlexAttention baseline (saves its compiles)")
    ap.add_argument("--skip-fp8", action="store_true", help="no FP8 decode section")
    ap.add_argument("--selftest", action="store_true", help="no GPU: check the ctypes layer on a CPU pool")
    args = ap.parse_args()
    if args.selftest:
        selftest(args.lib)
        return
    run(args)


if __name__ == "__main__":
    main()
