"""The weight store, offline only: a built-in model's GGUF dequantised once by transformers and cached as
safetensors (the GGUF load takes ~15-40 s, the cached copy ~2-4 s), every cached file checked against the digest
recorded when it was written (a damaged copy is rebuilt), and a local folder's weights checked before loading
(safetensors only, shapes read from the headers)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from pipeline.model.registry import ModelLoadError, ProgressFn, _sha256, builtin, cache_dir

log = logging.getLogger("llm_explorer")


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


def built_folder(key: str, progress: ProgressFn | None = None) -> tuple[Path, Path]:
    """(the GGUF, the folder its safetensors copy lives in) for a built-in model; ModelLoadError when it is not
    installed."""
    b = builtin(key)
    gguf = b.gguf(progress) if b else None
    if gguf is None:
        raise ModelLoadError(f"{b.name if b else key} is not installed: {b.install if b else 'not a built-in model'}.")
    return gguf, cache_dir() / f"{key}-{gguf.stat().st_size}"


def cached_folder(key: str, progress: ProgressFn | None = None) -> Path:
    """A built-in model's safetensors copy, converted from its GGUF when missing, unfinished or damaged."""
    gguf, folder = built_folder(key, progress)
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
    found: dict[str, tuple] = {}
    for f in sorted(folder.glob("*.safetensors")):
        found.update(_safetensors_header(f))
    cfg = _read_config(folder)
    check_architecture(cfg, folder.name)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layers_cfg = getattr(text, "num_hidden_layers", None)
    layer_ids = {int(k.split("layers.")[1].split(".")[0]) for k in found if "layers." in k and k.split("layers.")[1].split(".")[0].isdigit()}
    if layers_cfg is not None and layer_ids and layers_cfg != len(layer_ids):
        raise ModelLoadError(
            f"config.json asks for {layers_cfg:,} layers but the weight files hold {len(layer_ids):,}: the folder's config does not match its weights."
        )
    expected, tied = _expected_tensors(cfg, text, folder.name)
    problems = _mismatches(found, expected, tied)
    if problems:
        raise ModelLoadError(
            f"The weights in {folder.name} do not match its config.json: "
            + "; ".join(problems)
            + ". Loading it would give a model with random weights, so it is refused."
        )


def _read_config(folder: Path):
    """The folder's config as transformers reads it (no remote code); a ModelLoadError that names the architecture
    when this transformers does not know it, or the reason when config.json cannot be read."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; the user needs the reason
        try:
            mt = json.loads((folder / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            mt = None
        if isinstance(mt, str) and mt:  # an architecture this transformers does not know (or only with remote code)
            raise ModelLoadError(
                f"{folder.name} is a '{mt[:60]}' model, an architecture this version of transformers does not know (and code from a "
                f"model folder is never run). The explorer runs decoder-only causal language models: {SUPPORTED_FAMILIES}."
            ) from e
        raise ModelLoadError(f"config.json of {folder.name} cannot be read: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e


def _expected_tensors(cfg, text, name: str) -> tuple[dict[str, tuple], set[str]]:
    """{tensor name: shape} of the causal LM the config describes, built on the "meta" device, and the names of
    the tensors tied to another (which a file may leave out)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - e.g. a vision or audio model: no causal-LM class for its config
        raise ModelLoadError(
            f"{name} ({getattr(cfg, 'model_type', '?')}) is not a causal language model transformers can build "
            f"({type(e).__name__}: {str(e).splitlines()[0][:160]}). The explorer runs decoder-only causal language models: {SUPPORTED_FAMILIES}."
        ) from e
    expected = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    tied = getattr(meta, "_tied_weights_keys", None) or []
    tied = (
        set(tied if isinstance(tied, (list, tuple, set)) else tied.keys())
        if getattr(text, "tie_word_embeddings", False) or getattr(cfg, "tie_word_embeddings", False)
        else set()
    )
    return expected, tied


def _mismatches(found: dict[str, tuple], expected: dict[str, tuple], tied: set[str]) -> list[str]:
    """What differs between the files' tensors and the config's, said briefly: missing, unexpected, wrong shape."""
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
    return problems


SUPPORTED_FAMILIES = "Llama, Qwen2/2.5, Qwen3, Mistral, Gemma-3, Phi-3, GPT-2, OLMo-2 and decoders of their shape"
ENCODER_ONLY = {"bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta", "camembert", "modernbert", "mpnet"}


def check_architecture(cfg, name: str) -> None:
    """Refuse, with a sentence naming the architecture and what is supported, a model the explorer cannot take apart:
    an encoder-only or encoder-decoder model (neither predicts the next token of a prompt) or a mixture of experts."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    mt = getattr(cfg, "model_type", "?")
    arch = ", ".join(getattr(cfg, "architectures", None) or []) or mt
    what = None
    if getattr(cfg, "is_encoder_decoder", False):
        what = "an encoder-decoder model (it translates or summarises a whole input; this explorer follows a decoder writing one token at a time)"
    elif mt in ENCODER_ONLY or any(
        a.endswith(("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")) for a in getattr(cfg, "architectures", None) or []
    ):
        what = "an encoder-only model (it reads text but does not write the next token)"
    elif any((getattr(text, k, 0) or 0) > 1 for k in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")):
        what = "a mixture of experts (its feed-forward blocks route each token to a few of many experts; the pages take one feed-forward block a layer apart)"
    if what:
        raise ModelLoadError(f"{name} is {arch}: {what}. The explorer runs decoder-only causal language models: {SUPPORTED_FAMILIES}.")


def memory_estimate(folder: Path, dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """(whether it fits, a sentence): the parameter count from the safetensors headers (no tensor is read), the bytes
    the weights take in their own files and in `dtype` as the explorer loads them, and the memory free now on
    `device` (a quarter kept free for activations, the KV cache and the page)."""
    params = sum(int(torch.Size(shape).numel()) for f in sorted(folder.glob("*.safetensors")) for shape in _safetensors_header(f).values())
    on_disk = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    ours = params * torch.tensor([], dtype=dtype).element_size()
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        import psutil

        free = psutil.virtual_memory().available
    fits = ours <= 0.75 * free
    gb = lambda b: f"{b / 1e9:,.2f} GB"  # noqa: E731
    sentence = (
        f"{params / 1e6:,.1f} M parameters: {gb(on_disk)} in its files, {gb(ours)} in {str(dtype).replace('torch.', '')} as the explorer "
        f"loads it; {gb(free)} of memory is free on this {'GPU' if device.type == 'cuda' else 'machine'}"
        + ("." if fits else f", and a model may take at most three quarters of it ({gb(0.75 * free)}): it does not fit, so it is not loaded.")
    )
    return fits, sentence


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
