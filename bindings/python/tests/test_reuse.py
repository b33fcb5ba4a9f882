"""Partial-block prefix hits and retention priorities (issue 22)."""

import pytest

import pagedkv


def computed(pool, s, n):
    with pool.prepare([s], n):
        pass  # a manager-only step committed when the block ends normally


def test_partial_hit_copies_first_tokens_of_a_cached_block():
    with pagedkv.Pool(num_blocks=8, block_size=4, enable_partial_reuse=True) as pool:
        assert pool.options.enable_partial_reuse
        a = pool.create_sequence()
        a.append(list(range(10)))
        computed(pool, a, 10)
        b = pool.create_sequence()
        m = b.match_prefix_partial([0, 1, 2, 3, 4, 5, 6, 42])
        assert isinstance(m, pagedkv.PrefixMatch)
        assert (m.num_cached, m.partial_tokens) == (7, 3)
        assert m.copy_src == a.block_table()[1]
        assert b.block_table() == [a.block_table()[0], m.copy_dst]
        assert b.info().num_computed_tokens == 7
        st = pool.stats()
        assert (st.num_partial_hits, st.partial_hit_tokens, st.prefix_hit_tokens) == (1, 3, 7)
        pool.validate()


def test_partial_reuse_is_off_by_default(manager_pool):
    a = manager_pool.create_sequence()
    a.append(list(range(10)))
    computed(manager_pool, a, 10)
    m = manager_pool.create_sequence().match_prefix_partial([0, 1, 2, 3, 4, 5, 6, 42])
    assert (m.num_cached, m.partial_tokens, m.copy_src) == (4, 0, pagedkv.NULL_BLOCK)


def test_retention_priorities_pins_and_clock():
    with pagedkv.Pool(
        num_blocks=8, block_size=4, enable_retention=True, max_pinned_blocks=1, enable_events=True
    ) as pool:
        pool.set_clock(1_000)
        a = pool.create_sequence()
        a.set_retention(
            [
                pagedkv.RetentionRange(0, 4, pagedkv.PRIORITY_PINNED),
                pagedkv.RetentionRange(4, None, 70, duration_ns=500),
            ]
        )
        a.append(list(range(9)))
        computed(pool, a, 9)
        counts = pool.priority_counts()
        assert len(counts) == 101 and counts[pagedkv.PRIORITY_PINNED] == 1 and counts[70] == 1
        a.free()
        assert pool.stats().num_pinned_blocks == 1
        assert pool.stats().num_free_blocks == 6  # the pinned block is never handed out
        list(pool.events())
        pool.set_clock(1_500)
        assert pool.priority_counts()[70] == 0
        (ev,) = list(pool.events())
        assert ev.type == pagedkv.EventType.BLOCK_PRIORITY and ev.num_tokens == pagedkv.PRIORITY_DEFAULT
        b = pool.create_sequence()
        b.append(list(range(50, 55)))
        computed(pool, b, 5)
        with pytest.raises(pagedkv.OutOfBlocksError, match="max_pinned_blocks"):
            b.set_retention([(0, 4, 100, 0)])
        with pytest.raises(pagedkv.InvalidArgumentError, match=r"ranges\[0\].priority"):
            b.set_retention([(0, 4, 101, 0)])
        with pytest.raises(TypeError):
            b.set_retention([(0, 4)])
        pool.validate()


def test_retention_needs_the_pool_option(manager_pool):
    s = manager_pool.create_sequence()
    with pytest.raises(pagedkv.InvalidStateError, match="enable_retention"):
        s.set_retention([pagedkv.RetentionRange(0, 8, 90)])
    assert manager_pool.priority_counts()[pagedkv.PRIORITY_DEFAULT] == 0
