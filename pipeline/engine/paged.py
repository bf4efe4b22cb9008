"""The engine's forward over a paged KV memory: prefill chunks and decode tokens of many requests, one pass.

    kv = PagedKV(lm, n_blocks, block_size)            # K, V: [layers, blocks, KV heads, block_size, head dim]
    step = PagedStep(lm, kv)
    logits = step.forward([Seq(tokens, start, table), ...])   # [len(seqs), vocab]: each seq's last token

A Seq is a run of tokens of one request at positions start, start+1, ...: a decode step is one token, a chunk
of a prompt is many. Every token of every request goes through the layers together, so each matrix
multiplication reads the weights once per iteration for all of them (the layer math is the fused step's,
pipeline.decode_step.fused, with the token dimension as batch: fused Q/K/V and gate/up, the model's own norms and RoPE
tables). Keys and values are written into each request's blocks first, then attention reads them back:
  * a prompt chunk: one causal attention call over its request's blocks (its queries see the earlier prompt
    and each other up to themselves, a sliding-window layer only its window);
  * decode tokens: one masked call for all of them when their lengths are close (blocks gathered, padded to
    the longest, the padding masked), otherwise one call per request over exactly its own tokens.

On a CPU with pipeline/decode_step/cpu/cpu_decode.c built, every pass goes through pipeline.decode_step.cpu.row_step instead (`_rows`: one row
per token, fixed-order kernels; CHOICE.engine_pass decides), so a request's logits are bit for bit the same whatever shares its passes; the torch
path above serves GPUs, and CPUs without the C kernels.

A pass can be cut short for a visitor who just arrived: `interrupt()`, asked after every layer, says a short
request is waiting; the seqs marked `parkable` (the engine marks decode tokens and the chunks of long prompts
that are not their last) then stop at that layer, their hidden state kept in the Seq and their K/V written up
to there; a prompt that completes in this pass goes on. A later pass carries the parked seqs from the layer
they stopped at (with the newcomer's prompt from layer 0, or after it: the scheduler's prefill first). On a
CPU a 64-token chunk costs a pass about 0.25 s of matrix work and a decode pass 0.1-0.15 s: without this, a
question waited for all of it, then for its own pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.decode_step.choice import CHOICE, DECODE_GRAPH, ROW_STEP
from pipeline.decode_step.cpu.huge_pages import aligned
from pipeline.decode_step.cpu.row_kv import PagedRows
from pipeline.decode_step.cpu.row_step import ONE_CALL_ROWS, row_step
from pipeline.decode_step.fused import finish_layer, project, project_qkv, window_masks
from pipeline.decode_step.fused_weights import fused_model
from pipeline.decode_step.kv_layout import block_span, window_start
from pipeline.model.loaded import LoadedModel


@dataclass
class Seq:
    tokens: list[int]  # new tokens of one request
    start: int  # position of the first of them
    table: list[int]  # the request's KV blocks, in order
    parkable: bool = False  # it may stop at a layer when interrupt() says so (forward(interrupt=...))
    layer: int = 0  # the first layer it goes through: > 0 when resumed where it was parked
    x: torch.Tensor | None = None  # its hidden state entering `layer` [n, 1, d] (parked or resumed)
    parked: bool = False  # set by the last forward: it stopped at `layer`

    @property
    def end(self) -> int:  # positions start..end-1
        return self.start + len(self.tokens)


class PagedKV:
    """The KV pool: `n_blocks` blocks of `block_size` tokens, keys and values of every layer."""

    def __init__(self, lm: LoadedModel, n_blocks: int, block_size: int = 16):
        f = lm.facts
        shape = (f.n_layers, n_blocks, f.n_kv_heads, block_size, f.head_dim)
        self.K, self.V = self._zeros(shape, lm), self._zeros(shape, lm)
        self.n_blocks, self.block_size = n_blocks, block_size
        self.block_bytes_per_layer = lm.kv_token_bytes * block_size

    @staticmethod
    def _zeros(shape: tuple, lm: LoadedModel) -> torch.Tensor:
        """A pool tensor of zeros. On a CPU in float32, in transparent huge pages (huge_pages.aligned): a decode step's
        attention reads each layer's few blocks cold, after the weights' stream has emptied the caches and the TLB;
        measured 2026-12-05 (one request, SmolLM2, ~50 positions): its attention 0.30 -> 0.24 ms a token on the
        thread with two KV heads, 0.20 -> 0.15 on the other."""
        if lm.device.type != "cpu" or lm.dtype != torch.float32:
            return torch.zeros(shape, device=lm.device, dtype=lm.dtype)
        a = aligned(int(np.prod(shape)), np.float32)
        a[:] = 0.0
        return torch.from_numpy(a).view(shape)

    @staticmethod
    def block_bytes(lm: LoadedModel, block_size: int) -> int:
        """Bytes of one block in every layer (K and V)."""
        return lm.facts.n_layers * lm.kv_token_bytes * block_size

    @property
    def nbytes(self) -> int:
        return self.K.numel() * self.K.element_size() * 2

    def read(self, layer: int, blocks: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [KV, hi-lo, D] of positions lo..hi-1 (blocks: the request's block ids, a tensor)."""
        ids, a = block_span(blocks, lo, hi, self.block_size)
        KV, D = self.K.shape[2], self.K.shape[4]
        k = self.K[layer].index_select(0, ids).transpose(0, 1).reshape(KV, -1, D)
        v = self.V[layer].index_select(0, ids).transpose(0, 1).reshape(KV, -1, D)
        return k[:, a : a + hi - lo], v[:, a : a + hi - lo]


class ChunkAttention(NamedTuple):
    """One prompt chunk's attention call: its rows [row, row + n) attend causally over positions [lo, hi)."""

    row: int
    n: int
    table: torch.Tensor  # the request's KV blocks
    lo: int
    hi: int
    masks: dict  # layer window -> [n, hi - lo] bool


class GatheredDecode(NamedTuple):
    """Every decode token in one masked call over their gathered blocks."""

    rows: torch.Tensor  # the tokens' rows in the pass
    blocks: torch.Tensor  # [tokens, blocks] each token's blocks, padded with its first
    masks: dict  # layer window -> [tokens, 1, 1, positions] bool


class RowDecode(NamedTuple):
    """One decode token on its own, over exactly its n positions."""

    row: int
    table: torch.Tensor
    n: int


@dataclass
class AttentionPlan:
    """How attention runs in one pass, built once for every layer: a call per prompt chunk, and the decode tokens
    either gathered into one call or one by one (PagedStep.gather decides)."""

    chunks: list[ChunkAttention] = field(default_factory=list)
    gather: GatheredDecode | None = None
    rows: list[RowDecode] = field(default_factory=list)


class PagedStep:
    """One model's batched forward over a PagedKV. The caller holds lm.lock and torch.inference_mode."""

    def __init__(self, lm: LoadedModel, kv: PagedKV):
        fm = fused_model(lm)  # the fused layers, norms and RoPE tables every step of this model shares
        self.lm, self.kv = lm, kv
        self.layers, self.final_norm, self.rope, self.windows = fm.layers, fm.final_norm, fm.rope, fm.windows
        self.H, self.KV, self.D, self.G = fm.H, fm.KV, fm.D, fm.G
        self.attention = "auto"  # decode tokens: "auto" | "rows" | "gather" (see gather())
        self.row = row_step(fm)  # on a CPU in fp32 (None elsewhere): every pass with the C kernels (_rows)
        self.graphs = None  # the engine's decode graphs (engine.graphed.DecodeGraphs; on a GPU by default)

    def gather(self, lens: list[int]) -> bool:
        """Attend for all decode tokens in one call (each request's blocks gathered, padded to the longest, the
        padding masked) when that wastes little, else one call per request over exactly its tokens. One call
        saves launches (what bounds a GPU, and Python overhead on a CPU); the padding costs reads."""
        if self.attention != "auto":
            return self.attention == "gather" and len(lens) > 0
        return len(lens) > 1 and max(lens) * len(lens) <= 2 * sum(lens)

    def _masks(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> dict:
        """{window: [n_q, n_k] bool} (fused.window_masks)."""
        return window_masks(q_pos, k_pos, self.windows)

    def forward(self, seqs: list[Seq], logits: bool = True, interrupt=None) -> torch.Tensor | None:
        """Every token of every seq through the model; K/V written into the seqs' blocks. Returns the logits of
        each seq's last token [len(seqs), vocab] float32 on the device (None with logits=False: a prompt chunk
        that is not the last needs no logits). A seq with layer > 0 enters there with its hidden state x. With
        `interrupt` (a callable asked after each layer), the parkable seqs active at a layer after which it says
        True stop there: their `layer`, `x` and `parked` say where they stopped, and their logits rows are NaN."""
        lm, kv = self.lm, self.kv
        decode_only = logits and all(len(s.tokens) == 1 and not s.layer for s in seqs)
        if CHOICE.engine_pass(self.row is not None, decode_only, graphs=self.graphs is not None).kernel == DECODE_GRAPH:
            out = self.graphs.forward(seqs)
            if out is not None:
                return out  # else no bucket serves it (too many rows, too long): the answer without graphs
        if CHOICE.engine_pass(self.row is not None, decode_only).kernel == ROW_STEP:
            return self._rows(seqs, logits, interrupt)  # every pass with the C kernels; else decode tokens only
        dev, H, KV, D = lm.device, self.H, self.KV, self.D
        x, rows, blk, off, rope = self._enter(seqs)
        parked: set[int] = set()
        views: dict[tuple, tuple] = {}  # active seqs -> (row index or None, blocks, offsets, RoPE, attention plan)
        n_layers, every = len(self.layers), tuple(range(len(seqs)))
        resuming = any(s.layer for s in seqs)
        if not any(s.parkable for s in seqs):
            interrupt = None
        for i, ly in enumerate(self.layers):
            act = tuple(j for j, s in enumerate(seqs) if s.layer <= i and j not in parked) if resuming or parked else every
            if not act:
                continue  # before a resumed chunk's layer, or only parked chunks left
            if act not in views:
                if len(act) == len(seqs):
                    views[act] = (None, blk, off, rope, self._attention_plan(seqs, dev))
                else:
                    idx = torch.tensor([rows[j] + t for j in act for t in range(len(seqs[j].tokens))], device=dev)
                    ro = {lt: (c.index_select(0, idx), sn.index_select(0, idx)) for lt, (c, sn) in rope.items()}
                    views[act] = (idx, blk[idx], off[idx], ro, self._attention_plan([seqs[j] for j in act], dev))
            idx, b, o, ro, plan = views[act]
            xa = x if idx is None else x.index_select(0, idx)
            q, k, v = project_qkv(ly, xa, H, KV, D, *ro[ly.rope])
            kv.K[i, b, :, o] = k  # [R, KV, D] into each token's slot
            kv.V[i, b, :, o] = v
            att = torch.empty(q.shape[0], H, D, device=dev, dtype=q.dtype)
            self._attend(i, ly, q, att, plan)
            xa = finish_layer(ly, xa, att.reshape(-1, 1, H * D))
            x = xa if idx is None else x.index_copy(0, idx, xa)
            if interrupt is not None and i + 1 < n_layers and interrupt():  # asked on: a resumed seq may start later
                for j in act:
                    s = seqs[j]
                    if s.parkable:
                        s.layer, s.x, s.parked = i + 1, x[rows[j] : rows[j] + len(s.tokens)].clone(), True
                        parked.add(j)
        return self._head(seqs, x, rows, parked) if logits else None

    def _enter(self, seqs: list[Seq]):
        """The pass's rows as they enter: hidden states x [R, 1, d] (embedded, or a resumed seq's own), each seq's
        first row, and each row's KV block, slot in it and RoPE rows (by layer type)."""
        lm, dev, bs = self.lm, self.lm.device, self.kv.block_size
        positions = [p for s in seqs for p in range(s.start, s.end)]
        cos_t, sin_t = self.rope.upto(max(s.end for s in seqs))
        pos = torch.tensor(positions, device=dev)
        blk = torch.tensor([s.table[p // bs] for s in seqs for p in range(s.start, s.end)], device=dev)
        rope = {lt: (cos_t[lt].index_select(0, pos), sin_t[lt].index_select(0, pos)) for lt in cos_t}
        x = lm.arch.embed()(torch.tensor([t for s in seqs for t in s.tokens], device=dev).view(len(positions), 1))
        rows, r = [], 0  # each seq's first row
        for s in seqs:
            rows.append(r)
            s.parked = False
            if s.layer:
                x[r : r + len(s.tokens)] = s.x
            r += len(s.tokens)
        return x, rows, blk, pos % bs, rope

    def _head(self, seqs: list[Seq], x: torch.Tensor, rows: list[int], parked: set[int]) -> torch.Tensor:
        """The logits of each seq's last token [len(seqs), vocab] float32 on the device; NaN rows for parked seqs."""
        lm, dev = self.lm, self.lm.device
        keep = [j for j in range(len(seqs)) if j not in parked]  # the LM head only for seqs that went through
        last = torch.tensor([rows[j] + len(seqs[j].tokens) - 1 for j in keep], device=dev, dtype=torch.long)
        h = self.final_norm(x.index_select(0, last)).view(len(keep), x.shape[-1])
        out = project(lm.arch.unembedding(), h)  # on a CPU: the kernel pipeline.decode_step.choice names for this many rows
        out = lm.arch.apply_softcap(out.float())  # on the device: the engine brings back what it needs
        if not parked:
            return out
        full = out.new_full((len(seqs), out.shape[-1]), float("nan"))
        full[keep] = out
        return full

    def decode_steps(self, seqs: list[Seq], stops: list[frozenset[int]], left: list[int], flag, steps: int, k: int):
        """Up to `steps` greedy tokens for decode seqs (one token each, at layer 0) in one C call, each step the same
        numbers as a pass of its own (RowStep.decode_steps, layer_call.row_steps): a layer_call.Steps, or None where
        it does not apply (no C kernels, or a model the call does not cover). stops: each seq's stop ids; left: the
        tokens each may still make; flag (a ctypes int): set by another thread, the call stops after its step. With
        decode graphs (a GPU engine), one replay of `steps` steps (DecodeGraphs.decode_steps; it cannot stop early)."""
        if not CHOICE.multi_step(self.row is not None, self.graphs is not None) or not seqs or any(len(s.tokens) != 1 or s.layer for s in seqs):
            return None
        if self.graphs is None and len(seqs) > ONE_CALL_ROWS:  # the C call takes this many; a graph's replay any bucket
            return None
        if self.graphs is not None:
            return self.graphs.decode_steps(seqs, left, steps, k)
        bs = self.kv.block_size
        width = max(map(len, stops))
        stop = np.full((len(seqs), width), -1, dtype=np.int32)
        for j, ids in enumerate(stops):
            stop[j, : len(ids)] = sorted(ids)
        rows = PagedRows(self.kv.K, self.kv.V, [s.table for s in seqs], [s.start for s in seqs])
        room = [len(s.table) * bs for s in seqs]
        return self.row.decode_steps([s.tokens[0] for s in seqs], [s.start for s in seqs], rows, room, stop, left, flag, steps, k)

    def _rows(self, seqs: list[Seq], logits: bool, interrupt) -> torch.Tensor | None:
        """A pass through pipeline.decode_step.cpu.row_step: every token of every seq one row (numpy for the small work, each
        row's attention over exactly its request's positions, the weights read once for all rows). With the native
        kernels every pass goes this way, so a request's numbers never depend on what shares its passes; without
        them only passes of decode tokens do. Parked as forward parks: a parkable seq stops at the layer where
        `interrupt` said so, its logits NaN, and resumes there."""
        tokens, positions, tables, first, park, last = [], [], [], [], [], []
        for s in seqs:
            s.parked = False
            n = len(s.tokens)
            tokens += s.tokens
            positions += range(s.start, s.end)
            tables += [s.table] * n
            first += [s.layer] * n
            park += [s.parkable] * n
            last.append(len(tokens) - 1)
        x0 = None
        if any(first):
            x0 = np.zeros((len(tokens), self.lm.facts.d_model), dtype=np.float32)
            for s, end in zip(seqs, last):
                if s.layer:
                    x0[end + 1 - len(s.tokens) : end + 1] = s.x.reshape(len(s.tokens), -1).numpy()
        rows = PagedRows(self.kv.K, self.kv.V, tables, positions, self.gather([s.end for s in seqs]))
        r = self.row.run(tokens, positions, rows, interrupt=interrupt if any(park) else None, first=first, x0=x0, parkable=park, want=last if logits else [])
        for s, end in zip(seqs, last):
            if r.parked is not None and r.parked[end] >= 0:
                n = len(s.tokens)
                s.layer, s.x, s.parked = int(r.parked[end]), torch.from_numpy(r.x[end + 1 - n : end + 1].copy()).view(n, 1, -1), True
        if not logits:
            return None
        if len(r.kept) == len(seqs):
            return r.logits
        full = torch.full((len(seqs), self.row.vocab), float("nan"))
        if r.logits is not None:
            full[[last.index(k) for k in r.kept.tolist()]] = r.logits
        return full

    def _attention_plan(self, seqs: list[Seq], dev) -> AttentionPlan:
        """How attention runs this pass: the decode tokens together (gathered) or one by one, and one causal
        call per prompt chunk. Row offsets, block tensors and masks are built once for all layers."""
        bs = self.kv.block_size
        rows, r = [], 0
        for s in seqs:
            rows.append((r, s))
            r += len(s.tokens)
        singles = [(r, s) for r, s in rows if len(s.tokens) == 1]
        chunks = [(r, s) for r, s in rows if len(s.tokens) > 1]
        plan = AttentionPlan()
        for r, s in chunks:
            # keys from position 0, or (every layer sliding, as in Mistral) from the window's start
            slides = self.windows and all(ly.window for ly in self.layers)
            lo = max(0, s.start - max(self.windows)) if slides else 0
            k_pos = torch.arange(lo, s.end, device=dev)
            q_pos = torch.arange(s.start, s.end, device=dev)
            plan.chunks.append(ChunkAttention(r, len(s.tokens), torch.tensor(s.table, device=dev), lo, s.end, self._masks(q_pos, k_pos)))
        lens = [s.end for _, s in singles]
        if self.gather(lens):
            nb = -(-max(lens) // bs)
            idx = torch.tensor([s.table[:nb] + [s.table[0]] * (nb - len(s.table[:nb])) for _, s in singles], device=dev)
            q_pos = torch.tensor([s.start for _, s in singles], device=dev)
            ar = torch.arange(nb * bs, device=dev)
            masks = {w: m[:, None, None, :] for w, m in window_masks(q_pos, ar, self.windows).items()}
            plan.gather = GatheredDecode(torch.tensor([r for r, _ in singles], device=dev), idx, masks)
        else:
            plan.rows = [RowDecode(r, torch.tensor(s.table, device=dev), s.end) for r, s in singles]
        return plan

    def _attend(self, i: int, ly, q: torch.Tensor, att: torch.Tensor, plan: AttentionPlan) -> None:
        """Fill att [R, H, D] for layer i from q [R, H, D] and the KV pool."""
        kv, KV, D, G, scale = self.kv, self.KV, self.D, self.G, ly.scale
        for r, n, table, lo, hi, masks in plan.chunks:  # a prompt chunk: causal over its request
            kk, vv = kv.read(i, table, lo, hi)
            qq = q[r : r + n].transpose(0, 1)[None]  # [1, H, n, D]
            o = F.scaled_dot_product_attention(qq, kk[None], vv[None], attn_mask=masks[ly.window], scale=scale, enable_gqa=G > 1)
            att[r : r + n] = o[0].transpose(0, 1)
        if plan.gather is not None:  # decode tokens: one masked call
            rows, idx, masks = plan.gather
            B = len(rows)
            kk = kv.K[i][idx].permute(0, 2, 1, 3, 4).reshape(B, KV, -1, D)
            vv = kv.V[i][idx].permute(0, 2, 1, 3, 4).reshape(B, KV, -1, D)
            o = F.scaled_dot_product_attention(q[rows].view(B, KV, G, D), kk, vv, attn_mask=masks[ly.window], scale=scale)
            att[rows] = o.reshape(B, -1, D)
        for r, table, n in plan.rows:  # decode tokens one by one, exact lengths
            lo = window_start(n, ly.window)
            kk, vv = kv.read(i, table, lo, n)
            att[r] = F.scaled_dot_product_attention(q[r].view(1, KV, G, D), kk[None], vv[None], scale=scale).reshape(-1, D)
