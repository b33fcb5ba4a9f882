"""Random operation sequences against a simple Python model of the pool.

The model keeps each live sequence's tokens and which of them are known to
be in the prefix cache; after every step the pool must agree with it (token
counts, table sizes, hashes, free block counts) and pass validate().

It also tracks, per storage slot, what this test wrote there: a step the
test committed writes its query tokens' K/V (identified by the sequence's
salt and token prefix up to that position); appending a token into a slot,
or a block newly taken from the free queue, leaves it unwritten until a
committed step covers it. The library may never attach, hit or plan over a
slot the model says holds nothing or another prefix's K/V.
"""

import os

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, precondition, rule

import pagedkv

BLOCK = 4
NUM_BLOCKS = 14
VOCAB = st.integers(0, 1)  # a tiny vocabulary makes prefix hits (and same-step lookups) common
TOKENS = st.lists(VOCAB, min_size=1, max_size=11)


class PoolMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(algo=st.sampled_from(["sha256_cbor", "xxh3_128"]))
    def make_pool(self, algo):
        self.pool = pagedkv.Pool(num_blocks=NUM_BLOCKS, block_size=BLOCK, hash_algo=algo, enable_events=True)
        self.tokens = {}  # Sequence -> list of tokens (the model)
        self.freed = []
        # Sequences whose blocks may have lost their cached hashes (a reset
        # since they filled them) or that use a salt: no hash expectations.
        self.reset_dirty = set()
        self.salt = {}  # Sequence -> salt
        self.slots = {}  # (block, offset) -> (salt, token prefix) written there by a committed step

    def teardown(self):
        if hasattr(self, "pool"):
            self.pool.close()

    # ------------------------------------------------------------ helpers

    def blocks_in_use(self):
        used = set()
        for s in self.tokens:
            used.update(b for b in s.block_table() if b != pagedkv.NULL_BLOCK)
        return used

    def cached_prefix_lower_bound(self, prompt):
        """Full blocks of prompt that a live sequence's table certainly holds
        with its hash cached (no reset since they were filled)."""
        best = 0
        for s, toks in self.tokens.items():
            if s in self.reset_dirty or self.salt[s] is not None:
                continue
            n = 0
            limit = min(len(toks), len(prompt), self.model_computed(s)) // BLOCK
            while n < limit and toks[n * BLOCK : (n + 1) * BLOCK] == prompt[n * BLOCK : (n + 1) * BLOCK]:
                n += 1
            best = max(best, n)
        return min(best * BLOCK, (len(prompt) - 1) // BLOCK * BLOCK)

    def key(self, s, toks, p):
        return (self.salt[s], tuple(toks[: p + 1]))

    def readable(self, s, toks, table, p):
        """Position p of s holds K/V this test wrote for exactly that prefix
        (window-free pool: no null blocks)."""
        return self.slots.get((table[p // BLOCK], p % BLOCK)) == self.key(s, toks, p)

    def model_computed(self, s):
        toks, table = self.tokens[s], s.block_table()
        n = 0
        while n < len(toks) and self.readable(s, toks, table, n):
            n += 1
        return n

    # ------------------------------------------------------------ rules

    @rule(target=seqs, prompt=TOKENS, salt=st.sampled_from([None, None, "s"]))
    def create(self, prompt, salt):
        return self.admit(prompt, salt)

    @rule(target=seqs, other=seqs, extra=VOCAB)
    def create_like(self, other, extra):
        """A request with another live request's tokens (the same system
        prompt admitted in the same step, before either was computed)."""
        if other not in self.tokens:
            return other
        return self.admit(self.tokens[other] + [extra], self.salt[other])

    def admit(self, prompt, salt):
        s = self.pool.create_sequence(cache_salt=salt)
        free_before = self.pool.stats().num_free_blocks
        bound = self.cached_prefix_lower_bound(prompt) if salt is None else 0
        cached = s.match_prefix(prompt)
        assert cached % BLOCK == 0 and cached <= len(prompt) - 1
        assert cached >= bound, (cached, bound)
        assert s.num_tokens == cached and len(s.block_table()) == cached // BLOCK
        self.salt[s] = salt
        table = s.block_table()
        for p in range(cached):  # never a block this test did not write for this prefix
            assert self.readable(s, prompt, table, p), ("hit on unwritten slot", p, table)
        if salt is None:
            assert s.block_hashes() == self.pool.hash_prefix(prompt[:cached])
        # Hits never allocate; they may take cached blocks out of the queue.
        assert self.pool.stats().num_free_blocks <= free_before
        self.tokens[s] = list(prompt[:cached])
        if salt is not None:
            self.reset_dirty = self.reset_dirty | {s}  # salted: not comparable
        return s

    @rule(s=seqs, new=TOKENS, lookahead=st.integers(0, 3))
    def append(self, s, new, lookahead):
        if s not in self.tokens:
            return
        needed = s.blocks_needed(len(new), lookahead)
        before = self.pool.stats()
        table_before = s.block_table()
        if needed > before.num_free_blocks:
            try:
                s.append(new, lookahead)
            except pagedkv.OutOfBlocksError:
                pass
            else:
                raise AssertionError("append beyond the free blocks succeeded")
            assert self.pool.stats() == before and s.block_table() == table_before
            return
        in_use = self.blocks_in_use()
        s.append(new, lookahead)
        after = self.pool.stats()
        assert before.num_free_blocks - after.num_free_blocks == needed
        n0 = len(self.tokens[s])
        table = s.block_table()
        for j, b in enumerate(table):
            if j < len(table_before) and table_before[j] == b:
                continue
            # A copy (copy-on-write) carries our earlier tokens' K/V; any
            # other slot of a block new to us holds nothing we wrote.
            old = table_before[j] if j < len(table_before) else None
            for o in range(BLOCK):
                got = self.slots.get((old, o)) if old is not None and j * BLOCK + o < n0 else None
                if got is not None:
                    self.slots[(b, o)] = got
                else:
                    self.slots.pop((b, o), None)
            assert old is not None or b not in in_use, ("new block was in use", b)
        for p in range(n0, n0 + len(new)):  # slots receiving new tokens: unwritten
            self.slots.pop((table[p // BLOCK], p % BLOCK), None)
        self.tokens[s].extend(new)
        assert s.info().num_slots >= len(self.tokens[s]) + lookahead

    @rule(target=seqs, s=seqs)
    def fork(self, s):
        if s not in self.tokens:
            return s
        child = s.fork()
        assert child.block_table() == s.block_table()
        self.tokens[child] = list(self.tokens[s])
        self.salt[child] = self.salt[s]
        if s in self.reset_dirty:
            self.reset_dirty = self.reset_dirty | {child}
        return child

    @rule(s=seqs, data=st.data())
    def truncate(self, s, data):
        if s not in self.tokens:
            return
        n = data.draw(st.integers(0, len(self.tokens[s]) + 1))
        if n > len(self.tokens[s]):
            try:
                s.truncate(n)
            except pagedkv.InvalidArgumentError:
                return
            raise AssertionError("truncate past the end succeeded")
        s.truncate(n)
        del self.tokens[s][n:]

    @rule(s=consumes(seqs))
    def free(self, s):
        if s in self.tokens:
            s.free()
            del self.tokens[s]
            self.reset_dirty = self.reset_dirty - {s}
            self.freed.append(s)
        s.free()  # idempotent

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def use_freed(self, data):
        s = data.draw(st.sampled_from(self.freed))
        try:
            self.pool._call(pagedkv._pagedkv.pkv_seq_get_info, s.id)
        except pagedkv.NotFoundError:
            return
        raise AssertionError("a freed id was found")

    @rule()
    def reset(self):
        self.pool.reset_prefix_cache()
        assert self.pool.stats().num_cached_blocks == 0
        self.reset_dirty = set(self.tokens)
        kinds = [e.type for e in self.pool.events()]
        assert kinds[-1] == pagedkv.EventType.ALL_CLEARED

    @rule(data=st.data())
    def step(self, data):
        live = [s for s, t in self.tokens.items() if t]
        if not live:
            return
        chosen = data.draw(st.lists(st.sampled_from(live), min_size=1, unique=True))
        counts = []
        for s in chosen:
            n = len(self.tokens[s])
            if data.draw(st.booleans()):  # what the engine would schedule
                counts.append(max(1, n - s.num_computed_tokens))
            else:
                counts.append(data.draw(st.integers(1, n)))
        # What the plan writes, then whether every context slot is readable.
        tables = {s: s.block_table() for s in chosen}
        writes = {}
        for s, q in zip(chosen, counts):
            toks = self.tokens[s]
            for p in range(len(toks) - q, len(toks)):
                writes[(tables[s][p // BLOCK], p % BLOCK)] = self.key(s, toks, p)
        ok = all(
            self.readable(s, self.tokens[s], tables[s], p)
            or writes.get((tables[s][p // BLOCK], p % BLOCK)) == self.key(s, self.tokens[s], p)
            for s, q in zip(chosen, counts)
            for p in range(len(self.tokens[s]) - q)
        )
        if not ok:
            try:
                self.pool.prepare(chosen, counts).close()
            except pagedkv.InvalidStateError as e:
                assert "would attend over tokens" in str(e)
                return
            raise AssertionError(("a plan over unwritten context was accepted", chosen, counts))
        fail = data.draw(st.booleans())

        class ModelRaised(Exception):
            pass

        try:
            with self.pool.prepare(chosen, counts) as b:
                assert b.num_tokens == sum(counts)
                lens = b.plan(pagedkv.PlanArray.CONTEXT_LENS).numpy().tolist()
                assert lens == [len(self.tokens[s]) for s in chosen]
                if fail:
                    raise ModelRaised()  # before the writes: aborted
        except ModelRaised:
            return
        self.slots.update(writes)  # committed when the block ended

    # ------------------------------------------------------------ invariants

    @invariant()
    def agrees_with_model(self):
        if not hasattr(self, "pool"):
            return
        self.pool.validate()
        st_ = self.pool.stats()
        assert st_.num_seqs == len(self.tokens)
        assert st_.num_tokens == sum(len(t) for t in self.tokens.values())
        used = self.blocks_in_use()
        assert st_.num_used_blocks == len(used)
        assert st_.num_free_blocks == NUM_BLOCKS - 1 - len(used)
        assert st_.num_cached_blocks <= NUM_BLOCKS - 1
        for s, toks in self.tokens.items():
            info = s.info()
            assert info.num_tokens == len(toks)
            assert info.num_blocks == len(s.block_table()) >= -(-len(toks) // BLOCK)
            if s not in self.reset_dirty:
                assert s.block_hashes() == self.pool.hash_prefix(toks)
            assert info.num_computed_tokens == self.model_computed(s), (info, self.model_computed(s))


PoolMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PAGEDKV_HYPOTHESIS_EXAMPLES", "60")), stateful_step_count=25
)
test_pool_state_machine = PoolMachine.TestCase
