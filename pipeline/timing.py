"""Timing helpers shared by every measurement: device sync, best-of-N, real text of an exact token count.

A GPU runs kernels asynchronously, so a wall-clock time means something only after `sync(device)`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

SAMPLE_TEXT = (
    "The sky looks blue because air molecules scatter short wavelengths of sunlight more than long ones. "
    "At sunset the light crosses more air, so the blue is scattered away and reds remain. "
)


def sync(device: torch.device | str | None = None) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type == "cuda":
        if torch.cuda.is_available():
            torch.cuda.synchronize(dev)


def syncer(device: torch.device) -> Callable[[], None]:
    """A zero-argument sync for `device` (cheap to call in hooks)."""
    if torch.device(device).type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def best_of(fn: Callable[[], object], device: torch.device, reps: int = 5, warmup: bool = True) -> float:
    """Seconds of the fastest of `reps` device-synchronised calls of fn (after one warm-up call)."""
    s = syncer(device)
    if warmup:
        fn()
    s()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        s()
        best = min(best, time.perf_counter() - t)
    return best


def ids_of_length(lm, n: int) -> torch.Tensor:
    """[1, n] token ids of real text, repeated and cut to exactly n tokens, on the model's device."""
    ids = lm.tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    ids = (ids * (n // len(ids) + 1))[:n]
    return torch.tensor([ids], device=lm.device)


@dataclass(frozen=True)
class Ratios:
    """A speed ratio measured in interleaved repeats: one value per repeat, both sides timed next to each other
    (a shared machine drifts between repeats; a ratio taken within one repeat cancels most of it). The headline
    is the median with its range, flagged noisy when the repeats disagree by more than the effect."""

    values: tuple[float, ...]

    @property
    def median(self) -> float | None:
        import statistics

        return statistics.median(self.values) if self.values else None

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.values), max(self.values)) if self.values else None

    @property
    def noisy(self) -> bool:
        """Fewer than 3 repeats, or a range wider than the median's distance from 1x (a tie)."""
        if len(self.values) < 3:
            return True
        return max(self.values) - min(self.values) > abs(self.median - 1.0)

    def __str__(self) -> str:
        if not self.values:
            return "—"
        lo, hi = self.spread
        return f"{self.median:.2f}× ({lo:.2f}–{hi:.2f})" + (", noisy: a tie" if self.noisy else "")
