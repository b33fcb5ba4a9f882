"""The opt-in of the vLLM differential tests (test_vllm_differential*.py):
the module calling require_vllm() at import is skipped unless PKV_VLLM_SRC
names a directory holding vLLM's Python files (see
test_vllm_differential.py's docstring) and the packages its block-manager
modules import are installed."""

from __future__ import annotations

import os

import pytest


def require_vllm(see: str = "test_vllm_differential.py") -> str:
    """PKV_VLLM_SRC, or a module-level skip saying what is missing."""
    src = os.environ.get("PKV_VLLM_SRC")
    if not src:
        pytest.skip(f"PKV_VLLM_SRC is not set (see {see})", allow_module_level=True)
    if not os.path.isfile(os.path.join(src, "vllm", "v1", "core", "kv_cache_manager.py")):
        pytest.skip(f"{src}: no vllm/v1/core/kv_cache_manager.py", allow_module_level=True)
    for mod in ("torch", "cbor2", "xxhash", "msgspec", "zmq"):
        pytest.importorskip(mod)
    return src
