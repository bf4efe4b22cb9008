"""The autoregressive loop, our own: prefill once, then decode one token per step, with a KV cache.

`generate(...)` yields one `StepEvent` per generated token: its phase (prefill for the first token, decode
after), the token, the top candidates after the sampling filters, the step's wall time (device-synchronised
on GPU), and the KV cache bytes per layer read from the cache tensors themselves. Stops at EOS, at
max_new_tokens, or when the caller stops iterating. Each step holds the model lock only for its own forward
pass, so traces from other tabs interleave between steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from pipeline.common.timing import Busy
from pipeline.forward.sampling import GREEDY, Choice, Sampling, choose
from pipeline.forward.tokens import join_pieces, token_pieces, token_texts, tokenize
from pipeline.forward.tracing import TraceError, check_prompt, over_cap
from pipeline.generation.decode import CacheMode, open_step
from pipeline.generation.events import Finish, Phase, StepEvent, eos_ids
from pipeline.model.loaded import LoadedModel

MAX_NEW_TOKENS = 1024


@dataclass(eq=False)
class GenerationRecord:
    """One generation as the pages keep it: what was asked, and every event as it arrived (so a Stop, which
    reruns the page, loses nothing). Six pages read it: generation, prefill/decode, KV cache, hardware,
    roofline, streaming."""

    prompt: str
    chat: bool
    model: str  # label of the model that ran it
    max_new_tokens: int
    sampling: Sampling
    prompt_tokens: int  # tokens of the (templated) prompt
    use_cache: bool = True
    events: list = field(default_factory=list)  # [StepEvent], in order
    done: bool = False  # ran to EOS or the length limit
    stopped: bool = False  # Stop was pressed: the page moved on, what was generated is kept
    busy: Busy = field(default_factory=Busy)  # what else the server ran meanwhile (its times are inflated if anything)

    def text(self) -> str:
        """The generated text as a reader sees it (special tokens such as the final <|im_end|> left out): the events'
        exact bytes joined (pipeline.forward.tokens.join_pieces, text_of's rule)."""
        return join_pieces(((e.piece, e.special) for e in self.events), specials=False)

    @property
    def label(self) -> str:
        s = self.sampling
        how = "greedy" if s.greedy else f"temperature {s.temperature}, top-k {s.top_k}, top-p {s.top_p}, seed {s.seed}"
        return f"{self.model}, {'chat' if self.chat else 'plain'} prompt of {self.prompt_tokens} tokens, {how}, up to {self.max_new_tokens} new tokens" + (
            "" if self.use_cache else ", KV cache off"
        )


@dataclass
class Prepared:
    """A prompt ready to generate from, after validation: its tokens, the new tokens it may have (the page shows
    `notes` on what was capped)."""

    prompt_ids: list[int]
    max_new_tokens: int
    notes: list[str]


def kv_window(lm: LoadedModel) -> tuple[int, int | None]:
    """(number of sliding-window layers, tokens such a layer keeps). A sliding layer attends to the last
    `sliding_window` tokens, so its cache keeps sliding_window - 1 past tokens (the new one makes the window)."""
    a = lm.arch
    return (a.n_sliding, a.sliding_window - 1) if a.n_sliding and a.sliding_window else (0, None)


def kv_bytes_formula(lm: LoadedModel, tokens: int, bytes_per_value: int | None = None) -> int:
    """2 (K and V) x KV heads x head dim x bytes per value x tokens, summed over layers; a sliding-window
    layer holds at most its window (Gemma's local layers)."""
    return sum(lm.kv_layer_bytes(tokens, bytes_per_value))


@dataclass
class KVCost:
    """The KV cache of one sequence at a context length, from the config (a computation, not a measurement)."""

    tokens: int
    bytes: int  # this model (GQA: n_kv_heads key/value heads)
    bytes_one_kv_per_head: int  # the same if every query head had its own key/value head
    weight_bytes: int  # the model's weights, for scale


def kv_costs(lm: LoadedModel, sizes: list[int]) -> list[KVCost]:
    f = lm.facts
    return [
        KVCost(n, kv_bytes_formula(lm, n), kv_bytes_formula(lm, n) * f.n_heads // f.n_kv_heads, f.n_params * lm.arch.bytes_per_value)
        for n in sorted(set(sizes))
    ]


def measured_kv_per_token(lm: LoadedModel, ev: StepEvent) -> float | None:
    """Bytes of the cache tensors per token they hold after a step; None once a sliding window is full (the local
    layers stop growing, so the ratio is no longer per token)."""
    keep = kv_window(lm)[1]
    return ev.kv_bytes / ev.context_len if keep is None or ev.context_len <= keep else None


def prepare(lm: LoadedModel, prompt: str, max_new_tokens: int, chat: bool = False, max_prompt_tokens: int | None = None) -> Prepared:
    """The prompt as the ids a generation starts from (templated in chat mode), its new tokens capped (`notes` say
    how). TraceError, with what to do, for an empty prompt, one that fills the context window, or one over
    `max_prompt_tokens` (a demo server's cap)."""
    check_prompt(prompt)
    ids = tokenize(lm.tokenizer, prompt, chat=chat).input_ids
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        raise TraceError(over_cap(len(ids), max_prompt_tokens))
    notes = []
    limit = lm.facts.max_positions
    if limit is not None and len(ids) >= limit:
        raise TraceError(
            f"The prompt is {len(ids):,} tokens and fills this model's context window of {limit:,} tokens: there is no room to generate. Shorten it."
        )
    n = int(max_new_tokens)
    if n < 1:
        n = 1
        notes.append("max_new_tokens below 1 was raised to 1.")
    if n > MAX_NEW_TOKENS:
        notes.append(f"max_new_tokens {max_new_tokens:,} was capped at {MAX_NEW_TOKENS:,}.")
        n = MAX_NEW_TOKENS
    if limit is not None and len(ids) + n > limit:
        n = limit - len(ids)
        notes.append(f"Capped at {n:,} new tokens: the context window is {limit:,} tokens.")
    return Prepared(ids, n, notes)


def generate(
    lm: LoadedModel,
    prompt: str,
    max_new_tokens: int = 64,
    sampling: Sampling = GREEDY,
    use_cache: bool = True,
    chat: bool = False,
    request: Prepared | None = None,
    cache: CacheMode | str = CacheMode.DYNAMIC,
    stop_ids: set[int] | None = None,
):
    """This request's own loop: yield a StepEvent per generated token (greedy unless `sampling` says otherwise).
    Raises TraceError on bad prompts. (The shared engine is pipeline.serving.stream's other route.)

    cache: "dynamic" (grows by concatenation each step), "static" (transformers' preallocated cache, written in
    place), "fused" (our own static-shape decode step, pipeline.decode_step.fused: a CUDA graph replay per step on a GPU;
    greedy steps then bring only the top candidates back to the host, not the whole vocabulary) or
    "fused+compile" (the same step compiled by torch.compile first); the step itself is pipeline.generation.decode's.
    stop_ids: tokens that end the answer (default: the model's end-of-sequence tokens; an empty set generates
    exactly max_new_tokens)."""
    t0 = time.perf_counter()
    req = request or prepare(lm, prompt, max_new_tokens, chat)
    s = sampling
    gen = s.generator()
    stop = eos_ids(lm) if stop_ids is None else set(stop_ids)
    dec, pieces = token_texts(lm.tokenizer), token_pieces(lm.tokenizer)
    step = open_step(lm, cache, len(req.prompt_ids) + req.max_new_tokens, use_cache, greedy=s.greedy, n_top=s.n_top)
    n_ctx, tok = len(req.prompt_ids), None
    try:
        for i in range(req.max_new_tokens):
            t_step = time.perf_counter()
            with lm.lock, torch.inference_mode():
                out = step.prefill(req.prompt_ids) if i == 0 else step.step(tok, n_ctx - 1)
            c = choose(out, dec, s, gen)
            tok = c.token_id
            t_done = time.perf_counter()
            finished = Finish.EOS if tok in stop else (Finish.LENGTH if i == req.max_new_tokens - 1 else None)
            yield _event(step, i, c, n_ctx, finished, (t0, t_step, t_done), dec, pieces)
            if finished:
                return
            n_ctx += 1
    finally:
        step.close()


def _event(step, i: int, c: Choice, n_ctx: int, finished: Finish | None, times: tuple[float, float, float], dec, pieces) -> StepEvent:
    """Step i's event: its token and candidates (`c`), the context it attended over, the cache
    after it and what ran it; times = (request in, step start, step done)."""
    t0, t_step, t_done = times
    per_layer = step.kv_bytes_per_layer(n_ctx)
    piece, special = pieces(c.token_id)
    return StepEvent(
        index=i,
        phase=Phase.PREFILL if i == 0 else Phase.DECODE,
        token_id=c.token_id,
        text=dec(c.token_id),
        top=c.top,
        top_raw=c.top_raw,
        p=c.p,
        p_raw=c.p_raw,
        step_s=t_done - t_step,
        t_s=t_done - t0,
        context_len=n_ctx,
        kv_bytes_per_layer=per_layer,
        kv_bytes=sum(per_layer),
        kv_reserved_bytes=step.kv_reserved_bytes(),
        finished=finished,
        engine=step.runner,
        problems=step.problems,
        piece=piece,
        special=special,
    )


@dataclass
class Metrics:
    n: int
    ttft_s: float  # request in -> first token out (tokenization included)
    latency_s: float  # request in -> last token out
    itl_s: list[float]  # inter-token latency, one per gap
    tpot_s: float | None  # (latency - TTFT) / (n - 1)
    tokens_per_s: float | None  # decode rate: (n - 1) / (latency - TTFT)
    prefill_s: float = 0.0  # the first token's own pass (the prefill and its sample)
    before_s: float = 0.0  # TTFT - prefill_s: tokenizing, the engine's line, a fresh server's one-time setup

    def ttft_parts(self) -> str:
        """ "1,566 ms = 746 ms before the prefill + 820 ms prefill": TTFT in the parts a step-time chart shows."""
        return f"{self.ttft_s * 1000:,.0f} ms = {self.before_s * 1000:,.0f} ms before the prefill (tokenizing, waiting in line, setting up) + {self.prefill_s * 1000:,.0f} ms prefill"


def metrics(events: list[StepEvent]) -> Metrics:
    """Serving metrics as vLLM / TGI define them, from this run's events."""
    if not events:
        raise ValueError("no events")
    n = len(events)
    ttft, lat = events[0].t_s, events[-1].t_s
    itl = [b.t_s - a.t_s for a, b in zip(events, events[1:])]
    tpot = (lat - ttft) / (n - 1) if n > 1 else None
    prefill = min(events[0].step_s, ttft)
    return Metrics(n, ttft, lat, itl, tpot, (n - 1) / (lat - ttft) if n > 1 and lat > ttft else None, prefill, ttft - prefill)
