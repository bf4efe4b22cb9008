"""A loaded model: its weights in eval mode with the capture hooks installed, its thread-safe tokenizer, the shape
facts the pages explain, and the one executor every forward on it goes through (a fair lock, so no visitor holds the
model for everyone). Loading never touches the network (`local_files_only=True`, HF_HUB_OFFLINE), only safetensors
weights are read and `trust_remote_code` is never set."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pipeline.model.arch import Arch
from pipeline.model.registry import PRECISION_SUFFIX, ModelLoadError, ProgressFn, builtin, canonical_key, default_device, label_of, split_precision
from pipeline.model.store import built_folder, cache_problem, cached_folder, check_folder, check_weights, memory_estimate

log = logging.getLogger("llm_explorer")

_EXECUTOR_LOCK = threading.Lock()
SMALL_WORK_TOKENS = 64  # a forward over at most this many tokens runs on one intra-op thread (see threads_for)
# the engine's KV pool on a CPU (pipeline.engine.config's default, read from here), counted in footprint_bytes
CPU_KV_POOL_BYTES = 256 << 20


def thread_safe(tok):
    """The tokenizer, made safe to call from many threads at once (every visitor's session shares one); returned.

    transformers' fast tokenizer keeps a call's settings on its one Rust backend: each encode first sets the
    backend's `encode_special_tokens` (our split_special_tokens=True for text a visitor typed, False for the chat
    template) and its truncation and padding, then encodes. Two threads encoding at once can each get the other's
    setting: a template encoded with special tokens split reads '<|im_start|>' as 7 ordinary pieces (measured: 64
    of 2,400 chat prompts tokenized by 8 threads at once came out 54 tokens long instead of 36, and the engine
    answered those wrong prompts). One lock per tokenizer around its encode entry point (`_encode_plus`, which
    `__call__`, `encode`, `tokenize` and `apply_chat_template` all go through) makes setting and encoding one step."""
    encode = getattr(tok, "_encode_plus", None)
    if encode is None or getattr(tok, "_encode_lock", None) is not None:
        return tok
    lock = threading.RLock()

    def locked(*args, **kwargs):
        with lock:
            return encode(*args, **kwargs)

    tok._encode_plus, tok._encode_lock = locked, lock
    return tok


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
    size_note: str = ""  # a folder's or cached id's size and the free memory, said before it loaded (store.memory_estimate)
    precision: str = "fp32"  # "int8": weight-only int8 projections (pipeline.model.quantised), served by int8 panels

    _executor: object = field(default=None, repr=False)
    _owned: dict = field(default_factory=dict, repr=False)
    _owned_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def owned(self, name: str, make: Callable[[LoadedModel], object]):
        """The object `name` built for this model by `make(model)` on first use (a class taking the model will do),
        kept as long as the model is: one per model however many threads ask at once (`make` may ask for another
        owned object: the lock is re-entrant)."""
        got = self._owned.get(name)
        if got is None:
            with self._owned_lock:
                got = self._owned.get(name)
                if got is None:
                    got = self._owned[name] = make(self)
        return got

    def __post_init__(self):
        if self.arch is None:
            self.arch = Arch.of(self.model, self.dtype)

    @property
    def footprint_bytes(self) -> int:
        """About what this model holds while it serves: its weights, on a CPU in fp32 the decode kernels' panel copy
        of its matrices (as large again), and the engine's KV pool (a CPU's CPU_KV_POOL_BYTES; a GPU's is sized from
        free memory and not counted here). What the app's model cache budgets by."""
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        if self.device.type != "cpu":
            return weights
        copy = weights if self.dtype == torch.float32 else 0
        if self.precision == "int8":
            copy //= 4  # the panels are int8
        return weights + copy + CPU_KV_POOL_BYTES

    @property
    def kv_token_bytes(self) -> int:
        """Bytes of K and V for one token in one layer: 2 x KV heads x head dim x bytes per value (the one place the
        KV cache's size is defined: the formula on the KV-cache page, the engine's blocks, the costs table)."""
        f = self.facts
        return 2 * f.n_kv_heads * f.head_dim * self.arch.bytes_per_value

    def kv_layer_bytes(self, tokens: int, bytes_per_value: int | None = None) -> list[int]:
        """Each layer's K and V bytes for a context of `tokens` tokens (what `StepEvent.kv_bytes_per_layer` means on
        every path): kv_token_bytes per token; a sliding-window layer keeps at most its window less the new token
        (Gemma's local layers)."""
        per = self.kv_token_bytes * (bytes_per_value or self.arch.bytes_per_value) // self.arch.bytes_per_value
        return [per * (min(tokens, w - 1) if w else tokens) for w in self.arch.windows]

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


def facts_of(model: torch.nn.Module) -> ModelFacts:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    if isinstance(rope, dict) and "rope_theta" not in rope and rope:
        rope = next(iter(rope.values())) if isinstance(next(iter(rope.values())), dict) else rope
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or getattr(cfg, "rope_theta", None)
    arch = Arch.of(model, next(model.parameters()).dtype)
    try:
        norm_cls = type(arch.final_norm_module()).__name__
    except AttributeError:
        norm_cls = "?"
    has_learned = arch.pos_embed() is not None
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
        attn_scaling=float((arch.attn_scaling(0) if arch.layers else None) or head_dim**-0.5),
    )


def load_model(
    name: str | None = None,
    device: str | torch.device | None = None,
    progress: ProgressFn | None = None,
    told: Callable[[str], None] | None = None,
    precision: str = "fp32",  # or "int8" (see below)
) -> LoadedModel:
    """Load a model by key (a built-in model's, the default when None), local folder path, or Hugging Face id found in
    the local Hugging Face cache. Never downloads. precision "int8" (or a key ending ":int8"): a model of its own, key
    + ":int8", label + " (int8)", each projection and the LM head int8 per row (pipeline.model.quantised); fp32 default.

    `progress(fraction, message)` is called during the one-time GGUF conversion and the load. For a folder or an id,
    its size and the free memory (store.memory_estimate) are said before anything loads (to `told` and as a progress
    message), and a model that would not fit is refused with that sentence (ModelLoadError)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from pipeline.model.capture import install as install_capture

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    name, precision = _precision_of(name, precision)
    key = canonical_key(name)
    if b := builtin(key):
        folder, label = cached_folder(key, progress), b.name
    else:
        folder = check_folder(key)
        check_weights(folder)
        label = label_of(folder)
    dev, dtype = default_device()
    if device is not None:
        dev = torch.device(device)
        dtype = dtype if dev.type == "cuda" else torch.float32
    if not builtin(key):  # a folder or a cached id: its size said first, and a model that cannot fit refused
        fits, sentence = memory_estimate(folder, dtype, dev)
        if told:
            told(f"{label}: {sentence}")
        if progress:
            progress(0.8, f"{label}: {sentence}")
        if not fits:
            raise ModelLoadError(f"{label}: {sentence}")
    if progress:
        progress(0.85, f"loading {label} from {folder.name} (safetensors)")
    try:
        tok = thread_safe(AutoTokenizer.from_pretrained(folder, local_files_only=True))
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, use_safetensors=True, dtype=dtype, trust_remote_code=False)
    except Exception as e:  # transformers raises many kinds; the user needs the reason, not a traceback
        raise ModelLoadError(f"Could not load {folder}: {type(e).__name__}: {str(e).splitlines()[0][:300]}") from e
    model.to(dev).eval()
    served = _quantise(model, dtype, dev, key, label) if precision == "int8" else (key, label)
    install_capture(model)

    lm = _loaded(*served, model, tok, dev, dtype, folder, t0)
    lm.precision = precision
    if not builtin(key):
        lm.size_note = sentence
    lm.run(_warm_up, lm)  # one-time allocations and kernel choices stay out of measurements
    if progress:
        progress(1.0, "ready")
    return lm


def _precision_of(name: str | None, precision: str) -> tuple[str | None, str]:
    """The model's key without a ":int8" ending, and the precision it asks for (the ending's, else `precision`)."""
    if precision not in ("fp32", "int8"):
        raise ModelLoadError(f"precision {precision!r}: fp32 or int8")
    name, named = split_precision(name)
    return name, "int8" if named == "int8" else precision


def _quantise(model: torch.nn.Module, dtype: torch.dtype, dev: torch.device, key: str, label: str) -> tuple[str, str]:
    """The model's projections in int8 weight-only (pipeline.model.quantised), refused where it cannot serve them;
    returns the int8 model's key and label."""
    from pipeline.model.quantised import quantise

    if dev.type != "cpu" or dtype != torch.float32:
        raise ModelLoadError("int8 weight-only serving runs on a CPU in fp32 (the C decode kernels' int8 panels)")
    try:
        quantise(model, Arch.of(model, dtype))
    except ValueError as e:
        raise ModelLoadError(f"int8: {e}") from e
    return key + PRECISION_SUFFIX, f"{label} (int8)"


def _warm_up(lm: LoadedModel, progress: ProgressFn | None = None) -> None:
    with torch.inference_mode():
        if getattr(lm.tokenizer, "chat_template", None):  # the template's compiled Jinja, once
            lm.tokenizer.apply_chat_template([{"role": "user", "content": "warm up"}], tokenize=True, add_generation_prompt=True)
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

    if builtin(key):
        gguf, folder = built_folder(key)
        if cache_problem(folder, ("tokenizer.json", "tokenizer_config.json")) is None:  # else from the GGUF itself
            return thread_safe(AutoTokenizer.from_pretrained(folder, local_files_only=True))
        return thread_safe(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    return thread_safe(AutoTokenizer.from_pretrained(check_folder(key), local_files_only=True))


def random_model(folder: str | Path, device: str | torch.device | None = None, seed: int = 0) -> LoadedModel:
    """The architecture of a model folder (config.json + tokenizer) with SEEDED RANDOM weights: for speed and
    memory measurements where the real weights cannot travel. Its outputs are meaningless; its label says so."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pipeline.model.capture import install as install_capture

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
