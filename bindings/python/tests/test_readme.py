"""The Python snippets users copy from bindings/python/README.md, run as written.

Each block is taken from the README at test time (the first ```python block
after a heading), so a renamed call, a changed signature or a claim the code
does not keep fails here. Only what a reader supplies is added: the engine's
own variables for the "Engine loops" block.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pagedkv

README = Path(__file__).resolve().parents[1] / "README.md"


def snippet(after_heading: str | None = None) -> str:
    text = README.read_text()
    if after_heading is not None:
        at = text.find("\n" + after_heading + "\n")
        assert at >= 0, f"README.md has no heading {after_heading!r}"
        text = text[at:]
    m = re.search(r"^```python\n(.*?)^```$", text, re.S | re.M)
    assert m, f"no ```python block after {after_heading!r}"
    return m.group(1)


def run(code: str, **namespace):
    ns = dict(namespace)
    exec(compile(code, str(README), "exec"), ns)
    return ns


def test_quick_start(monkeypatch):
    pytest.importorskip("ml_dtypes")
    ns: dict = {}
    computed = []
    exit_pool = pagedkv.Pool.__exit__

    def record_then_exit(self, *args):
        # The block's `with Pool(...)` closes the pool: read its sequence first.
        computed.append(ns["seq"].num_computed_tokens)
        return exit_pool(self, *args)

    monkeypatch.setattr(pagedkv.Pool, "__exit__", record_then_exit)
    exec(compile(snippet(), str(README), "exec"), ns)
    # "every layer was written: the step is committed, its tokens count as computed"
    assert computed == [100]
    assert ns["out"].shape == (100, 8, 64)
    assert np.isfinite(ns["out"].astype(np.float32)).all()


def test_engine_loops():
    pool = pagedkv.Pool(num_blocks=256, block_size=16, num_layers=0)  # manager only
    running = [pool.create_sequence() for _ in range(3)]
    for i, s in enumerate(running):
        s.append(list(range(100 * i, 100 * i + 40)))
    with pool.prepare(running, [40, 40, 40]):
        pass
    ns = run(
        snippet("## Engine loops: batched calls, token buffers, lookups by hash"),
        pool=pool,
        running=running,
        sampled=np.array([5, 6, 7], dtype=np.int32),
        finished=[running[2]],
        prompt=list(range(1000, 1050)),
        salt="tenant-a",
        max_tokens=16,
    )
    # append_batch, then prepare_decode: two decode tokens each, committed by
    # the manager-only pool's `with` blocks.
    assert [s.num_computed_tokens for s in running[:2]] == [42, 42]
    assert ns["cached"] == 0 and ns["seq"].info().num_tokens == 50
    pool.close()


def test_hybrid_models():
    ns = run(snippet("## Hybrid models: several KV groups in one pool"))
    window_table, full_table = ns["window_table"], ns["full_table"]
    assert len(window_table) == len(full_table) == 63  # ceil(1000 / 16)
    ns["pool"].close()
