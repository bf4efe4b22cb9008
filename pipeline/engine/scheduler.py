"""Iteration-level scheduling (Orca, OSDI 2022) over a paged KV memory (vLLM's PagedAttention): no model here.

Every engine iteration asks `plan()` what to run:
  * retire cancelled requests (their blocks go back to the pool at once);
  * admit waiting requests in arrival order while the batch has room and the pool has the blocks for the
    request's whole budget (prompt + max new tokens, less the blocks its prompt finds in the prefix cache): a
    request that does not fit waits; nothing is preempted;
  * give prefill work: at most `prefill_chunk` prompt tokens per iteration in all and `request_chunk` per request,
    the shortest remaining prompt first, and prompts that complete this iteration without the chunks of longer
    ones. A long prompt is prefilled over several iterations while the running requests keep decoding, and a
    short question arriving meanwhile does not wait for a long chunk: the engine stops that chunk and the decode
    tokens at the layer they have reached (engine.paged, "parked"), and the question is prefilled the next
    iteration, before they resume (measured in bench_serving.py's "steady" and "long-prompt" workloads);
  * decode one token for every request whose prompt is in the cache, except in a pass that gives waiting
    prompts their first token: those run alone (prefill first), at most `max_decode_stall` passes in a row
    (the engine asks for 2; bench_serving.py measures it against "engine-mixed", which has it off: a newcomer's
    first token sooner, for a pause of a pass or two in the answers already streaming).
After the pass the engine reports what it did, `update(plan, outputs)`: the prompt tokens now in the cache and
the token sampled for each request. The scheduler moves each request along its life (State: waiting -> prefill ->
decode -> finished, or padding under static batching), registers full prompt blocks in the prefix cache, decides
which requests ended (EOS, length, cancelled) and retires them the same iteration, their blocks back to the pool;
`fail()` retires the requests of a pass that failed. A request's life is its `state` and, once it ended, `finish`
(why); nobody else writes them.

Two policies, as vLLM's SchedulingPolicy: Policy.CONTINUOUS (the above) and Policy.STATIC, the comparison the
batching page draws: nobody is admitted until the whole batch has arrived (static_batch_size), and rows that
finish keep their slot (padding) until the longest is done (`release_static_batch()` then retires them all).
The engine asks and reports, nothing more: `plan()`, `update()`, `fail()`, `release_static_batch()`, and questions
answered under the lock (`work_ahead`, `occupancy`, `newcomer_fits`, `blocks_for`); it never edits the queues, a
request's state or the block pool.

Memory: a pool of fixed-size blocks (`block_size` tokens of K and V in every layer). A request reserves the
blocks for prompt + max_new_tokens when admitted (vLLM allocates block by block and preempts when the pool runs
out; reserving up front never has to preempt, at the price of holding blocks a request that stops early never
fills). The waiting queue is bounded: beyond `max_queue` a submission is refused with a clear message.

Prefix cache (vLLM's automatic prefix caching): a request's full prompt blocks, once written in every layer, are
registered under their tokens (and every token before them); a request admitted later whose prompt starts the
same way shares those blocks (reference counted) and starts its prefill after them. Every chat prompt starts
with the template's system turn, so on a class server most of a short question's prefill is already done. A
cached block nobody holds counts as free and is reused, least recently freed first, when the pool needs it.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
from collections import Counter, deque

from pipeline.engine.blocks import BlockPool
from pipeline.engine.request import Chunk, PassOutput, Plan, Policy, QueueFull, QueueStats, Request, State, TooLarge
from pipeline.generation.events import Finish


class Scheduler:
    """Thread-safe: submit / cancel come from visitors' threads, plan / finish from the engine's."""

    def __init__(
        self,
        pool: BlockPool,
        max_batch: int = 32,
        max_queue: int = 64,
        prefill_chunk: int = 256,
        request_chunk: int | None = None,
        prefix_cache: bool = True,
        max_decode_stall: int = 0,
        policy: Policy = Policy.CONTINUOUS,
        static_batch_size: int | None = None,
        decode_steps: int = 1,
    ):
        self.pool, self.max_batch, self.max_queue, self.prefill_chunk = pool, max_batch, max_queue, prefill_chunk
        self.prefix_cache = prefix_cache  # admitted prompts share the cached blocks of the prompts they start with
        self.request_chunk = request_chunk or prefill_chunk
        self.max_decode_stall, self._stalled = max_decode_stall, 0  # passes in a row the decode rows may sit out
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted: prefilling or decoding
        self.lock = threading.Lock()
        self.ended: Counter[str] = Counter()  # requests retired, by reason (eos, length, cancelled...)
        self.changed = threading.Condition(self.lock)
        self.policy, self.static_batch_size = Policy(policy), static_batch_size
        self.static_batch: list[Request] = []  # Policy.STATIC: the batch being run
        self._cancelled: set[int] = set()  # asked to stop (from a visitor's thread), retired at the next plan or token
        # a pass of decode rows only, each greedy without kept logits, with nobody waiting, may make up to this many
        # tokens a row (vLLM's multi-step scheduling; Plan.steps); `news` is set to 1 when a request arrives or is
        # cancelled, and such a pass reads it after each step and stops there, so neither waits for the rest of it
        self.decode_steps = decode_steps
        self.news = ctypes.c_int(0)

    # -- visitors' side ----------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        need = self.pool.blocks_for(req.n_tokens)
        if need > self.pool.n_blocks:
            raise TooLarge(
                f"This request needs room for {req.n_tokens:,} tokens ({need:,} blocks of "
                f"{self.pool.block_size}); the server's KV memory holds {self.pool.n_blocks:,} blocks. "
                "Shorten the prompt or ask for fewer new tokens."
            )
        with self.lock:
            if len(self.waiting) >= self.max_queue:
                raise QueueFull(
                    f"Server busy: {len(self.waiting)} requests are already waiting, the most this server queues. Nothing was started; "
                    "try again in a few seconds."
                )
            self.waiting.append(req)
            self.news.value = 1
            self.changed.notify_all()

    def cancel(self, req: Request) -> None:
        """Stop a request (Stop pressed, tab closed): it is retired and its blocks freed at the next plan."""
        with self.lock:
            if req.state != State.FINISHED:
                self._cancelled.add(req.id)
                self.news.value = 1
            self.changed.notify_all()

    def wake(self) -> None:
        """Wake the engine's worker (a cancel or a new request it should see now)."""
        with self.lock:
            self.changed.notify_all()

    def position(self, req: Request) -> int:
        """1 for the next to be admitted, 2 behind it...; 0 once admitted (or finished)."""
        with self.lock:
            for i, r in enumerate(self.waiting):
                if r is req:
                    return i + 1
            return 0

    # -- the engine's side -------------------------------------------------------------------------------
    def plan(self) -> Plan:
        """This iteration's work under the scheduler's policy."""
        with self.lock:
            retired = [r for r in list(self.waiting) + self.running if r.id in self._cancelled and r.state != State.FINISHED]
            for r in retired:
                self._retire(r, Finish.CANCELLED)
            return self._plan_static(retired) if self.policy == Policy.STATIC else self._plan_continuous(retired)

    def _plan_continuous(self, retired: list[Request]) -> Plan:
        now = time.perf_counter()
        while self.waiting and len(self.running) < self.max_batch:
            r = self.waiting[0]
            shared, serial = self.pool.match(r.prompt_ids) if self.prefix_cache else ([], 0)
            need = self.pool.blocks_for(r.n_tokens) - len(shared)
            if not self.pool.fits(need, shared):
                break  # first come, first served: nobody overtakes a waiting request
            self.waiting.popleft()
            self.pool.share(shared)
            r.blocks, r.state, r.admitted_at = shared + self.pool.take(need), State.PREFILL, now
            r.prefilled = r.cached = len(shared) * self.pool.block_size
            r.registered, r.prefix_serial = len(shared), serial
            if shared:
                self.pool.hit_tokens += r.cached
                self.pool.hit_requests += 1
            self.running.append(r)
        budget, prefill = self.prefill_chunk, []
        # the shortest remaining prompt first: a short question that arrives while a long prompt is being
        # prefilled chunk by chunk gets its first token next iteration, not after the whole long prompt
        todo = sorted((r for r in self.running if r.state == State.PREFILL), key=lambda r: len(r.prompt_ids) - r.prefilled)
        completing = [r for r in todo if len(r.prompt_ids) - r.prefilled <= self.request_chunk]
        # prompts that finish this iteration go alone: a long prompt's next chunk waits one iteration rather
        # than lengthen the one that gives the short ones their first token
        for r in completing or todo:
            if budget <= 0:
                break
            n = min(budget, self.request_chunk, len(r.prompt_ids) - r.prefilled)
            prefill.append(Chunk(r, r.prefilled, r.prefilled + n))
            budget -= n
        decode = [r for r in self.running if r.state == State.DECODE]
        # prefill first (vLLM's default before chunked prefill), bounded: a pass that gives waiting prompts
        # their first token runs without the decode rows, at most max_decode_stall passes in a row, so a
        # visitor who just pressed Enter waits for their own prompt, not for everyone's next token too
        if decode and completing and self._stalled < self.max_decode_stall:
            decode, self._stalled = [], self._stalled + 1
        else:
            self._stalled = 0
        return Plan(prefill, decode, retired, self._steps(prefill, decode))

    def _steps(self, prefill: list[Chunk], decode: list[Request]) -> int:
        """Decode tokens each row may make in this pass (under the lock): decode_steps for a pass of decode rows
        only, each greedy without kept logits, with nobody waiting or cancelled; else 1. Clears `news` first, so a
        request that arrives after this answer stops the pass after its current step."""
        self.news.value = 0
        if self.decode_steps < 2 or prefill or not decode or self.waiting or self._cancelled:
            return 1
        return self.decode_steps if all(r.sampling.greedy and not r.keep_logits for r in decode) else 1

    def _plan_static(self, retired: list[Request]) -> Plan:
        """Static batching: admit only a whole batch at once (everyone waiting, up to max_batch, once at least
        static_batch_size are), run it until its longest request is done; rows that finished early stay in the
        batch as padding."""
        if not self.static_batch:
            batch = list(itertools.islice(self.waiting, min(len(self.waiting), self.max_batch)))
            want = min(self.static_batch_size or 1, self.max_batch)
            if len(batch) >= want and sum(self.pool.blocks_for(r.n_tokens) for r in batch) <= self.pool.n_free:
                now = time.perf_counter()
                for r in batch:
                    self.waiting.popleft()
                    r.blocks, r.state, r.admitted_at = self.pool.take(self.pool.blocks_for(r.n_tokens)), State.PREFILL, now
                    self.running.append(r)
                self.static_batch = batch
        prefill = [Chunk(r, 0, len(r.prompt_ids)) for r in self.static_batch if r.state == State.PREFILL]
        decode = [r for r in self.static_batch if r.state in (State.DECODE, State.PADDING)] if not prefill else []
        return Plan(prefill, decode, retired)

    def release_static_batch(self) -> list[Request]:
        """Policy.STATIC: once every row of the batch has ended, retire them all (their blocks back to the pool)
        and return them; otherwise nothing."""
        with self.lock:
            batch = self.static_batch
            if not batch or not all(r.finish is not None for r in batch):
                return []
            for r in batch:
                self._retire(r, r.finish)
            self.static_batch = []
            return batch

    def keeps_finished_rows(self) -> bool:
        """Whether a request that ended keeps its row until its batch is done (static batching's padding)."""
        return self.policy == Policy.STATIC

    # -- questions the engine asks (answered under the lock) ----------------------------------------------
    def work_ahead(self, req: Request) -> int | None:
        """Tokens still to generate before `req` is admitted (those running, and those waiting ahead of it);
        None once it is admitted."""
        with self.lock:
            for i, r in enumerate(self.waiting):
                if r is req:
                    ahead = list(itertools.islice(self.waiting, i))
                    return sum(r.max_new_tokens - len(r.generated) for r in self.running) + sum(r.max_new_tokens for r in ahead)
            return None

    def occupancy(self) -> tuple[dict[int, int], list[int]]:
        """(blocks held per running request id, waiting request ids in order)."""
        with self.lock:
            return {r.id: len(r.blocks) for r in self.running}, [r.id for r in self.waiting]

    def newcomer_fits(self) -> bool:
        """A short request (its prompt one chunk) waits first in line and could be admitted now. Read without the
        lock: only the engine's thread removes waiting requests, and a stale answer costs one early stop or one
        wait."""
        if self.policy != Policy.CONTINUOUS:
            return False
        try:
            r = self.waiting[0]
        except IndexError:
            return False
        return len(r.prompt_ids) <= self.request_chunk and len(self.running) < self.max_batch and self.pool.blocks_for(r.n_tokens) <= self.pool.n_free

    def blocks_for(self, n_tokens: int) -> int:
        """KV blocks that n_tokens tokens take."""
        return self.pool.blocks_for(n_tokens)

    def update(self, plan: Plan, outputs: PassOutput) -> dict[int, Finish | None]:
        """The engine's report of one pass: move each request along its life. A chunk not parked advances the
        request's prefill (its full prompt blocks join the prefix cache; a complete prompt moves it to decode); a
        sampled token is appended, and the request ends at its stop token, at its length, or when it was cancelled
        meanwhile: retired at once (blocks back to the pool), or kept as padding under static batching. Returns, for
        every request that got a token, why it ended (None: it goes on)."""
        by_id = plan.requests()
        ended: dict[int, Finish | None] = {}
        with self.lock:
            for rid, end in outputs.prefilled.items():
                r = by_id[rid]
                if r.state != State.PREFILL:
                    continue
                r.prefilled = end
                self._cache_prompt(r)
                if end >= len(r.prompt_ids):
                    r.state = State.DECODE
            for rid, tok in outputs.tokens.items():
                r = by_id[rid]
                r.generated.append(tok)
                if r.first_token_at is None:
                    r.first_token_at = outputs.at
                r.last_token_at = outputs.at
                end = Finish.EOS if tok in r.stop_ids else (Finish.LENGTH if len(r.generated) >= r.max_new_tokens else None)
                if r.id in self._cancelled:
                    end = end or Finish.CANCELLED
                if end is not None:
                    if self.policy == Policy.STATIC:
                        r.state, r.finish = State.PADDING, end  # keeps its slot until the whole batch is done
                    else:
                        self._retire(r, end)
                ended[rid] = end
        return ended

    def fail(self, requests: list[Request]) -> None:
        """A pass failed (out of memory, a bad state): its requests end with Finish.ERROR, their blocks freed."""
        with self.lock:
            for r in requests:
                self._retire(r, Finish.ERROR)

    def _cache_prompt(self, req: Request) -> None:
        """Register the request's full prompt blocks whose K/V are now written in every layer (those below
        req.prefilled) in the prefix cache (under the lock)."""
        if not self.prefix_cache:
            return
        bs = self.pool.block_size
        while (req.registered + 1) * bs <= min(req.prefilled, len(req.prompt_ids)):
            i = req.registered
            req.prefix_serial = self.pool.register(req.blocks[i], req.prefix_serial, req.prompt_ids[i * bs : (i + 1) * bs])
            req.registered += 1

    def finish(self, req: Request, reason: Finish) -> None:
        with self.lock:
            self._retire(req, reason)

    def _retire(self, req: Request, reason: Finish) -> None:
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req.blocks:
            self.pool.give_back(req.blocks)
            req.blocks = []
        if req.state != State.FINISHED:
            self.ended[reason] += 1
        self._cancelled.discard(req.id)
        req.state, req.finish, req.finished_at = State.FINISHED, reason, time.perf_counter()
        self.changed.notify_all()

    def wait_for_work(self, timeout: float) -> bool:
        """Block until something is waiting or running (or timeout); True if there is work."""
        with self.lock:
            if not (self.waiting or self.running):
                self.changed.wait(timeout)
            return bool(self.waiting or self.running)

    def snapshot(self) -> QueueStats:
        with self.lock:
            return QueueStats(
                running=len(self.running),
                waiting=len(self.waiting),
                blocks_used=self.pool.n_blocks - self.pool.n_free,
                blocks=self.pool.n_blocks,
                blocks_cached=self.pool.n_cached,
                prefix_hit_tokens=self.pool.hit_tokens,
                prefix_hit_requests=self.pool.hit_requests,
                ended={str(k): v for k, v in self.ended.items()},
            )
