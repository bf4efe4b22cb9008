"""Where the row step's rows keep their keys and values, and attention over them (pipeline.decode_step.cpu.row_step uses both
through one interface: write(layer, k, v), attend(layer, q, window, scale), rows(act) for cpu_decode.c's one-call
layer). BufferKV: one request's static buffers (our own loop's fused mode); PagedRows: the engine's KV blocks, each
row over its own block table."""

from __future__ import annotations

import copy

import numpy as np
import torch

from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu import layer_call
from pipeline.decode_step.cpu.paged_attention import paged_attend
from pipeline.decode_step.kv_layout import block_span, visible, window_start


def view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory (no copy)."""
    return t.detach().numpy()


def attend(q: np.ndarray, K: np.ndarray, V: np.ndarray, scale: np.float32) -> np.ndarray:
    """One decode token's attention: q [KV, G, D] (each KV head's G query heads) over K, V [KV, n, D] -> [KV * G * D]."""
    s = np.matmul(q, K.transpose(0, 2, 1))  # [KV, G, n]
    s *= scale
    s -= s.max(-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(-1, keepdims=True)
    return np.matmul(s, V).reshape(-1)


def native_attend(q: np.ndarray, K: np.ndarray, V: np.ndarray, tables: np.ndarray, lo: np.ndarray, hi: np.ndarray, bs: int, scale) -> np.ndarray:
    """Decode attention in pipeline/decode_step/cpu/cpu_decode.c (`paged_attend`, through its checked call, pipeline.decode_step.cpu.paged_attention), over the keys
    and values where they lie: q [B, KV, G, D], K and V one layer's blocks [blocks, KV, bs, D] (or a static buffer
    [KV, max_len, D], one block), tables [B, blocks] int32, each row attending to positions lo[b] <= p < hi[b].
    -> [B, KV * G * D]."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    B, KV, G, D = q.shape
    # a small call (one row over a short context: ~15 µs of work) stays on the calling thread: handing it to the
    # pool costs more than it saves
    threads = torch.get_num_threads() if int((hi - lo).sum()) * KV * G * D >= PARALLEL_ATTENTION else 1
    return paged_attend(q, K, V, tables, lo, hi, bs, scale, threads)


PARALLEL_ATTENTION = 1 << 18  # multiply-adds of q . K from which attention is split over the threads

_ONE_BLOCK = np.zeros((1, 1), dtype=np.int32)


class BufferKV:
    """One request's K/V in static buffers [layers, KV, max_len, D] (pipeline.decode_step.fused's), at `pos`."""

    def __init__(self, K: torch.Tensor, V: torch.Tensor):
        self.K, self.V = view(K), view(V)
        self.pos = 0

    def rows(self, act=None) -> layer_call.LayerRows:
        """The one row for cpu_decode.c's one-call layer: its slot at `pos`, attending up to it."""
        if act is not None and list(act) != [0]:
            raise ValueError("BufferKV holds one row")
        return layer_call.LayerRows(self.K, self.V, [0], [self.pos], _ONE_BLOCK, [self.pos + 1], self.K.shape[2])

    def write(self, i: int, k: np.ndarray, v: np.ndarray) -> None:
        self.K[i, :, self.pos] = k[0]
        self.V[i, :, self.pos] = v[0]

    def attend(self, i: int, q: np.ndarray, window: int | None, scale) -> np.ndarray:
        lo, hi = window_start(self.pos + 1, window), self.pos + 1
        if CHOICE.c_kernels():
            rng = np.array([lo, hi], dtype=np.int32)
            return native_attend(q, self.K[i], self.V[i], _ONE_BLOCK, rng[:1], rng[1:], self.K.shape[2], scale)
        return attend(q[0], self.K[i, :, lo:hi], self.V[i, :, lo:hi], scale)[None]


class PagedRows:
    """The engine's KV blocks [layers, blocks, KV, block_size, D] for B decode tokens (one per request, each with
    its block table and position). With pipeline/decode_step/cpu/cpu_decode.c each row's attention reads its own blocks where they
    lie (native_attend: nothing gathered or padded). Without it, attention gathers all rows' blocks into one
    padded, masked call when their lengths are close (`gathered`: the engine's PagedStep.gather decides, by
    default the same rule), else goes row by row over exactly its positions (always for a lone request)."""

    def __init__(self, K: torch.Tensor, V: torch.Tensor, tables: list[list[int]], positions: list[int], gathered: bool | None = None):
        self.K, self.V = view(K), view(V)
        bs = self.bs = self.K.shape[3]
        self.pos = np.asarray(positions)
        self.tables = tables
        self.blk = np.asarray([t[p // bs] for t, p in zip(tables, positions)])
        self.off = self.pos % bs
        lens = self.pos + 1
        B = len(positions)
        if CHOICE.c_kernels():  # each row over its own blocks, in place (native_attend): nothing gathered
            width = max(len(t) for t in tables)
            self.table_arr = np.zeros((B, width), dtype=np.int32)
            for b, t in enumerate(tables):
                self.table_arr[b, : len(t)] = t
            self.hi = lens.astype(np.int32)
            self.gathered = False
            return
        self.gathered = (B > 1 and lens.max() * B <= 2 * lens.sum()) if gathered is None else gathered and B > 1
        if self.gathered:
            nb = -(-int(lens.max()) // bs)
            self.idx = np.asarray([(t[:nb] + [t[0]] * nb)[:nb] for t in tables])  # [B, nb], padded with a real block
            self.k_pos = np.arange(nb * bs)
            self._masks: dict = {}
            self.idx_t = torch.from_numpy(self.idx)

    def rows(self, act=None) -> layer_call.LayerRows:
        """The rows (or those of `act`) for cpu_decode.c's one-call layer: each one's slot, block table and end."""
        sel = slice(None) if act is None else np.asarray(act)
        return layer_call.LayerRows(self.K, self.V, self.blk[sel], self.off[sel], self.table_arr[sel], self.hi[sel], self.bs)

    def write(self, i: int, k: np.ndarray, v: np.ndarray) -> None:
        self.K[i, self.blk, :, self.off] = k
        self.V[i, self.blk, :, self.off] = v

    def select(self, idx: np.ndarray) -> PagedRows:
        """The same memory for the rows `idx` only (a pass where some rows are parked or not yet resumed): with the
        native kernels."""
        if not CHOICE.c_kernels():
            raise RuntimeError("PagedRows.select needs pipeline/decode_step/cpu/cpu_decode.c (the fallback passes go through torch)")
        r = copy.copy(self)
        r.pos, r.blk, r.off, r.table_arr, r.hi = self.pos[idx], self.blk[idx], self.off[idx], self.table_arr[idx], self.hi[idx]
        r.tables = [self.tables[j] for j in idx]
        return r

    def _mask(self, window: int | None) -> torch.Tensor:
        """[B, 1, 1, positions] True where a row may attend: its own positions (and within its window)."""
        m = self._masks.get(window)
        if m is None:
            ok = visible(self.pos[:, None], self.k_pos[None], window)
            m = self._masks[window] = torch.from_numpy(ok)[:, None, None, :]
        return m

    def _read(self, i: int, table: list[int], lo: int, hi: int):
        ids, a = block_span(table, lo, hi, self.bs)
        KV, D = self.K.shape[2], self.K.shape[4]
        k = self.K[i, ids].transpose(1, 0, 2, 3).reshape(KV, -1, D)
        v = self.V[i, ids].transpose(1, 0, 2, 3).reshape(KV, -1, D)
        return k[:, a : a + hi - lo], v[:, a : a + hi - lo]

    def attend(self, i: int, q: np.ndarray, window: int | None, scale) -> np.ndarray:
        if CHOICE.c_kernels():
            lo = window_start(self.hi, window).astype(np.int32)
            return native_attend(q, self.K[i], self.V[i], self.table_arr, lo, self.hi, self.bs, scale)
        if self.gathered:  # torch's SDPA over the gathered blocks (it also keeps the OpenMP pool warm for the next product)
            B, KV, G, D = q.shape
            K = torch.from_numpy(self.K[i])[self.idx_t].permute(0, 2, 1, 3, 4).reshape(B, KV, -1, D)  # [B, KV, nb * bs, D]
            V = torch.from_numpy(self.V[i])[self.idx_t].permute(0, 2, 1, 3, 4).reshape(B, KV, -1, D)
            o = torch.nn.functional.scaled_dot_product_attention(torch.from_numpy(q), K, V, attn_mask=self._mask(window), scale=float(scale))
            return o.reshape(B, -1).numpy()
        out = np.empty((q.shape[0], q[0].size), dtype=np.float32)
        for b, (t, p) in enumerate(zip(self.tables, self.pos.tolist())):
            out[b] = attend(q[b], *self._read(i, t, window_start(p + 1, window), p + 1), scale)
        return out
