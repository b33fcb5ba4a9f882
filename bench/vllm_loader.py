"""Loads vLLM V1's block-manager modules (BlockPool, kv_cache_utils) from a
directory the user points at, without importing the rest of vLLM: its
package __init__ files are skipped and every other vllm.* module the two
import is replaced by a stub whose attributes are inert placeholders.

    python3 -m pip download vllm --no-deps -d /tmp/vllm-wheel
    unzip -q /tmp/vllm-wheel/vllm-*.whl 'vllm/*' -d /tmp/vllm-src
    ... --vllm /tmp/vllm-src

Nothing of vLLM is part of this repository.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

# Modules executed from vLLM's own files; everything else under vllm is a stub.
REAL = {
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.utils.hashing",
    "vllm.utils.math_utils",
}


class _Meta(type):
    # Attributes of a stub class are placeholders too (enum members used as
    # defaults, class constants).
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _Placeholder(metaclass=_Meta):
    """Stands for any class, function or constant of a stubbed module."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Placeholder()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __class_getitem__(cls, item):
        return cls

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        # A fresh class per name: usable in annotations, unions, isinstance.
        cls = _Meta(name, (_Placeholder,), {})
        setattr(self, name, cls)
        return cls


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str, real: set) -> None:
        self.root = root
        self.real = real

    def find_spec(self, name, path=None, target=None):
        if name != "vllm" and not name.startswith("vllm."):
            return None
        rel = os.path.join(self.root, *name.split("."))
        if name in self.real:
            return importlib.util.spec_from_file_location(name, rel + ".py")
        if os.path.isdir(rel):  # a package: its __init__ is skipped
            spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
            spec.submodule_search_locations = [rel]
            return spec
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        mod = StubModule(spec.name)
        if spec.submodule_search_locations is not None:
            mod.__path__ = list(spec.submodule_search_locations)
        return mod

    def exec_module(self, module):
        pass


def install(root: str, real: set) -> None:
    """From now on, `import vllm.X` executes root/vllm/X.py for the modules
    in real and gives a stub for every other vllm module."""
    sys.meta_path.insert(0, _Finder(root, real))


def load(root: str):
    """(block_pool module, kv_cache_utils module) of the vLLM copy at root."""
    if not os.path.isfile(os.path.join(root, "vllm", "v1", "core", "block_pool.py")):
        raise SystemExit(
            f"{root}: no vllm/v1/core/block_pool.py (unzip vLLM's wheel there)"
        )
    install(root, REAL)
    import vllm.v1.core.block_pool as bp  # noqa: E402
    import vllm.v1.core.kv_cache_utils as kcu  # noqa: E402

    return bp, kcu
