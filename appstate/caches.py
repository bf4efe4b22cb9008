"""Caches every session shares: a thread-safe LRU, the byte-bounded trace cache, and one session's cross-check
results (held weakly, so keeping a result never keeps a trace alive)."""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict

from pipeline.common.memo import LRU, give_back_freed_memory


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
    """Cross-check results of one session, per (check, the object checked: a trace or a run's result), held
    with a weak reference to that object, so keeping results never keeps a trace alive, and a new run never
    shows the old run's results; at most `max_items`, oldest out first."""

    def __init__(self, max_items: int = 64):
        self.max_items = max_items
        self._items: OrderedDict = OrderedDict()

    def get(self, key: str, owner):
        got = self._items.get(key)
        alive = got[0]() if got is not None else None
        if alive is None or alive is not owner:
            return None
        self._items.move_to_end(key)
        return got[1]

    def put(self, key: str, owner, value) -> None:
        self._items[key] = (weakref.ref(owner), value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)
