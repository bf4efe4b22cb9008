"""The app's state, without Streamlit: model loaders, the byte-bounded trace cache, and a page's last run.

views/ keeps one instance of each per process (st.cache_resource) or per session (st.session_state, passed in
as a plain mapping), so everything here is unit-tested without a browser.

    loaders = Loaders(max_models=4, max_bytes=6 << 30)   # both bounds; LRU out first, `evictions` says what went
    ldr = loaders.get(key)            # starts loading in a background thread; ldr.done / .fraction / .error
    loaders.forget(key)               # only this model (a failed load never evicts the others)
    traces = TraceCache(budget_bytes)
    tr = traces.get(key, make)        # shared by every session, least recently used out first
    runs = RunStore(); runs.attach(state, browser_id, new_id, address)   # a browser's runs, restored after a refresh
    remember(state, "gen", model_key, record); recall(state, "gen", model_key)
"""

from __future__ import annotations

import gc
import hashlib
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pipeline
from pipeline.common.memo import give_back_freed_memory
from pipeline.model import ModelLoadError, canonical_key


def load_warm(key: str, progress: Callable | None = None):
    """The app's way to load a model: `pipeline.load_model`, then two traced warm-up passes on the model's own
    thread (pipeline.forward.tracing.warm_up), so a visitor's first numbers are never warm-up."""

    def part(lo: float, hi: float):
        return (lambda f, m: progress(lo + (hi - lo) * f, m)) if progress else None

    lm = pipeline.load_model(key, progress=part(0.0, 0.95))
    if progress:
        progress(0.95, "warming up: two traced forward passes")
    pipeline.forward.tracing.warm_up(lm)
    if progress:
        progress(1.0, "ready")
    return lm


class Loader:
    """Loads one model in a background thread so the page can show progress instead of freezing."""

    def __init__(self, key: str, load: Callable | None = None, on_done: Callable | None = None):
        self.key, self.fraction, self.message = key, 0.0, "starting"
        self.result, self.error, self.t0 = None, None, time.time()
        self.done = threading.Event()
        self._load, self._on_done = load or load_warm, on_done
        threading.Thread(target=self._run, daemon=True, name=f"load-{key}").start()

    def _progress(self, f, msg):
        self.fraction, self.message = f, msg

    def _run(self):
        try:
            self.result = self._load(self.key, progress=self._progress)
        except ModelLoadError as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - keep serving whatever happens
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if self._on_done is not None:  # before `done`: whoever waited sees the cache already within its bounds
                try:
                    self._on_done(self)
                except Exception:  # noqa: BLE001 - never leave a loader unfinished
                    pass
            self.done.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


MODELS_ROOT_ENV = "LLM_EXPLORER_MODELS_ROOT"


def models_roots() -> list[Path]:
    """The folders under which the app's "Local folder" loader opens models: LLM_EXPLORER_MODELS_ROOT (several
    separated by ":"), else ~/models; and the explorer's own cache of converted models. The library and the CLI open any folder; a visitor of the app never names
    one outside these."""

    from pipeline.model import cache_dir

    raw = os.environ.get(MODELS_ROOT_ENV) or str(Path.home() / "models")
    roots = [Path(os.path.realpath(os.path.expanduser(r))) for r in raw.split(os.pathsep) if r.strip()]
    return roots + [Path(os.path.realpath(cache_dir()))]  # and the models this explorer converted itself


def folder_refusal(path: str, roots: list[Path] | None = None) -> str | None:
    """Why the app will not look at `path` (None: it is under a models root). The answer is the same whether or not
    the path exists, is a file or a folder, so the loader tells nothing about the rest of the file system; a
    symbolic link that leads out of the roots is refused too."""

    roots = models_roots() if roots is None else roots
    real = Path(os.path.realpath(os.path.expanduser(str(path).strip() or ".")))
    if any(real == r or real.is_relative_to(r) for r in roots):
        return None
    where = ", ".join(str(r) for r in roots)
    return (
        f"This server opens model folders only under {where}. Put the model folder (config.json + *.safetensors) there, "
        f"or start the server with {MODELS_ROOT_ENV} set to the folder that holds your models."
    )


def default_trace_budget() -> int:
    """Bytes the shared trace cache may hold: LLM_EXPLORER_TRACE_BUDGET_MB, else 1,200 MB."""

    try:
        return int(float(os.environ.get("LLM_EXPLORER_TRACE_BUDGET_MB", "1200")) * 2**20)
    except ValueError:
        return 1200 << 20


def default_model_budget() -> int:
    """Bytes the loaded models may hold together: LLM_EXPLORER_MODEL_BUDGET_GB, else 6 GB (on the 24 GB build
    machine: SmolLM2 and Gemma-3 with their panel copies and KV pools take 3.8 GB, which leaves the trace cache's
    1.2 GB and a class's sessions plenty of room)."""

    try:
        return int(float(os.environ.get("LLM_EXPLORER_MODEL_BUDGET_GB", "6")) * 2**30)
    except ValueError:
        return 6 << 30


@dataclass(frozen=True)
class Eviction:
    """A model the server unloaded to make room (said in the page of whoever loads the next one)."""

    at: float  # time.time()
    key: str
    label: str
    nbytes: int
    for_key: str  # the model it made room for
    why: str  # "bytes" or "count"


class Loaders:
    """One Loader per model (keys made canonical: "x/", "x//" and a symlink to x are one model), at most
    `max_models` kept and at most `max_bytes` of loaded models (`LoadedModel.footprint_bytes`: weights, the decode
    kernels' copy, the KV pool), least recently used out first; the newest always stays. A failed load is
    forgotten alone. An evicted model is really freed: nothing else in the process holds it (pipeline's per-model
    objects live on the model; tests/app/test_appstate.py and tests/pipeline/test_lifetime.py check it), once the
    sessions that were using it have moved on. `evictions` says what was unloaded and why."""

    def __init__(self, max_models: int = 4, load: Callable | None = None, max_bytes: int | None = None):
        self.max_models, self._load = max_models, load
        self.max_bytes = default_model_budget() if max_bytes is None else max_bytes
        self._items: OrderedDict[str, Loader] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions: deque[Eviction] = deque(maxlen=64)

    def get(self, key: str) -> Loader:
        key = canonical_key(key)
        with self._lock:
            ldr = self._items.get(key)
            if ldr is None:
                ldr = self._items[key] = Loader(key, self._load, on_done=self._loaded)
                while len(self._items) > self.max_models:
                    self._evict(next(iter(self._items)), key, "count")
            self._items.move_to_end(key)
            return ldr

    @staticmethod
    def _bytes(ldr: Loader) -> int:
        return getattr(ldr.result, "footprint_bytes", 0) if ldr.result is not None else 0

    def nbytes(self) -> int:
        with self._lock:
            return sum(self._bytes(x) for x in self._items.values())

    def _loaded(self, ldr: Loader) -> None:
        """A load finished: unload the least recently used others while the loaded models hold more than the budget."""
        evicted = False
        with self._lock:
            if self._items.get(ldr.key) is not ldr:
                return
            while sum(self._bytes(x) for x in self._items.values()) > self.max_bytes:
                old = next((k for k, x in self._items.items() if x is not ldr and x.done.is_set()), None)
                if old is None:
                    break
                self._evict(old, ldr.key, "bytes")
                evicted = True
        if evicted:  # nothing else holds an evicted model (pipeline's per-model parts live on it): free it now
            gc.collect()
            give_back_freed_memory()

    def _evict(self, key: str, for_key: str, why: str) -> None:
        ldr = self._items.pop(key)
        if ldr.result is not None:
            self.evictions.append(Eviction(time.time(), key, getattr(ldr.result, "label", key), self._bytes(ldr), for_key, why))

    def forget(self, key: str) -> None:
        with self._lock:
            self._items.pop(canonical_key(key), None)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)


class LRU:
    """A thread-safe cache, least recently used out first, at most `max_items` values (`over()` says when it holds
    too much; the newest value always stays). `key in cache` tells, before any work, whether `get` would make
    the value anew (a caller counts that work against a visitor's limits)."""

    def __init__(self, max_items: int = 16):
        self.max_items, self.items, self.lock = max_items, OrderedDict(), threading.Lock()

    def __contains__(self, key) -> bool:
        with self.lock:
            return key in self.items

    def over(self) -> bool:
        return len(self.items) > self.max_items

    def get(self, key, make: Callable[[], Any]):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = make()
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            dropped = []
            while len(self.items) > 1 and self.over():
                dropped.append(self.items.popitem(last=False))
        if dropped:
            self.evicted(dropped)
        return value

    def evicted(self, dropped: list) -> None:
        """Called (outside the lock) with the (key, value) pairs that just went out."""

    def __len__(self) -> int:
        return len(self.items)


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
