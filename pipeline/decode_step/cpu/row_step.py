"""The decode step on a CPU, at the speed of reading the weights once.

Decoding one token multiplies one row of activations by every weight matrix: for SmolLM2 in fp32 that is
538 MB read from memory per token and only 0.27 GFLOP of arithmetic, so the step cannot be faster than the
memory streams those bytes (bench/bench_cpu_anchor.py measures that limit, the C read probe pipeline.decode_step.cpu.bandwidth,
and this step side by side). Where one token's time goes now, measured in the engine, one request, each thread's
products, waits and attention timed inside the C call (an instrumented build, 2026-12-05, the project's 2-core
machine; the panels, the KV pool and the probe's buffer in huge pages, `huge_pages.aligned`):

  * the 121 matrix products (Q/K/V fused, output, gate/up fused, down, per layer; then the LM head over 49,152
    rows): 14.1-14.7 ms in a quiet minute, the probe's read taking 14.5-15.0 (they read as fast as it); in a fast
    minute (the probe at ~8.1 ms, ~66 GB/s) 8.4 ms, 0.97 of it (0.92 with the panels in 4 KiB pages, 0.83 with
    the last panels of each product read one at a time). pipeline/decode_step/cpu/cpu_decode.c's kernel streams the weights'
    panel copy, one row as four long streams a thread (`panels_for`);
  * the threads' waits at the layer's meeting points: 0.3-0.4 ms a token on the thread with more small work, 0.6-0.8
    on the other, which waits for it (it has two of the three KV heads' attention and the RoPE);
  * attention: 0.24 and 0.15 ms (0.28 and 0.20 in a fast minute), most of it reading each layer's keys and values
    cold (0.07 read a second time);
  * norms, RoPE, the K/V write, SiLU and residual adds: ~0.2 ms. These three are inside one C call for every layer
    and the head (`row_layers`), and nothing streams during them;
  * greedy_summary 0.06 ms, and the engine's Python between calls ~1 ms a pass, paid once for up to 8 greedy tokens
    (cpu_decode.c's `row_steps`, EngineConfig.decode_steps): ~0.15 ms a token.
So one request reads at 0.94-0.96 of the probe in a quiet minute (token 15.1-15.7 ms), and at ~0.855 in a fast
one (token 9.5 ms), where the fixed ~1 ms of waits and small work weighs 12% of an 8 ms read. Each of these was measured before it was built; the findings
(OpenMP's slow wake-ups on these virtual CPUs, one stream a thread keeping too few reads in flight, fixed halves,
cold-cache Python, the fast minutes, huge pages, what was tried and not kept) are in docs/findings.md, "CPU
decode at the weights' read speed".

Why not torch for the small work: the same step written with torch
operators (pipeline.decode_step.fused, what a GPU runs as one CUDA graph) spent 18-24 ms a token on the small work alone:
each of its ~600 operators costs 4-7 µs of dispatch on this CPU (F.rms_norm 34 µs, SDPA 69 µs for one query).
So the small work here is numpy on views of the model's own tensors (nothing copied: the arrays ARE the torch
parameters' memory), where an operation costs 1-2 µs, and four things are one C call each in
pipeline/decode_step/cpu/cpu_decode.c (built where gcc and AVX2 exist; else numpy, OpenBLAS and oneDNN do the same maths): the
matrix products, attention over the request's KV blocks where they lie, RMSNorm, and SiLU(gate) * up. The
model's own embedding module (and its activation, when it is not SiLU) are called as they are. The maths is the
model's, written out:

    x = embed(token)
    for each layer:
        h   = rms_norm(x) * w                       (Gemma: * (1 + w), and norms after attention and MLP too)
        q, k, v = split(Wqkv @ h)                   (Qwen3 / Gemma: per-head norms of q and k)
        q, k = rope(q, pos), rope(k, pos)
        K[pos], V[pos] = k, v                       (the caller's KV memory: a static buffer or paged blocks)
        a   = softmax(q · K[:pos+1]ᵀ · scale) · V   (each KV head serves its G query heads; a sliding layer
                                                     reads only its window)
        x   = x + Wo @ a
        g, u = split(Wgu @ rms_norm(x) * w)
        x   = x + Wdown @ (act(g) * u)
    logits = E @ (rms_norm(x) * w)

With B tokens (one per request, each at its own position) the same code runs on [B, d] rows: each weight is read
once for all B, and attention reads each request's own keys. A prompt chunk is one row per token (`run`), each at its
position, attending up to itself. With pipeline/decode_step/cpu/cpu_decode.c a row's numbers do not depend on what shares its
step (every sum runs in the same order for any number of rows): a request's logits are bit for bit the same alone,
among 31 others, beside prompt chunks, resumed after parking, from the prefix cache (tests/pipeline/test_exact.py).
Every product is the model's own, in another summation order: logits within 1e-4 of transformers' forward and greedy
tokens identical to `generate` (tests/pipeline/test_row_step.py, test_fused.py). Used on a CPU in fp32: our own
loop's "fused" mode (pipeline.decode_step.fused) and every engine pass (engine.paged; without the C kernels, passes of
decode tokens only).
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import NamedTuple

import numpy as np
import torch

from pipeline.decode_step.choice import CHOICE, PANEL, SGEMV
from pipeline.decode_step.cpu import layer_call
from pipeline.decode_step.cpu.matmul import linear, panel, panel_product, panel_rows
from pipeline.decode_step.cpu.norms import rms_norm, silu_mul
from pipeline.decode_step.cpu.row_kv import view
from pipeline.decode_step.cpu.threads import PLAN
from pipeline.decode_step.fused_weights import FusedModel, fused_model, supported
from pipeline.model.arch import NormSpec, is_silu
from pipeline.model.loaded import LoadedModel
from pipeline.model.quantised import layer_rows, rows_of


class Norm:
    """An RMSNorm with the module's own formula (the adapter's NormSpec, pipeline.model.arch): Llama
    `w * (x / rms(x))`, Gemma `(x / rms(x)) * (1 + w)`."""

    def __init__(self, spec: NormSpec):
        if not isinstance(spec, NormSpec):
            raise ValueError(f"no row-step norm for {type(spec).__name__}")
        self.eps, self.scale = spec.eps, view(spec.scale)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x [..., d]: each row divided by its root mean square, then scaled (pipeline/decode_step/cpu/cpu_decode.c's rms_norm
        where it is built: one call instead of six numpy operations)."""
        if CHOICE.c_kernels() and x.flags.c_contiguous and x.dtype == np.float32:
            return rms_norm(x, self.scale, self.eps)
        ms = np.einsum("...i,...i->...", x, x)[..., None] / np.float32(x.shape[-1])
        h = x * (1.0 / np.sqrt(ms + np.float32(self.eps)))
        h *= self.scale
        return h


WHOLE_LAYERS = True  # a layer in one C call where it applies (_RowLayer.whole); bench_cpu_anchor's split turns it off
ONE_CALL_ROWS = 8  # a pass of at most this many rows runs every layer in one C call even where it could be interrupted
# (a newcomer then waits for the pass's end, ~20-35 ms, instead of its next layer)


class _RowLayer:
    def __init__(self, ly):
        # torch weights (for several rows: pipeline.decode_step.cpu.matmul.linear) and numpy views of the same memory (for one)
        self.t = {"qkv": (ly.wqkv, ly.bqkv), "o": (ly.out.weight, ly.out.bias), "gu": (ly.wgu, None), "down": (ly.down.weight, ly.down.bias)}
        self.n = {k: (view(w), None if b is None else view(b)) for k, (w, b) in self.t.items()}
        self.act = ly.act
        self.silu = is_silu(ly.act)  # pipeline/decode_step/cpu/cpu_decode.c's silu_mul applies
        self.scale = np.float32(ly.scale)
        self.window, self.rope = ly.window, ly.rope
        self.norm_in, self.norm_mid = Norm(ly.norm_in), Norm(ly.norm_mid)
        self.norm_ff, self.norm_out, self.norm_q, self.norm_k = (Norm(n) if n is not None else None for n in (ly.norm_ff, ly.norm_out, ly.norm_q, ly.norm_k))

    def act_mul(self, gu: np.ndarray) -> np.ndarray:
        """act(g) * u for gu = [g | u] [B, 2I]: the model's own activation module, or (SiLU, where
        pipeline/decode_step/cpu/cpu_decode.c is built) its silu_mul, the same formula in one call."""
        half = gu.shape[1] // 2
        g, u = gu[:, :half], gu[:, half:]
        if self.silu and CHOICE.c_kernels() and gu.flags.c_contiguous and gu.dtype == np.float32:
            return silu_mul(gu)
        return view(self.act(torch.from_numpy(g))) * u

    custom: dict | None = None  # name -> its own product (pipeline.decode_step.cpu.precision's bf16 and int8 variants)
    int8: dict | None = None  # name -> (w8, scale): an int8 model's products (pipeline.model.quantised), else None
    _whole: layer_call.LayerWeights | None | bool = False  # False: not asked yet

    def whole(self) -> layer_call.LayerWeights | None:
        """The layer's weights for cpu_decode.c's one-call layer (`row_layer`), where it applies: the C kernels built,
        a Llama-family layer (no norms but the two, SiLU, no per-head norms) and the model's own fp32 products."""
        if self.custom is not None:  # set after the step was built (pipeline.decode_step.cpu.precision): its own products
            return None
        if self._whole is False:
            ok = CHOICE.c_kernels() and self.silu
            ok = ok and all(n is None for n in (self.norm_ff, self.norm_out, self.norm_q, self.norm_k))
            self._whole = None
            if ok:
                (wqkv, bqkv), (wo, bo), (wgu, bgu), (wd, bd) = (self.t[k] for k in ("qkv", "o", "gu", "down"))
                n_in, n_mid = self.norm_in, self.norm_mid
                scales = None
                if self.int8 is not None:  # int8 panels and their scales, the same layer code
                    (wqkv, sq), (wo, so), (wgu, sg), (wd, sd) = (self.int8[k] for k in ("qkv", "o", "gu", "down"))
                    scales = (sq, so, sg, sd)
                args = (wqkv, bqkv, wo, bo, wgu, bgu, wd, bd, n_in.scale, n_in.eps, n_mid.scale, n_mid.eps, *self.dims)
                self._whole = layer_call.LayerWeights(*args, scales=scales)
        return self._whole

    def project(self, name: str, x: np.ndarray) -> np.ndarray:
        """x [B, in] times the layer's weight `name`: pipeline/decode_step/cpu/cpu_decode.c for any number of rows (the same numbers
        for a row whatever shares it); without it, OpenBLAS's sgemv for one row and pipeline.decode_step.cpu.matmul.linear for more."""
        if self.custom is not None:
            return self.custom[name](x)
        w, b = self.t[name]
        if self.int8 is not None and CHOICE.c_kernels():  # int8 panels, the same kernels as the one-call layer's
            w8, sc = self.int8[name]
            bias = None if b is None else np.ascontiguousarray(b.detach().numpy())
            return panel_product(np.ascontiguousarray(x, dtype=np.float32), panel(w8), *w8.shape, bias, scale=view(sc))
        # an int8 model without the C kernels: the dequantised fp32 weights (the model's own) below
        # the one choice (pipeline.decode_step.choice), over numpy views here; a prompt's rows too stay on the panel
        # kernel (its sums run in the same order for any number of rows: a row's numbers never depend on what shares it)
        kernel = CHOICE.row_product(x.shape[0]).kernel
        if kernel == PANEL:
            return panel_rows(x, w, b)
        if kernel == SGEMV:
            w, b = self.n[name]
            y = (w @ x[0])[None]
            if b is not None:
                y += b
            return y
        return view(linear(torch.from_numpy(x), w, b))


class RowPass(NamedTuple):
    logits: torch.Tensor | None  # [len(kept), vocab]
    parked: np.ndarray | None  # [B] the layer each row stopped at, -1 where it went through
    x: np.ndarray  # [B, d] hidden states (a parked row's entering its layer)
    kept: np.ndarray  # the rows whose logits these are


class RowStep:
    """The model's decode step for B tokens (one per request), over numpy views of its weights. Built once per
    model (`row_step`).

        step.logits(tokens, positions, kv, interrupt=None)   -> torch [B, vocab] float32, or None if parked
    where kv holds the rows' keys and values (BufferKV: one request's static buffers; PagedRows: the engine's
    blocks): kv.write(layer, k, v) with k, v [B, KV, D] at the rows' positions, kv.attend(layer, q, window,
    scale) with q [B, KV, G, D] -> [B, KV * G * D].
    With `interrupt` (asked after every layer, as the engine's torch step does), a True answer stops every row at
    that layer: `parked` then holds (the next layer, hidden states [B, d]) and logits returns None."""

    def __init__(self, fm: FusedModel):
        self.lm = lm = fm.lm
        self.H, self.KV, self.D, self.G = fm.H, fm.KV, fm.D, fm.G
        self.layers = [_RowLayer(ly) for ly in fm.layers]
        for i, ly in enumerate(self.layers):
            ly.dims = (self.H, self.KV, self.D)
            ly.int8 = layer_rows(lm.arch, i)  # None for an fp32 model
        self.final_norm = Norm(fm.final_norm)
        head = lm.arch.unembedding()
        self.head = _RowLayer.__new__(_RowLayer)
        self.head.t = {"head": (head.weight, getattr(head, "bias", None))}
        self.head.n = {k: (view(w), None if b is None else view(b)) for k, (w, b) in self.head.t.items()}
        rows = rows_of(head)
        self.head.int8 = None if rows is None else {"head": rows}
        self.vocab = head.weight.shape[0]
        self.rope = fm.rope
        self._stacked: tuple | None = None
        self._head: layer_call.Head | None = None
        emb = lm.arch.embed()
        # a plain embedding is a row of its table: numpy's take (the module's call cost 0.17 ms a pass); else the module
        self._table = view(emb.weight) if type(emb) is torch.nn.Embedding else None

    def stack(self) -> layer_call.LayerStack | None:
        """Every layer for cpu_decode.c's `row_layers` (one call a pass), where each layer is one call
        (_RowLayer.whole) and they share their RoPE table and scale, with no sliding window."""
        wholes = tuple(ly.whole() for ly in self.layers)
        if any(w is None for w in wholes):
            return None
        if self._stacked is None or self._stacked[0] != tuple(map(id, wholes)):
            first = self.layers[0]
            same = all(ly.window is None and ly.rope == first.rope and ly.scale == first.scale for ly in self.layers)
            self._stacked = (tuple(map(id, wholes)), layer_call.LayerStack(list(wholes)) if same else None)
        return self._stacked[1]

    def head_call(self) -> layer_call.Head | None:
        """The final norm and LM head for `row_layers`' same call, where the head is the model's own fp32 product."""
        if self.head.custom is not None:
            return None
        if self._head is None:
            w, b = self.head.t["head"]
            w, rows = (w, None) if self.head.int8 is None else self.head.int8["head"]
            self._head = layer_call.Head(self.final_norm.scale, self.final_norm.eps, w, b, rows=rows)
        return self._head

    def logits(self, tokens: list[int], positions: list[int], kv, interrupt=None) -> torch.Tensor | None:
        """The logits [B, vocab] (float32 torch) after each token at its position; their K/V written. None when
        `interrupt` stopped the pass (see the class)."""
        self.parked = None
        # one row on the fallback kernels: its threads as many as the last steps got (pipeline.decode_step.cpu.threads); the
        # C kernels and several rows keep torch's (CHOICE.one_row_threads)
        with torch.no_grad(), PLAN.step() if CHOICE.one_row_threads(len(tokens)) else nullcontext():
            r = self.run(tokens, positions, kv, interrupt=interrupt)
        if r.parked is not None and (r.parked >= 0).any():
            self.parked = (int(r.parked.max()), r.x)
            return None
        return r.logits

    def _embed(self, tokens: list[int]) -> np.ndarray:
        """The rows' embeddings [B, d], a new array (the layers update it in place)."""
        if self._table is not None:
            return self._table[tokens]
        return view(self.lm.arch.embed()(torch.tensor([tokens]))).reshape(len(tokens), -1).copy()

    def _one_call(self, x: np.ndarray, positions, kv, interrupt, want) -> RowPass | None:
        """Every layer in ONE C call (cpu_decode.c's row_layers: the same kernels in the same order as a call a layer),
        and the final norm and LM head for the rows `want` in the same call, where that applies: every layer is one
        call (stack), the rows enter at layer 0, and nothing may stop them between layers (no `interrupt`, or at most
        ONE_CALL_ROWS rows and no newcomer now). None where it does not apply (`run` then goes layer by layer)."""
        B = len(x)
        if not (B and WHOLE_LAYERS and CHOICE.c_kernels() and hasattr(kv, "rows")) or (stack := self.stack()) is None:
            return None
        if interrupt is not None and (B > ONE_CALL_ROWS or interrupt()):
            return None
        first = self.layers[0]
        cos_t, sin_t = self.rope.numpy(max(positions) + 1)
        pos = np.asarray(positions)
        cos = np.ascontiguousarray(cos_t[first.rope][pos], dtype=np.float32)
        sin = np.ascontiguousarray(sin_t[first.rope][pos], dtype=np.float32)
        keep = np.arange(B) if want is None else np.asarray(want, dtype=np.int64)
        out = layer_call.row_layers(x, stack, kv.rows(None), cos, sin, first.scale, head=self.head_call(), keep=keep)
        logits = self.lm.arch.apply_softcap(torch.from_numpy(out)) if len(keep) else None
        return RowPass(logits, None if interrupt is None else np.full(B, -1), x, keep)

    def decode_steps(self, tokens, positions, kv, room, stop, left, flag, steps: int, k: int) -> layer_call.Steps | None:
        """Up to `steps` greedy tokens for these decode rows in ONE C call (layer_call.row_steps: each step the same
        numbers as a pass of its own), where it applies: a plain embedding, every layer one call (stack), the
        model's own head, no logit softcap, KV rows with block tables. None elsewhere (the caller runs one pass)."""
        if self._table is None or self.lm.arch.softcap or not CHOICE.c_kernels() or not hasattr(kv, "rows") or (stack := self.stack()) is None:
            return None
        if (head := self.head_call()) is None:
            return None
        first = self.layers[0]
        cos_t, sin_t = self.rope.numpy(max(positions) + steps)
        return layer_call.row_steps(
            stack, head, kv.rows(None), self._table, cos_t[first.rope], sin_t[first.rope], tokens, positions, room, stop, left, flag, steps, first.scale, k
        )

    def run(self, tokens, positions, kv, *, interrupt=None, first=None, x0=None, parkable=None, want=None):
        """Rows of any requests at any positions through the layers: a decode token is one row, a prompt chunk one
        row per token (each row attends to its request's positions up to its own, so the K/V of the whole chunk are
        written before attention reads them). Every operation works row by row in a fixed order (the C kernels), so
        a row's numbers are the same whatever else is in the pass: other requests, prompt chunks, resumed rows.

        first [B]: the layer a row enters at (a row parked earlier resumes there), with its hidden state in x0 [B, d].
        parkable [B] bool: which rows stop when `interrupt()` (asked after every layer) says True (default: all).
        Returns a RowPass: logits [len(kept), vocab] float32 torch for the rows of `want` (default all) that were
        not parked (None if none); parked: int [B], the layer each row stopped at or -1 (None without interrupt);
        x [B, d]: the hidden states, a parked row's entering the layer it stopped at."""
        B, L = len(tokens), len(self.layers)
        x = self._embed(tokens)
        if first is None or not any(first):
            done = self._one_call(x, positions, kv, interrupt, want)
            if done is not None:
                return done
        pos = np.asarray(positions)
        first = np.zeros(B, dtype=np.int64) if first is None else np.asarray(first)
        if x0 is not None and first.any():
            x[first > 0] = x0[first > 0]
        at = np.full(B, -1) if interrupt is not None else None
        can_park = np.ones(B, dtype=bool) if parkable is None else np.asarray(parkable, dtype=bool)
        cos_t, sin_t = self.rope.numpy(int(pos.max()) + 1)
        tables = {lt: (cos_t[lt][pos][:, None], sin_t[lt][pos][:, None]) for lt in cos_t}
        whole = WHOLE_LAYERS and CHOICE.c_kernels() and all(ly.whole() is not None for ly in self.layers) and hasattr(kv, "rows")
        # cpu_decode.c's one-call layer: each row's RoPE rows [B, D], its KV slots checked once a pass
        flat = {lt: tuple(np.ascontiguousarray(t[:, 0], dtype=np.float32) for t in cs) for lt, cs in tables.items()} if whole else None
        passes: dict = {}
        for i, ly in enumerate(self.layers):
            on = (first <= i) if at is None else (first <= i) & (at < 0)
            act = None if on.all() else np.flatnonzero(on)
            if act is not None and not len(act):
                continue
            if whole:
                xa = self._whole_layer(i, ly, x, act, kv, flat, passes)
            else:
                xa, kva = (x, kv) if act is None else (x[act], kv.select(act))
                self._layer(i, ly, xa, kva, *(tables[ly.rope] if act is None else (t[act] for t in tables[ly.rope])))
            if act is not None:
                x[act] = xa
            if at is not None and i + 1 < L and interrupt():
                at[on & can_park] = i + 1
        return self._finish(x, at, want)

    def _whole_layer(self, i: int, ly: _RowLayer, x: np.ndarray, act, kv, flat: dict, passes: dict) -> np.ndarray:
        """Layer i in one C call (cpu_decode.c's row_layer) for the rows `act` (None: all) of x; their rows of KV memory,
        RoPE and workspace made once a pass for each set of rows (`passes`). Returns the rows' new hidden states."""
        key = None if act is None else act.tobytes()
        if key not in passes:
            sel = slice(None) if act is None else act
            rows = kv.rows(act)
            ws = np.empty(rows.M * ly.whole().ws, dtype=np.float32)  # one workspace for the pass's layers
            passes[key] = (rows, *(np.ascontiguousarray(t[sel]) for t in flat[ly.rope]), ws)
        rows, cos, sin, ws = passes[key]
        xa = x if act is None else np.ascontiguousarray(x[act])
        layer_call.row_layer(i, xa, ly.whole(), rows, cos, sin, ly.window, ly.scale, ws)
        return xa

    def _layer(self, i: int, ly: _RowLayer, xa: np.ndarray, kva, cos: np.ndarray, sin: np.ndarray) -> None:
        """Layer i for the rows xa [n, d] (updated in place), the small work in numpy and each product by the kernel
        choice: norm, Q/K/V, per-head norms, RoPE (cos, sin [n, 1, D]), the K/V written, attention, the output, the MLP."""
        H, KV, D, G = self.H, self.KV, self.D, self.G
        half = D // 2
        qkv = ly.project("qkv", ly.norm_in(xa)).reshape(-1, H + 2 * KV, D)
        qk, v = qkv[:, : H + KV], qkv[:, H + KV :]
        if ly.norm_q is not None:  # per-head norms (contiguous: the C norm, one row at a time)
            qk = np.concatenate([ly.norm_q(np.ascontiguousarray(qk[:, :H])), ly.norm_k(np.ascontiguousarray(qk[:, H:]))], axis=1)
        rot = np.empty_like(qk)  # RoPE: qk * cos + rotate_half(qk) * sin
        np.negative(qk[..., half:], out=rot[..., :half])
        rot[..., half:] = qk[..., :half]
        rot *= sin
        qk = qk * cos
        qk += rot
        kva.write(i, qk[:, H:], v)
        a = kva.attend(i, qk[:, :H].reshape(-1, KV, G, D), ly.window, ly.scale)
        o = ly.project("o", a)
        if ly.norm_ff is not None:  # Gemma: norms after attention, before and after the MLP
            xa += ly.norm_mid(o)
            h = ly.norm_ff(xa)
        else:
            xa += o
            h = ly.norm_mid(xa)
        gu = ly.project("gu", h)
        m = ly.project("down", ly.act_mul(gu))
        xa += ly.norm_out(m) if ly.norm_out is not None else m

    def _finish(self, x: np.ndarray, at: np.ndarray | None, want) -> RowPass:
        """The final norm and LM head for the rows of `want` (default all) that were not parked."""
        keep = np.arange(len(x)) if want is None else np.asarray(want, dtype=np.int64)
        if at is not None:
            keep = keep[at[keep] < 0]
        if not len(keep):
            return RowPass(None, at, x, keep)
        out = torch.from_numpy(self.head.project("head", self.final_norm(np.ascontiguousarray(x[keep]))))
        return RowPass(self.lm.arch.apply_softcap(out), at, x, keep)


def fits(fm: FusedModel) -> bool:
    """On a CPU in fp32, with every norm one the adapter gives a formula for (a NormSpec)."""
    norms = [fm.final_norm, *(n for ly in fm.layers for n in (ly.norm_in, ly.norm_mid, ly.norm_ff, ly.norm_out, ly.norm_q, ly.norm_k) if n is not None)]
    return fm.lm.device.type == "cpu" and fm.lm.dtype == torch.float32 and all(isinstance(n, NormSpec) for n in norms)


def usable(lm: LoadedModel) -> bool:
    """Whether the row step runs this model: the architectures the fused step implements, on a CPU in fp32, with
    norms the adapter knows (fits)."""
    if lm.device.type != "cpu" or lm.dtype != torch.float32 or not supported(lm)[0]:
        return False
    return fits(fused_model(lm))


_row_lock = threading.Lock()


def row_step(fm: FusedModel) -> RowStep | None:
    """The model's RowStep (built once, kept on its FusedModel), or None where it does not apply (fits)."""
    if not fits(fm):
        return None
    with _row_lock:
        if fm.row is None:
            fm.row = RowStep(fm)
    return fm.row
