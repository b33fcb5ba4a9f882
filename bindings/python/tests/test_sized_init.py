"""Versioned structs: the binding initialises every struct it hands the library
with pkv_X_init_sized and its own sizeof (docs/conventions.md, "Versioned
structs"), never with the plain pkv_X_init, which stops at the size the
library froze."""

import pathlib
import re

import pytest

import pagedkv
from pagedkv import _pagedkv as raw

STRUCTS = [
    "pkv_pool_options",
    "pkv_seq_options",
    "pkv_hash_options",
    "pkv_attention_params",
    "pkv_batch_info",
    "pkv_pool_stats",
    "pkv_seq_info",
    "pkv_prefix_match",
    "pkv_event_publisher_options",
    "pkv_event_publisher_stats",
    "pkv_kv_group_spec",
    "pkv_group_stats",
    "pkv_tier_options",
    "pkv_tier_match",
    "pkv_tier_stats",
    "pkv_transfer_options",
]

SWIG = pathlib.Path(__file__).resolve().parent.parent / "swig" / "pagedkv.i"


def test_the_interface_calls_only_sized_inits():
    text = re.sub(r"/\*.*?\*/", "", SWIG.read_text(), flags=re.S)  # comments aside
    plain = sorted(set(re.findall(r"\b(pkv_\w+_init)\s*[(,]", text)) - {"pkv_tensor_init"})
    assert plain == [], f"plain _init calls stop at the frozen size: {plain}"
    for name in STRUCTS:
        assert re.search(rf"\b{name}_init_sized\s*[(,]", text), f"{name} never gets its sized init"
    # Every sized call passes this module's sizeof.
    for call in re.findall(r"\bpkv_\w+_init_sized\((.*?)\)[;)]", text):
        assert "sizeof" in call, call


@pytest.mark.parametrize("name", STRUCTS)
def test_raw_sized_init_writes_the_module_s_struct(name):
    s = getattr(raw, name)()
    s.struct_size = 0
    assert getattr(raw, name + "_init_sized")(s) is None
    # At least what the plain _init writes (its frozen size).
    plain = getattr(raw, name)()
    init = getattr(raw, name + "_init")
    if name in ("pkv_prefix_match", "pkv_tier_match"):
        plain = init()  # a result struct: the typemap allocates it
    else:
        init(plain)
    assert s.struct_size >= plain.struct_size > 0
    with pytest.raises(pagedkv.InvalidArgumentError, match="NULL"):
        getattr(raw, name + "_init_sized")(None)
    with pytest.raises(TypeError):
        getattr(raw, name + "_init_sized")(object())


def test_raw_sized_init_sets_the_library_defaults():
    o = raw.pkv_pool_options()
    raw.pkv_pool_options_init_sized(o)
    assert (o.block_size, o.enable_prefix_caching, o.max_events) == (16, 1, 65536)
    assert o.hash_algo == raw.PKV_HASH_SHA256_CBOR and o.dtype == raw.PKV_DTYPE_BF16
    t = raw.pkv_transfer_options()
    raw.pkv_transfer_options_init_sized(t)
    assert t.timeout_ms == 30000
    g = raw.pkv_kv_group_spec()
    raw.pkv_kv_group_spec_init_sized(g)
    assert (g.kind, g.num_layers, g.dtype) == (raw.PKV_GROUP_FULL, 1, raw.PKV_DTYPE_BF16)


def test_result_structs_come_back_at_the_module_s_size(manager_pool):
    st = raw.pkv_pool_stats()
    raw.pkv_pool_stats_init_sized(st)
    got = manager_pool._call(raw.pkv_pool_get_stats)
    assert got.struct_size == st.struct_size
    assert got.num_blocks == 16
    o = raw.pkv_pool_options()
    raw.pkv_pool_options_init_sized(o)
    assert manager_pool._call(raw.pkv_pool_get_options).struct_size == o.struct_size
