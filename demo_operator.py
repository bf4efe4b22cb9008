"""What a demo server's operator page keeps and guards, Streamlit-free: the errors visitors hit (logged with a
traceback under a short request id; the visitor sees only the id), the browsers seen recently, and the operator
password against online guessing (per client address).

    errors = ErrorLog(); rid = errors.record(exc, where)
    guard = PasswordGuard(); guard.wait(address); guard.attempt(ok, address)
    sessions = Sessions(); sessions.seen(browser); sessions.active()
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("llm_explorer")


class ErrorLog:
    """Errors a visitor hit: logged server-side with the traceback under a short request id; the visitor sees only
    the id. The last `keep` are kept for the operator page."""

    def __init__(self, keep: int = 200):
        self.items: deque[tuple[float, str, str, str]] = deque(maxlen=keep)  # (time, id, where, one line)
        self._lock = threading.Lock()

    def record(self, exc: BaseException, where: str) -> str:
        rid = uuid.uuid4().hex[:8]
        log.error("request %s in %s: %s", rid, where, "".join(traceback.format_exception(exc)))
        with self._lock:
            self.items.append((time.time(), rid, where, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"))
        return rid


@dataclass
class _Tries:
    failures: deque = field(default_factory=lambda: deque(maxlen=1000))  # times of wrong passwords
    locked_until: float = 0.0
    next_try: float = 0.0


class PasswordGuard:
    """The operator password against online guessing, per client address (one instance per process): after a wrong
    password every attempt from that address waits `throttle_s` (doubling with each failure in the window, at most
    `lockout_s`), and `max_failures` wrong passwords within `window_s` lock the page for that address for
    `lockout_s`, the right password included. A stranger's guesses never lock the operator out from another
    address. Every failure is logged with its time and address, never the guess.

        guard = PasswordGuard(); wait = guard.wait(address)   # seconds before an attempt is taken (0: go)
        guard.attempt(ok, address)                            # record the outcome of an attempt that was taken
    """

    def __init__(
        self, max_failures: int = 5, window_s: float = 900.0, lockout_s: float = 900.0, throttle_s: float = 2.0, clock=time.time, max_addresses: int = 4096
    ):
        self.max_failures, self.window_s, self.lockout_s, self.throttle_s, self.clock = max_failures, window_s, lockout_s, throttle_s, clock
        self.max_addresses = max_addresses
        self._by: OrderedDict[str, _Tries] = OrderedDict()
        self._lock = threading.Lock()

    def _of(self, address: str) -> _Tries:
        t = self._by.get(address)
        if t is None:
            t = self._by[address] = _Tries()
            while len(self._by) > self.max_addresses:  # the oldest address whose lock has run out goes
                old = next((a for a, x in self._by.items() if x.locked_until <= self.clock() and a != address), None)
                if old is None:
                    break
                del self._by[old]
        self._by.move_to_end(address)
        return t

    def recent(self, address: str = "local") -> int:
        """Wrong passwords from this address within the window."""
        now = self.clock()
        with self._lock:
            return sum(1 for t in self._of(address).failures if now - t <= self.window_s)

    def wait(self, address: str = "local") -> float:
        """Seconds until an attempt from this address may be made (0 when one may be made now)."""
        now = self.clock()
        with self._lock:
            t = self._of(address)
            return max(0.0, t.locked_until - now, t.next_try - now)

    def locked(self, address: str = "local") -> bool:
        with self._lock:
            return self.clock() < self._of(address).locked_until

    def attempt(self, ok: bool, address: str = "local") -> bool:
        """Record an attempt from `address`; returns whether it is accepted (False while that address is locked or
        throttled, the right password included)."""
        now = self.clock()
        with self._lock:
            t = self._of(address)
            if now < max(t.locked_until, t.next_try):
                return False
            if ok:
                return True
            t.failures.append(now)
            n = sum(1 for x in t.failures if now - x <= self.window_s)
            t.next_try = now + min(self.lockout_s, self.throttle_s * 2 ** (n - 1))
            if n >= self.max_failures:
                t.locked_until = now + self.lockout_s
            log.warning(
                "operator page: wrong password from %s at %s (%d from that address in the last %.0f min)%s",
                address,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
                n,
                self.window_s / 60,
                f"; that address is locked for {self.lockout_s / 60:.0f} min" if n >= self.max_failures else "",
            )
            return False


class Sessions:
    """Browsers seen recently (by their run-store id), for the operator page; at most `keep`."""

    def __init__(self, keep: int = 4096, clock: Callable[[], float] = time.monotonic):
        self.keep, self.clock = keep, clock
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, session: str) -> None:
        with self._lock:
            self._seen[session] = self.clock()
            self._seen.move_to_end(session)
            while len(self._seen) > self.keep:
                self._seen.popitem(last=False)

    def active(self, window_s: float = 300.0) -> int:
        now = self.clock()
        with self._lock:
            return sum(1 for t in self._seen.values() if now - t <= window_s)
