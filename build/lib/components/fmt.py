"""Numbers as a page, a slide or an export shows them."""

from __future__ import annotations


def prob(p: float) -> str:
    """A probability readable at any size: 0.734, 0.004, 2.1e-05 (a sampled token is never shown as "0.000")."""
    if p <= 0:
        return "0"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.2g}"


def number(v) -> str:
    """A measured number in a table cell: a whole number as one (12,288; 10, not 10.0000), others to four
    significant digits at most, trailing zeros dropped (37.91, 1.5, 0.9998, 0.004212; below 0.001 two: 2.3e-06): a small
    difference is never shown as 0.0000, nor a probability of 0.9998 as 1."""
    if v is None or v != v:  # None or NaN: an empty cell
        return ""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    a = abs(v)
    if a >= 100:
        return f"{v:,.1f}"
    if a >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    if a < 1e-3:
        return f"{v:.2g}"
    s = f"{v:.4g}"
    return f"{v:.7g}" if s in ("1", "-1") else s
