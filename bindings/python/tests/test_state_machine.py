"""Random operation sequences against a simple Python model of the pool.

The model keeps each live sequence's tokens and which of them are known to
be in the prefix cache; after every step the pool must agree with it (token
counts, table sizes, hashes, free block counts) and pass validate().
"""

import os

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, precondition, rule

import pagedkv

BLOCK = 4
NUM_BLOCKS = 14
VOCAB = st.integers(0, 3)  # a tiny vocabulary makes prefix hits common
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
            if s in self.reset_dirty:
                continue
            n = 0
            limit = min(len(toks), len(prompt)) // BLOCK
            while n < limit and toks[n * BLOCK : (n + 1) * BLOCK] == prompt[n * BLOCK : (n + 1) * BLOCK]:
                n += 1
            best = max(best, n)
        return min(best * BLOCK, (len(prompt) - 1) // BLOCK * BLOCK)

    # ------------------------------------------------------------ rules

    @rule(target=seqs, prompt=TOKENS, salt=st.sampled_from([None, None, "s"]))
    def create(self, prompt, salt):
        s = self.pool.create_sequence(cache_salt=salt)
        free_before = self.pool.stats().num_free_blocks
        bound = self.cached_prefix_lower_bound(prompt) if salt is None else 0
        cached = s.match_prefix(prompt)
        assert cached % BLOCK == 0 and cached <= len(prompt) - 1
        assert cached >= bound, (cached, bound)
        assert s.num_tokens == cached and len(s.block_table()) == cached // BLOCK
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
        s.append(new, lookahead)
        after = self.pool.stats()
        assert before.num_free_blocks - after.num_free_blocks == needed
        self.tokens[s].extend(new)
        assert s.info().num_slots >= len(self.tokens[s]) + lookahead

    @rule(target=seqs, s=seqs)
    def fork(self, s):
        if s not in self.tokens:
            return s
        child = s.fork()
        assert child.block_table() == s.block_table()
        self.tokens[child] = list(self.tokens[s])
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
        counts = [data.draw(st.integers(1, len(self.tokens[s]))) for s in chosen]
        with self.pool.prepare(chosen, counts) as b:
            assert b.num_tokens == sum(counts)
            lens = b.plan(pagedkv.PlanArray.CONTEXT_LENS).numpy().tolist()
            assert lens == [len(self.tokens[s]) for s in chosen]

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


PoolMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PAGEDKV_HYPOTHESIS_EXAMPLES", "60")), stateful_step_count=25
)
test_pool_state_machine = PoolMachine.TestCase
