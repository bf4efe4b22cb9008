"""A demo server's limits on starting runs, Streamlit-free (the policy that sets them is demo.py): a sliding-window
rate limit per browser or address, an address's places for runs queued or running at once, and the fair line for heavy
experiments. Every limit here is an int or None, and "no limit" has one meaning (`unlimited`): None, the one spelling
of it that demo.load_policy writes, and a 0 or a negative number (an operator's 0 in secrets.toml) read the same.

    limiter = RateLimiter(per_minute=20); limiter.allow(session_id) -> seconds to wait (0: go)
    slots = AddressSlots(); with slots.hold(address, limit): ...                # raises Busy when the address is full
    line = FairQueue(at_once=1); with line.turn(session_id, what, on_wait=...): ...   # heavy experiments, fair share
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field


def limit_of(value) -> int | None:
    """A limit as written (an int, or a string of one, from secrets.toml) in its one spelling: a positive int, or None
    for no limit (None, 0 and a negative number all mean that)."""
    if value is None:
        return None
    n = int(value)
    return n if n > 0 else None


def unlimited(limit: int | None) -> bool:
    """Whether `limit` is no limit at all (None; a 0 or a negative number reads the same: limit_of)."""
    return limit is None or limit <= 0


OWN = object()  # RateLimiter: the limit given at construction


class RateLimiter:
    """At most `per_minute` starts per session in any sliding minute (None: no limit); with `window_s`, in any sliding
    window of that many seconds (the limit's name stays: 5 with window_s=3600 is five an hour)."""

    def __init__(self, per_minute: int | None, clock: Callable[[], float] = time.monotonic, max_sessions: int = 4096, window_s: float = 60.0):
        self.per_minute, self.clock, self.max_sessions, self.window_s = per_minute, clock, max_sessions, window_s
        self._seen: OrderedDict[str, deque] = OrderedDict()
        self._lock = threading.Lock()

    def wait(self, session: str, per_minute: int | None | object = OWN) -> float:
        """Seconds until `session` may start a run (0: now), recording nothing."""
        limit = self.per_minute if per_minute is OWN else per_minute
        if unlimited(limit):
            return 0.0
        now = self.clock()
        with self._lock:
            q = [t for t in self._seen.get(session, ()) if now - t < self.window_s]
            return self.window_s - (now - q[0]) if len(q) >= limit else 0.0

    def allow(self, session: str, per_minute: int | None | object = OWN) -> float:
        """Record a start and return 0, or return the seconds until one is allowed (nothing recorded).
        `per_minute` overrides the limit given at construction (the policy can change; the record stays)."""
        limit = self.per_minute if per_minute is OWN else per_minute
        if unlimited(limit):
            return 0.0
        now = self.clock()
        with self._lock:
            q = self._seen.setdefault(session, deque())
            self._seen.move_to_end(session)
            while q and now - q[0] >= self.window_s:
                q.popleft()
            if len(q) >= limit:
                return self.window_s - (now - q[0])
            q.append(now)
            while len(self._seen) > self.max_sessions:
                self._seen.popitem(last=False)
            return 0.0


class AddressSlots:
    """At most `limit` runs queued or running at once per client address (None: no limit): a script that opens a new
    session for every run sheds its cookie and its session, never its address.

        slots = AddressSlots(); with slots.hold(address, limit): ...   # raises Busy when the address is full
    """

    def __init__(self):
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, address: str) -> int:
        with self._lock:
            return self._held.get(address, 0)

    @contextmanager
    def hold(self, address: str, limit: int | None):
        if not unlimited(limit):
            with self._lock:
                n = self._held.get(address, 0)
                if n >= limit:
                    raise Busy(
                        f"Refused: your network address already has {n} runs queued or running on this server, the most one address "
                        "may have at once. Try again in a few seconds, when one of them has finished."
                    )
                self._held[address] = n + 1
        try:
            yield
        finally:
            if not unlimited(limit):
                with self._lock:
                    self._held[address] -= 1
                    if not self._held[address]:
                        del self._held[address]


class Busy(RuntimeError):
    """This session already has a heavy experiment running or waiting."""


@dataclass
class _Ticket:
    session: str
    what: str
    since: float = field(default_factory=time.monotonic)
    go: threading.Event = field(default_factory=threading.Event)


class FairQueue:
    """Heavy experiments (sweeps, kernel runs, production mode, speculative comparisons, long traces) wait here,
    `at_once` running at a time (None: no queue), served round-robin over sessions: one per session in line, so a
    visitor who starts ten gets no more turns than one who starts one. `turn()` tells the waiting visitor where
    they stand; a tab that leaves while waiting (the page's script stops) leaves the line."""

    def __init__(self, at_once: int | None = 1):
        self.at_once = at_once
        self._waiting: list[_Ticket] = []
        self._running: list[_Ticket] = []
        self._lock = threading.Lock()
        self.served = 0

    def _promote(self) -> None:
        while self._waiting and len(self._running) < self.at_once:
            t = self._waiting.pop(0)
            self._running.append(t)
            t.go.set()

    def position(self, ticket: _Ticket) -> int:
        with self._lock:
            return 0 if ticket in self._running else self._waiting.index(ticket) + 1 if ticket in self._waiting else 0

    def snapshot(self) -> dict:
        with self._lock:
            now = time.monotonic()
            return {
                "running": [(t.what, round(now - t.since, 1)) for t in self._running],
                "waiting": [(t.what, round(now - t.since, 1)) for t in self._waiting],
                "served": self.served,
            }

    @contextmanager
    def turn(self, session: str, what: str, on_wait: Callable[[int], None] | None = None, poll_s: float = 0.5):
        """Wait for a turn (calling on_wait(position) while in line), run the body, give the turn back.
        Raises Busy when this session already holds a place."""
        if unlimited(self.at_once):
            yield
            return
        t = _Ticket(session, what)
        with self._lock:
            if any(x.session == session for x in self._waiting + self._running):
                raise Busy("You already have an experiment running or waiting: it must finish before you start another.")
            self._waiting.append(t)
            self._promote()
        try:
            while not t.go.wait(poll_s):
                if on_wait is not None:
                    on_wait(self.position(t))
            yield
        finally:
            with self._lock:
                if t in self._waiting:
                    self._waiting.remove(t)
                if t in self._running:
                    self._running.remove(t)
                    self.served += 1
                self._promote()
