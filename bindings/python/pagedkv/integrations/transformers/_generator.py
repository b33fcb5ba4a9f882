"""A continuous-batching generator for transformers decoder models on pagedkv.

Each step schedules, under a token budget, every running sequence's next
tokens (one for decode, a chunk of the prompt for chunked prefill), then
admits waiting requests; runs the model once over all of them (see
_runner.py) and samples a token for each sequence whose known tokens are now
all computed. What pagedkv does for it:

- prefix caching: an admitted sequence first attaches the cached blocks of
  its prompt's longest cached prefix (``Sequence.match_prefix``); only the
  rest is computed;
- preemption: when an append finds no free block, the most recently admitted
  running sequence is freed (its committed full blocks stay in the prefix
  cache) and requeued first; on readmission it recomputes only what the
  cache lost (recompute preemption, as vLLM's);
- parallel sampling: a request for n samples is prefilled once; at its first
  sample the sequence is forked n - 1 times (``Sequence.fork``: the children
  share every block, copy-on-write on the shared tail).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Deque, Iterable, List, Optional, Sequence

import pagedkv
from pagedkv._types import _index, _real

from ._runner import pool_for_model, run_step


@dataclasses.dataclass
class SamplingParams:
    """How to sample one request.

    temperature 0 is greedy (argmax, as ``generate(do_sample=False)``);
    top_k and top_p then do nothing. With temperature > 0 the logits go
    through transformers' warpers in their order: divided by temperature,
    then top_k (0: every token) keeps the k most likely tokens, then top_p
    (nucleus sampling, 0 < top_p <= 1; 1.0: off) keeps the smallest set of
    the most likely tokens whose probabilities sum to at least top_p, and
    always the most likely one (``TopPLogitsWarper``). These are not read
    from the model's ``generation_config``: only its ``eos_token_id`` is.
    seed: the request's samples are reproducible for a given seed, whatever
    else is batched with it and across preemption (its n samples draw from
    generators derived from it); None draws a fresh seed from torch's global
    generator at add_request, so requests, Generators and runs differ
    (``torch.manual_seed`` before adding them makes them repeat).
    stop_token_ids None takes the model's ``generation_config.eos_token_id``;
    ignore_eos generates exactly max_new_tokens."""

    max_new_tokens: int = 16
    n: int = 1
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop_token_ids: Optional[Sequence[int]] = None
    ignore_eos: bool = False


@dataclasses.dataclass
class Completion:
    """One finished sample: ``tokens`` are the generated ids (no prompt).
    ``logits`` (with ``keep_logits``) holds the logits each token was
    sampled from, f32 [len(tokens), vocab] (None if no token was sampled).
    finish_reason "error": the request could not run (its prompt or
    sequence outgrew the pool, the model refused it in a forward, sampling
    failed); ``error`` holds the exception, ``tokens`` what was generated
    before it, and every unfinished sample of the request ends so."""

    request_id: int
    index: int
    prompt: List[int]
    tokens: List[int]
    finish_reason: str  # "length", "stop", "abort" (abort_request) or "error"
    logits: Any = None
    error: Optional[BaseException] = None  # with finish_reason "error"


@dataclasses.dataclass
class GeneratorStats:
    steps: int = 0
    scheduled_tokens: int = 0
    admitted_tokens: int = 0  # tokens of sequences at admission (readmissions after preemption too)
    prefix_hit_tokens: int = 0  # of those, tokens attached from the prefix cache
    chunked_prefills: int = 0  # steps that computed part of a prompt, leaving the rest
    preemptions: int = 0
    forks: int = 0
    max_batch_seqs: int = 0  # most sequences in one step


class _Request:
    __slots__ = ("done", "id", "params", "prompt", "stop")

    def __init__(self, rid: int, prompt: List[int], params: SamplingParams, stop: frozenset) -> None:
        self.id = rid
        self.prompt = prompt
        self.params = params
        self.stop = stop
        self.done: List[Completion] = []


class _Seq:
    """One sample of a request: its tokens and where the pool is with them."""

    __slots__ = ("appended", "computed", "forks_left", "handle", "index", "logits", "req", "rng", "tokens")

    def __init__(self, req: _Request, index: int, tokens: List[int], rng: Any) -> None:
        self.req = req
        self.index = index
        self.tokens = tokens  # prompt + generated
        self.handle: Optional[pagedkv.Sequence] = None  # None while waiting
        self.appended = 0  # tokens in the pool's sequence
        self.computed = 0  # of those, tokens whose K/V a committed step wrote
        self.forks_left = req.params.n - 1 if index == 0 else 0
        self.rng = rng
        self.logits: List[Any] = []

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - len(self.req.prompt)


class Generator:
    """Continuous batching of a transformers causal LM over a pagedkv pool.

    model: a ``*ForCausalLM`` whose attention modules call transformers'
    attention-function registry (Llama, Qwen2, Mistral, Gemma, Phi-3,
    gpt-oss, ... : the models with ``attn_implementation`` support; the
    README lists those tested and those refused). num_blocks: KV blocks of
    block_size tokens for all sequences together, block 0 (the null block)
    included: they hold (num_blocks - 1) * block_size tokens. max_num_batched_tokens:
    the token budget of one step (prompts longer than what is left are
    prefilled in chunks). max_num_seqs: the most sequences running at once,
    a request of n samples counting n from its admission (SamplingParams.n
    above it is refused). keep_logits: each Completion carries the logits its
    tokens were sampled from (for tests and scoring).
    """

    def __init__(
        self,
        model: Any,
        *,
        num_blocks: int = 1024,
        block_size: int = 16,
        max_num_batched_tokens: int = 512,
        max_num_seqs: int = 64,
        enable_prefix_caching: bool = True,
        num_threads: Optional[int] = None,
        keep_logits: bool = False,
    ) -> None:
        import torch

        # ints only: a fractional budget reached the plan as a float count
        max_num_batched_tokens = _index(max_num_batched_tokens, "max_num_batched_tokens")
        max_num_seqs = _index(max_num_seqs, "max_num_seqs")
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be at least 1")
        self.pool = pool_for_model(  # first: it refuses what is not a decoder-only model
            model,
            num_blocks=num_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            num_threads=num_threads,
        )
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.prefix_caching = enable_prefix_caching
        self.keep_logits = keep_logits
        self.stats = GeneratorStats()
        self._torch = torch
        self._next_id = 0
        self._waiting: Deque[_Seq] = collections.deque()
        self._unadmitted = 0
        self._running: List[_Seq] = []
        self._out: List[Completion] = []  # what the current step finished
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self._vocab: Optional[int] = getattr(emb, "num_embeddings", None)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self._default_stop = frozenset([eos] if isinstance(eos, int) else (eos or []))

    # ------------------------------------------------------------ requests

    def add_request(self, prompt: Iterable[int], params: Optional[SamplingParams] = None) -> int:
        """Queues a prompt (token ids); returns its request id (the
        ``request_id`` of its Completions, which step() returns)."""
        return self._add(prompt, params).id

    def _add(self, prompt: Iterable[int], params: Optional[SamplingParams]) -> _Request:
        params = params or SamplingParams()
        # ints only (int() read 2.7 as 2 and "5" as 5), checked before
        # anything is queued: a request the model cannot run failed every
        # later step.
        # One prompt of ints given where prompts are expected
        # (generate([1, 2, 3])) failed with "'int' object is not iterable".
        try:
            tokens = list(prompt) if not isinstance(prompt, (str, bytes)) else None
        except TypeError:
            tokens = None
        if tokens is None:
            raise TypeError(
                f"prompt: expected a sequence of token ids, got {type(prompt).__name__} "
                "(generate() takes a list of prompts, each a list of token ids: generate([[1, 2, 3]]))"
            )
        prompt = [_index(t, f"prompt[{i}]") for i, t in enumerate(tokens)]
        if not prompt:
            raise ValueError("prompt is empty")
        if self._vocab is not None:
            for i, t in enumerate(prompt):
                if not 0 <= t < self._vocab:
                    raise ValueError(f"prompt[{i}] = {t} is outside the vocabulary [0, {self._vocab})")
        for name in ("n", "max_new_tokens", "top_k"):
            _index(getattr(params, name), name)
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be at least 1")
        if params.n > self.max_num_seqs:
            # Its samples run together (forked from one prefill): it could
            # never be admitted.
            raise ValueError(f"n = {params.n} samples is more than max_num_seqs = {self.max_num_seqs}")
        # A negative or NaN temperature sampled greedily (it is not > 0) and a
        # negative top_k sampled from every token, both without a word
        # (transformers' warpers refuse them).
        temperature = _real(params.temperature, "temperature")
        if not temperature >= 0:
            raise ValueError(f"temperature must be 0 (greedy) or positive, got {temperature}")
        if params.top_k < 0:
            raise ValueError(f"top_k must be 0 (all tokens) or positive, got {params.top_k}")
        top_p = _real(params.top_p, "top_p")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1: every token), got {top_p}")
        if params.seed is not None:
            # What torch.Generator.manual_seed takes: past it, it raised
            # ValueError "Overflow when unpacking long long", naming nothing,
            # after the request had taken an id.
            seed = _index(params.seed, "seed")
            if not -(2**63) <= seed <= 2**64 - 1:
                raise ValueError(f"seed must be an int in [-2^63, 2^64 - 1] (torch's seeds), got {seed}")
        # ints, as the sampled ids are: a torch tensor's elements hash by
        # identity, so stop_token_ids=torch.tensor([eos]) never matched one.
        stop = (
            frozenset()
            if params.ignore_eos
            else (
                frozenset(_index(t, f"stop_token_ids[{i}]") for i, t in enumerate(params.stop_token_ids))
                if params.stop_token_ids is not None
                else self._default_stop
            )
        )
        rid = self._next_id
        self._next_id += 1
        req = _Request(rid, prompt, params, stop)
        rng = None
        if params.temperature > 0:
            # seed None: a seed drawn from torch's global generator, which
            # torch seeds from the OS at start-up (torch.manual_seed makes it
            # reproducible, as it does transformers' generate()). Seeding
            # with the request id gave every Generator and every run the
            # same "random" samples.
            seed = params.seed if params.seed is not None else int(self._torch.randint(0, 2**63 - 1, ()))
            rng = self._torch.Generator(device="cpu")
            rng.manual_seed(seed)
        self._waiting.append(_Seq(req, 0, list(prompt), rng))
        return req

    def abort_request(self, request_id: int) -> List[Completion]:
        """Stops a request added with add_request (vLLM's ``abort_request``):
        its sequences, forked samples included, are freed and leave the
        queue and the running set. Returns a Completion for each of its
        samples that had not finished, ``finish_reason="abort"``, with the
        tokens generated so far (step() never returns these; samples that
        finished before keep the Completions step() returned). A request
        that already finished (or was aborted) is a no-op: []. An id this
        Generator never returned is a ValueError."""
        rid = _index(request_id, "request_id")
        if not 0 <= rid < self._next_id:
            raise ValueError(
                f"request_id {rid}: no such request (this Generator returned ids 0 to {self._next_id - 1})"
            )
        req = next((s.req for s in itertools.chain(self._running, self._waiting) if s.req.id == rid), None)
        return [] if req is None else self._end(req, "abort")

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def generate(
        self, prompts: Iterable[Iterable[int]], params: Optional[SamplingParams] = None
    ) -> List[List[Completion]]:
        """Runs prompts to completion; result[i] holds prompt i's n samples
        in sample order.

        A request that cannot run (a prompt that can never fit the pool, a
        forward the model refuses for it, a sampling failure) fails alone:
        the others run to their end, then generate() raises the first failed
        request's exception (the same type and message step() records in its
        Completion.error: a RuntimeError for a pool too small, the model's
        ValueError, ...) with ``results`` set on it, the list generate()
        would have returned, failed samples with finish_reason "error". A bad
        prompt or parameter raises before anything runs, and an interrupt
        (any BaseException that is not an Exception) as it happens; then
        none of the call's requests stays queued or running."""
        reqs: List[_Request] = []
        try:
            for p in prompts:
                reqs.append(self._add(p, params))
            while self.has_unfinished():
                self.step()
        except BaseException:
            # Left queued, a request that cannot run made every later
            # generate() raise its error again.
            self._drop(reqs)
            # nor does a later step() return what they finished before it
            ids = {r.id for r in reqs}
            self._out = [c for c in self._out if c.request_id not in ids]
            raise
        results = [sorted(r.done, key=lambda c: c.index) for r in reqs]
        failed = [c for r in results for c in r if c.finish_reason == "error"]
        if failed:
            # One failure raised at once and dropped every other request's
            # results, finished or not.
            error = failed[0].error
            assert error is not None
            try:
                error.results = results  # type: ignore[attr-defined]
            except AttributeError:  # an exception type without a __dict__
                raise GenerationError(str(error), results) from error
            ids = sorted({c.request_id for c in failed})
            if hasattr(error, "add_note"):
                error.add_note(
                    f"generate(): {len(ids)} of {len(reqs)} requests failed (request ids {ids}); "
                    "the others finished: this exception's .results holds every prompt's Completions"
                )
            raise error
        return results

    def _drop(self, reqs: List[_Request]) -> List[_Seq]:
        """Forgets the samples of reqs, waiting or running (freed); returns them."""
        gone = {r.id for r in reqs}
        dropped = [s for s in itertools.chain(self._running, self._waiting) if s.req.id in gone]
        for s in dropped:
            if s.handle is not None:
                try:
                    s.handle.free()
                except pagedkv.PagedKVError:
                    pass  # the pool was closed: nothing is held
                s.handle = None
        self._running = [s for s in self._running if s.req.id not in gone]
        self._waiting = collections.deque(s for s in self._waiting if s.req.id not in gone)
        return dropped

    def _end(self, req: _Request, reason: str, error: Optional[BaseException] = None) -> List[Completion]:
        """Ends req before its samples finished: drops its sequences and
        makes a Completion (finish_reason reason) for each sample not done,
        with the tokens it has (none for a fork not made yet)."""
        seqs = {s.index: s for s in self._drop([req])}
        finished = {c.index for c in req.done}
        out = []
        for index in range(req.params.n):
            if index in finished:
                continue
            s = seqs.get(index)
            tokens = s.tokens[len(req.prompt) :] if s is not None else []
            logits = self._torch.stack(s.logits) if self.keep_logits and s is not None and s.logits else None
            out.append(Completion(req.id, index, req.prompt, tokens, reason, logits, error))
        req.done.extend(out)
        return out

    def _fail(self, req: _Request, error: BaseException) -> None:
        """Ends req with error (its sequences freed, the others untouched);
        step() returns its samples' Completions (finish_reason "error")."""
        self._out.extend(self._end(req, "error", error))

    def close(self) -> None:
        for s in self._running:
            if s.handle is not None:
                s.handle.free()
        self._running.clear()
        self._waiting.clear()
        self.pool.close()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ scheduling

    def _capacity(self) -> str:
        """The pool's room, for errors: block 0 is the null block, which no
        sequence gets (a pool of 2 blocks of 4 tokens holds 4 tokens)."""
        n, bs = self.pool.num_blocks, self.pool.block_size
        return f"{n - 1} usable blocks of {bs} tokens, {(n - 1) * bs} tokens: {n} less the null block"

    def _preempt(self, victim: _Seq) -> None:
        assert victim.handle is not None
        victim.handle.free()
        victim.handle = None
        victim.appended = victim.computed = 0
        self._running.remove(victim)
        self._waiting.appendleft(victim)
        self.stats.preemptions += 1

    def _grow(self, s: _Seq, upto: int) -> Optional[bool]:
        """Appends s's tokens up to upto, preempting the most recently
        admitted sequences while blocks run out; False if s itself had to
        go, None if its request failed (s alone cannot hold upto tokens)."""
        while True:
            try:
                s.handle.append(s.tokens[s.appended : upto])
                s.appended = upto
                return True
            except pagedkv.OutOfBlocksError:
                victim = self._running[-1]
                if victim is s and len(self._running) == 1:
                    # Nothing else holds blocks: s can never hold upto tokens.
                    # Preempted and readmitted, it recomputed its first chunk
                    # and came back here for good without prefix caching.
                    generated = f" + {s.num_generated} generated" if s.num_generated else ""
                    self._fail(
                        s.req,
                        RuntimeError(
                            f"request {s.req.id}: its first {upto} tokens (of prompt {len(s.req.prompt)}{generated}) "
                            f"need more blocks than the pool has ({self._capacity()})"
                        ),
                    )
                    return None
                self._preempt(victim)
                if victim is s:
                    return False

    def _admit(self, s: _Seq, budget: int) -> int:
        """Starts a waiting sequence; returns the tokens it schedules (0 if
        its first chunk does not fit in the free blocks)."""
        h = self.pool.create_sequence()
        hit = h.match_prefix(s.tokens) if self.prefix_caching else 0
        count = min(len(s.tokens) - hit, budget)
        if h.blocks_needed(count) > self.pool.stats().num_free_blocks:
            h.free()
            self._unadmitted = hit + count
            return 0
        h.append(s.tokens[hit : hit + count])
        s.handle, s.appended, s.computed = h, hit + count, hit
        self.stats.admitted_tokens += len(s.tokens)
        self.stats.prefix_hit_tokens += hit
        return count

    def _seats(self) -> int:
        """Running sequences, counting the forks each will make at its
        first sample: admission kept only len(running) under max_num_seqs,
        and a request of n samples admitted one seat below it forked to
        n - 1 past it."""
        return sum(1 + s.forks_left for s in self._running)

    def _schedule(self) -> tuple[list, list]:
        budget = self.max_num_batched_tokens
        seqs: List[_Seq] = []
        counts: List[int] = []
        preempted = self.stats.preemptions
        i = 0
        while i < len(self._running) and budget > 0:
            s = self._running[i]
            count = min(len(s.tokens) - s.computed, budget)
            grown = self._grow(s, s.computed + count)
            if grown is None:
                continue  # its request failed and left the running set (s was alone in it)
            if not grown:
                break
            seqs.append(s)
            counts.append(count)
            budget -= count
            i += 1
        # Admit only while nothing had to be preempted this step (unless
        # everything was: then the longest-waiting sequence gets the pool).
        while True:
            while (
                self._waiting
                and budget > 0
                and self._seats() + 1 + self._waiting[0].forks_left <= self.max_num_seqs
                and (self.stats.preemptions == preempted or not seqs)
            ):
                s = self._waiting[0]
                count = self._admit(s, budget)
                if count == 0:
                    break
                self._waiting.popleft()
                self._running.append(s)
                seqs.append(s)
                counts.append(count)
                budget -= count
            if not (not seqs and self._waiting and not self._running):
                return seqs, counts
            # Nothing else holds blocks: it can never run. Left queued, it
            # made every later step raise this again; raised, it hid the
            # requests behind it until the next step. It fails alone and the
            # next waiting request gets its turn.
            # The tokens it needed at once: its prefix hit (the blocks of a
            # sequence that outgrew the pool and was preempted) and the chunk,
            # not the token budget.
            s = self._waiting[0]
            generated = f" + {s.num_generated} generated" if s.num_generated else ""
            self._fail(
                s.req,
                RuntimeError(
                    f"request {s.req.id}: its first {self._unadmitted} tokens "
                    f"(of prompt {len(s.req.prompt)}{generated}) "
                    f"need more blocks than the pool has ({self._capacity()})"
                ),
            )

    # ------------------------------------------------------------ stepping

    def step(self) -> List[Completion]:
        """One engine step; returns the samples that finished in it, those
        of requests that failed in it included (finish_reason "error", see
        Completion). A request that cannot run fails alone: step() raises
        only for an interrupt (a BaseException that is not an Exception),
        which leaves the step uncommitted, to be run again: the sequences a
        rerun one by one had computed before it sample first, and what
        finished or failed in the interrupted step comes back from the next
        step()."""
        seqs, counts = self._schedule()
        if seqs:
            self._run(seqs, counts)
        out, self._out = self._out, []
        return out

    def _run(self, seqs: List[_Seq], counts: List[int]) -> None:
        torch = self._torch
        ids: List[int] = []
        sampling: List[int] = []
        for j, (s, c) in enumerate(zip(seqs, counts)):
            ids.extend(s.tokens[s.computed : s.computed + c])
            if s.computed + c == len(s.tokens):
                sampling.append(j)
            elif s.num_generated == 0:
                self.stats.chunked_prefills += 1
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        rows = torch.tensor(sampling, dtype=torch.long)
        try:
            logits = run_step(self.model, self.pool, [s.handle for s in seqs], counts, input_ids, rows)
        except Exception as e:
            # Left running, a request the model refuses (or one whose forward
            # fails) made every later step raise. Nothing of the step counts:
            # each sequence runs alone, and those that still fail end their
            # requests.
            row_of, interrupt = self._run_one_by_one(seqs, counts, sampling, e)
        else:
            for s, c in zip(seqs, counts):
                s.computed += c
            row_of = {j: logits[r] for r, j in enumerate(sampling)}
            interrupt = None
        self.stats.steps += 1
        self.stats.scheduled_tokens += len(ids)
        self.stats.max_batch_seqs = max(self.stats.max_batch_seqs, len(seqs))
        for j in sampling:
            s = seqs[j]
            if s.handle is None or j not in row_of:  # its request failed above
                continue
            samples = [s]
            for _ in range(s.forks_left):  # parallel sampling: children share the prompt's blocks
                child = _Seq(s.req, s.req.params.n - s.forks_left, list(s.tokens), _child_rng(s, torch))
                child.handle = s.handle.fork()
                child.appended, child.computed = s.appended, s.computed
                self._running.append(child)
                samples.append(child)
                s.forks_left -= 1
                self.stats.forks += 1
            for x in samples:
                try:
                    done = self._sample(x, row_of[j])
                except Exception as e:
                    # Left running, a sequence whose tokens were all computed
                    # but that got no new one was scheduled for 0 tokens: every
                    # later step failed with a plan error. Its request fails;
                    # the other sequences of the step still sample.
                    error = RuntimeError(f"request {x.req.id}: sampling failed ({type(e).__name__}: {e})")
                    error.__cause__ = e
                    self._fail(x.req, error)
                    break
                if done:
                    self._out.append(done)
        if interrupt is not None:
            raise interrupt

    def _run_one_by_one(
        self, seqs: List[_Seq], counts: List[int], sampling: List[int], error: Exception
    ) -> tuple[dict, Optional[BaseException]]:
        """After a step that raised error: runs each sequence's part alone;
        a sequence whose part raises fails its request. Returns the logits
        of the sampling ones that ran, by index into seqs, and an interrupt
        (a BaseException that is not an Exception) that stopped the reruns:
        the sequences run before it committed their tokens and must sample
        (left computed but unsampled, the next step planned them for 0
        tokens, which the pool refuses, and their requests failed); those
        after it are left as they were, to run at the next step."""
        torch = self._torch
        if len(seqs) == 1:
            self._fail(seqs[0].req, error)
            return {}, None
        row_of = {}
        for j, (s, c) in enumerate(zip(seqs, counts)):
            if s.handle is None:  # a sibling failed its request
                continue
            ids = torch.tensor(s.tokens[s.computed : s.computed + c], dtype=torch.long, device=self.device)
            rows = torch.tensor([0] if j in sampling else [], dtype=torch.long)
            try:
                logits = run_step(self.model, self.pool, [s.handle], [c], ids, rows)
            except Exception as e:
                self._fail(s.req, e)
                continue
            except BaseException as interrupt:
                return row_of, interrupt
            s.computed += c
            if j in sampling:
                row_of[j] = logits[0]
        return row_of, None

    def _sample(self, s: _Seq, logits: Any) -> Optional[Completion]:
        torch = self._torch
        p = s.req.params
        if p.temperature > 0:
            scores = _warp(logits, p.temperature, p.top_k, p.top_p)
            tok = int(torch.multinomial(torch.softmax(scores, -1).cpu(), 1, generator=s.rng))
        else:
            tok = int(torch.argmax(logits))
        s.tokens.append(tok)
        if self.keep_logits:
            s.logits.append(logits.float().cpu())
        reason = "stop" if tok in s.req.stop else "length" if s.num_generated >= p.max_new_tokens else None
        if reason is None:
            return None
        s.handle.free()
        s.handle = None
        self._running.remove(s)
        c = Completion(
            s.req.id,
            s.index,
            s.req.prompt,
            s.tokens[len(s.req.prompt) :],
            reason,
            torch.stack(s.logits) if self.keep_logits else None,
        )
        s.req.done.append(c)
        return c


class GenerationError(RuntimeError):
    """What generate() raises when a failed request's exception cannot
    carry ``results`` (a type without a ``__dict__``): the same message,
    that exception as ``__cause__``, and ``results``."""

    def __init__(self, message: str, results: List[List[Completion]]) -> None:
        super().__init__(message)
        self.results = results


def _warp(logits: Any, temperature: float, top_k: int, top_p: float) -> Any:
    """The scores a sample is drawn from (softmax of them), from one row of
    logits: transformers' TemperatureLogitsWarper, TopKLogitsWarper and
    TopPLogitsWarper (min_tokens_to_keep 1) in that order; tokens filtered
    out are -inf."""
    import torch

    scores = logits.float() / temperature
    if top_k > 0:
        kth = torch.topk(scores, min(top_k, scores.shape[-1])).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        # Ascending, as transformers: the tokens whose cumulative probability
        # (from the least likely up) stays <= 1 - top_p go; the most likely
        # token always stays.
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove = cumulative <= (1 - top_p)
        remove[-1:] = False
        scores = scores.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    return scores


def _child_rng(parent: _Seq, torch: Any) -> Any:
    if parent.rng is None:
        return None
    g = torch.Generator(device="cpu")
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=parent.rng)))
    return g
