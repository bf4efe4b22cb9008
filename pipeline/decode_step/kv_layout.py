"""Which keys and values a query reads: the bookkeeping every attention path shares (the fused step, the CPU row
step, the engine's batched step; torch and numpy alike), each rule spelled once.

    window_start(end, window)   the first position a query at end - 1 reads (a sliding-window layer's window
                                counts the query's own token); int or numpy array
    visible(q_pos, k_pos, w)    the causal mask, within the window on a sliding layer; numpy or torch
    block_span(table, lo, hi, block_size)   the KV blocks holding positions [lo, hi) and the offset of lo in them
"""

from __future__ import annotations

import numpy as np


def window_start(end, window: int | None):
    """The first position a query at position end - 1 attends to: 0 on a full-attention layer, end - window (not
    below 0) on a sliding-window layer. `end` an int or a numpy array of them."""
    if isinstance(end, np.ndarray):
        return np.maximum(end - window, 0) if window else np.zeros_like(end)
    return max(0, end - window) if window else 0


def visible(q_pos, k_pos, window: int | None):
    """True where a query at q_pos may read the key at k_pos: k_pos <= q_pos, and k_pos > q_pos - window on a
    sliding-window layer (window_start's rule as a mask). Broadcasts; numpy arrays or torch tensors."""
    ok = k_pos <= q_pos
    return ok & (k_pos > q_pos - window) if window else ok


def block_span(table, lo: int, hi: int, block_size: int):
    """(the ids of the blocks that hold positions [lo, hi) from a request's block table, where lo sits in the first
    of them): the block reads of the numpy and the torch paths."""
    b0, b1 = lo // block_size, -(-hi // block_size)
    return table[b0:b1], lo - b0 * block_size
