"""Memos. Per object (`per_object`): values that die with their object (a model, a tokenizer, a trace), never keyed
by id(), which keeps the value alive forever and can hand it to a new object that reuses the address. By value
(`shared`, `digest`, `LRU`): results kept for equal plain-data arguments, bounded (see below). For a while
(`fresh_for`): a value read from outside the process (a file, installed packages) asked for on every page run."""

from __future__ import annotations

import functools
import hashlib
import threading
import weakref
from collections import OrderedDict

import numpy as np


def per_object(fn):
    """Memoise fn(obj) in a weak-keyed dictionary: one value per live `obj`, freed when `obj` is."""
    memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(obj):
        with lock:
            if obj in memo:
                return memo[obj]
        value = fn(obj)
        with lock:
            return memo.setdefault(obj, value)

    wrapper.memo = memo
    return wrapper


def fresh_for(seconds: float, key=None):
    """Memoise a function of no arguments for `seconds` (time.monotonic), and again at once when `key()` (if given)
    changes: for what the server reads from outside (the secrets file, installed packages) that pages ask for on
    every run, where reading it each time was measurable (views.guard.policy, registry.available_models). One value,
    swapped whole (thread-safe: two callers at the edge may both read, either result is current)."""

    def wrap(fn):
        last: list = [None]  # (key, when, value)

        @functools.wraps(fn)
        def wrapper():
            import time

            k, now, got = key() if key else None, time.monotonic(), last[0]
            if got is not None and got[0] == k and now - got[1] < seconds:
                return got[2]
            value = fn()
            last[0] = (k, now, value)
            return value

        wrapper.forget = lambda: last.__setitem__(0, None)
        return wrapper

    return wrap


def give_back_freed_memory() -> None:
    """glibc's malloc_trim: return freed heap pages to the system (a no-op elsewhere). Freed tensors below glibc's
    (self-raising) mmap threshold stay in the heap otherwise: after a trace or a model is dropped, RSS would keep
    the high-water mark instead of saying what the process holds."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ---- by value: results kept for equal arguments, bounded (components' figure builders, shared by all visitors) ----
# A live class's 30 followers draw the same page from the same trace (the shared trace cache) within a second of each
# other, and building a Plotly figure is most of a page's run (the attention page: its heatmaps 40%, copying them for
# the page 20%). A builder wrapped in `shared` returns, for arguments equal to an earlier call's (numpy arrays compared
# by their bytes), the very object it built then. That object is shared between visitors: nobody changes it
# (views.render.figure draws a copy; tests/components/test_memo.py checks that page runs leave the figures as they
# were). Bounded: at most MAX_ENTRIES results and MAX_BYTES of their arguments' arrays (a proxy for the figures'
# size), the least recently used dropped first; thread-safe. An argument that is not plain data (a model, a trace
# object) is not hashed: the builder then runs as if unwrapped.
MAX_ENTRIES = 256
MAX_BYTES = 64 << 20


class _Unhashable(Exception):
    pass


def _feed(h, v) -> int:
    """Adds v to the digest; returns the bytes of the arrays it holds."""
    if isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        h.update(f"A{a.dtype.str}{a.shape}".encode())
        if a.dtype == object:
            raise _Unhashable
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
        return a.nbytes
    if v is None or isinstance(v, (str, int, float, bool, np.generic)):
        h.update(f"{type(v).__name__}:{v!r};".encode())
        return 0
    if isinstance(v, (list, tuple)):
        h.update(f"{type(v).__name__}{len(v)}[".encode())
        return sum(_feed(h, x) for x in v)
    if isinstance(v, dict):
        h.update(f"D{len(v)}{{".encode())
        return sum(_feed(h, k) + _feed(h, x) for k, x in v.items())
    raise _Unhashable


def digest(*parts) -> tuple[str, int] | None:
    """A key for plain data (arrays by their bytes), and the bytes of the arrays in it; None for anything else."""
    h = hashlib.blake2b(digest_size=16)
    try:
        n = _feed(h, parts)
    except _Unhashable:
        return None
    return h.hexdigest(), n


class LRU:
    """THE cache of the project (appstate's trace cache is one): thread-safe, least recently used out first, at most
    `max_items` values and, with `max_bytes`, that many bytes of their declared sizes; a subclass may say otherwise
    when it holds too much (`over`). The newest value always stays. `key in cache` tells, before any work, whether
    `get` would make the value anew (a caller counts that work against a visitor's limits); `peek` and `put` are the
    same in two steps."""

    def __init__(self, max_items: int = 16, max_bytes: int | None = None):
        self.max_items, self.max_bytes = max_items, max_bytes
        self.items: OrderedDict = OrderedDict()
        self.sizes: dict = {}
        self.bytes = 0
        self.lock = threading.Lock()
        self.hits = self.misses = 0
        self._making: dict = {}  # key -> an Event set when the one `get` making it is done (single flight)

    def __contains__(self, key) -> bool:
        """Whether the value is kept or being made by another caller's `get` (which this caller's `get` waits for)."""
        with self.lock:
            return key in self.items or key in self._making

    def __len__(self) -> int:
        return len(self.items)

    def over(self) -> bool:
        return len(self.items) > self.max_items or (self.max_bytes is not None and self.bytes > self.max_bytes)

    def peek(self, key):
        """The value kept for `key` (now the most recently used), or None."""
        with self.lock:
            if key not in self.items:
                self.misses += 1
                return None
            self.items.move_to_end(key)
            self.hits += 1
            return self.items[key]

    def put(self, key, value, size: int = 0) -> None:
        with self.lock:
            self.bytes += size - self.sizes.pop(key, 0)
            self.items[key] = value
            self.sizes[key] = size
            self.items.move_to_end(key)
            dropped = []
            while len(self.items) > 1 and self.over():
                k, v = self.items.popitem(last=False)
                self.bytes -= self.sizes.pop(k, 0)
                dropped.append((k, v))
        if dropped:
            self.evicted(dropped)

    def get(self, key, make, size: int = 0):
        """The value for `key`, made by `make()` (outside the lock) when it is not kept, by one caller at a time: the
        others asking for the same key meanwhile wait for it (a live class's followers all asked at once for the
        trace of the presenter's new prompt, and each traced it again). If the maker fails, the next one tries."""
        while True:
            with self.lock:
                if key in self.items:
                    self.items.move_to_end(key)
                    self.hits += 1
                    return self.items[key]
                making = self._making.get(key)
                if making is None:
                    making = self._making[key] = threading.Event()
                    break
            making.wait()
        try:
            value = make()
            self.put(key, value, size)
        finally:
            with self.lock:
                self._making.pop(key, None)
            making.set()
        return value

    def evicted(self, dropped: list) -> None:
        """Called (outside the lock) with the (key, value) pairs that just went out."""

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.sizes.clear()
            self.bytes = 0


BUILT = LRU(MAX_ENTRIES, MAX_BYTES)  # every shared builder's results


def shared(builder):
    """`builder`'s results kept per server for equal arguments (see the module's docstring). The figure returned
    carries its key as `_shared_key`, which views.render.figure uses to keep its own page-ready copy once."""
    name = f"{builder.__module__}.{builder.__qualname__}"

    @functools.wraps(builder)
    def wrapper(*args, **kwargs):
        key = digest(name, args, sorted(kwargs.items()))
        if key is None:
            return builder(*args, **kwargs)

        def build():
            out = builder(*args, **kwargs)
            try:
                out._shared_key = key[0]  # a Plotly figure takes private attributes; an array does not (and needs none)
            except AttributeError:
                pass
            return out

        return BUILT.get(key[0], build, key[1])

    return wrapper
