"""Speculative decoding, our own draft-then-verify loop (Leviathan et al. 2023; Chen et al. 2023).

A cheap draft proposes gamma tokens; the target model scores all of them in ONE forward pass. Greedy: the
longest prefix where the target's own argmax agrees is accepted, plus one target token (the correction at the
first disagreement, or a bonus token when all agree), so the output is exactly plain greedy decoding.
Sampling: each proposal x is accepted with probability min(1, p(x)/q(x)); at the first rejection a token is
drawn from norm(max(0, p - q)), which makes the output distributed exactly as sampling from the target.

Drafts: "prompt_lookup" (copy the continuation of the latest earlier match of the last n-gram), "early_exit:K"
(the target's own first K layers, then its final norm and LM head: shared weights, no extra memory), or a
LoadedModel sharing the tokenizer.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from enum import StrEnum

import torch
from torch import nn

from pipeline.common.timing import Ratios
from pipeline.forward.sampling import GREEDY, Sampling, filter_probs
from pipeline.generation.events import eos_ids
from pipeline.generation.loop import prepare
from pipeline.model.loaded import LoadedModel


@dataclass
class SpecStep:
    proposed: list[int]
    accepted: int  # how many proposals the target accepted
    correction: int  # the target's own token appended after them
    draft_s: float
    verify_s: float


@dataclass
class SpecResult:
    tokens: list[int]
    steps: list[SpecStep] = field(default_factory=list)
    seconds: float = 0.0
    target_calls: int = 0

    @property
    def proposed(self) -> int:
        return sum(len(s.proposed) for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted / len(self.steps) if self.steps else 0.0


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """Leviathan et al.: expected tokens per target call (1 - a^(g+1)) / (1 - a)."""
    if alpha >= 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def _crop(cache, n: int):
    extra = cache.get_seq_length() - n
    if extra > 0:
        cache.crop(-extra)


# ------------------------------------------------------------------------------------ drafts
class PromptLookup:
    """Propose the tokens that followed the latest earlier occurrence of the context's last n-gram."""

    name = "prompt lookup"

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def reset(self, lm):
        pass

    def propose(self, ctx: list[int], gamma: int, **_) -> tuple[list[int], list[torch.Tensor] | None]:
        for n in range(min(self.max_ngram, len(ctx) - 1), 0, -1):
            tail = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):
                if ctx[start : start + n] == tail:
                    cont = ctx[start + n : start + n + gamma]
                    if cont:
                        return cont, None
        return [], None


def early_exit_model(lm: LoadedModel, k: int) -> nn.Module:
    """A causal LM made of the target's first k layers + its final norm + LM head (modules shared, not copied)."""
    return lm.arch.first_layers_model(k)


class ModelDraft:
    """A causal LM that proposes greedily (or by sampling), keeping its own KV cache."""

    def __init__(self, model: nn.Module, name: str):
        self.model, self.name = model, name
        self.cache, self.seen = None, 0

    def reset(self, lm):
        from transformers import DynamicCache

        self.cache, self.seen = DynamicCache(config=self.model.config), 0

    def propose(self, ctx: list[int], gamma: int, device=None, sample_fn=None):
        out, dists = [], []
        _crop(self.cache, min(self.seen, len(ctx) - 1))
        self.seen = self.cache.get_seq_length()
        feed = ctx[self.seen :]
        for _ in range(gamma):
            with torch.inference_mode():
                o = self.model(input_ids=torch.tensor([feed], device=device), past_key_values=self.cache, use_cache=True, logits_to_keep=1)
            logits = o.logits[0, -1].float().cpu()
            tok, q = sample_fn(logits)
            out.append(tok)
            dists.append(q)
            feed = [tok]
        self.seen = self.cache.get_seq_length()  # = len(ctx) + gamma - 1 (the last proposal is not fed)
        return out, dists


class DraftKind(StrEnum):
    PROMPT_LOOKUP = "prompt_lookup"  # copy the continuation of the latest earlier match of the last n-gram
    EARLY_EXIT = "early_exit"  # the target's own first layers (EarlyExit says how many)


@dataclass(frozen=True)
class EarlyExit:
    """The early-exit draft: the target's first `layers` layers, then its final norm and LM head."""

    layers: int
    kind: DraftKind = DraftKind.EARLY_EXIT


Draft = DraftKind | EarlyExit | LoadedModel


def parse_draft(text: str) -> DraftKind | EarlyExit:
    """The CLI's spelling: "prompt_lookup" or "early_exit:K"."""
    name, _, k = text.partition(":")
    if name == DraftKind.EARLY_EXIT and k.isdigit():
        return EarlyExit(int(k))
    if name == DraftKind.PROMPT_LOOKUP and not k:
        return DraftKind.PROMPT_LOOKUP
    raise ValueError(f"unknown draft {text!r}: prompt_lookup or early_exit:K")


def make_draft(lm: LoadedModel, kind: Draft | str, gamma: int = 4):
    if isinstance(kind, LoadedModel):
        if kind.tokenizer.get_vocab() != lm.tokenizer.get_vocab():
            raise ValueError(f"{kind.label} does not share {lm.label}'s tokenizer, so it cannot draft for it.")
        return ModelDraft(kind.model, kind.label)
    if isinstance(kind, str):
        kind = parse_draft(kind)
    if kind == DraftKind.PROMPT_LOOKUP:
        return PromptLookup()
    if isinstance(kind, EarlyExit):
        if not 0 < kind.layers < lm.facts.n_layers:
            raise ValueError(f"early exit needs 0 < k < {lm.facts.n_layers}")
        return ModelDraft(early_exit_model(lm, kind.layers), f"early exit after {kind.layers} of {lm.facts.n_layers} layers")
    raise ValueError(f"unknown draft {kind!r}")


# --------------------------------------------------------------------------------- acceptance
def accept_greedy(ps: list[torch.Tensor], proposal: list[int], stop: set[int]) -> tuple[int, int | None]:
    """Greedy verification of a draft's proposal against the target's distributions ps[i] ([vocab], the
    target's next-token distribution after proposal[:i]). Accept while the target's argmax agrees; at the first
    disagreement the target's argmax is the correction. Returns (accepted, correction), correction None when
    every proposal was accepted or an accepted one was EOS."""
    for i, x in enumerate(proposal):
        best = int(ps[i].argmax())
        if best != x:
            return i, best
        if x in stop:
            return i + 1, None
    return len(proposal), None


def accept_sampled(
    ps: list[torch.Tensor], qs: list[torch.Tensor] | None, proposal: list[int], stop: set[int], gen: torch.Generator | None
) -> tuple[int, int | None]:
    """Speculative sampling (Leviathan et al., Algorithm 1): accept proposal x with probability
    min(1, p(x) / q(x)) (q = the draft's distribution; a deterministic draft such as prompt lookup has q = 1 on
    x); at the first rejection draw the correction from norm(max(0, p - q)). The output is then distributed
    exactly as sampling from the target. Random draws come from `gen`, in order, one per examined proposal."""
    for i, x in enumerate(proposal):
        p = ps[i]
        q = qs[i] if qs is not None else torch.nn.functional.one_hot(torch.tensor(x), p.numel()).float()
        if torch.rand(1, generator=gen).item() >= min(1.0, float(p[x]) / max(float(q[x]), 1e-20)):
            resid = (p - q).clamp(min=0)
            resid = resid / resid.sum() if resid.sum() > 0 else p
            return i, int(torch.multinomial(resid, 1, generator=gen)[0])
        if x in stop:
            return i + 1, None
    return len(proposal), None


# --------------------------------------------------------------------------------- the loop
@dataclass
class _Pick:
    """The request's sampling: the filtered distribution of a step's logits, and a token chosen from it (greedy: its
    argmax; else a draw from `gen`, the draws in order). A draft that samples is handed it as its sample_fn."""

    sampling: Sampling
    gen: torch.Generator | None

    def dist(self, logits: torch.Tensor) -> torch.Tensor:
        return filter_probs(logits, self.sampling)

    def __call__(self, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        p = self.dist(logits)
        tok = int(p.argmax()) if self.sampling.greedy else int(torch.multinomial(p, 1, generator=self.gen)[0])
        return tok, p


def _until_stop(tokens: list[int], stop: set[int]) -> list[int]:
    """The tokens up to and including the first stop token (an answer ends there)."""
    for j, t in enumerate(tokens):
        if t in stop:
            return tokens[: j + 1]
    return tokens


def _verify(lm: LoadedModel, cache, ctx: list[int], proposal: list[int], qs, pick: _Pick, stop: set[int]) -> tuple[int, int | None]:
    """One target call over the context's last token and the proposal (the cache cropped to hold everything before
    that token): how many proposed tokens it accepts, and its own token after them (the correction at the first
    rejection, or a bonus token after a fully accepted proposal; None after an accepted stop token)."""
    _crop(cache, len(ctx) - 1)  # the cache holds everything but the last token
    with lm.lock, torch.inference_mode():
        o = lm.model(input_ids=torch.tensor([[ctx[-1]] + proposal], device=lm.device), past_key_values=cache, use_cache=True)
    logits = o.logits[0].float().cpu()  # [1 + len(proposal), vocab]
    ps = [pick.dist(logits[i]) for i in range(len(proposal))]
    if pick.sampling.greedy:
        accepted, correction = accept_greedy(ps, proposal, stop)
    else:
        accepted, correction = accept_sampled(ps, qs, proposal, stop, pick.gen)
    if correction is None and not (accepted and proposal[accepted - 1] in stop):
        correction, _ = pick(logits[accepted])  # bonus token after a fully accepted proposal
    return accepted, correction


def speculative_generate(
    lm: LoadedModel, prompt: str, draft="prompt_lookup", gamma: int = 4, max_new_tokens: int = 64, sampling: Sampling = GREEDY, chat: bool = False
) -> SpecResult:
    """Generate with a draft; returns the tokens and one record per target call."""
    from transformers import DynamicCache

    t0 = time.perf_counter()
    req = prepare(lm, prompt, max_new_tokens, chat)
    d = draft if hasattr(draft, "propose") else make_draft(lm, draft, gamma)
    d.reset(lm)
    pick, stop = _Pick(sampling, sampling.generator()), eos_ids(lm)
    ctx = list(req.prompt_ids)
    out: list[int] = []
    res = SpecResult(tokens=out)
    cache = DynamicCache(config=lm.model.config)
    with lm.lock, torch.inference_mode():  # prefill: the first token comes from the target
        o = lm.model(input_ids=torch.tensor([ctx], device=lm.device), past_key_values=cache, use_cache=True, logits_to_keep=1)
    res.target_calls += 1
    tok, _ = pick(o.logits[0, -1].float().cpu())
    out.append(tok)
    ctx.append(tok)
    while len(out) < req.max_new_tokens and out[-1] not in stop:
        room = req.max_new_tokens - len(out)
        t_d = time.perf_counter()
        with lm.lock:
            proposal, qs = d.propose(ctx, min(gamma, room - 1) if room > 1 else 0, device=lm.device, sample_fn=pick)
        draft_s = time.perf_counter() - t_d
        proposal = proposal[: max(0, room - 1)]
        t_v = time.perf_counter()
        accepted, correction = _verify(lm, cache, ctx, proposal, qs, pick, stop)
        res.target_calls += 1
        new = _until_stop(proposal[:accepted] + ([correction] if correction is not None else []), stop)  # stop at EOS inside the run
        out.extend(new)
        ctx.extend(new)
        res.steps.append(SpecStep(proposal, accepted, correction if correction is not None else -1, draft_s, time.perf_counter() - t_v))
    del out[req.max_new_tokens :]
    res.seconds = time.perf_counter() - t0
    return res


@dataclass
class SpecComparison:
    """Plain decoding and speculative decoding of the same request, same settings, interleaved repeats."""

    draft: str  # what drafted
    gamma: int
    sampling: Sampling
    plain_tokens: list[int]
    plain_runs_s: list[float]  # wall time of plain decoding, each repeat (s)
    spec_runs_s: list[float]  # wall time of speculative decoding, each repeat (s)
    spec: SpecResult  # the last speculative run (its calls are drawn)

    @property
    def plain_s(self) -> float:
        return statistics.median(self.plain_runs_s)

    @property
    def speedups(self) -> Ratios:
        """plain time / speculative time, one per repeat (both timed next to each other)."""
        return Ratios(tuple(p / s for p, s in zip(self.plain_runs_s, self.spec_runs_s) if s))

    @property
    def speedup(self) -> float:
        return self.speedups.median or 0.0

    @property
    def identical(self) -> bool:
        """Greedy speculative output equals plain greedy output (the guarantee; not expected when sampling)."""
        return self.spec.tokens == self.plain_tokens


def compare_with_plain(
    lm: LoadedModel,
    prompt: str,
    draft="prompt_lookup",
    gamma: int = 4,
    max_new_tokens: int = 64,
    sampling: Sampling = GREEDY,
    chat: bool = False,
    reps: int = 5,
    progress=None,
) -> SpecComparison:
    """Decode `prompt` plainly (our loop) and with the draft, `reps` times, the order alternating each repeat:
    tokens, wall times, every verify call of the last speculative run."""
    from pipeline.generation.loop import generate

    plain_s, spec_s, plain, res = [], [], [], None
    for r in range(reps):
        for which in ("plain", "spec") if r % 2 == 0 else ("spec", "plain"):
            if progress:
                progress((2 * r + (which == "spec")) / (2 * reps), f"repeat {r + 1}/{reps}: {which}")
            t = time.perf_counter()
            if which == "plain":
                plain = [e.token_id for e in generate(lm, prompt, max_new_tokens, sampling, chat=chat)]
                plain_s.append(time.perf_counter() - t)
            else:
                res = speculative_generate(lm, prompt, draft, gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling, chat=chat)
                spec_s.append(res.seconds)
    name = draft if isinstance(draft, str) else getattr(draft, "label", "a model")
    return SpecComparison(name, gamma, sampling, plain, plain_s, spec_s, res)
