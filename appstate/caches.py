"""Caches every session shares: a thread-safe LRU, the byte-bounded trace cache, and the cross-check results (held
weakly, so keeping a result never keeps a trace alive)."""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict

from pipeline.common import LRU, give_back_freed_memory


def default_trace_budget() -> int:
    """Bytes the shared trace cache may hold: LLM_EXPLORER_TRACE_BUDGET_MB, else 1,200 MB."""

    try:
        return int(float(os.environ.get("LLM_EXPLORER_TRACE_BUDGET_MB", "1200")) * 2**20)
    except ValueError:
        return 1200 << 20


class TraceCache(LRU):
    """Traces shared by every session, least recently used first out, bounded by bytes (a 2,048-token trace
    holds ~400 MB; a 40-token chat prompt on SmolLM2 9 MB, an 11-token one on Gemma-3 3 MB). The newest trace always
    stays, even alone over the budget. A server's memory grows by this cache until it is full, then stays level
    (bench/bench_class.py): the budget is LLM_EXPLORER_TRACE_BUDGET_MB, default 1,200."""

    def __init__(self, budget: int | None = None):
        super().__init__()
        self.budget = default_trace_budget() if budget is None else budget

    def evicted(self, dropped: list) -> None:
        del dropped
        give_back_freed_memory()  # the traces' pages back to the system, so RSS stays level

    def over(self) -> bool:
        return self.nbytes > self.budget

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.items.values())


class CheckResults:
    """Cross-check results per (check, the object checked: a trace or a run's result), held with a weak reference to
    that object, so keeping results never keeps a trace alive, and a new run never shows the old run's results; at
    most `max_items`, oldest out first. One store serves every session (views.proof): a check of a shared trace runs
    once however many visitors open its page, where a store per session ran it once per visitor (a class of 30
    following the presenter to the attention page ran its check, a full forward, 30 times: a quarter of the server's
    work, sampled by py-spy). Thread-safe; `compute` runs a missing check once while other callers wait for it."""

    def __init__(self, max_items: int = 512):
        self.max_items = max_items
        self._items: OrderedDict = OrderedDict()  # (key, id(owner)) -> (weak reference to owner, results)
        self._lock = threading.Lock()
        self._running: dict = {}  # (key, id(owner)) -> the lock its computation holds

    def get(self, key: str, owner):
        with self._lock:
            got = self._items.get((key, id(owner)))
            if got is None or got[0]() is not owner:
                return None
            self._items.move_to_end((key, id(owner)))
            return got[1]

    def put(self, key: str, owner, value) -> None:
        with self._lock:
            self._items[(key, id(owner))] = (weakref.ref(owner), value)
            self._items.move_to_end((key, id(owner)))
            for k in [k for k, (ref, _) in self._items.items() if ref() is None]:  # owners gone: their results too
                del self._items[k]
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def compute(self, key: str, owner, fn):
        """The stored results, or `fn()`'s, stored: one caller computes, the others asking meanwhile wait for it (if it
        fails, the next one tries)."""
        k = (key, id(owner))
        with self._lock:
            running = self._running.setdefault(k, threading.Lock())
        with running:
            got = self.get(key, owner)
            if got is None:
                got = fn()
                self.put(key, owner, got)
        with self._lock:
            if self._running.get(k) is running:
                del self._running[k]  # later callers find the results (or start afresh)
        return got
