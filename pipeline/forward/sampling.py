"""Logits -> softmax -> temperature -> top-k -> top-p -> min-p -> sample.

The same order and the same tie rules as transformers' logits processors (TemperatureLogitsWarper,
TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper), so `filter_probs` equals softmax of their output
on any logits (tests/pipeline/test_sampling.py checks it). Temperature 0 means greedy: all mass on the
argmax. Every function takes a [vocab] or [batch, vocab] tensor or array. `choose` is where a decode step's
output (StepOutput: its logits, or on a greedy fused step only their summary) becomes the token and the candidates
the pages show, whoever ran the step (our own loop, the shared engine).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Sampling:
    """How one request picks its tokens: the one spelling every path takes (pipeline.generate, the engine and Ray
    Serve, speculative decoding, the pages' controls). The type's own defaults are greedy (temperature 0: all mass
    on the argmax), what a caller gets when it asks for nothing; the app's controls start from DEFAULTS."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = 0  # each request has its own generator: reproducible whatever else runs
    n_top: int = 10  # candidates reported per step

    @property
    def greedy(self) -> bool:
        return not (self.temperature and self.temperature > 0)

    def generator(self) -> torch.Generator | None:
        """This request's own random generator (None without a seed)."""
        return torch.Generator().manual_seed(int(self.seed)) if self.seed is not None else None


GREEDY = Sampling()
DEFAULTS = Sampling(temperature=0.7, top_k=50, top_p=0.95)  # where the next-token page's sliders, the generation pages and the overview's check start


@dataclass
class FilterStep:
    name: str  # "softmax", "temperature", "top-k", "top-p", "min-p"
    probs: np.ndarray  # [vocab] renormalised distribution after this step (zeros where filtered)
    kept: int  # number of candidates still alive
    active: bool  # whether this step changed anything (e.g. top_k=0 is off)


def _t(x) -> torch.Tensor:
    return (torch.from_numpy(np.asarray(x)) if not isinstance(x, torch.Tensor) else x).float()


def _filter_scores(scores: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float, on_step=None) -> torch.Tensor:
    ninf = -float("inf")
    if on_step:
        on_step("softmax", scores, True)
    if temperature is None or temperature <= 0:  # greedy
        keep = scores == scores.max(dim=-1, keepdim=True).values
        first = keep.float().argmax(dim=-1, keepdim=True)
        scores = torch.full_like(scores, ninf).scatter(-1, first, 0.0)
        if on_step:
            on_step("temperature", scores, True)
        return scores
    scores = scores / temperature
    if on_step:
        on_step("temperature", scores, temperature != 1.0)
    if top_k and top_k > 0:
        k = min(int(top_k), scores.size(-1))
        thresh = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < thresh, ninf)
    if on_step:
        on_step("top-k", scores, bool(top_k and top_k > 0))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1:] = False  # always keep at least one
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, ninf)
    if on_step:
        on_step("top-p", scores, top_p is not None and top_p < 1.0)
    if min_p and min_p > 0:
        probs = torch.softmax(scores, dim=-1)
        top_probs = probs.amax(dim=-1, keepdim=True)
        remove = probs < (min_p * top_probs)
        sorted_idx = torch.argsort(scores, descending=True, dim=-1)
        remove_sorted = torch.gather(remove, -1, sorted_idx)
        remove_sorted[..., :1] = False
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, ninf)
    if on_step:
        on_step("min-p", scores, bool(min_p and min_p > 0))
    return scores


def filter_probs(logits, sampling: Sampling = GREEDY) -> torch.Tensor:
    """The renormalised next-token distribution after all of `sampling`'s filters; zeros where filtered. Same shape
    as logits."""
    return torch.softmax(_filter_scores(_t(logits), sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p), dim=-1)


def filter_steps(logits, sampling: Sampling = GREEDY) -> list[FilterStep]:
    """Each stage's distribution, for drawing which candidates survive which filter ([vocab] logits)."""
    steps: list[FilterStep] = []

    def on_step(name, scores, active):
        p = torch.softmax(scores, dim=-1)
        steps.append(FilterStep(name, p.numpy(), int(torch.isfinite(scores).sum()), bool(active)))

    _filter_scores(_t(logits), sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, on_step)
    return steps


def sample(logits, sampling: Sampling = GREEDY) -> int:
    """Draw one token id from the filtered distribution with the request's own generator: the same seed gives the
    same token."""
    gen = sampling.generator()
    return int(torch.multinomial(filter_probs(logits, sampling).reshape(-1), 1, generator=gen)[0])


@dataclass
class GreedySummary:
    """What a greedy step needs of a row's logits, computed where the logits are (on the device) so that only a few
    numbers travel to the host: the argmax, the log-sum-exp (probabilities without the whole softmax) and the top-k
    values and ids. For one row ([vocab] logits) or many ([rows, vocab]); `row(i)` picks one."""

    argmax: torch.Tensor  # [] or [rows], long
    logsumexp: torch.Tensor  # [] or [rows]
    values: torch.Tensor  # [k] or [rows, k]
    ids: torch.Tensor  # [k] or [rows, k], long

    @classmethod
    def of(cls, logits: torch.Tensor, k: int) -> GreedySummary:
        values, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
        return cls(logits.argmax(-1), torch.logsumexp(logits, -1), values, ids)

    def cpu(self) -> GreedySummary:
        return GreedySummary(self.argmax.cpu(), self.logsumexp.cpu(), self.values.cpu(), self.ids.cpu())

    def row(self, i: int) -> GreedySummary:
        return GreedySummary(self.argmax[i], self.logsumexp[i], self.values[i], self.ids[i])

    @property
    def token(self) -> int:
        return int(self.argmax)

    def top(self, n: int) -> list[tuple[int, float]]:
        """The n most likely (id, probability)."""
        return list(zip(self.ids[:n].tolist(), torch.exp(self.values[:n] - self.logsumexp).tolist()))


def entropy_bits(probs) -> float:
    p = _t(probs)
    p = p[p > 0]
    return max(0.0, float(-(p * p.log2()).sum()))


def prob_of(logits, token_id: int) -> float:
    """softmax(logits)[token_id], computed stably in float64 (log-sum-exp)."""
    x = np.asarray(logits, dtype=np.float64)
    return float(np.exp(x[token_id] - np.logaddexp.reduce(x)))


def top_token(logits) -> tuple[int, float]:
    """(the most likely token id, its softmax probability)."""
    i = int(np.asarray(logits).argmax())
    return i, prob_of(logits, i)


@dataclass
class StepOutput:
    """What one forward leaves for sampling. Exactly one of the two is set."""

    logits: torch.Tensor | None = None  # [vocab] float32 on the host
    summary: GreedySummary | None = None  # greedy: what the device computed of the logits (argmax, log-sum-exp, top-k)


@dataclass
class Choice:
    """A sampled token and the distribution it came from (probabilities, most likely first)."""

    token_id: int
    top: list[tuple[int, str, float]]  # after the filters
    top_raw: list[tuple[int, str, float]]  # before them (softmax at temperature 1)
    p: float  # the chosen token's probability after the filters
    p_raw: float  # ... and before them


def choose(out: StepOutput, dec, sampling: Sampling = GREEDY, generator: torch.Generator | None = None) -> Choice:
    """The token for one step (greedy at temperature 0, else a draw from the filtered distribution) and the top
    sampling.n_top candidates before and after the filters. `dec(id)` gives a token's text."""
    n_top = sampling.n_top
    if out.summary is not None:  # greedy, summarised on the device
        s = out.summary
        tok, top = s.token, s.top(n_top)
        return Choice(tok, [(tok, dec(tok), 1.0)], [(a, dec(a), b) for a, b in top], 1.0, top[0][1])
    logits = out.logits
    if sampling.greedy:  # the filters leave only the top token: skip building the vocabulary
        tok = int(logits.argmax())  # first maximum, as filter_probs picks it
        lse = torch.logsumexp(logits, 0)
        rv, ri = logits.topk(min(n_top, logits.numel()))
        return Choice(
            tok, [(tok, dec(tok), 1.0)], [(a, dec(a), b) for a, b in zip(ri.tolist(), torch.exp(rv - lse).tolist())], 1.0, float(torch.exp(logits[tok] - lse))
        )
    probs = filter_probs(logits, sampling)
    tok = int(torch.multinomial(probs, 1, generator=generator)[0])
    n = min(n_top, probs.numel())
    p_top, i_top = probs.topk(n)
    raw = torch.softmax(logits, -1)
    r_top, ri_top = raw.topk(n)
    return Choice(
        tok,
        [(a, dec(a), b) for a, b in zip(i_top.tolist(), p_top.tolist()) if b > 0],
        [(a, dec(a), b) for a, b in zip(ri_top.tolist(), r_top.tolist())],
        float(probs[tok]),
        float(raw[tok]),
    )
