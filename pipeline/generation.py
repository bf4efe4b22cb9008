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

from .decode import choose, open_step, token_texts
from .events import Finish, StepEvent, eos_ids
from .models import LoadedModel
from .sampling import GREEDY, Sampling
from .timing import Busy, Ratios, Samples, ids_of_length, syncer
from .tokens import text_of, tokenize
from .tracing import TraceError, check_prompt

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

    def text(self, tokenizer) -> str:
        """The generated text as a reader sees it (special tokens such as the final <|im_end|> left out)."""
        return text_of(tokenizer, [e.token_id for e in self.events], specials=False)

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
    f = lm.facts
    n_sliding, keep = kv_window(lm)
    per_layer_token = lm.kv_token_bytes * (bytes_per_value or lm.arch.bytes_per_value) // lm.arch.bytes_per_value
    full = (f.n_layers - n_sliding) * per_layer_token * tokens
    return full + (n_sliding * per_layer_token * min(tokens, keep) if n_sliding else 0)


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


def prepare(lm: LoadedModel, prompt: str, max_new_tokens: int, chat: bool = False) -> Prepared:
    check_prompt(prompt)
    ids = tokenize(lm.tokenizer, prompt, chat=chat).input_ids
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
    cache: str = "dynamic",
    stop_ids: set[int] | None = None,
):
    """This request's own loop: yield a StepEvent per generated token (greedy unless `sampling` says otherwise).
    Raises TraceError on bad prompts. (The shared engine is pipeline.serving.stream's other route.)

    cache: "dynamic" (grows by concatenation each step), "static" (transformers' preallocated cache, written in
    place), "fused" (our own static-shape decode step, pipeline.fused: a CUDA graph replay per step on a GPU;
    greedy steps then bring only the top candidates back to the host, not the whole vocabulary) or
    "fused+compile" (the same step compiled by torch.compile first); the step itself is pipeline.decode's.
    stop_ids: tokens that end the answer (default: the model's end-of-sequence tokens; an empty set generates
    exactly max_new_tokens)."""
    t0 = time.perf_counter()
    req = request or prepare(lm, prompt, max_new_tokens, chat)
    s = sampling
    gen = s.generator()
    stop = eos_ids(lm) if stop_ids is None else set(stop_ids)
    dec = token_texts(lm.tokenizer)
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
            per_layer = step.kv_bytes_per_layer()
            finished = Finish.EOS if tok in stop else (Finish.LENGTH if i == req.max_new_tokens - 1 else None)
            yield StepEvent(
                index=i,
                phase="prefill" if i == 0 else "decode",
                token_id=tok,
                text=dec(tok),
                top=c.top,
                top_raw=c.top_raw,
                p=c.p,
                p_raw=c.p_raw,
                step_s=t_done - t_step,
                t_s=t_done - t0,
                context_len=n_ctx,
                kv_bytes_per_layer=per_layer,
                kv_bytes=sum(per_layer),
                finished=finished,
                engine=step.name,
            )
            if finished:
                return
            n_ctx += 1
    finally:
        step.close()


@dataclass
class Metrics:
    n: int
    ttft_s: float  # request in -> first token out (tokenization included)
    latency_s: float  # request in -> last token out
    itl_s: list[float]  # inter-token latency, one per gap
    tpot_s: float | None  # (latency - TTFT) / (n - 1)
    tokens_per_s: float | None  # decode rate: (n - 1) / (latency - TTFT)


def metrics(events: list[StepEvent]) -> Metrics:
    """Serving metrics as vLLM / TGI define them, from this run's events."""
    if not events:
        raise ValueError("no events")
    n = len(events)
    ttft, lat = events[0].t_s, events[-1].t_s
    itl = [b.t_s - a.t_s for a, b in zip(events, events[1:])]
    tpot = (lat - ttft) / (n - 1) if n > 1 else None
    return Metrics(n, ttft, lat, itl, tpot, (n - 1) / (lat - ttft) if n > 1 and lat > ttft else None)


def long_prompt(lm: LoadedModel, n_tokens: int) -> str:
    """Real text of about n_tokens tokens (for experiments that need a long context)."""
    return lm.tokenizer.decode(ids_of_length(lm, n_tokens)[0].tolist())


@dataclass
class SweepRow:
    """Prefill and decode at one prompt length, every repeat kept (device-synchronised)."""

    tokens: int  # prompt length T
    prefill: Samples  # one forward over T tokens, filling the KV cache (s), one value per repeat
    decode: Samples  # one token over the T-token cache, mean of the decode steps (s), one value per repeat

    @property
    def prefill_s(self) -> float:
        return self.prefill.median

    @property
    def decode_step_s(self) -> float:
        return self.decode.median

    @property
    def prefill_per_token_s(self) -> float:
        return self.prefill_s / self.tokens


def prefill_decode_sweep(lm: LoadedModel, lengths: list[int], decode_steps: int = 8, repeats: int = 3, progress=None) -> list[SweepRow]:
    """For each prompt length T: the prefill forward (T tokens at once, filling the KV cache) and a decode
    step after it (mean of `decode_steps`), `repeats` times after a warm-up. The repeats are interleaved: each
    repeat measures every length once, in an order rotated each repeat, so a busy moment of a shared machine
    spoils one repeat of several lengths, not every repeat of one length (growth_verdict reads them)."""
    from transformers import DynamicCache

    sync = syncer(lm.device)

    def once(ids):
        with lm.lock, torch.inference_mode():
            cache = DynamicCache(config=lm.model.config)
            sync()
            t = time.perf_counter()
            out = lm.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            sync()
            prefill = time.perf_counter() - t
            nxt = out.logits[:, -1:].argmax(-1)
            t = time.perf_counter()
            for _ in range(decode_steps):
                out = lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)
                nxt = out.logits[:, -1:].argmax(-1)
            sync()
            return prefill, (time.perf_counter() - t) / decode_steps

    ids = {n: ids_of_length(lm, n) for n in lengths}
    once(ids[lengths[0]])  # warm-up
    got: dict[int, list[tuple[float, float]]] = {n: [] for n in lengths}
    for r in range(repeats):
        order = lengths[r % len(lengths) :] + lengths[: r % len(lengths)]
        for j, n in enumerate(order):
            got[n].append(once(ids[n]))
            if progress:
                progress((r * len(lengths) + j + 1) / (repeats * len(lengths)), f"repeat {r + 1} of {repeats}: {n} tokens")
    return [SweepRow(n, Samples(tuple(p for p, _ in got[n])), Samples(tuple(d for _, d in got[n]))) for n in lengths]


def growth(first: Samples, last: Samples) -> Samples:
    """last / first within each repeat (both measured in the same repeat, next to each other)."""
    return Samples(tuple(b / a for a, b in zip(first.values, last.values)))


@dataclass(frozen=True)
class Verdict:
    """What a page may say about a measured trend: `claim` only when every repeat supports it, else `doubt`
    says why this machine could not tell."""

    claim: str | None
    doubt: str | None


def sweep_verdict(rows: list[SweepRow]) -> Verdict:
    """The prefill/decode page's sentence. "Prefill pays for every prompt token; a decode step mostly for reading the weights"
    needs, in every repeat, a decode step that grew less than 2x while the prompt grew, and a prefill that grew
    more than twice as much as the decode step did. A decode step that grew 2x or more in every repeat is a
    finding of its own (attention over a long cache); repeats on both sides of 2x are noise."""
    first, last = rows[0], rows[-1]
    gp, gd = growth(first.prefill, last.prefill), growth(first.decode, last.decode)
    said = (
        f"From {first.tokens:,} to {last.tokens:,} tokens ({last.tokens / first.tokens:.0f}× longer), across {len(gp.values)} repeats "
        f"prefill took {gp.median:.1f}× as long ({gp.lo:.1f}–{gp.hi:.1f}) and a decode step {gd.median:.2f}× as long ({gd.lo:.2f}–{gd.hi:.2f})."
    )
    if len(gp.values) < 2:
        return Verdict(None, said + " One repeat cannot tell a trend from noise: run the sweep with more repeats.")
    if gd.hi < 2 and gp.lo > 2 * gd.hi:
        return Verdict(said + " Prefill pays for every prompt token; a decode step mostly pays for reading the weights.", None)
    if gd.lo >= 2 and gp.lo > gd.hi:
        return Verdict(said + " At this length a decode step grows too: it attends over the whole cache, and that part grows with the context.", None)
    return Verdict(
        None,
        said + " The repeats disagree (the ranges overlap the line between the two readings), so this machine was too noisy to tell "
        "what grows with the prompt: other work shared the processor. Run the sweep again when it is quieter.",
    )


@dataclass
class CacheRow:
    """Decode steps with and without the KV cache after a prompt of `tokens` tokens, every repeat kept."""

    tokens: int  # context the steps attend over (the prompt)
    on: Samples  # mean decode step with the cache (s): one token fed
    off: Samples  # mean decode step without it (s): the whole context fed again
    same_tokens: bool  # greedy tokens identical with and without


def cache_off_sweep(lm: LoadedModel, lengths: list[int], new_tokens: int = 3, repeats: int = 3, progress=None) -> list[CacheRow]:
    """The same greedy generation with and without the KV cache after prompts of each length, interleaved
    repeats: a step without the cache is a forward over the whole context, so its time grows with the context,
    while a step with it feeds one token. Steps after the first (prefill) are averaged."""
    prompts = {n: long_prompt(lm, n) for n in lengths}

    def steps(n: int, use_cache: bool) -> tuple[float, list[int], int]:
        ev = list(generate(lm, prompts[n], new_tokens, use_cache=use_cache))
        dec = [e.step_s for e in ev[1:]] or [ev[0].step_s]
        return sum(dec) / len(dec), [e.token_id for e in ev], ev[0].context_len

    steps(lengths[0], True)  # warm-up
    runs: dict[tuple[int, bool], list[float]] = {}
    same: dict[int, dict[bool, list[int]]] = {}
    ctx: dict[int, int] = {}
    jobs = [(n, c) for n in lengths for c in (True, False)]
    for r in range(repeats):
        k = r % len(jobs)
        for j, (n, c) in enumerate(jobs[k:] + jobs[:k]):
            t, toks, ctx[n] = steps(n, c)
            runs.setdefault((n, c), []).append(t)
            same.setdefault(n, {})
            same[n][c] = toks
            if progress:
                progress((r * len(jobs) + j + 1) / (repeats * len(jobs)), f"repeat {r + 1} of {repeats}: {n} tokens, cache {'on' if c else 'off'}")
    return [CacheRow(ctx[n], Samples(tuple(runs[(n, True)])), Samples(tuple(runs[(n, False)])), same[n][True] == same[n][False]) for n in lengths]


def cache_verdict(rows: list[CacheRow]) -> Verdict:
    """The prefill/decode page's sentence on the cache: "without the cache a step grows with the context" only when, in every
    repeat, the longest context's step took more than twice the shortest's without the cache."""
    first, last = rows[0], rows[-1]
    g_off, g_on = growth(first.off, last.off), growth(first.on, last.on)
    said = (
        f"From a {first.tokens:,}- to a {last.tokens:,}-token context, a step without the cache took {g_off.median:.1f}× as long "
        f"({g_off.lo:.1f}–{g_off.hi:.1f}), with it {g_on.median:.2f}× ({g_on.lo:.2f}–{g_on.hi:.2f})."
    )
    if len(g_off.values) < 2:
        return Verdict(None, said + " One repeat cannot tell a trend from noise.")
    if g_off.lo > 2 and g_off.lo > g_on.hi:
        return Verdict(said + " Without the cache every step recomputes the whole context, so it grows with it; with the cache a step feeds one token.", None)
    return Verdict(
        None, said + " The repeats disagree, so this machine was too noisy to tell: other work shared the processor. Run it again when it is quieter."
    )


CACHE_MODES = ("dynamic", "static", "fused")


@dataclass
class ModeRun:
    """One decoding mode's runs of the same greedy request."""

    events: list  # [StepEvent] of the last run
    tokens_per_s: float | None  # median decode rate over the runs (tokens/s)
    runs: list[float]  # every run's decode rate (tokens/s), in order
    warmup_s: float  # the warm-up's wall time (s): buffers, graph capture, compile
    utilisation: float | None  # mean device utilisation during the last run (%)
    utilisation_of: str  # what that figure is (NVML GPU %, or process CPU %)
    engine: str  # what ran the steps (transformers, or the fused step's mode)

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events]


@dataclass(eq=False)
class CacheModeComparison:
    """compare_cache_modes(): the same request decoded in each mode, runs interleaved."""

    modes: dict[str, ModeRun]  # mode name -> its runs; "dynamic" is the reference
    prompt_ids: list[int]  # the request's tokens

    def ratios(self, mode: str) -> Ratios:
        """tokens/s of `mode` over the dynamic loop's, one per repeat (the two measured in the same repeat)."""
        return Ratios(tuple(a / b for a, b in zip(self.modes[mode].runs, self.modes["dynamic"].runs) if a and b))

    def ratio(self, mode: str) -> float | None:
        """The median of the per-repeat ratios."""
        return self.ratios(mode).median

    def same_tokens(self, mode: str) -> bool:
        return self.modes[mode].token_ids == self.modes["dynamic"].token_ids

    def headline(self, mode: str) -> str | None:
        """ "1.39× the dynamic loop" only when the repeats hold it: not noisy, and the medians of tokens/s point the
        same way as the median ratio (a ratio of 1.39 with a median rate below the dynamic's is noise). None when
        this machine could not tell the two apart."""
        r, a, b = self.ratios(mode), self.modes[mode].tokens_per_s, self.modes["dynamic"].tokens_per_s
        if not r.values or r.noisy or not a or not b or (r.median > 1) != (a > b):
            return None
        return f"{r.median:.2f}× the dynamic loop ({r.spread[0]:.2f}–{r.spread[1]:.2f})"


def compare_cache_modes(
    lm: LoadedModel, prompt: str, n: int, chat: bool = False, reps: int = 5, modes: tuple[str, ...] = CACHE_MODES, progress=None
) -> CacheModeComparison:
    """Greedy decoding of the same request in each mode, interleaved `reps` times after a warm-up of each
    (which also builds buffers, captures graphs, compiles); the order alternates every repeat (forward, then
    backward), so no mode always runs right after the same one."""
    import statistics

    from .telemetry import Sampler

    req = prepare(lm, prompt, n, chat)
    warm = {}
    for j, m in enumerate(modes):
        if progress:
            what = {
                "fused+compile": " (torch.compile compiles the step once: about a minute)",
                "fused": " (builds the buffers" + (", captures the CUDA graph)" if lm.device.type == "cuda" else ")"),
            }.get(m, "")
            progress(j / (len(modes) * (reps + 1)), f"warm-up: {m}{what}")
        t = time.perf_counter()
        g = generate(lm, prompt, chat=chat, cache=m, request=req)
        for ev in g:
            if ev.index >= 2:
                break
        g.close()  # hands a fused decoder back at once
        warm[m] = time.perf_counter() - t
    rates: dict[str, list[float]] = {m: [] for m in modes}
    last: dict[str, list[StepEvent]] = {}
    util: dict[str, tuple] = {}
    for r in range(reps):
        for j, m in enumerate(modes if r % 2 == 0 else modes[::-1]):
            if progress:
                progress((len(modes) * (r + 1) + j) / (len(modes) * (reps + 1)), f"run {r + 1}/{reps}: {m}")
            with Sampler(interval_s=0.05) as s:
                ev = list(generate(lm, prompt, chat=chat, cache=m, request=req))
            last[m] = ev
            util[m] = s.timeline.mean_utilisation()  # the last run's
            rate = metrics(ev).tokens_per_s
            if rate:
                rates[m].append(rate)
    return CacheModeComparison(
        {
            m: ModeRun(
                events=last[m],
                tokens_per_s=statistics.median(rates[m]) if rates[m] else None,
                runs=rates[m],
                warmup_s=warm[m],
                utilisation=util[m][0],
                utilisation_of=util[m][1],
                engine=last[m][0].engine,
            )
            for m in modes
        },
        req.prompt_ids,
    )
