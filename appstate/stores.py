"""What visitors' actions add to the server, bounded so that no client can evict another's: saved runs (a
browser's, restored after a refresh), frozen views (?view=), long prompts behind links (?p=); and a page's last
run in its session."""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from typing import Any

from hosting.store import Store, open_store

log = logging.getLogger(__name__)

DAY = 86400.0


class Full(RuntimeError):
    """A store refused an entry: every entry that could make room is still within the time it was promised."""


class OwnedStore:
    """What visitors' actions add to the server (saved runs, frozen views, long prompts), bounded so that one client
    can never evict another's entries:
      - per browser (`per_browser`, in `size` units): over it, that browser's own oldest entry goes;
      - per client address (`per_address`) and in total (`total`): over either, the oldest entry (of that address,
        or of anyone) that is older than `keep_s` goes, else the new entry is refused (Full). So whatever strangers
        do, an entry stays for at least `keep_s` unless its own browser replaces it.
    Entries for which `expendable(value)` is true (a browser that has no runs yet) go first, whoever made them.

    The entries live in the one store (hosting.store: SQLite by default, Redis by URL) under namespace `ns`, pickled,
    with their owner, time and size beside them (`ns#meta`): every process of the app sees the same entries, and they
    survive a restart. Each put is one locked read-modify-write of the owners' list, so the bounds hold across
    processes. Without a `store`, a private in-memory one (a test's)."""

    def __init__(
        self,
        per_browser: int,
        per_address: int,
        total: int,
        keep_s: float,
        size: Callable[[Any], int] = lambda v: 1,
        expendable: Callable[[Any], bool] = lambda v: False,
        clock: Callable[[], float] = time.time,
        store: Store | None = None,
        ns: str = "owned",
    ):
        self.per_browser, self.per_address, self.total, self.keep_s = per_browser, per_address, total, keep_s
        self.size, self.expendable, self.clock = size, expendable, clock
        self.store = store if store is not None else open_store(":memory:")
        self.ns, self.meta_ns = ns, ns + "#meta"

    def _meta(self) -> dict[str, dict]:
        return {k: json.loads(v) for k, v in self.store.items(self.meta_ns).items()}

    def __contains__(self, key) -> bool:
        return self.store.get(self.meta_ns, key) is not None

    def __len__(self) -> int:
        return len(self.store.items(self.meta_ns))

    def get(self, key: str):
        raw = self.store.get(self.ns, key)
        return None if raw is None else pickle.loads(raw)

    def owner(self, key: str) -> tuple[str, str] | None:
        raw = self.store.get(self.meta_ns, key)
        if raw is None:
            return None
        m = json.loads(raw)
        return m["b"], m["a"]

    def _victim(self, meta: dict, pick, new_key: str, protected: bool):
        """The entry to drop among those `pick` selects (never the new one): expendable ones first (least recently
        used), then the oldest (only one older than keep_s when `protected`)."""
        now = self.clock()
        cands = [(k, m) for k, m in meta.items() if k != new_key and pick(m)]
        for k, m in sorted(cands, key=lambda km: km[1].get("u", km[1]["at"])):
            if m.get("x"):
                return k
        for k, m in sorted(cands, key=lambda km: km[1]["at"]):
            if not protected or now - m["at"] >= self.keep_s:
                return k
        return None

    def put(self, key: str, value, browser: str, address: str) -> None:
        """Keep `value` under `key` for (browser, address); raises Full (nothing kept) when no room can be made."""
        raw = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        with self.store.lock(self.ns):
            meta = self._meta()
            old = meta.get(key)
            now = self.clock()
            if old is not None and old["b"] != browser:
                old["at"] = old["u"] = now  # the same content from another browser (a long prompt's id is its hash): one entry
                self.store.put(self.meta_ns, key, json.dumps(old).encode())
                return
            m = {"b": browser, "a": address, "at": now, "u": now, "s": self.size(value), "x": bool(self.expendable(value))}
            if m["s"] > self.per_browser:
                raise Full(f"this is larger than the {self.per_browser:,} one browser may keep on this server")
            meta[key] = m
            drop = []
            for pick, limit, protected in (
                (lambda x: x["b"] == browser, self.per_browser, False),
                (lambda x: x["a"] == address, self.per_address, True),
                (lambda x: True, self.total, True),
            ):
                while sum(x["s"] for x in meta.values() if pick(x)) > limit:
                    k = self._victim(meta, pick, key, protected)
                    if k is None:
                        raise Full("the server keeps what others shared for a promised time, and its store is full of it")
                    del meta[k]
                    drop.append(k)
            for k in drop:
                self.store.delete(self.ns, k)
                self.store.delete(self.meta_ns, k)
            self.store.put(self.ns, key, raw)
            self.store.put(self.meta_ns, key, json.dumps(m).encode())

    def touch(self, key: str) -> None:
        """The entry was used (an expendable one that is used goes after those that are not)."""
        raw = self.store.get(self.meta_ns, key)
        if raw is not None:
            m = json.loads(raw)
            if self.clock() - m.get("u", 0) > 60:  # at most a write a minute per entry
                m["u"] = self.clock()
                self.store.put(self.meta_ns, key, json.dumps(m).encode())


class SharedTexts:
    """Prompts too long for a link, kept on the server under a short id (the first 12 hex digits of their
    SHA-256), so a link can carry the id instead (?p=id). Bounded in characters per browser (its own oldest out),
    per client address and in total (an OwnedStore: a prompt stays at least KEEP_S whatever strangers send); the
    same text always gets the same id, on any server."""

    KEEP_S = 7 * DAY

    def __init__(
        self, budget_chars: int = 40_000_000, per_browser: int = 1_000_000, per_address: int = 10_000_000, clock=time.time, store: Store | None = None
    ):
        self.store = OwnedStore(per_browser, per_address, budget_chars, self.KEEP_S, size=len, clock=clock, store=store, ns="texts")

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
    """A page's last runs survive a browser refresh (which opens a new Streamlit session) and a server restart, and
    belong to the browser that made them: they are kept under the browser's own id (a cookie the app sets, never in
    the address). A link carries a view (model, prompt, settings), never this id.

    A visitor who wants to hand over results freezes them: `freeze` stores a copy under a fresh random id (?view=),
    and whoever opens that link gets a copy of the copy in their own runs (`thaw`), under their own id. Nothing
    anyone does through a link reaches the owner's runs.

    Both live in the one store (OwnedStores, namespaces "runs" and "views"), so strangers cannot empty them and every
    process sees them: a browser's runs are kept at least KEEP_RUNS_S, a frozen view at least KEEP_VIEW_S unless its
    own browser makes more than `views_per_browser` (its oldest goes). A session's runs are a live dict in its state;
    `save` (the app calls it at the end of every run) writes its finished runs to the store when they changed, and this
    process keeps the live dicts of the browsers it serves (a refresh here copies the newest, unfinished ones too)."""

    KEEP_RUNS_S = DAY
    KEEP_VIEW_S = 7 * DAY
    LIVE = 512  # browsers whose live runs this process keeps (its memory is a cache: the store holds what was saved)

    def __init__(
        self,
        max_sessions: int = 512,
        max_frozen: int = 1024,
        per_address: int = 128,
        views_per_browser: int = 16,
        views_per_address: int = 128,
        clock=time.time,
        store: Store | None = None,
    ):
        store = store if store is not None else open_store(":memory:")
        self.sessions = OwnedStore(1, per_address, max_sessions, self.KEEP_RUNS_S, expendable=lambda runs: not runs, clock=clock, store=store, ns="runs")
        self.views = OwnedStore(views_per_browser, views_per_address, max_frozen, self.KEEP_VIEW_S, clock=clock, store=store, ns="views")
        self.views_per_browser = views_per_browser
        self.lock = threading.Lock()
        self._live: OrderedDict[str, dict] = OrderedDict()

    def attach(self, state: MutableMapping, browser: str | None, new_id: Callable[[], str], address: str = "local") -> str:
        """Give this session its id (its browser's, or a new one when the browser has none yet) and its runs: a refresh
        of the same browser starts from a copy of its runs (this process's live ones, else the store's). Returns the
        id. Raises StoreDown (the session keeps its id and its runs last as long as the tab) when the store is away."""
        with self.lock:
            if "_sid" not in state:
                state["_sid"] = browser or new_id()
                live = self._live.get(browser) if browser else None
                if live is not None:
                    state[RUNS] = _copy_runs(live)
                    state["_runs_saved"] = None
                    self._live[state["_sid"]] = state[RUNS]
                elif browser:
                    self._live[browser] = state.setdefault(RUNS, {})
                    saved = self.sessions.get(browser)  # may raise StoreDown: the tab's own runs from here on
                    if saved:
                        state[RUNS].update(saved)
                    state["_runs_saved"] = _signature(state[RUNS])
            key = state["_sid"]
            self._live[key] = state.setdefault(RUNS, {})
            self._live.move_to_end(key)
            while len(self._live) > self.LIVE:
                self._live.popitem(last=False)
            return key

    def save(self, state: MutableMapping, address: str = "local") -> bool:
        """Write this session's finished runs to the store when they changed since the last save (a run replaced, a
        generation finished); returns whether it wrote. A run that cannot be pickled stays in the tab only (logged);
        a full store keeps nothing new (Full is logged: the runs last as long as the tab). Raises StoreDown."""
        key = state.get("_sid")
        runs = state.get(RUNS)
        if not key or runs is None:
            return False
        sig = _signature(runs)
        if sig == state.get("_runs_saved"):
            return False
        kept = {}
        for slot, (mk, v) in _finished(runs).items():
            try:
                pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 - a record holding a lock or a model: the tab's own
                log.info("run %s is not kept in the store (%s: %s)", slot, type(e).__name__, e)
                continue
            kept[slot] = (mk, v)
        try:
            self.sessions.put(key, kept, key, address)
        except Full as e:
            log.info("runs of one browser not kept: %s", e)
        state["_runs_saved"] = sig
        return True

    def freeze(self, state: MutableMapping, new_id: Callable[[], str], address: str = "local") -> str:
        """A copy of this session's finished runs under a new id, for a link (?view=id); raises Full when this
        address and the server hold as many views as they keep, all within their promised time."""
        vid = new_id()
        self.views.put(vid, _finished(state.get(RUNS, {})), state.get("_sid") or "?", address)
        return vid

    def thaw(self, state: MutableMapping, view_id: str) -> bool:
        """Copy a frozen view's runs into this session's own (same slots replaced); False when it is not here."""
        runs = self.views.get(view_id)  # unpickled: a copy of the copy
        if runs is None:
            return False
        state.setdefault(RUNS, {}).update(runs)
        return True


def _finished(runs: dict) -> dict:
    return {slot: (mk, v) for slot, (mk, v) in runs.items() if getattr(v, "done", True) or getattr(v, "stopped", False)}


def _signature(runs: dict) -> tuple:
    """What changes when a run is replaced or a record finishes (cheap: no copy, no pickling)."""
    return tuple(sorted((slot, mk, id(v), bool(getattr(v, "done", True)), bool(getattr(v, "stopped", False))) for slot, (mk, v) in runs.items()))


def _copy_runs(runs: dict) -> dict:
    """A copy of a runs dict whose values are copied one level down: a Stop pressed on a copy (which flags its
    record) never reaches the original's record."""
    import copy

    return {slot: (mk, copy.copy(v)) for slot, (mk, v) in runs.items()}
