"""A demo server's limits on starting runs, Streamlit-free (the policy that sets them is hosting/demo.py): a sliding-window
rate limit per browser or address, an address's places for runs queued or running at once, and the fair line for heavy
experiments. The counters live in the one store (hosting.store), so they hold across every process of the app and
across restarts; the fair line is each process's own (it shares that process's model and CPU). Every limit here is an int or None, and "no limit" has one meaning (`unlimited`): None, the one spelling
of it that demo.load_policy writes, and a 0 or a negative number (an operator's 0 in secrets.toml) read the same.

    limiter = RateLimiter(per_minute=20); limiter.allow(session_id) -> seconds to wait (0: go)
    slots = AddressSlots(); with slots.hold(address, limit): ...                # raises Busy when the address is full
    line = FairQueue(at_once=1); with line.turn(session_id, what, on_wait=...): ...   # heavy experiments, fair share
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from hosting.store import Store, StoreDown, open_store


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
    window of that many seconds (the limit's name stays: 5 with window_s=3600 is five an hour). The starts are counted
    in the one store (hosting.store, namespace `ns`), so every process of the app counts them once: a script that
    lands on several processes does not multiply its quota. Raises StoreDown when the store cannot be reached (the
    page then refuses the run with the store's message: a limit that cannot be counted is not skipped)."""

    def __init__(
        self,
        per_minute: int | None,
        clock: Callable[[], float] = time.time,
        max_sessions: int = 4096,
        window_s: float = 60.0,
        store: Store | None = None,
        ns: str = "rate",
    ):
        self.per_minute, self.clock, self.max_sessions, self.window_s = per_minute, clock, max_sessions, window_s
        self.store = store if store is not None else open_store(":memory:")
        self.ns = ns

    def _starts(self, session: str, now: float) -> list[float]:
        raw = self.store.get(self.ns, session)
        return [t for t in (json.loads(raw) if raw else ()) if now - t < self.window_s]

    def wait(self, session: str, per_minute: int | None | object = OWN) -> float:
        """Seconds until `session` may start a run (0: now), recording nothing."""
        limit = self.per_minute if per_minute is OWN else per_minute
        if unlimited(limit):
            return 0.0
        now = self.clock()
        q = self._starts(session, now)
        return self.window_s - (now - q[-limit]) if len(q) >= limit else 0.0

    def allow(self, session: str, per_minute: int | None | object = OWN) -> float:
        """Record a start and return 0, or return the seconds until one is allowed (nothing recorded).
        `per_minute` overrides the limit given at construction (the policy can change; the record stays)."""
        limit = self.per_minute if per_minute is OWN else per_minute
        if unlimited(limit):
            return 0.0
        now = self.clock()
        with self.store.lock(self.ns):
            q = self._starts(session, now)
            if len(q) >= limit:
                return self.window_s - (now - q[-limit])
            q.append(now)
            self.store.put(self.ns, session, json.dumps(q[-max(limit, 1) :]).encode(), ttl_s=self.window_s + 1)
            return 0.0


class AddressSlots:
    """At most `limit` runs queued or running at once per client address (None: no limit): a script that opens a new
    session for every run sheds its cookie and its session, never its address. Counted in the one store across every
    process: each run holds a lease (LEASE_S: a process killed mid-run frees its places when its leases run out).

        slots = AddressSlots(); with slots.hold(address, limit): ...   # raises Busy when the address is full
    """

    LEASE_S = 900.0

    def __init__(self, store: Store | None = None, ns: str = "slots"):
        self.store = store if store is not None else open_store(":memory:")
        self.ns = ns

    def _held(self, address: str, now: float) -> dict[str, float]:
        raw = self.store.get(self.ns, address)
        return {k: t for k, t in (json.loads(raw) if raw else {}).items() if t > now}

    def count(self, address: str) -> int:
        return len(self._held(address, time.time()))

    @contextmanager
    def hold(self, address: str, limit: int | None):
        if unlimited(limit):
            yield
            return
        token = secrets.token_hex(8)
        try:
            self._take(address, limit, token)
        except StoreDown as e:  # a limit that cannot be counted is not skipped
            raise Busy(f"Refused for now: {e}. Try again in a moment.") from e
        try:
            yield
        finally:
            try:
                self._give(address, token)
            except StoreDown:  # the lease runs out by itself
                pass

    def _take(self, address: str, limit: int, token: str) -> None:
        with self.store.lock(self.ns):
            now = time.time()
            held = self._held(address, now)
            if len(held) >= limit:
                raise Busy(
                    f"Refused: your network address already has {len(held)} runs queued or running on this server, the most one address "
                    "may have at once. Try again in a few seconds, when one of them has finished."
                )
            held[token] = now + self.LEASE_S
            self.store.put(self.ns, address, json.dumps(held).encode(), ttl_s=self.LEASE_S)

    def _give(self, address: str, token: str) -> None:
        with self.store.lock(self.ns):
            held = self._held(address, time.time())
            held.pop(token, None)
            if held:
                self.store.put(self.ns, address, json.dumps(held).encode(), ttl_s=self.LEASE_S)
            else:
                self.store.delete(self.ns, address)


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
