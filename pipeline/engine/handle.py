"""What a visitor and the pages see of the engine: a submitted request's Handle (an iterator of StepEvents, its
place in line, Stop), the record of each iteration (the batching page's Gantt) and the engine's stats."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import asdict, dataclass, field

from pipeline.engine.request import QueueStats, Request, State


class EngineError(RuntimeError):
    """A request ended with an error; the message is meant for the user."""


@dataclass
class IterationRecord:
    """What one engine iteration did (the batching page's Gantt and occupancy come from these)."""

    index: int
    t0: float  # seconds since the engine started
    t1: float
    decode: list[int]  # request ids that decoded (a token each step)
    prefill: list[tuple[int, int]]  # (request id, prompt tokens prefilled this iteration)
    waiting: list[int]  # request ids still queued after admission
    blocks: dict[int, int]  # request id -> KV blocks it holds
    finished: list[int]  # request ids retired this iteration
    padded: list[int] = field(default_factory=list)  # static batching: rows computed only as padding
    steps: int = 1  # tokens each row of `decode` made (a pass of several decode steps: EngineConfig.decode_steps)


@dataclass(frozen=True)
class EngineStats(QueueStats):
    """What an engine is serving at one moment (the operator page, the live panel, Ray Serve's replicas)."""

    kv_bytes_in_use: int = 0
    kv_bytes_total: int = 0
    tokens_per_s_last_minute: float = 0.0
    iterations: int = 0
    engine: str = ""  # what it is (and, from Ray Serve, which replica answered)

    def as_dict(self) -> dict:
        return asdict(self)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th... (a place in line)."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


@dataclass
class Waiting:
    """A request still in line."""

    position: int  # 1 = next to be admitted
    eta_s: float | None  # about how long until it is (None: no recent rate to go by)

    def __str__(self) -> str:
        return f"{ordinal(self.position)} in line" + (f", about {self.eta_s:.0f} s" if self.eta_s is not None else "")


class Handle:
    """A submitted request, as its visitor sees it: an iterator of StepEvents."""

    def __init__(self, engine, req: Request):
        """`engine`: the Engine serving it (core.py; not imported here: the engine imports this module)."""
        self.engine, self.request = engine, req
        self.events: queue.Queue = queue.Queue()
        self.error: str | None = None

    def __iter__(self):
        try:
            while True:
                try:
                    ev = self.events.get(timeout=1.0)
                except queue.Empty:
                    if self.request.state == State.FINISHED and self.events.empty():
                        return
                    continue
                if ev is None:
                    if self.error:
                        raise EngineError(self.error)
                    return
                yield ev
        finally:
            if self.request.finish is None:
                self.cancel()  # the visitor stopped listening: free the slot

    def stream(self, wait_every: float = 0.5):
        """The events, with a `Waiting` item every `wait_every` seconds while the request is still in line
        (for a page to say "2nd in line, about 3 s")."""
        it = iter(self)
        # a request that the worker admits at its next iteration is not "in line": say nothing for the first moment
        deadline = time.perf_counter() + wait_every
        while self.position() > 0 and self.request.finish is None and time.perf_counter() < deadline:
            threading.Event().wait(0.02)
        waiting = True
        while waiting:
            pos = self.position()
            if pos == 0 or self.request.finish is not None:
                break
            yield Waiting(pos, self.eta_s())
            if self.request.first_token_at is None:
                threading.Event().wait(wait_every)
            waiting = self.request.first_token_at is None and self.position() > 0
        yield from it

    def cancel(self) -> None:
        self.engine.scheduler.cancel(self.request)

    def position(self) -> int:
        """Place in the waiting line (1 = next); 0 once running."""
        return self.engine.scheduler.position(self.request)

    def eta_s(self) -> float | None:
        """Seconds until this request is likely admitted, from the recent token rate (None when unknown)."""
        return self.engine.eta_s(self.request)
