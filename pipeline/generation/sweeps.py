"""Sweeps over the loop, each with a verdict computed from its own repeats: prefill against decode as the prompt
grows (page 7), the cost of decoding without a KV cache (page 8), and the cache modes side by side (pages 8, 12)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pipeline.common.timing import Ratios, Samples, ids_of_length, syncer
from pipeline.generation.decode import CacheMode
from pipeline.generation.events import Runner, StepEvent
from pipeline.generation.loop import generate, metrics, prepare
from pipeline.model.loaded import LoadedModel


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


CACHE_MODES = tuple(CacheMode)  # every mode; compare_cache_modes runs the quick three unless asked
QUICK_MODES = (CacheMode.DYNAMIC, CacheMode.STATIC, CacheMode.FUSED)


@dataclass
class ModeRun:
    """One decoding mode's runs of the same greedy request."""

    events: list  # [StepEvent] of the last run
    tokens_per_s: float | None  # median decode rate over the runs (tokens/s)
    runs: list[float]  # every run's decode rate (tokens/s), in order
    warmup_s: float  # the warm-up's wall time (s): buffers, graph capture, compile
    utilisation: float | None  # mean device utilisation during the last run (%)
    utilisation_of: str  # what that figure is (NVML GPU %, or process CPU %)
    engine: Runner  # what ran the steps (transformers, or the fused step in its mode)
    problems: tuple[str, ...] = ()  # what did not run as asked (a compile or capture that failed, what ran instead)

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.events]


@dataclass(eq=False)
class CacheModeComparison:
    """compare_cache_modes(): the same request decoded in each mode, runs interleaved."""

    modes: dict[CacheMode, ModeRun]  # each mode's runs; CacheMode.DYNAMIC is the reference
    prompt_ids: list[int]  # the request's tokens

    def ratios(self, mode: str) -> Ratios:
        """tokens/s of `mode` over the dynamic loop's, one per repeat (the two measured in the same repeat)."""
        return Ratios(tuple(a / b for a, b in zip(self.modes[mode].runs, self.modes[CacheMode.DYNAMIC].runs) if a and b))

    def ratio(self, mode: str) -> float | None:
        """The median of the per-repeat ratios."""
        return self.ratios(mode).median

    def same_tokens(self, mode: str) -> bool:
        return self.modes[mode].token_ids == self.modes[CacheMode.DYNAMIC].token_ids

    def headline(self, mode: str) -> str | None:
        """ "1.39× the dynamic loop" only when the repeats hold it: not noisy, and the medians of tokens/s point the
        same way as the median ratio (a ratio of 1.39 with a median rate below the dynamic's is noise). None when
        this machine could not tell the two apart."""
        r, a, b = self.ratios(mode), self.modes[mode].tokens_per_s, self.modes[CacheMode.DYNAMIC].tokens_per_s
        if not r.values or r.noisy or not a or not b or (r.median > 1) != (a > b):
            return None
        return f"{r.median:.2f}× the dynamic loop ({r.spread[0]:.2f}–{r.spread[1]:.2f})"


def compare_cache_modes(
    lm: LoadedModel, prompt: str, n: int, chat: bool = False, reps: int = 5, modes: tuple[CacheMode | str, ...] = QUICK_MODES, progress=None
) -> CacheModeComparison:
    """Greedy decoding of the same request in each mode, interleaved `reps` times after a warm-up of each
    (which also builds buffers, captures graphs, compiles); the order alternates every repeat (forward, then
    backward), so no mode always runs right after the same one."""
    import statistics

    from pipeline.common.telemetry import Sampler

    modes = tuple(CacheMode(m) for m in modes)  # "dynamic" from a caller is CacheMode.DYNAMIC from here on
    req = prepare(lm, prompt, n, chat)
    warm = {}
    for j, m in enumerate(modes):
        if progress:
            what = {
                CacheMode.FUSED_COMPILE: " (torch.compile compiles the step once: about a minute)",
                CacheMode.FUSED: " (builds the buffers" + (", captures the CUDA graph)" if lm.device.type == "cuda" else ")"),
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
                problems=last[m][0].problems,
            )
            for m in modes
        },
        req.prompt_ids,
    )
