"""A speculative-decoding and parallel-sampling engine on a CPU storage pool,
checked against a reference that never reads the library's bookkeeping.

The engine admits prompts (by tokens, by precomputed hashes, or create +
match_prefix + append; base model, LoRA adapters and salted tenants; with
and without lookahead), runs decode steps through ``prepare_decode`` (with
and without ``persistent_table=True``; Sequence lists, id arrays, int
lists) and through ``append_batch`` / ``append`` + ``prepare``, multi-token
query steps (a draft of k tokens appended and computed in one step, and
recomputed tokens), two live plans at once, rejects draft tokens by
``truncate`` after a committed, an aborted, a partly written or a
never-committed step, makes plans stale (truncate / free before the last
layer), forks for parallel sampling (between steps and between a plan and
its writes; children diverge, parents are freed first), frees and preempts
(re-admitting the same tokens later: prefix hits on blocks written by
earlier steps, also blocks written by decode and then truncated away),
swaps computed sequences out and back in, reuses emptied sequences for new
prompts (truncate to 0, match_prefix, append), calls ``reserve``, and misuses
the API (each refused with the documented error, changing nothing).

Every K/V the engine writes encodes the token prefix it belongs to (a hash of
the adapter, the salt and tokens[0..p], which also fixes the position p):
the reference knows exactly which K/V each slot of each sequence must hold.
After every operation it checks only what a user can observe: the bytes of
every slot the library counts as computed (``block_table()`` +
``kv_tensor`` views), lengths, ``num_computed_tokens`` (at least what the
reference committed: a fork sharing a full block its parent's step wrote
counts it too), cached tokens (multiples of the block size, at least what a
live sequence holds written; a hit's bytes are then checked as above),
block hashes against ``hash_prefix``, stats, the KV events as a router
would track them, every plan array (``token_positions`` and
``last_token_indices`` too), ``blocks_needed`` against the appends it
predicts, and the CPU attention output (and LSE) of every query against a
float64 reference over the K/V the reference says the context holds.

``PKV_REVIEW20_SOAK=N`` runs N more seeds per configuration (80 steps, up to
10 live sequences; opt-in soak). ``PKV_REVIEW20_COVERAGE=1`` prints what
each CI seed exercised (run pytest with -s).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import pagedkv
from conftest import np_dtype
from pagedkv import InvalidStateError, OutOfBlocksError

M64 = (1 << 64) - 1


def _mix(x):
    """splitmix64 of a uint64 numpy array."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(M64)
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(M64)
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(M64)
    return x ^ (x >> np.uint64(31))


def _next_key(prev, token):
    """The prefix key of tokens[0..p] from that of tokens[0..p-1]."""
    with np.errstate(over="ignore"):
        return int(_mix(np.array([(prev * 1000003 + token + 1) & M64], dtype=np.uint64))[0])


class Engine:
    def __init__(
        self, rng, *, dtype, block_size, num_layers, num_blocks, heads, head_dim, group, threads, max_prompt=0
    ):
        self.rng = rng
        self.dtype = dtype
        self.npdt = np_dtype(dtype)
        self.bs = block_size
        self.L = num_layers
        self.H = heads
        self.D = head_dim
        self.G = group  # query heads per KV head
        self.pool = pagedkv.Pool(
            num_blocks=num_blocks,
            block_size=block_size,
            num_layers=num_layers,
            num_kv_heads=heads,
            head_dim=head_dim,
            dtype=dtype,
            num_threads=threads,
            enable_events=True,
            max_events=1 << 16,
        )
        self.cached = {}  # block id -> hash, as the pool's events tell a router
        self.event_no = None
        self.kv = {}  # (key, layer) -> (k, v) float64 [H, D]
        self.live = []  # states
        self.preempted = []  # token lists to re-admit
        longest = max_prompt or 4 * block_size + 3
        self.prompts = [list(rng.integers(0, 6, size=int(rng.integers(1, longest)))) for _ in range(4)]
        self.persistent = []  # the persistent-table batch order
        self.steps = 0
        self.hits = 0
        self.checked_rows = 0
        self.log = []
        self.cov = {}
        self.history = []  # token lists whose blocks truncates released
        self.swapped = []  # (tokens, lora, salt, host buffer) of sequences swapped out

    # -- the reference's K/V ------------------------------------------------
    def kv_of(self, key, layer):
        got = self.kv.get((key, layer))
        if got is None:
            n = 2 * self.H * self.D
            idx = np.arange(n, dtype=np.uint64) + np.uint64(layer * 7919 * n)
            with np.errstate(over="ignore"):
                r = _mix(idx ^ np.uint64(key))
            vals = ((r % np.uint64(129)).astype(np.int64) - 64).astype(np.float64) / 16.0
            vals = vals.reshape(2, self.H, self.D)
            got = (vals[0], vals[1])
            self.kv[(key, layer)] = got
        return got

    @staticmethod
    def keys_of(tokens, start=None):
        keys = []
        prev = 0x1234 if start is None else start
        for t in tokens:
            prev = _next_key(prev, int(t))
            keys.append(prev)
        return keys

    # -- sequences ----------------------------------------------------------
    @staticmethod
    def root(lora, salt):
        """The key before the first token: the adapter and the salt change
        the K/V (an adapter does; a salt stands for a tenant whose blocks
        must never be served to another)."""
        return _next_key(_next_key(0x1234, lora), 0 if salt is None else 1 + int(salt[1:]))

    def new_state(self, seq, tokens, computed, lora=0, salt=None):
        st = {"seq": seq, "tokens": list(tokens), "c": computed, "lora": lora, "salt": salt, "cached": 0}
        st["keys"] = self.keys_of(tokens, self.root(lora, salt))
        self.live.append(st)
        return st

    def extend(self, st, toks):
        prev = st["keys"][-1] if st["keys"] else self.root(st["lora"], st["salt"])
        st["tokens"] += list(toks)
        for t in toks:
            prev = _next_key(prev, int(t))
            st["keys"].append(prev)

    def shared_at(self, st, pos):
        """Whether the block holding position pos of st is in another live table."""
        if pos >= len(st["tokens"]):
            return False
        b = st["seq"].block_table()[pos // self.bs]
        return any(b in o["seq"].block_table() for o in self.live if o is not st)

    def count(self, what):
        self.cov[what] = self.cov.get(what, 0) + 1

    def cut(self, st, n):
        if n % self.bs and self.shared_at(st, n):
            self.count("truncate into a shared block")
        if n < st["c"]:
            self.count("truncate computed tokens")
            self.history = [*self.history, (list(st["tokens"][: st["c"]]), st["lora"], st["salt"])][-8:]
        self.log.append(f"truncate {st['seq'].id} to {n}")
        del st["tokens"][n:]
        del st["keys"][n:]
        st["cached"] = min(st["cached"], n)
        st["c"] = min(st["c"], n)

    def written_floor(self, tokens, lora, salt):
        """Tokens a lookup of tokens must hit at least: the longest run of
        full blocks that a live sequence holds computed with the same tokens,
        capped so one token is left."""
        bs = self.bs
        best = 0
        for st in self.live:
            if (st["lora"], st["salt"]) != (lora, salt):
                continue
            n = min(st["c"], len(tokens) - 1) // bs * bs
            m = 0
            while m + bs <= n and st["tokens"][m : m + bs] == list(tokens[m : m + bs]):
                m += bs
            best = max(best, m)
        return best

    def admit(self, tokens, lora=0, salt=None):
        tokens = [int(t) for t in tokens]
        floor = self.written_floor(tokens, lora, salt)
        mode = int(self.rng.integers(3))
        la = int(self.rng.integers(0, 3)) if self.rng.integers(4) == 0 else 0
        free_before = self.pool.stats().num_free_blocks
        keys = {"lora_id": lora, "cache_salt": salt}
        try:
            if mode == 0:
                seq, cached = self.pool.admit(tokens, lookahead=la, **keys)
            elif mode == 1:
                seq, cached = self.pool.admit(
                    tokens, hashes=self.pool.hash_prefix(tokens, **keys), lookahead=la, **keys
                )
            else:
                seq = self.pool.create_sequence(**keys)
                cached = seq.match_prefix(tokens)
                try:
                    seq.append(tokens[cached:], la)
                except OutOfBlocksError:
                    seq.free()
                    raise
        except OutOfBlocksError:
            assert self.pool.stats().num_free_blocks == free_before
            return None
        assert cached % self.bs == 0 and cached <= len(tokens) - 1, (cached, len(tokens))
        assert cached >= floor, f"admission hit {cached} tokens, a live sequence holds {floor} written"
        self.hits += cached
        if cached:
            self.count("admission hits")
        self.log.append(f"admit mode {mode} {seq.id} {tokens} lora {lora} salt {salt} cached {cached}")
        st = self.new_state(seq, tokens, cached, lora, salt)
        st["cached"] = cached
        return st

    def free(self, st, preempt=False):
        self.log.append(f"free {st['seq'].id}")
        st["seq"].free()
        self.live.remove(st)
        if st in self.persistent:
            self.persistent.remove(st)
        if preempt:
            self.preempted.append((st["tokens"], st["lora"], st["salt"]))

    # -- checks -------------------------------------------------------------
    def drain(self, where):
        """A router's view of the prefix cache, from the pool's events."""
        for e in self.pool.events():
            if self.event_no is not None:
                assert e.seq_no == self.event_no + 1, f"{where}: event {e.seq_no} after {self.event_no}"
            self.event_no = e.seq_no
            if e.type == pagedkv.EventType.BLOCK_STORED:
                assert e.block_id not in self.cached, f"{where}: block {e.block_id} stored twice"
                assert e.num_tokens == self.bs
                self.cached[e.block_id] = e.block_hash
            elif e.type == pagedkv.EventType.BLOCK_REMOVED:
                assert self.cached.get(e.block_id) == e.block_hash, f"{where}: block {e.block_id} removed, not stored"
                del self.cached[e.block_id]
            elif e.type == pagedkv.EventType.ALL_CLEARED:
                self.cached.clear()
        stats = self.pool.stats()
        assert stats.num_events_dropped == 0
        assert len(self.cached) == stats.num_cached_blocks, f"{where}: events say {len(self.cached)} cached"
        for st in self.live:
            table, hashes = st["seq"].block_table(), st["seq"].block_hashes()
            for j, h in enumerate(hashes):
                if table[j] in self.cached:
                    assert self.cached[table[j]] == h, f"{where}: block {table[j]} cached under another hash"

    def check_all(self, where):
        self.pool.validate()
        self.drain(where)
        stats = self.pool.stats()
        used = {b for st in self.live for b in st["seq"].block_table()} - {0}
        assert stats.num_used_blocks == len(used), where
        assert stats.num_free_blocks + stats.num_used_blocks == self.pool.num_blocks - 1, where
        assert stats.num_seqs == len(self.live), where
        assert stats.num_tokens == sum(len(st["tokens"]) for st in self.live), where
        views = [(self.pool.kv_tensor(ly, "k").numpy(), self.pool.kv_tensor(ly, "v").numpy()) for ly in range(self.L)]
        for st in self.live:
            s = st["seq"]
            info = s.info()
            assert info.num_tokens == len(st["tokens"]), where
            assert info.num_cached_tokens == st["cached"], where
            # A fork shares its parent's full blocks: a step of one that writes
            # a shared full block (the same tokens) computes it for both, so
            # the library may count more than the reference; every slot it
            # counts is checked below.
            assert st["c"] <= info.num_computed_tokens <= len(st["tokens"]), (
                f"{where}: seq {s.id} computed {info.num_computed_tokens}, reference {st['c']} "
                f"(len {len(st['tokens'])})\n" + "\n".join(self.log[-40:])
            )
            st["c"] = info.num_computed_tokens
            # the block hashes follow the tokens the reference appended
            full = len(st["tokens"]) // self.bs
            want = self.pool.hash_prefix(st["tokens"], lora_id=st["lora"], cache_salt=st["salt"])
            assert s.block_hashes()[:full] == want[:full], where
            table = s.block_table()
            assert len(table) * self.bs >= len(st["tokens"]), where
            assert 0 not in table[: -(-len(st["tokens"]) // self.bs)], where
            for p in range(st["c"]):
                b, off = table[p // self.bs], p % self.bs
                for ly in range(self.L):
                    ek, ev = self.kv_of(st["keys"][p], ly)
                    gk = views[ly][0][b, :, off, :].astype(np.float64)
                    gv = views[ly][1][b, :, off, :].astype(np.float64)
                    if not (np.array_equal(gk, ek) and np.array_equal(gv, ev)):
                        raise AssertionError(
                            f"{where}: seq {s.id} position {p} (block {b}, offset {off}, layer {ly}) "
                            f"holds other K/V than tokens[0..{p}] were written with; tokens {st['tokens']}"
                        )

    def check_plan(self, batch, sts, qcounts, persistent):
        arr = {k: np.array(v) for k, v in batch.plan_arrays().items()}
        lens = [len(st["tokens"]) for st in sts]
        np.testing.assert_array_equal(arr["context_lens"], lens)
        np.testing.assert_array_equal(arr["query_indptr"], np.concatenate([[0], np.cumsum(qcounts)]))
        slots = []
        for st, q in zip(sts, qcounts):
            table = st["seq"].block_table()
            for p in range(len(st["tokens"]) - q, len(st["tokens"])):
                slots.append(table[p // self.bs] * self.bs + p % self.bs)
        np.testing.assert_array_equal(arr["slot_mapping"], slots)
        positions = [p for st, q in zip(sts, qcounts) for p in range(len(st["tokens"]) - q, len(st["tokens"]))]
        np.testing.assert_array_equal(np.array(batch.token_positions()), positions)
        np.testing.assert_array_equal(np.array(batch.last_token_indices()), np.cumsum(qcounts) - 1)
        assert [s.id for s in batch.sequences] == [st["seq"].id for st in sts]
        ind, pages = arr["page_indptr"], arr["page_indices"]
        for i, st in enumerate(sts):
            np_ = -(-lens[i] // self.bs)
            row = pages[ind[i] : ind[i] + np_]
            np.testing.assert_array_equal(row, st["seq"].block_table()[:np_], err_msg=f"row {i}")
            if persistent:
                assert not pages[ind[i] + np_ : ind[i + 1]].any(), f"row {i} past its pages"
            last = lens[i] - (np_ - 1) * self.bs
            assert arr["last_page_len"][i] == last

    # -- one step -----------------------------------------------------------
    def step(self):
        rng = self.rng
        self.steps += 1
        if not self.live:
            return
        persistent = bool(rng.integers(2))
        decode_step = rng.integers(2) == 0  # only sequences with nothing to compute
        pick = [st for st in self.live if st["c"] == len(st["tokens"])] if decode_step else self.live
        if not pick:
            return
        if persistent and rng.integers(4):
            # keep each sequence at the same row from step to step
            self.persistent = [st for st in self.persistent if st in pick]
            for st in pick:
                if st not in self.persistent:
                    self.persistent.append(st)
            chosen = list(self.persistent)
        else:
            k = int(rng.integers(1, len(pick) + 1))
            chosen = [pick[i] for i in rng.choice(len(pick), size=k, replace=False)]
        decode_only = all(st["c"] == len(st["tokens"]) for st in chosen)
        drafts = {}
        before = {id(st): len(st["tokens"]) for st in chosen}
        use_decode = decode_only and rng.integers(3) != 0
        if use_decode:
            toks = rng.integers(0, 6, size=len(chosen)).astype(np.int32)
            ids = np.array([st["seq"].id for st in chosen], dtype=np.uint64)
            cut = int(rng.integers(1, len(chosen))) if len(chosen) > 1 and rng.integers(4) == 0 else len(chosen)
            batches = []
            for lo, hi in ((0, cut), (cut, len(chosen))):
                if lo == hi:
                    continue
                part = chosen[lo:hi]
                try:
                    b = self.pool.prepare_decode(
                        [ids[lo:hi], [st["seq"] for st in part], [int(i) for i in ids[lo:hi]]][int(rng.integers(3))],
                        toks[lo:hi],
                        persistent_table=persistent,
                    )
                except OutOfBlocksError:
                    for st in part:
                        assert len(st["seq"]) == before[id(st)]
                    continue
                for st, t in zip(part, toks[lo:hi]):
                    self.extend(st, [int(t)])
                batches.append((b, part, [1] * len(part)))
            if not batches:
                self.free(chosen[int(rng.integers(len(chosen)))], preempt=True)
                return
        else:
            kept, qcounts = [], []
            batched = decode_only and rng.integers(2)
            if batched:
                toks = rng.integers(0, 6, size=len(chosen)).astype(np.int32)
                try:
                    self.pool.append_batch([st["seq"] for st in chosen], toks)
                except OutOfBlocksError:
                    self.free(chosen[int(rng.integers(len(chosen)))], preempt=True)
                    return
                for st, t in zip(chosen, toks):
                    self.extend(st, [int(t)])
                kept, qcounts = chosen, [1] * len(chosen)
            else:
                for st in chosen:
                    uncomputed = len(st["tokens"]) - st["c"]
                    new = []
                    if uncomputed == 0 or rng.integers(4) == 0:
                        k = int(rng.integers(0, 4)) if rng.integers(2) else 0
                        new = [int(t) for t in rng.integers(0, 6, size=1 + k)]
                    la = int(rng.integers(0, 3)) if rng.integers(3) == 0 else 0
                    if new or la:
                        need = st["seq"].blocks_needed(len(new), la)
                        fits = need <= self.pool.stats().num_free_blocks
                        try:
                            st["seq"].append(new, la) if la else st["seq"].append(new)
                            self.log.append(f"append {st['seq'].id} {new} la {la}")
                        except OutOfBlocksError:
                            assert not fits, f"append of {len(new)} + {la} refused, blocks_needed {need}"
                            assert len(st["seq"]) == len(st["tokens"])
                            continue
                        assert fits, f"append of {len(new)} + {la} took blocks, blocks_needed {need} > free"
                        self.extend(st, new)
                        if len(new) > 1:
                            drafts[id(st)] = len(new) - 1
                    q = len(st["tokens"]) - st["c"]
                    if q == 0:
                        continue
                    if rng.integers(5) == 0:  # recompute some computed tokens too
                        q = int(rng.integers(q, len(st["tokens"]) + 1))
                    kept.append(st)
                    qcounts.append(q)
                if not kept:
                    return
            chosen = kept
            cut = int(rng.integers(1, len(chosen))) if len(chosen) > 1 and rng.integers(4) == 0 else len(chosen)
            batches = []
            for lo, hi in ((0, cut), (cut, len(chosen))):
                if lo == hi:
                    continue
                try:
                    part = [st["seq"] for st in chosen[lo:hi]]
                    if rng.integers(2):  # ids, as an engine keeping only ids passes them
                        part = np.array([q.id for q in part], dtype=np.uint64)
                    b = self.pool.prepare(part, qcounts[lo:hi], persistent_table=persistent)
                except OutOfBlocksError:  # copy-on-write blocks
                    continue
                batches.append((b, chosen[lo:hi], qcounts[lo:hi]))
        self.count(("prepare_decode" if use_decode else "prepare") + (" persistent" if persistent else ""))
        if len(batches) > 1:
            self.count("two live plans")
        if drafts:
            self.count("draft steps")
        for _, part, qc in batches:
            for st, q in zip(part, qc):
                n = len(st["tokens"]) - q
                if n % self.bs and self.shared_at(st, n):
                    self.count("query into a shared partial block")
        for b, part, qc in batches:  # the second plan's arrays must not move under the first's steps
            self.run_batch(b, part, qc, persistent, drafts)

    def run_batch(self, batch, chosen, qcounts, persistent, drafts):
        rng = self.rng
        self.log.append(
            f"step {self.steps}: "
            + ", ".join(f"{st['seq'].id} len {len(st['tokens'])} q {q}" for st, q in zip(chosen, qcounts))
        )
        with batch:
            self.check_plan(batch, chosen, qcounts, persistent)
            fate = int(rng.integers(6))  # 0: never written, 1: partly written, 2: stale, else committed
            layers = self.L if fate >= 3 else (0 if fate == 0 else int(rng.integers(0, self.L + 1)))
            if fate in (1, 2):
                layers = min(layers, self.L - 1)
            if rng.integers(6) == 0:  # a fork after prepare, before (some of) the step's writes
                st = chosen[int(rng.integers(len(chosen)))]
                try:
                    child = st["seq"].fork()
                    self.new_state(child, st["tokens"], st["c"], st["lora"], st["salt"])["cached"] = st["cached"]
                    self.log.append(f"fork after prepare {st['seq'].id} -> {child.id} c {st['c']}")
                    self.count("fork after prepare")
                except OutOfBlocksError:
                    pass
            rows = []
            for st, q in zip(chosen, qcounts):
                n = len(st["tokens"])
                rows += [(st, p) for p in range(n - q, n)]
            T = len(rows)
            for ly in range(layers):
                k = np.empty((T, self.H, self.D), dtype=np.float64)
                v = np.empty_like(k)
                for r, (st, p) in enumerate(rows):
                    k[r], v[r] = self.kv_of(st["keys"][p], ly)
                batch.cache_write(ly, k.astype(self.npdt), v.astype(self.npdt))
                self.check_attention(batch, ly, rows)
            if fate == 2:
                # a sequence of the plan changes before the last layer is written
                victim = chosen[int(rng.integers(len(chosen)))]
                if rng.integers(2) and len(victim["tokens"]) > 1:
                    self.cut(victim, int(rng.integers(1, len(victim["tokens"]))))
                    victim["seq"].truncate(len(victim["tokens"]))
                else:
                    self.free(victim, preempt=bool(rng.integers(2)))
                with pytest.raises(InvalidStateError):
                    batch.cache_write(0, *([np.zeros((T, self.H, self.D), dtype=self.npdt)] * 2))
                layers = 0
        self.log.append(f"  fate {fate} layers {layers}")
        if layers == self.L:
            for st in chosen:
                if st in self.live:
                    st["c"] = len(st["tokens"])
        self.check_all(f"step {self.steps} fate {fate}")
        # speculative rejection: drop some draft tokens (whatever the fate)
        for st in chosen:
            k = min(drafts.get(id(st), 0), len(st["tokens"]))  # a stale-plan truncate may have cut them
            if k and st in self.live and rng.integers(3):
                reject = int(rng.integers(1, k + 1))
                self.cut(st, len(st["tokens"]) - reject)
                st["seq"].truncate(len(st["tokens"]))
        self.check_all(f"step {self.steps} after rejection")

    def check_attention(self, batch, layer, rows):
        rng = self.rng
        T = len(rows)
        qh = self.H * self.G
        q = (rng.integers(-8, 9, size=(T, qh, self.D)) / 16.0).astype(self.npdt)
        want_lse = bool(rng.integers(2))
        got = batch.attention(layer, q, lse=True) if want_lse else batch.attention(layer, q)
        out, lse = got if want_lse else (got, None)
        out = np.asarray(out).astype(np.float64)
        qf = q.astype(np.float64)
        scale = 1.0 / np.sqrt(self.D)
        for r, (st, p) in enumerate(rows):
            ks = np.stack([self.kv_of(st["keys"][j], layer)[0] for j in range(p + 1)])  # [ctx, H, D]
            vs = np.stack([self.kv_of(st["keys"][j], layer)[1] for j in range(p + 1)])
            for h in range(qh):
                kh = h // self.G
                logits = ks[:, kh, :] @ qf[r, h] * scale
                w = np.exp(logits - logits.max())
                ref = (w / w.sum()) @ vs[:, kh, :]
                tol = 1e-4 if self.dtype == "f32" else 3e-2
                if lse is not None:
                    ref_lse = np.log(w.sum()) + logits.max()
                    assert abs(float(np.asarray(lse)[r, h]) - ref_lse) < 1e-3, (lse[r, h], ref_lse)
                if not np.allclose(out[r, h], ref, atol=tol, rtol=tol):
                    raise AssertionError(
                        f"step {self.steps} layer {layer}: attention of seq {st['seq'].id} position {p} "
                        f"head {h}: {out[r, h]} vs reference {ref}; tokens {st['tokens']}"
                    )
            self.checked_rows += 1

    # -- misuse: a clear error, and nothing changes ------------------------
    def misuse(self):
        rng = self.rng
        if not self.live:
            return
        self.drain("before misuse")
        st = self.live[int(rng.integers(len(self.live)))]
        s, n = st["seq"], len(st["tokens"])
        other = [o for o in self.live if o is not st and o["c"] == len(o["tokens"])]
        kind = int(rng.integers(8))
        ids = lambda sts: np.array([o["seq"].id for o in sts], dtype=np.uint64)  # noqa: E731
        if kind == 0:
            with pytest.raises(pagedkv.InvalidArgumentError, match="num_tokens"):
                s.truncate(n + 1 + int(rng.integers(3)))
        elif kind == 1:
            with pytest.raises(pagedkv.InvalidArgumentError, match=r"query_counts\[0\]"):
                self.pool.prepare([s], n + 1)
        elif kind == 2 and n - st["c"] >= 2:  # a context nobody wrote
            with pytest.raises(InvalidStateError, match=r"seqs\[0\]"):
                self.pool.prepare([s], n - st["c"] - 1)
        elif kind == 3 and n > st["c"]:  # prepare_decode over an uncomputed context
            sts = [*other[:2], st]
            # checked in order: an earlier sequence's append may find no free block first
            with pytest.raises((InvalidStateError, OutOfBlocksError), match=rf"seqs\[{len(sts) - 1}\]|free"):
                self.pool.prepare_decode(ids(sts), np.zeros(len(sts), dtype=np.int32))
        elif kind == 4 and n:
            with pytest.raises(pagedkv.InvalidArgumentError, match="twice"):
                self.pool.prepare([s, s], 1)
        elif kind == 5:
            # checked in order: seqs[0]'s append may find no free block first
            with pytest.raises((pagedkv.InvalidArgumentError, OutOfBlocksError), match=r"twice|seqs\[0\].*free"):
                self.pool.prepare_decode(ids([st, st]), [1, 2])
        elif kind == 6:
            with pytest.raises(pagedkv.PagedKVError):
                self.pool.free_batch(ids([*other[:1], st, st]))
        elif kind == 7:  # a freed sequence's id among good ones
            gone = self.pool.create_sequence()
            gid = gone.id
            gone.free()
            sts = other[:2]
            arr = np.concatenate([ids(sts), np.array([gid], dtype=np.uint64)])
            # checked in order: an earlier sequence's append may find no free block first
            with pytest.raises((pagedkv.NotFoundError, OutOfBlocksError), match=rf"seqs\[{len(sts)}\]|free"):
                self.pool.prepare_decode(arr, np.zeros(len(arr), dtype=np.int32))
            self.drain("misuse")  # the free's events, if any
        self.count("misuse")
        assert list(self.pool.events()) == [], "a refused call queued events"

    # -- between steps ------------------------------------------------------
    def churn(self):
        rng = self.rng
        op = int(rng.integers(11))
        if op <= 2 or not self.live:
            # the adapter and the salt: mostly the base model, sometimes a
            # LoRA or a tenant's salt (their blocks must never mix)
            lora = 0 if rng.integers(3) else int(rng.integers(1, 3))
            salt = None if rng.integers(3) else f"s{int(rng.integers(2))}"
            if self.preempted and rng.integers(2):
                toks, lora, salt = self.preempted.pop(int(rng.integers(len(self.preempted))))
            elif self.history and rng.integers(3) == 0:  # blocks written, then truncated away
                toks, lora, salt = self.history[int(rng.integers(len(self.history)))]
                toks = list(toks) + [int(t) for t in rng.integers(0, 6, size=int(rng.integers(0, 3)))]
            else:
                base = self.prompts[int(rng.integers(len(self.prompts)))]
                if self.live and rng.integers(3) == 0:  # a live sequence's tokens (decode-written blocks)
                    base = self.live[int(rng.integers(len(self.live)))]["tokens"] or base
                cut = int(rng.integers(1, len(base) + 1))
                toks = list(base[:cut]) + [int(t) for t in rng.integers(0, 6, size=int(rng.integers(0, 5)))]
            if toks:
                self.admit(toks, lora, salt)
        elif op <= 4:  # parallel sampling / beam search
            st = self.live[int(rng.integers(len(self.live)))]
            children = []
            for _ in range(int(rng.integers(1, 3))):
                try:
                    child = st["seq"].fork()
                except OutOfBlocksError:
                    break
                children.append(self.new_state(child, st["tokens"], st["c"], st["lora"], st["salt"]))
                children[-1]["cached"] = st["cached"]
                self.log.append(f"fork {st['seq'].id} -> {child.id} c {st['c']}")
            if rng.integers(2):  # the parent goes first
                self.free(st)
        elif op == 5:
            st = self.live[int(rng.integers(len(self.live)))]
            self.free(st, preempt=bool(rng.integers(2)))
        elif op == 6:
            st = self.live[int(rng.integers(len(self.live)))]
            if len(st["tokens"]) > 1:
                n = int(rng.integers(0, len(st["tokens"])))
                self.cut(st, n)
                st["seq"].truncate(n)
            if not st["tokens"] and rng.integers(2):  # emptied: the sequence takes a new prompt
                toks = [int(t) for t in self.prompts[int(rng.integers(len(self.prompts)))]]
                floor = self.written_floor(toks, st["lora"], st["salt"])
                cached = st["seq"].match_prefix(toks)
                assert cached % self.bs == 0 and floor <= cached <= len(toks) - 1, (cached, floor)
                self.extend(st, toks[:cached])
                st["c"] = st["cached"] = cached
                try:
                    st["seq"].append(toks[cached:])
                except OutOfBlocksError:
                    pass  # the hits stay attached
                else:
                    self.extend(st, toks[cached:])
                self.count("emptied sequence reused")
            st = self.live[int(rng.integers(len(self.live)))]
            st["seq"].reserve(len(st["tokens"]) + int(rng.integers(0, 400)))
            self.count("reserve")
        elif op == 10:
            self.misuse()
        elif op == 8:  # preemption by swapping: out to host memory, freed, later back in
            done = [st for st in self.live if st["c"] == len(st["tokens"]) and st["tokens"]]
            if done:
                st = done[int(rng.integers(len(done)))]
                nb = -(-len(st["tokens"]) // self.bs)
                buf = self.pool.swap_out(st["seq"].block_table()[:nb])
                self.swapped.append((st["tokens"], st["lora"], st["salt"], buf))
                self.free(st)
        elif op == 9 and self.swapped:
            toks, lora, salt, buf = self.swapped.pop(int(rng.integers(len(self.swapped))))
            seq = self.pool.create_sequence(lora_id=lora, cache_salt=salt)
            try:
                seq.append(toks)
            except OutOfBlocksError:
                seq.free()
                self.swapped.append((toks, lora, salt, buf))
            else:
                self.pool.swap_in(seq.block_table()[: -(-len(toks) // self.bs)], buf)
                self.new_state(seq, toks, len(toks), lora, salt)
                self.count("swap in")
        self.check_all(f"churn op {op}")


CONFIGS = [
    # dtype, block_size, layers, blocks, heads, head_dim, group, threads
    ("f32", 1, 1, 48, 1, 4, 1, 1),
    ("f32", 4, 2, 40, 2, 4, 2, 1),
    ("bf16", 4, 1, 24, 1, 8, 2, 2),
    ("f32", 16, 2, 12, 1, 4, 1, 1),
    ("bf16", 16, 1, 10, 2, 4, 1, 1),
    ("bf16", 1, 2, 64, 1, 4, 3, 1),
    ("f32", 4, 1, 32, 2, 32, 4, 2),
    ("bf16", 16, 2, 14, 1, 64, 2, 2),
    ("f32", 16, 1, 80, 2, 16, 2, 2, 300),  # long contexts: several key tiles per query
    ("f32", 4, 1, 200, 1, 4, 1, 1, 12, 40),  # a crowd: decode steps of up to 40 sequences
]


def run_engine(seed, cfg, steps, max_live=6):
    dtype, bs, layers, blocks, heads, hd, group, threads = cfg[:8]
    rng = np.random.default_rng(seed)
    eng = Engine(
        rng,
        dtype=dtype,
        block_size=bs,
        num_layers=layers,
        num_blocks=blocks,
        heads=heads,
        head_dim=hd,
        group=group,
        threads=threads,
        max_prompt=cfg[8] if len(cfg) > 8 else 0,
    )
    crowd = cfg[9] if len(cfg) > 9 else 0
    max_live = max(max_live, crowd)
    with eng.pool:
        for _ in range(steps):
            for _ in range(1 + crowd // 6):
                eng.churn()
            eng.step()
            while len(eng.live) > max_live:
                eng.free(eng.live[0], preempt=True)
    return eng


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[0]}-bs{c[1]}-L{c[2]}-d{c[5]}")
@pytest.mark.parametrize("seed", range(8))
def test_engine_against_reference(cfg, seed):
    eng = run_engine(1000 * seed + CONFIGS.index(cfg), cfg, 25)
    assert eng.checked_rows > 0
    if os.environ.get("PKV_REVIEW20_COVERAGE"):
        print(cfg, sorted(eng.cov.items()))


@pytest.mark.skipif(not os.environ.get("PKV_REVIEW20_SOAK"), reason="opt-in soak: PKV_REVIEW20_SOAK=<seeds>")
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c[0]}-bs{c[1]}-L{c[2]}-d{c[5]}")
def test_engine_soak(cfg):
    for seed in range(int(os.environ["PKV_REVIEW20_SOAK"])):
        run_engine(10**6 + seed, cfg, 80, max_live=10)
