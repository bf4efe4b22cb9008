"""What a generation streams, whoever runs it (our own loop, the shared engine, a Ray Serve replica): one StepEvent
per token; and which tokens end an answer. Its own module so that the loop, the engine and the service layer
depend on it and not on each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pipeline.model.loaded import LoadedModel


class Phase(StrEnum):
    """Which pass made a token: the prompt's (its first token) or one decode step."""

    PREFILL = "prefill"
    DECODE = "decode"


class Finish(StrEnum):
    """Why an answer ended (a StrEnum: it compares equal to its value, "eos", and prints as it)."""

    EOS = "eos"  # the model wrote an end-of-sequence token
    LENGTH = "length"  # max_new_tokens reached
    CANCELLED = "cancelled"  # Stop pressed, tab closed: the request was cancelled in the engine
    ERROR = "error"  # the engine failed this request (its message is on the handle)


class Runner(StrEnum):
    """What ran a step: transformers' own forward, our fused step (pipeline.decode_step.fused) in one of its modes (the
    value is "fused step, " + the decoder's `mode`), or the shared engine (pipeline.engine)."""

    TRANSFORMERS = "transformers"
    FUSED_EAGER = "fused step, eager"
    FUSED_ROW_STEP = "fused step, CPU row step"
    FUSED_GRAPH = "fused step, CUDA graph"
    FUSED_COMPILED = "fused step, torch.compile + eager"
    FUSED_COMPILED_GRAPH = "fused step, torch.compile + CUDA graph"
    ENGINE = "engine"

    @classmethod
    def fused(cls, mode: str) -> Runner:
        """The fused step in the decoder's mode (FusedDecoder.mode: "CUDA graph", "CPU row step", ...); a mode this
        list does not name is a ValueError, not a label made up on the way."""
        return cls(f"fused step, {mode}")

    @property
    def mode(self) -> str:
        """The fused step's mode ("CUDA graph"), or the runner's value for the others."""
        return self.value.removeprefix("fused step, ")


@dataclass
class StepEvent:
    index: int  # 0 = the first token (prefill), 1.. = decode steps
    phase: Phase
    token_id: int
    text: str  # the token's own text (pipeline.forward.tokens.text_of)
    top: list[tuple[int, str, float]]  # (id, text, probability after the filters), most likely first
    top_raw: list[tuple[int, str, float]]  # the same before the filters (softmax at temperature 1)
    p: float  # probability of the chosen token after the filters
    p_raw: float  # ... and before them
    step_s: float  # this step's forward + sampling time (an engine pass of several decode steps: its time / its steps)
    t_s: float  # time since the request arrived (tokenization included): when the event was sent
    context_len: int  # tokens the step attended over
    # the keys and values of the context's tokens after this step, per layer and in all (LoadedModel.kv_layer_bytes:
    # the same meaning on every path; on the dynamic cache read from its tensors)
    kv_bytes_per_layer: list[int] = field(default_factory=list)
    kv_bytes: int = 0
    kv_reserved_bytes: int = 0  # what the path set aside for this request: a preallocated buffer, whole KV blocks
    finished: Finish | None = None  # on the last event: why the answer ended
    engine: Runner = Runner.TRANSFORMERS  # what ran the step
    problems: tuple[str, ...] = ()  # what did not run as asked on the way (a compile or capture that failed, what ran instead)
    batch: int = 1  # requests in the forward that produced this token (the engine batches)
    request_id: int = 0  # the engine's id of the request
    cached_tokens: int = 0  # on the prefill event: prompt tokens whose K/V the engine's prefix cache already held
    piece: bytes = b""  # the token's exact bytes (its piece, for a special token), so an answer's text needs no tokenizer
    special: bool = False  # a special token (<|im_end|>), left out of the answer a reader sees
    logits: Any = None  # the step's full logits [vocab] (torch, float32), when the request asked for them (the engine's keep_logits)


def eos_ids(lm: LoadedModel) -> set[int]:
    """The tokens that end an answer by default: the generation config's end-of-sequence ids and the tokenizer's."""
    ids = set()
    gc = getattr(lm.model, "generation_config", None)
    e = getattr(gc, "eos_token_id", None)
    ids.update(e if isinstance(e, (list, tuple)) else [e] if e is not None else [])
    if lm.tokenizer.eos_token_id is not None:
        ids.add(lm.tokenizer.eos_token_id)
    return ids
