"""What visitors' actions add to the server, bounded so that no client can evict another's: saved runs (a
browser's, restored after a refresh), frozen views (?view=), long prompts behind links (?p=); and a page's last
run in its session."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

DAY = 86400.0


class Full(RuntimeError):
    """A store refused an entry: every entry that could make room is still within the time it was promised."""


@dataclass
class _Owned:
    value: Any
    browser: str
    address: str
    at: float
    size: int


class OwnedStore:
    """What visitors' actions add to the server (saved runs, frozen views, long prompts), bounded so that one client
    can never evict another's entries:
      - per browser (`per_browser`, in `size` units): over it, that browser's own oldest entry goes;
      - per client address (`per_address`) and in total (`total`): over either, the oldest entry (of that address,
        or of anyone) that is older than `keep_s` goes, else the new entry is refused (Full). So whatever strangers
        do, an entry stays for at least `keep_s` unless its own browser replaces it (or the server restarts).
    Entries for which `expendable(value)` is true (a browser that has no runs yet) go first, whoever made them."""

    def __init__(
        self,
        per_browser: int,
        per_address: int,
        total: int,
        keep_s: float,
        size: Callable[[Any], int] = lambda v: 1,
        expendable: Callable[[Any], bool] = lambda v: False,
        clock: Callable[[], float] = time.time,
    ):
        self.per_browser, self.per_address, self.total, self.keep_s = per_browser, per_address, total, keep_s
        self.size, self.expendable, self.clock = size, expendable, clock
        self.items: OrderedDict[str, _Owned] = OrderedDict()
        self.lock = threading.RLock()

    def __contains__(self, key) -> bool:
        with self.lock:
            return key in self.items

    def __len__(self) -> int:
        return len(self.items)

    def get(self, key: str):
        with self.lock:
            e = self.items.get(key)
            return None if e is None else e.value

    def owner(self, key: str) -> tuple[str, str] | None:
        with self.lock:
            e = self.items.get(key)
            return None if e is None else (e.browser, e.address)

    def _used(self, pick) -> int:
        return sum(e.size for e in self.items.values() if pick(e))

    def _victim(self, pick, new_key: str, protected: bool):
        """The entry to drop among those `pick` selects (never the new one): expendable ones first, then the oldest
        (only one older than keep_s when `protected`)."""
        now = self.clock()
        cands = [(k, e) for k, e in self.items.items() if k != new_key and pick(e)]
        for k, e in cands:
            if self.expendable(e.value):
                return k
        for k, e in sorted(cands, key=lambda ke: ke[1].at):
            if not protected or now - e.at >= self.keep_s:
                return k
        return None

    def put(self, key: str, value, browser: str, address: str) -> None:
        """Keep `value` under `key` for (browser, address); raises Full (nothing kept) when no room can be made."""
        with self.lock:
            old = self.items.get(key)
            if old is not None and old.browser != browser:
                old.at = self.clock()  # the same content from another browser (a long prompt's id is its hash): one entry
                return
            e = _Owned(value, browser, address, self.clock(), self.size(value))
            if e.size > self.per_browser:
                raise Full(f"this is larger than the {self.per_browser:,} one browser may keep on this server")
            self.items[key] = e
            self.items.move_to_end(key)
            for pick, limit, protected in (
                (lambda x: x.browser == browser, self.per_browser, False),
                (lambda x: x.address == address, self.per_address, True),
                (lambda x: True, self.total, True),
            ):
                while self._used(pick) > limit:
                    k = self._victim(pick, key, protected)
                    if k is None:
                        del self.items[key]
                        if old is not None:
                            self.items[key] = old
                        raise Full("the server keeps what others shared for a promised time, and its store is full of it")
                    del self.items[k]

    def touch(self, key: str) -> None:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)


class SharedTexts:
    """Prompts too long for a link, kept on the server under a short id (the first 12 hex digits of their
    SHA-256), so a link can carry the id instead (?p=id). Bounded in characters per browser (its own oldest out),
    per client address and in total (an OwnedStore: a prompt stays at least KEEP_S whatever strangers send); the
    same text always gets the same id, on any server."""

    KEEP_S = 7 * DAY

    def __init__(self, budget_chars: int = 40_000_000, per_browser: int = 1_000_000, per_address: int = 10_000_000, clock=time.time):
        self.store = OwnedStore(per_browser, per_address, budget_chars, self.KEEP_S, size=len, clock=clock)

    @staticmethod
    def id_of(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]

    def put(self, text: str, browser: str = "?", address: str = "local") -> str:
        """The text's id; raises Full when it cannot be kept."""
        key = self.id_of(text)
        self.store.put(key, text, browser, address)
        return key

    def get(self, key: str) -> str | None:
        return self.store.get(key)


# ------------------------------------------------------------------------- a page's last run, per session
RUNS = "_runs"  # session-state key: {slot: (model key, value)}


def remember(state: MutableMapping, slot: str, model_key: str, value) -> None:
    """Keep `value` as this session's last result for `slot` (one per slot: a new run replaces the old)."""
    state.setdefault(RUNS, {})[slot] = (model_key, value)


def recall(state: MutableMapping, slot: str, model_key: str):
    """This session's last result for `slot` if it was made with `model_key`, else None."""
    got = state.get(RUNS, {}).get(slot)
    return got[1] if got is not None and got[0] == model_key else None


def forget_run(state: MutableMapping, slot: str) -> None:
    state.get(RUNS, {}).pop(slot, None)


class RunStore:
    """A page's last runs survive a browser refresh (which opens a new Streamlit session), and belong to the browser
    that made them: they are kept here under the browser's own id (a cookie the app sets, never in the address). A
    link carries a view (model, prompt, settings), never this id.

    A visitor who wants to hand over results freezes them: `freeze` stores a copy under a fresh random id (?view=),
    and whoever opens that link gets a copy of the copy in their own runs (`thaw`), under their own id. Nothing
    anyone does through a link reaches the owner's runs.

    Both are OwnedStores, so strangers cannot empty them: a browser's runs are kept at least KEEP_RUNS_S (browsers
    that have no runs yet go first: a flood of cookie-less visits evicts only its own kind), a frozen view at least
    KEEP_VIEW_S unless its own browser makes more than `views_per_browser` (its oldest goes)."""

    KEEP_RUNS_S = DAY
    KEEP_VIEW_S = 7 * DAY

    def __init__(
        self,
        max_sessions: int = 512,
        max_frozen: int = 1024,
        per_address: int = 128,
        views_per_browser: int = 16,
        views_per_address: int = 128,
        clock=time.time,
    ):
        self.sessions = OwnedStore(1, per_address, max_sessions, self.KEEP_RUNS_S, expendable=lambda runs: not runs, clock=clock)
        self.views = OwnedStore(views_per_browser, views_per_address, max_frozen, self.KEEP_VIEW_S, clock=clock)
        self.views_per_browser = views_per_browser
        self.lock = threading.Lock()

    def attach(self, state: MutableMapping, browser: str | None, new_id: Callable[[], str], address: str = "local") -> str:
        """Give this session its id (its browser's, or a new one when the browser has none yet) and keep its runs
        under it; a refresh of the same browser starts from a copy of its runs. Returns the id. (When the store has
        no room, the runs last as long as the tab.)"""
        with self.lock:
            if "_sid" not in state:
                saved = self.sessions.get(browser) if browser else None
                if saved is not None:
                    state[RUNS] = _copy_runs(saved)
                state["_sid"] = browser or new_id()
            key = state["_sid"]
            runs = state.setdefault(RUNS, {})
            if self.sessions.get(key) is not runs:
                try:
                    self.sessions.put(key, runs, key, address)
                except Full:
                    pass
            self.sessions.touch(key)
            return key

    def freeze(self, state: MutableMapping, new_id: Callable[[], str], address: str = "local") -> str:
        """A copy of this session's finished runs under a new id, for a link (?view=id); raises Full when this
        address and the server hold as many views as they keep, all within their promised time."""
        runs = {slot: (mk, v) for slot, (mk, v) in state.get(RUNS, {}).items() if getattr(v, "done", True) or getattr(v, "stopped", False)}
        vid = new_id()
        self.views.put(vid, _copy_runs(runs), state.get("_sid") or "?", address)
        return vid

    def thaw(self, state: MutableMapping, view_id: str) -> bool:
        """Copy a frozen view's runs into this session's own (same slots replaced); False when it is not here."""
        runs = self.views.get(view_id)
        if runs is None:
            return False
        state.setdefault(RUNS, {}).update(_copy_runs(runs))
        return True


def _copy_runs(runs: dict) -> dict:
    """A copy of a runs dict whose values are copied one level down: a Stop pressed on a copy (which flags its
    record) never reaches the original's record."""
    import copy

    return {slot: (mk, copy.copy(v)) for slot, (mk, v) in runs.items()}
