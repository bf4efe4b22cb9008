"""The models a server has loaded: loaders that load in the background with progress, bounded by count and by
bytes (least recently used out, every eviction recorded), and the folders a visitor may open (the models root)."""

from __future__ import annotations

import gc
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pipeline
from pipeline.common import give_back_freed_memory
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
    separated by ":"), else ~/models; the explorer's own cache of converted models; the local Hugging Face cache. The library and the CLI open any folder; a visitor of the app never names
    one outside these."""

    from pipeline.model import cache_dir

    raw = os.environ.get(MODELS_ROOT_ENV) or str(Path.home() / "models")
    roots = [Path(os.path.realpath(os.path.expanduser(r))) for r in raw.split(os.pathsep) if r.strip()]
    from huggingface_hub import constants

    # and the models this explorer converted itself, and the local Hugging Face cache (a model opened by its id)
    return roots + [Path(os.path.realpath(cache_dir())), Path(os.path.realpath(constants.HF_HUB_CACHE))]


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


def freeze_loaded() -> None:
    """After a model loaded: everything alive now (the libraries, the model's modules: ~10^6 objects) out of the cyclic
    collector's sight (gc.freeze). A full collection walked them all, a pause of ~1 s in a live class's moves and 8% of
    its server's time (py-spy, 120 followers). Reference counting still frees them; an eviction unfreezes them."""
    gc.collect()
    gc.freeze()


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
            if ldr.result is not None:
                freeze_loaded()
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
        gc.unfreeze()  # the evicted model's objects collectable again (the next load freezes what is left)
        if ldr.result is not None:
            self.evictions.append(Eviction(time.time(), key, getattr(ldr.result, "label", key), self._bytes(ldr), for_key, why))

    def forget(self, key: str) -> None:
        with self._lock:
            self._items.pop(canonical_key(key), None)

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)
