"""Timing helpers shared by every measurement: device sync, best-of-N, real text of an exact token count.

A GPU runs kernels asynchronously, so a wall-clock time means something only after `sync(device)`.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

SAMPLE_TEXT = (
    "The sky looks blue because air molecules scatter short wavelengths of sunlight more than long ones. "
    "At sunset the light crosses more air, so the blue is scattered away and reds remain. "
)


def sync(device: torch.device | str | None = None) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type == "cuda":
        if torch.cuda.is_available():
            torch.cuda.synchronize(dev)


def syncer(device: torch.device) -> Callable[[], None]:
    """A zero-argument sync for `device` (cheap to call in hooks)."""
    if torch.device(device).type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def best_of(fn: Callable[[], object], device: torch.device, reps: int = 5, warmup: bool = True) -> float:
    """Seconds of the fastest of `reps` device-synchronised calls of fn (after one warm-up call)."""
    s = syncer(device)
    if warmup:
        fn()
    s()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        s()
        best = min(best, time.perf_counter() - t)
    return best


def ids_of_length(lm, n: int) -> torch.Tensor:
    """[1, n] token ids of real text, repeated and cut to exactly n tokens, on the model's device."""
    ids = lm.tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    ids = (ids * (n // len(ids) + 1))[:n]
    return torch.tensor([ids], device=lm.device)


@dataclass(frozen=True)
class Ratios:
    """A speed ratio measured in interleaved repeats: one value per repeat, both sides timed next to each other
    (a shared machine drifts between repeats; a ratio taken within one repeat cancels most of it). The headline
    is the median with its range, flagged noisy when the repeats disagree on the direction (a tie)."""

    values: tuple[float, ...]

    @property
    def median(self) -> float | None:
        import statistics

        return statistics.median(self.values) if self.values else None

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.values), max(self.values)) if self.values else None

    @property
    def noisy(self) -> bool:
        """Fewer than 3 repeats, or repeats on both sides of 1x (or at it): they do not agree which side is faster.
        Every repeat on one side is a finding, however wide the range (5 of 5 slower is a slowdown)."""
        if len(self.values) < 3:
            return True
        return not (min(self.values) > 1.0 or max(self.values) < 1.0)

    def __str__(self) -> str:
        if not self.values:
            return "—"
        lo, hi = self.spread
        return f"{self.median:.2f}× ({lo:.2f}–{hi:.2f})" + (", noisy: a tie" if self.noisy else "")


@dataclass(frozen=True)
class Samples:
    """Repeated measurements of one quantity (seconds, tokens/s, a share): the median with its range, and whether
    two of them differ by more than the repeats' own spread (ranges that do not overlap)."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        import statistics

        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    def fmt(self, scale: float = 1000.0, unit: str = "ms", digits: int = 0) -> str:
        """ "12 ms (10–15)": the median and, with more than one repeat, the range."""
        m = f"{self.median * scale:,.{digits}f}"
        if len(self.values) < 2:
            return f"{m} {unit}"
        return f"{m} {unit} ({self.lo * scale:,.{digits}f}–{self.hi * scale:,.{digits}f})"

    def above(self, other: Samples, factor: float = 1.0) -> bool:
        """Every repeat of this one is more than `factor` times every repeat of the other (needs 2 repeats)."""
        return len(self.values) >= 2 and len(other.values) >= 2 and self.lo > factor * other.hi

    def tells_apart(self, other: Samples) -> bool:
        """Whether the repeats separate the two (one above the other); False: within the machine's noise."""
        return self.above(other) or other.above(self)


def interleaved(fns: dict[str, Callable[[], float]], repeats: int, progress: Callable[[float, str], None] | None = None) -> dict[str, Samples]:
    """Each fn() returns one measurement; every repeat runs all of them, in an order rotated each repeat, so a
    machine that slows down for a while slows every one of them alike (a shared machine drifts between repeats)."""
    names = list(fns)
    got: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for i, n in enumerate(order):
            got[n].append(float(fns[n]()))
            if progress:
                progress((r * len(names) + i + 1) / (repeats * len(names)), f"repeat {r + 1} of {repeats}: {n}")
    return {n: Samples(tuple(v)) for n, v in got.items()}


# ------------------------------------------------------------------------------------------ what else ran
KINDS = {  # kind -> (singular, plural) as a page says it
    "trace": ("traced forward pass", "traced forward passes"),
    "generation": ("generation", "generations"),
    "experiment": ("timed experiment", "timed experiments"),
}


@dataclass(frozen=True)
class Busy:
    """What else this process was running while a measurement ran: {kind: how many at most}. Empty: the model
    had the machine to itself (as far as this server's own records go: traces, the engine's steps, experiments)."""

    others: tuple[tuple[str, int], ...] = ()

    def __bool__(self) -> bool:
        return any(n for _, n in self.others)

    def __str__(self) -> str:
        if not self:
            return "Nothing else ran on this server while it was measured."
        parts = [f"{n} other {KINDS.get(k, (k, k + 's'))[n != 1]}" for k, n in self.others if n]
        return f"{' and '.join(parts)} ran on this server while this was measured: this time is inflated."

    def less_one(self, kind: str) -> Busy:
        """The same, less one of `kind` (a request's own engine steps counted it among the batch)."""
        return Busy(tuple((k, max(0, n - 1) if k == kind else n) for k, n in self.others))

    def merged(self, other: Busy) -> Busy:
        d = dict(self.others)
        for k, n in other.others:
            d[k] = max(d.get(k, 0), n)
        return Busy(tuple(sorted(d.items())))


class Activity:
    """The process's record of model work, so a time shown can say what else ran while it was measured. Each
    piece of work is registered from start to end with its kind and how many requests it served (an engine step
    serves its batch); `during(t0, t1)` tells what overlapped an interval. Work started inside a job (in its
    thread, or in an engine it drives there: the batching scene's own steps) belongs to that job and is never
    "something else" to it or to its other parts. Thread-safe; keeps the last `keep`.

        with ACTIVITY.doing("trace") as job: ...      # afterwards job.busy: what else overlapped it
    """

    def __init__(self, keep: int = 2048, clock: Callable[[], float] = time.perf_counter):
        import collections
        import threading

        self.clock = clock
        self._active: dict[int, tuple[str, int, float, int]] = {}  # token -> (kind, n, t0, the job it belongs to)
        self._done: collections.deque = collections.deque(maxlen=keep)  # (kind, n, t0, t1, the job it belongs to)
        self._lock = threading.Lock()
        self._next = 0

    def start(self, kind: str, n: int = 1) -> int:
        with self._lock:
            self._next += 1
            self._active[self._next] = (kind, n, self.clock(), _OWNER.get() or self._next)
            return self._next

    def end(self, token: int) -> Busy:
        """Close a piece of work; returns what else overlapped it (not counting its own job's parts)."""
        t1 = self.clock()
        with self._lock:
            kind, n, t0, owner = self._active.pop(token)
        busy = self.during(t0, t1, own=owner)
        with self._lock:
            self._done.append((kind, n, t0, t1, owner))
        return busy

    def during(self, t0: float, t1: float, exclude: int | None = None, own: int | None = None) -> Busy:
        """At most how many of each kind ran at once (approximated by the largest single entry, counts of
        overlapping entries for work of one request each) in [t0, t1], besides `exclude` and the parts of job `own`."""
        count: dict[str, int] = {}
        with self._lock:
            entries = [(k, n) for tok, (k, n, s, o) in self._active.items() if tok != exclude and o != own and s < t1]
            # newest first: entries are kept in the order they ended (give or take the few microseconds between an
            # entry's clock reading and its append), so the scan stops a second before t0 instead of reading all
            # `keep` of them (0.2 ms, on every engine iteration)
            for k, n, s, e, o in reversed(self._done):
                if e < t0 - 1.0:
                    break
                if e > t0 and s < t1 and o != own:
                    entries.append((k, n))
        for k, n in entries:
            count[k] = max(count.get(k, 0), n) if k == "generation" else count.get(k, 0) + n
        return Busy(tuple(sorted(count.items())))

    def doing(self, kind: str, n: int = 1):
        return _Job(self, kind, n)


class _Job:
    def __init__(self, activity: Activity, kind: str, n: int):
        self.activity, self.kind, self.n, self.busy = activity, kind, n, Busy()

    def __enter__(self):
        self.token = self.activity.start(self.kind, self.n)
        self._scope = _OWNER.set(_OWNER.get() or self.token)  # what starts inside (this thread) is part of this job
        return self

    def __exit__(self, *exc) -> None:
        _OWNER.reset(self._scope)
        self.busy = self.activity.end(self.token)


_OWNER: contextvars.ContextVar[int | None] = contextvars.ContextVar("activity_job", default=None)
ACTIVITY = Activity()  # one per process: every model's traces, engine steps and experiments
