"""Issue 14: sequence ids name their pool; salts, LoRA names and multimodal
item hashes in vLLM's key encoding versus strict_key_domains."""

import pytest

import pagedkv
from pagedkv import _pagedkv as _c


def test_another_pools_id_is_not_found():
    a = pagedkv.Pool(num_blocks=16, block_size=4)
    b = pagedkv.Pool(num_blocks=16, block_size=4)
    sa = a.create_sequence()
    sb = b.create_sequence()
    assert sa.id != sb.id
    sb.append([1, 2, 3])
    ptr = b._h.acquire()
    try:
        with pytest.raises(pagedkv.NotFoundError):
            _c.pkv_seq_free(ptr, sa.id)
        with pytest.raises(pagedkv.NotFoundError):
            _c.pkv_seq_append(ptr, sa.id, [1], 0)
    finally:
        b._h.release()
    assert sb.num_tokens == 3
    sa.free()
    a.validate()
    b.validate()


@pytest.mark.parametrize("strict", [False, True])
def test_strict_key_domains(strict):
    pool = pagedkv.Pool(num_blocks=16, block_size=4, strict_key_domains=strict)
    assert pool.options.strict_key_domains is strict
    prompt = list(range(100, 109))
    holder = pool.create_sequence(cache_salt="tenant-a-salt")
    holder.append(prompt[:8])
    with pool.prepare([holder], 8):  # its step ran: the blocks hold written K/V
        pass
    # vLLM's encoding: an adapter name reads like the salt in the first block
    # (the name keys every block, the salt only the first); strict: never.
    named = pool.create_sequence(lora_name="tenant-a-salt")
    assert named.match_prefix(prompt) == (0 if strict else 4)
    # Item keys are [hash, offset] pairs: no salt equals one in either mode.
    probe = pool.create_sequence(mm_items=[(0, 2, "tenant-a-salt")])
    assert probe.match_prefix(prompt) == 0
    assert pool.hash_prefix(prompt[:8], cache_salt="tenant-a-salt") == holder.block_hashes()
    assert (
        pagedkv.hash_prefix(prompt[:8], block_size=4, cache_salt="tenant-a-salt", strict_key_domains=strict)
        == holder.block_hashes()
    )


def test_strict_key_domains_is_checked():
    with pytest.raises(pagedkv.InvalidArgumentError, match="strict_key_domains"):
        _c.pkv_pool_create({"num_blocks": 8, "strict_key_domains": 3})  # past VLLM_TAGGED (2)
