"""The decode step, behind one interface.

Two implementations of `DecodeStep`, driven by `generation.generate()` (and by the batched engine):

    TransformersStep   transformers' own forward with a dynamic or static cache (or none: every step feeds
                       the whole context again)
    FusedStep          our static-shape step (pipeline.decode_step.fused): fused matrices, static KV buffers, a CUDA graph
                       replay per token on a GPU

    step = open_step(lm, "dynamic", n_positions)   # or "static", "fused", "fused+compile", use_cache=False
    out = step.prefill(prompt_ids)                 # StepOutput for the prompt's last position
    out = step.step(token_id, position)            # one token at `position`
    step.kv_bytes_per_layer(tokens); step.kv_reserved_bytes(); step.close()

The caller holds lm.lock around prefill() / step() (one forward at a time on the shared model) and
pipeline.forward.sampling's `choose()` turns a StepOutput into the token and the candidates the pages show.
"""

from __future__ import annotations

from enum import StrEnum

import torch

from pipeline.common.timing import sync
from pipeline.forward.sampling import StepOutput
from pipeline.generation.events import Runner
from pipeline.model.loaded import LoadedModel


def kv_bytes(cache) -> list[int]:
    """Bytes held by each layer's key and value tensors in a transformers cache."""
    out = []
    for layer in getattr(cache, "layers", []):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        out.append(sum(t.numel() * t.element_size() for t in (k, v) if isinstance(t, torch.Tensor)))
    return out


class TransformersStep:
    """transformers' forward, one call per token. cache: "dynamic" (grows by concatenation), "static"
    (preallocated, written in place) or None (no cache: each step feeds the whole context)."""

    def __init__(self, lm: LoadedModel, cache: CacheMode | str | None, n_positions: int):
        from transformers import DynamicCache, StaticCache

        self.lm, self.runner, self.problems, self.on_device = lm, Runner.TRANSFORMERS, (), False
        if cache is None:
            self.cache = None
        elif cache == CacheMode.STATIC:
            self.cache = StaticCache(config=lm.model.config, max_cache_len=n_positions)
        else:
            self.cache = DynamicCache(config=lm.model.config)
        self.preallocated = cache == CacheMode.STATIC
        self._context: torch.Tensor | None = None  # every token so far, when there is no cache

    def _forward(self, ids: torch.Tensor) -> StepOutput:
        out = self.lm.model(input_ids=ids, past_key_values=self.cache, use_cache=self.cache is not None, logits_to_keep=1)
        logits = out.logits[0, -1].float()
        sync(self.lm.device)
        return StepOutput(logits=logits.cpu())

    def prefill(self, prompt_ids: list[int]) -> StepOutput:
        ids = torch.tensor([prompt_ids], device=self.lm.device)
        self._context = ids if self.cache is None else None
        return self._forward(ids)

    def step(self, token_id: int, position: int) -> StepOutput:
        nxt = torch.tensor([[token_id]], device=self.lm.device)
        if self.cache is None:
            self._context = torch.cat([self._context, nxt], dim=1)
            return self._forward(self._context)
        return self._forward(nxt)

    def kv_bytes_per_layer(self, tokens: int) -> list[int]:
        """The context's K/V per layer: read from the dynamic cache's tensors (a measurement), the formula for the
        static cache (its buffer is preallocated)."""
        if self.cache is None:
            return []
        return kv_bytes(self.cache) if not self.preallocated else self.lm.kv_layer_bytes(tokens)

    def kv_reserved_bytes(self) -> int:
        return sum(kv_bytes(self.cache)) if self.cache is not None else 0

    def close(self):
        self.cache = self._context = None


class FusedStep:
    """Our static-shape step (pipeline.decode_step.fused). With `on_device` (greedy, few candidates) only a summary of the
    logits comes back to the host: argmax, log-sum-exp and the top candidates."""

    def __init__(self, lm: LoadedModel, n_positions: int, compile: bool = False, on_device: bool = False, n_top: int = 10):
        from pipeline.decode_step.fused import acquire_decoder
        from pipeline.decode_step.fused_weights import fused_model

        fm = fused_model(lm)  # the model's fused weights, shared by every decoder of it
        self.lm = lm
        self.dec = acquire_decoder(fm, n_positions, compile=compile)
        self.on_device = on_device and n_top <= self.dec.n_top
        self.runner, self.problems = Runner.fused(self.dec.mode), tuple(self.dec.problems)

    def _out(self, logits, summary) -> StepOutput:
        return StepOutput(summary=summary.cpu()) if self.on_device else StepOutput(logits=logits.cpu())

    def prefill(self, prompt_ids: list[int]) -> StepOutput:
        return self._out(*self.dec.prefill(torch.tensor([prompt_ids], device=self.lm.device)))

    def step(self, token_id: int, position: int) -> StepOutput:
        return self._out(*self.dec.step(token_id, position))

    def kv_bytes_per_layer(self, tokens: int) -> list[int]:
        return self.lm.kv_layer_bytes(tokens)

    def kv_reserved_bytes(self) -> int:
        return sum(self.dec.kv_bytes_reserved_per_layer())

    def close(self):
        if self.dec is not None:
            self.dec.release()  # hand the decoder (its buffers, its graph) back at once
            self.dec = None


class CacheMode(StrEnum):
    """How our own loop keeps keys and values (a StrEnum: "dynamic" in a link or a config still reads)."""

    DYNAMIC = "dynamic"  # transformers' cache, grown by concatenation each step
    STATIC = "static"  # transformers' preallocated cache, written in place
    FUSED = "fused"  # our static-shape step (pipeline.decode_step.fused): a CUDA graph replay per step on a GPU
    FUSED_COMPILE = "fused+compile"  # the same step compiled by torch.compile first

    @property
    def fused(self) -> bool:
        return self in (CacheMode.FUSED, CacheMode.FUSED_COMPILE)


def open_step(lm: LoadedModel, cache: CacheMode | str = CacheMode.DYNAMIC, n_positions: int = 0, use_cache: bool = True, greedy: bool = False, n_top: int = 10):
    """The decode step for a generation of at most n_positions tokens (prompt + new)."""
    mode = CacheMode(cache) if use_cache else None
    if mode is None or not mode.fused:
        return TransformersStep(lm, mode, n_positions)
    return FusedStep(lm, n_positions, compile=mode == CacheMode.FUSED_COMPILE, on_device=greedy, n_top=n_top)
