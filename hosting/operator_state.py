"""What a demo server's operator page keeps and guards, Streamlit-free: the errors visitors hit (logged with a
traceback under a short request id; the visitor sees only the id), the browsers seen recently, and the operator
password against online guessing (per client address).

    errors = ErrorLog(); rid = errors.record(exc, where)
    guard = PasswordGuard(); guard.wait(address); guard.attempt(ok, address)
    sessions = Sessions(); sessions.seen(browser); sessions.active()
"""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hosting.store import Store, StoreDown, open_store

log = logging.getLogger("llm_explorer")


class ErrorLog:
    """Errors a visitor hit: logged server-side with the traceback under a short request id; the visitor sees only
    the id. The last `keep` are kept for the operator page, in the one store: the operator sees every process's."""

    def __init__(self, keep: int = 200, store: Store | None = None, ns: str = "errors"):
        self.keep = keep
        self.store = store if store is not None else open_store(":memory:")
        self.ns = ns

    def record(self, exc: BaseException, where: str) -> str:
        rid = uuid.uuid4().hex[:8]
        log.error("request %s in %s: %s", rid, where, "".join(traceback.format_exception(exc)))
        line = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        try:
            with self.store.lock(self.ns):
                self.store.put(self.ns, f"{time.time():017.6f}-{rid}", json.dumps([time.time(), rid, where, line]).encode(), ttl_s=7 * 86400)
                keys = sorted(self.store.items(self.ns))
                for k in keys[: max(0, len(keys) - self.keep)]:
                    self.store.delete(self.ns, k)
        except StoreDown:  # logged above with its traceback; the operator page says the store is away
            pass
        return rid

    @property
    def items(self) -> list[tuple[float, str, str, str]]:
        """(time, id, where, one line), oldest first."""
        return [tuple(json.loads(v)) for _, v in sorted(self.store.items(self.ns).items())]


@dataclass
class _Tries:
    failures: deque = field(default_factory=lambda: deque(maxlen=1000))  # times of wrong passwords
    locked_until: float = 0.0
    next_try: float = 0.0


class PasswordGuard:
    """The operator password against online guessing, per client address, counted in the one store (every process
    sees the same failures): after a wrong password every attempt from that address waits `throttle_s` (doubling
    with each failure in the window, at most `lockout_s`), and `max_failures` wrong passwords within `window_s` lock
    the page for that address for `lockout_s`, the right password included. A stranger's guesses never lock the
    operator out from another address. Every failure is logged with its time and address, never the guess. While the
    store cannot be reached, no attempt is accepted (StoreDown: the page says so).

        guard = PasswordGuard(); wait = guard.wait(address)   # seconds before an attempt is taken (0: go)
        guard.attempt(ok, address)                            # record the outcome of an attempt that was taken
    """

    def __init__(
        self,
        max_failures: int = 5,
        window_s: float = 900.0,
        lockout_s: float = 900.0,
        throttle_s: float = 2.0,
        clock=time.time,
        max_addresses: int = 4096,
        store: Store | None = None,
        ns: str = "password",
    ):
        self.max_failures, self.window_s, self.lockout_s, self.throttle_s, self.clock = max_failures, window_s, lockout_s, throttle_s, clock
        self.max_addresses = max_addresses
        self.store = store if store is not None else open_store(":memory:")
        self.ns = ns

    def _of(self, address: str) -> _Tries:
        raw = self.store.get(self.ns, address)
        if raw is None:
            return _Tries()
        d = json.loads(raw)
        return _Tries(deque(d["f"], maxlen=1000), d["l"], d["n"])

    def _keep(self, address: str, t: _Tries) -> None:
        ttl = max(self.window_s, self.lockout_s) + 60
        self.store.put(self.ns, address, json.dumps({"f": list(t.failures), "l": t.locked_until, "n": t.next_try}).encode(), ttl_s=ttl)

    def recent(self, address: str = "local") -> int:
        """Wrong passwords from this address within the window."""
        now = self.clock()
        return sum(1 for t in self._of(address).failures if now - t <= self.window_s)

    def wait(self, address: str = "local") -> float:
        """Seconds until an attempt from this address may be made (0 when one may be made now)."""
        now = self.clock()
        t = self._of(address)
        return max(0.0, t.locked_until - now, t.next_try - now)

    def locked(self, address: str = "local") -> bool:
        return self.clock() < self._of(address).locked_until

    def attempt(self, ok: bool, address: str = "local") -> bool:
        """Record an attempt from `address`; returns whether it is accepted (False while that address is locked or
        throttled, the right password included)."""
        with self.store.lock(self.ns):
            now = self.clock()
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
            self._keep(address, t)
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
    """Browsers seen recently (by their run-store id), for the operator page, in the one store (every process's
    visitors); each browser written at most every WRITE_S by a process, its entry gone after `keep_s`."""

    WRITE_S = 30.0

    def __init__(self, keep: int = 4096, clock: Callable[[], float] = time.time, store: Store | None = None, ns: str = "browsers", keep_s: float = 3600.0):
        self.keep, self.clock, self.keep_s = keep, clock, keep_s
        self.store = store if store is not None else open_store(":memory:")
        self.ns = ns
        self._written: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, session: str) -> None:
        now = self.clock()
        with self._lock:
            last = self._written.get(session)
            if last is not None and 0 <= now - last < self.WRITE_S:
                return
            self._written[session] = now
            self._written.move_to_end(session)
            while len(self._written) > self.keep:
                self._written.popitem(last=False)
        self.store.put(self.ns, session, json.dumps(now).encode(), ttl_s=self.keep_s)

    def active(self, window_s: float = 300.0) -> int:
        now = self.clock()
        return sum(1 for v in self.store.items(self.ns).values() if now - json.loads(v) <= window_s + self.WRITE_S)
