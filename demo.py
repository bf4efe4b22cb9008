"""Demo mode: what a hosted explorer lets a visitor make the server do. Without Streamlit, unit-tested.

One switch turns it on: `LLM_EXPLORER_DEMO=1` (what `make demo` sets), or `enabled = true` in a `[demo]` section
of .streamlit/secrets.toml (the operator's file, never in git), which may also set the model allowlist, any cap
and the operator page's password:

    [demo]
    enabled = true
    models = ["smollm2-135m-instruct", "/srv/models/my-model"]   # model keys or folders; default: the embedded model
    operator_password = "..."
    new_tokens = 96                                              # any field of Caps

    policy = load_policy(secrets)       # secrets: a mapping (st.secrets), or None
    policy.enabled, policy.models, policy.caps.new_tokens
    limiter = RateLimiter(per_minute=20); limiter.allow(session_id) -> seconds to wait (0: go)
    line = FairQueue(at_once=1); with line.turn(session_id, on_wait=...): ...   # heavy experiments, fair share
    errors = ErrorLog(); rid = errors.record(exc, where)                       # logged with a traceback; visitors see rid

Outside demo mode nothing here limits anything (caps are the pages' own maxima, no queue, no rate limit).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

log = logging.getLogger("llm_explorer")


@dataclass(frozen=True)
class Caps:
    """What one visitor may ask of a demo server (each shown next to its control)."""

    prompt_tokens: int | None = 512  # tokens in a traced or generated prompt
    new_tokens: int | None = 128  # tokens one generation may produce (the generation, hardware, production, speculative and batching pages)
    sweep_tokens: int | None = 1024  # the longest prompt of a sweep (the prefill/decode, roofline and attention-kernels pages)
    repeats: int | None = 3  # timed repeats of a sweep point
    users: int | None = 8  # users in the batching page's scene
    requests_per_minute: int | None = 20  # runs one browser may start per minute (generations, sweeps, traces, tokenizing)
    address_at_once: int | None = 40  # runs one client address may have queued or running at once (a class behind one NAT fits)
    address_per_minute: int | None = 400  # runs one client address may start per minute, whatever its sessions or cookies
    classes_per_hour: int | None = 5  # live classes one client address (and one browser) may start per hour
    tokenize_chars: int | None = 20_000  # characters the tokens page tokenizes (outside demo mode: the prompt box's 200,000)
    heavy_at_once: int | None = 1  # heavy experiments running at once on the server (the rest wait in line, fairly)
    compile: bool = False  # production mode's torch.compile (a minute of the whole server's CPU)
    draft_folders: bool = False  # speculative decoding with a draft model from a typed folder


def unlimited(limit: int | None) -> bool:
    """None is "no limit", the one spelling of it in Caps (an operator's 0 in secrets.toml reads the same)."""
    return limit is None or limit <= 0


UNCAPPED = Caps(  # outside demo mode: no limit on anything
    prompt_tokens=None,
    new_tokens=None,
    sweep_tokens=None,
    repeats=None,
    users=None,
    requests_per_minute=None,
    address_at_once=None,
    address_per_minute=None,
    classes_per_hour=None,
    tokenize_chars=None,
    heavy_at_once=None,
    compile=True,
    draft_folders=True,
)


@dataclass(frozen=True)
class Policy:
    enabled: bool = False
    models: tuple[str, ...] = ()  # the allowlist (model keys or folders); empty outside demo mode
    caps: Caps = UNCAPPED
    operator_password: str | None = None

    def allows_model(self, key: str) -> bool:
        return not self.enabled or key in self.models


def _truthy(v) -> bool:
    return str(v).strip().lower() in {"1", "true", "yes", "on"}


def load_policy(secrets: Mapping | None = None, environ: Mapping | None = None) -> Policy:
    """The policy from the environment and the `[demo]` section of the secrets (either can switch it on)."""
    from pipeline.model.registry import DEFAULT, canonical_key

    env = os.environ if environ is None else environ
    sec = dict((secrets or {}).get("demo", {}) or {})
    password = sec.get("operator_password") or env.get("LLM_EXPLORER_OPERATOR_PASSWORD") or None
    if not (_truthy(env.get("LLM_EXPLORER_DEMO", "")) or _truthy(sec.get("enabled", False))):
        return Policy(operator_password=password)
    listed = sec.get("models") or [m for m in env.get("LLM_EXPLORER_MODELS", "").split(",") if m.strip()] or [DEFAULT]
    caps = replace(Caps(), **{f.name: type(getattr(Caps(), f.name))(sec[f.name]) for f in fields(Caps) if f.name in sec})
    return Policy(True, tuple(canonical_key(str(m).strip()) for m in listed), caps, password)


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


def secrets_file(root: str = ".") -> dict:
    """The operator's .streamlit/secrets.toml as a dict (what st.secrets reads), {} when there is none."""
    import tomllib

    path = os.path.join(root, ".streamlit", "secrets.toml")
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}


def warm(out=None) -> int:
    """`python -m demo`: build each allowlisted model's cache and load it once, before the server opens (so no
    visitor waits for the one-time conversion). Exit status 1 if a model cannot load."""
    import sys

    from pipeline.model.loaded import load_model
    from pipeline.model.registry import ModelLoadError

    out = out or sys.stdout
    policy = load_policy(secrets_file(), {**os.environ, "LLM_EXPLORER_DEMO": "1"})
    status = 0
    for key in policy.models:
        t = time.perf_counter()
        try:
            lm = load_model(key)
            out.write(f"{lm.label}: ready in {time.perf_counter() - t:.1f} s\n")
        except ModelLoadError as e:
            out.write(f"{key}: {e}\n")
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(warm())
