"""The autoregressive loop: what one step reports (events), the decode step of each cache mode (decode), our
generation loop with its metrics (loop), the sweeps with their verdicts (sweeps) and speculative decoding
(speculative). The face hands on the loop's and the sweeps' names: `pipeline.generation.generate`."""

from pipeline.generation.decode import CacheMode
from pipeline.generation.events import Finish, Phase, Runner, StepEvent
from pipeline.generation.loop import (
    MAX_NEW_TOKENS,
    GenerationRecord,
    KVCost,
    Metrics,
    Prepared,
    generate,
    kv_bytes_formula,
    kv_costs,
    kv_window,
    measured_kv_per_token,
    metrics,
    prepare,
)
from pipeline.generation.speculative import DraftKind, EarlyExit, compare_with_plain, expected_tokens_per_call
from pipeline.generation.steps import Step, Steps, steps
from pipeline.generation.sweeps import (
    CACHE_MODES,
    CacheModeComparison,
    CacheRow,
    ModeRun,
    SweepRow,
    Verdict,
    cache_off_sweep,
    cache_verdict,
    compare_cache_modes,
    growth,
    long_prompt,
    prefill_decode_sweep,
    sweep_verdict,
)

__all__ = [
    "Finish", "Phase", "Runner", "StepEvent", "Step", "Steps", "steps",
    "MAX_NEW_TOKENS", "GenerationRecord", "KVCost", "Metrics", "Prepared", "generate", "kv_bytes_formula", "kv_costs", "kv_window",
    "measured_kv_per_token", "metrics", "prepare", "CACHE_MODES", "CacheModeComparison", "CacheRow", "ModeRun", "SweepRow", "Verdict",
    "cache_off_sweep", "cache_verdict", "compare_cache_modes", "growth", "long_prompt", "prefill_decode_sweep", "sweep_verdict",
    "CacheMode", "DraftKind", "EarlyExit", "compare_with_plain", "expected_tokens_per_call",
]  # fmt: skip
