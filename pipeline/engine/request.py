"""A request's vocabulary, shared by the scheduler (pipeline.engine.scheduler), the engine (core) and a visitor's
handle: the request and its life (State, why it ended: Finish), one iteration's work (Plan: prefill Chunks and
decode rows) and what a pass reports back (PassOutput), the two policies, the refusals (QueueFull, TooLarge) and the
queue's stats. Only the scheduler writes a request's life (`state`, `blocks`, `prefilled`, `finish`...)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from pipeline.forward.sampling import GREEDY, Sampling
from pipeline.generation.events import Finish


class QueueFull(RuntimeError):
    """The server is busy: the waiting queue is full. The message is meant for the user."""


class TooLarge(ValueError):
    """A request that could never fit the KV memory, however long it waited."""


class State(StrEnum):
    """Where a request is in its life: waiting -> prefill -> decode -> finished (`Request.finish` says why). Under
    static batching a request that ended keeps its row as padding until its whole batch is done."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    PADDING = "padding"
    FINISHED = "finished"


class Policy(StrEnum):
    CONTINUOUS = "continuous"  # admit at every iteration (Orca)
    STATIC = "static"  # admit a whole batch, run it until its longest request is done


_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Sampling = GREEDY
    stop_ids: frozenset[int] = frozenset()
    name: str = ""  # who asked (a page, a user in the batching demo)
    keep_logits: bool = False  # every step's full logits on its event (the misconceptions page compares them bit for bit)
    id: int = field(default_factory=lambda: next(_ids))
    arrived: float = field(default_factory=time.perf_counter)
    # its life, written by the scheduler alone
    state: State = State.WAITING
    blocks: list[int] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens in the cache so far
    cached: int = 0  # of them, tokens whose K/V came from the prefix cache (another prompt's blocks, shared)
    registered: int = 0  # full prompt blocks in the prefix cache (matched or registered by this request)
    prefix_serial: int = 0  # the prefix cache's serial of the last of them (BlockPool.register)
    generated: list[int] = field(default_factory=list)
    finish: Finish | None = None  # why it ended (set with State.FINISHED or State.PADDING)
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


class Chunk(NamedTuple):
    """Prompt tokens [start, end) of one request to prefill this iteration."""

    request: Request
    start: int
    end: int


@dataclass
class Plan:
    """One iteration's work."""

    prefill: list[Chunk]
    decode: list[Request]  # requests that decode one token this iteration
    retired: list[Request]  # cancelled since the last plan (blocks already freed)
    steps: int = 1  # decode tokens each row may make in this pass (several: Scheduler.decode_steps)

    @property
    def empty(self) -> bool:
        return not (self.prefill or self.decode)

    def requests(self) -> dict[int, Request]:
        """The plan's requests by id (prefill chunks first)."""
        return {r.id: r for r in [c.request for c in self.prefill] + self.decode}


@dataclass
class PassOutput:
    """What the engine's pass did for a plan, reported back to the scheduler (`update`)."""

    prefilled: dict[int, int] = field(default_factory=dict)  # request id -> prompt tokens now in the cache (chunks not parked)
    tokens: dict[int, int] = field(default_factory=dict)  # request id -> the token sampled for it, in the order sampled
    at: float = 0.0  # when the pass ended (time.perf_counter)


@dataclass(frozen=True)
class QueueStats:
    """The scheduler's side of the engine's stats, at one moment."""

    running: int
    waiting: int
    blocks_used: int
    blocks: int
    blocks_cached: int
    prefix_hit_tokens: int
    prefix_hit_requests: int
    ended: dict[str, int]  # requests retired so far, by Finish value
