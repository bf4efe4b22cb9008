"""Iteration-level scheduling (Orca, OSDI 2022) over a paged KV memory (vLLM's PagedAttention): no model here.

Every engine iteration asks `plan()` what to run:
  * retire cancelled requests (their blocks go back to the pool at once);
  * admit waiting requests in arrival order while the batch has room and the pool has the blocks for the
    request's whole budget (prompt + max new tokens): a request that does not fit waits; nothing is preempted;
  * give prefill work: at most `prefill_chunk` prompt tokens per iteration in all and `request_chunk` per request,
    the shortest remaining prompt first, and prompts that complete this iteration without the chunks of longer
    ones. A long prompt is prefilled over several iterations while the running requests keep decoding, and a
    short question arriving meanwhile does not wait for a long chunk: the engine stops that chunk and the decode
    tokens at the layer they have reached (engine.paged, "parked"), and the question is prefilled the next
    iteration while they resume (measured in bench_serving.py's "steady" and "long-prompt" workloads);
  * decode one token for every request whose prompt is in the cache.
`finish()` retires a request the same iteration it ends (EOS, length, cancel, error).

Memory: a pool of fixed-size blocks (`block_size` tokens of K and V in every layer). A request reserves the
blocks for prompt + max_new_tokens when admitted (vLLM allocates block by block and preempts when the pool runs
out; reserving up front never has to preempt, at the price of holding blocks a request that stops early never
fills). The waiting queue is bounded: beyond `max_queue` a submission is refused with a clear message.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field


class QueueFull(RuntimeError):
    """The server is busy: the waiting queue is full. The message is meant for the user."""


class TooLarge(ValueError):
    """A request that could never fit the KV memory, however long it waited."""


@dataclass
class Sampling:
    """One request's own sampling settings (each row of a batch is sampled with its own)."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = 0  # each request has its own generator: reproducible whatever else runs
    n_top: int = 10  # candidates reported per step


_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stop_ids: frozenset[int] = frozenset()
    name: str = ""  # who asked (a page, a user in the batching demo)
    id: int = field(default_factory=lambda: next(_ids))
    arrived: float = field(default_factory=time.perf_counter)
    # state, written by the scheduler and the engine
    state: str = "waiting"  # waiting -> prefill -> decode -> finished
    blocks: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the cache so far
    generated: list[int] = field(default_factory=list)
    finish: str | None = None  # "eos" | "length" | "cancelled" | "error: ..."
    cancelled: bool = False
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None  # retired (static batching: when the whole batch is done)

    @property
    def n_tokens(self) -> int:
        """Tokens whose K/V the request needs room for: prompt + every new token."""
        return len(self.prompt_ids) + self.max_new_tokens

    @property
    def context_len(self) -> int:
        return len(self.prompt_ids) + len(self.generated)


class BlockPool:
    """Fixed-size KV blocks, handed out and taken back (ids only: the tensors live in the engine)."""

    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise ValueError("the KV pool needs at least one block of at least one token")
        self.n_blocks, self.block_size = n_blocks, block_size
        self._free = list(range(n_blocks - 1, -1, -1))

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    @property
    def n_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"{n} blocks asked, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def give_back(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


@dataclass
class Plan:
    """One iteration's work."""

    prefill: list[tuple[Request, int, int]]  # (request, first prompt token, end) chunks to prefill
    decode: list[Request]  # requests that decode one token this iteration
    retired: list[Request]  # cancelled since the last plan (blocks already freed)

    @property
    def empty(self) -> bool:
        return not (self.prefill or self.decode)


class Scheduler:
    """Thread-safe: submit / cancel come from visitors' threads, plan / finish from the engine's."""

    def __init__(self, pool: BlockPool, max_batch: int = 32, max_queue: int = 64, prefill_chunk: int = 256, request_chunk: int | None = None):
        self.pool, self.max_batch, self.max_queue, self.prefill_chunk = pool, max_batch, max_queue, prefill_chunk
        self.request_chunk = request_chunk or prefill_chunk
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted: prefilling or decoding
        self.lock = threading.Lock()
        self.ended: Counter[str] = Counter()  # requests retired, by reason (eos, length, cancelled...)
        self.changed = threading.Condition(self.lock)

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
                raise QueueFull(f"The server is busy: {len(self.waiting)} requests are already waiting. Try again in a moment.")
            self.waiting.append(req)
            self.changed.notify_all()

    def cancel(self, req: Request) -> None:
        """Stop a request (Stop pressed, tab closed): it is retired and its blocks freed at the next plan."""
        with self.lock:
            req.cancelled = True
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
        with self.lock:
            retired = [r for r in list(self.waiting) + self.running if r.cancelled and r.state != "finished"]
            for r in retired:
                self._retire(r, "cancelled")
            now = time.perf_counter()
            while self.waiting and len(self.running) < self.max_batch:
                r = self.waiting[0]
                need = self.pool.blocks_for(r.n_tokens)
                if need > self.pool.n_free:
                    break  # first come, first served: nobody overtakes a waiting request
                self.waiting.popleft()
                r.blocks, r.state, r.admitted_at = self.pool.take(need), "prefill", now
                self.running.append(r)
            budget, prefill = self.prefill_chunk, []
            # the shortest remaining prompt first: a short question that arrives while a long prompt is being
            # prefilled chunk by chunk gets its first token next iteration, not after the whole long prompt
            todo = sorted((r for r in self.running if r.state == "prefill"), key=lambda r: len(r.prompt_ids) - r.prefilled)
            completing = [r for r in todo if len(r.prompt_ids) - r.prefilled <= self.request_chunk]
            # prompts that finish this iteration go alone: a long prompt's next chunk waits one iteration rather
            # than lengthen the one that gives the short ones their first token
            for r in completing or todo:
                if budget <= 0:
                    break
                n = min(budget, self.request_chunk, len(r.prompt_ids) - r.prefilled)
                prefill.append((r, r.prefilled, r.prefilled + n))
                budget -= n
            decode = [r for r in self.running if r.state == "decode"]
            return Plan(prefill, decode, retired)

    def finish(self, req: Request, reason: str) -> None:
        with self.lock:
            self._retire(req, reason)

    def _retire(self, req: Request, reason: str) -> None:
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req.blocks:
            self.pool.give_back(req.blocks)
            req.blocks = []
        if req.state != "finished":
            self.ended[reason] += 1
        req.state, req.finish, req.finished_at = "finished", reason, time.perf_counter()
        self.changed.notify_all()

    def wait_for_work(self, timeout: float) -> bool:
        """Block until something is waiting or running (or timeout); True if there is work."""
        with self.lock:
            if not (self.waiting or self.running):
                self.changed.wait(timeout)
            return bool(self.waiting or self.running)

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "running": len(self.running),
                "waiting": len(self.waiting),
                "blocks_used": self.pool.n_blocks - self.pool.n_free,
                "blocks": self.pool.n_blocks,
                "ended": dict(self.ended),
            }
