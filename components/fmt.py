"""Numbers as a page, a slide or an export shows them."""

from __future__ import annotations


def prob(p: float) -> str:
    """A probability readable at any size: 0.734, 0.004, 2.1e-05 (a sampled token is never shown as "0.000")."""
    if p <= 0:
        return "0"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.2g}"
