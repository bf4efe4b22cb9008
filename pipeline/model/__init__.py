"""The model room: which models exist (registry), their weights on disk (store), a loaded model (loaded), and the
one adapter that knows each architecture's parts (arch), with the hooks every loaded model carries (capture)."""

from pipeline.model.loaded import (
    SMALL_WORK_TOKENS,
    FairLock,
    LoadedModel,
    ModelFacts,
    facts_of,
    load_model,
    load_tokenizer,
    random_model,
    thread_safe,
    threads_for,
)
from pipeline.model.registry import (
    BUILTINS,
    DEFAULT,
    EMBEDDED,
    GEMMA,
    ModelChoice,
    ModelLoadError,
    available_models,
    builtin,
    cache_dir,
    canonical_key,
    default_device,
    embedded_gguf,
    gemma_installed,
    int8_label,
    split_precision,
)
from pipeline.model.store import CACHE_DONE, cache_ok, cache_problem, cached_folder, check_folder, check_weights, convert_gguf

__all__ = [
    "BUILTINS", "CACHE_DONE", "DEFAULT", "EMBEDDED", "GEMMA", "SMALL_WORK_TOKENS", "FairLock", "LoadedModel", "ModelChoice", "ModelFacts",
    "ModelLoadError", "available_models", "builtin", "cache_dir", "cache_ok", "cache_problem", "cached_folder", "canonical_key",
    "check_folder", "check_weights", "convert_gguf", "default_device", "embedded_gguf", "facts_of", "gemma_installed", "int8_label",
    "load_model", "load_tokenizer", "random_model", "split_precision", "thread_safe", "threads_for",
]  # fmt: skip
