"""The engine's decode passes on a GPU as CUDA graphs, one per padded batch size (vLLM's shape).

    graphs = DecodeGraphs(step, scratch)          # step: the engine's PagedStep; scratch: a pool block nobody holds
    logits = graphs.forward(seqs)                 # a decode pass: [len(seqs), vocab], or None where it does not apply
    steps = graphs.decode_steps(seqs, left, 8, k) # 8 greedy tokens a row in ONE replay (a layer_call.Steps), or None

Why. A decode pass of SmolLM2 (30 layers) launches ~450 kernels of a few microseconds each, and the Python around
them costs more than the GPU's work: the weights' read takes ~60 µs on an H200, the eager pass milliseconds (the
engine served one request at 26.5 tok/s, 2026-12-04). A CUDA graph replays every kernel of the pass with one launch.

How. A graph replays fixed shapes reading fixed tensors, so a pass's inputs are copied into static tensors of its
bucket: B rows (the next power of two at least the pass's rows: 1, 2, 4 ... 256), each row's token, position and
block table cut or padded to `nb` blocks (the next power of two that holds its positions). The body is the engine's
batched step for decode tokens (pipeline.decode_step.fused's layer functions, the gathered attention of engine.paged:
each row's blocks gathered from the pool, the positions after its own masked), with everything it reads on the
device: the key/value slot each row writes is looked up from its table on the device, the RoPE rows indexed from
tables made once for every position. Padding rows, and a row's table past its own blocks, point at the scratch
block (the pool's last, never handed out): what they write lands there and no row reads it at a position it sees.
Buckets of up to TRIMMED_MAX_ROWS rows run the trimmed Triton step instead (pipeline.decode_step.gpu.triton_step: four kernels a
layer, reading each row's keys and values through its block table), where the kernel choice allows it.

Several greedy steps in one replay (`decode_steps`, the CPU's multi-step in engine.core): each step's argmax is the
next step's token and the positions advance on the device, so the Python between passes is paid once for all of
them. A row that ends in the middle (a stop token, its length) goes on computing in the replay; the engine drops
what it made after its end, and its writes past its own blocks land in the scratch block.

On a CPU (the tests) the same body runs eagerly, the numbers a graph replays: tests/pipeline/test_decode_graphs.py
checks them against `generate` and the torch step; bench/gpu_check.py measures the graphs on a lent GPU.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu.layer_call import Steps
from pipeline.decode_step.fused import finish_layer, project, project_qkv, window_masks
from pipeline.decode_step.fused_weights import fused_model
from pipeline.decode_step.gpu.graphs import capture_step
from pipeline.forward.sampling import GreedySummary

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOP_K = 20  # the candidates a multi-step replay keeps per step (a request reports Sampling.n_top <= this)
MAX_GATHERED = 1 << 22  # rows x positions a graph may gather (K and V): above, the eager step serves the pass
MAX_GRAPHS = 48  # graphs kept, least recently replayed dropped first
TRIMMED_MAX_ROWS = 8  # buckets of up to this many rows run the trimmed Triton step (pipeline.decode_step.gpu.triton_step, each
# row's products over the weights again, from L2); larger ones torch's batched products, which read the weights once


def pow2(n: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return b


def batch_bucket(rows: int) -> int | None:
    """The padded batch size for `rows` decode rows, or None above the largest bucket."""
    return next((b for b in BATCH_BUCKETS if b >= rows), None)


@dataclass
class _Bucket:
    """One graph's static inputs and outputs: B rows, nb blocks a row, `steps` tokens a replay."""

    B: int
    nb: int
    steps: int
    tok: torch.Tensor  # [B] long
    pos: torch.Tensor  # [B] long
    table: torch.Tensor  # [B, nb] long
    graph: object = None  # the captured torch.cuda.CUDAGraph (None: the body runs eagerly)
    out: tuple | None = None  # the graph's static outputs
    trimmed: object = None  # its TrimmedStep, where the trimmed kernels serve this bucket (else the torch body)


class DecodeGraphs:
    """The decode passes of one engine's PagedStep, by bucket; graphs captured on first use (`capture` False, or a
    capture that failed: the same body eagerly). The caller holds lm.lock and torch.inference_mode, as for every
    pass."""

    def __init__(self, step, scratch: int, capture: bool | None = None, top_k: int = TOP_K, trimmed: bool | None = None):
        """trimmed: run buckets of up to TRIMMED_MAX_ROWS rows as the trimmed Triton step (None: where the kernel
        choice says, CHOICE.trimmed_step: on a GPU, a Llama-layout model; True on a CPU: Triton's interpreter, the
        tests). The first such bucket is checked against the torch body; where they differ the torch body serves."""
        lm = step.lm
        self.step, self.kv, self.scratch, self.top_k = step, step.kv, scratch, top_k
        self.capture = (lm.device.type == "cuda") if capture is None else capture
        if self.capture and lm.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.bs = self.kv.block_size
        limit = lm.facts.max_positions or 1 << 15
        self.cos, self.sin = step.rope.upto(limit)  # every position's rows, made once: a graph keeps reading these
        self.positions = min(len(t) for t in self.cos.values())
        self.ar = torch.arange(pow2(-(-self.positions // self.bs)) * self.bs, device=lm.device)
        self.embed, self.head = lm.arch.embed(), lm.arch.unembedding()
        self._buckets: OrderedDict[tuple, _Bucket] = OrderedDict()
        self.problems: list[str] = []  # captures that failed (the body then runs eagerly), a trimmed step dropped
        self.fm = fused_model(lm)
        self.trimmed = CHOICE.trimmed_step(self.fm) is None if trimmed is None else trimmed
        self.trimmed_err: float | None = None  # the check's relative difference (None: not checked yet)
        self.captures, self.capture_s, self.replays = 0, 0.0, 0

    # -- the engine's side -----------------------------------------------------------------------------------------
    def forward(self, seqs) -> torch.Tensor | None:
        """Logits [len(seqs), vocab] float32 of one decode pass (each seq one token at layer 0), K/V written into
        the seqs' blocks; None where no bucket serves it (too many rows, too long, not decode tokens)."""
        b = self._ready(seqs, 1)
        return None if b is None else self._run(b)[0][: len(seqs)]

    def decode_steps(self, seqs, left: list[int], steps: int, k: int) -> Steps | None:
        """`steps` greedy tokens for each decode seq in one replay: a layer_call.Steps ([steps, rows] arrays; a row
        whose `left` is smaller, or that stops, is read only up to there by the engine), or None where no bucket
        serves it or k > top_k."""
        if steps < 2 or k > self.top_k or max(left, default=0) < 2:
            return None
        b = self._ready(seqs, steps)
        if b is None:
            return None
        M = len(seqs)
        am, lse, vals, ids = (t[:, :M].cpu().numpy() for t in self._run(b))  # one transfer each, after the replay
        return Steps(steps, am, lse, vals[..., :k], ids[..., :k])

    # -- buckets -----------------------------------------------------------------------------------------------------
    def _ready(self, seqs, steps: int) -> _Bucket | None:
        """The bucket for these seqs with their inputs copied in (captured first if new), or None."""
        if not seqs or any(len(s.tokens) != 1 or s.layer for s in seqs):
            return None
        B = batch_bucket(len(seqs))
        last = max(s.start for s in seqs) + steps  # positions the replay reaches, + 1
        nb = pow2(-(-last // self.bs))
        if B is None or last > self.positions or B * nb * self.bs > MAX_GATHERED:
            return None
        b = self._bucket(B, nb, steps)
        tok, pos = np.zeros(B, np.int64), np.zeros(B, np.int64)  # built in numpy: the host's time between replays
        table = np.full((B, nb), self.scratch, np.int64)
        for j, s in enumerate(seqs):
            tok[j], pos[j] = s.tokens[0], s.start
            own = s.table[:nb]
            table[j, : len(own)] = own
        for dst, src in ((b.tok, tok), (b.pos, pos), (b.table, table)):
            dst.copy_(torch.from_numpy(src))
        return b

    def _bucket(self, B: int, nb: int, steps: int) -> _Bucket:
        key = (B, nb, steps)
        b = self._buckets.get(key)
        if b is not None:
            self._buckets.move_to_end(key)
            return b
        dev = self.step.lm.device
        b = _Bucket(
            B,
            nb,
            steps,
            torch.zeros(B, dtype=torch.long, device=dev),
            torch.zeros(B, dtype=torch.long, device=dev),
            torch.full((B, nb), self.scratch, dtype=torch.long, device=dev),
        )
        if self.trimmed and B <= TRIMMED_MAX_ROWS:
            b.trimmed = self._trimmed(b)
        if self.capture:  # captured over padding (every row the scratch block), then replayed over the real inputs
            g, out, problem, s = capture_step(lambda: self._body(b), contextlib.nullcontext(), dev)
            self.capture_s += s
            if problem:
                self.problems.append(problem)
            else:
                b.graph, b.out = g, out
                self.captures += 1
        self._buckets[key] = b
        while len(self._buckets) > MAX_GRAPHS:
            self._buckets.popitem(last=False)
        return b

    def _trimmed(self, b: _Bucket):
        """A TrimmedStep for the bucket, checked once against the torch body over its (padding) inputs, or None where
        the trimmed step failed or differed (then no bucket uses it: `problems` says why)."""
        from pipeline.decode_step.gpu.triton_step import TrimmedStep

        try:
            t = TrimmedStep(self.fm, b.B, self.cos, self.sin)
            if self.trimmed_err is None:
                ref = self._one(b, b.tok, b.pos)
                self.trimmed_err = float((t.body(b.tok, b.pos, b.table, self.kv.K, self.kv.V) - ref).norm() / ref.norm())
        except Exception as e:  # noqa: BLE001 - a Triton build or launch error: the torch body serves
            self.trimmed, self.problems = False, self.problems + [f"the trimmed step failed ({type(e).__name__}: {str(e)[:200]})"]
            return None
        if self.trimmed_err > self.step.lm.arch.tol:
            self.trimmed, self.problems = False, self.problems + [f"the trimmed step differs from the torch body by {self.trimmed_err:.2g}"]
            return None
        return t

    def _run(self, b: _Bucket) -> tuple:
        if b.graph is None:
            return self._body(b)
        b.graph.replay()
        self.replays += 1
        return b.out

    # -- the body: what a graph replays ----------------------------------------------------------------------------
    def _body(self, b: _Bucket) -> tuple:
        """b.steps decode steps of b.B rows over the static inputs: (logits [B, vocab]) for one step, else each
        step's greedy summary (argmax [S, B], logsumexp [S, B], top values and ids [S, B, top_k])."""
        tok, pos = b.tok, b.pos
        out = []
        for _ in range(b.steps):
            logits = b.trimmed.body(tok, pos, b.table, self.kv.K, self.kv.V) if b.trimmed else self._one(b, tok, pos)
            if b.steps == 1:
                return (logits,)
            s = GreedySummary.of(logits, self.top_k)
            out.append(s)
            tok, pos = s.argmax, pos + 1
        return tuple(torch.stack([getattr(s, f) for s in out]) for f in ("argmax", "logsumexp", "values", "ids"))

    def _one(self, b: _Bucket, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One decode step of every row: K/V written at each row's slot (looked up on the device), attention over
        its gathered blocks up to its position; the logits [B, vocab] float32."""
        st, kv, bs, B, nb = self.step, self.kv, self.bs, b.B, b.nb
        H, KV, D, G = st.H, st.KV, st.D, st.G
        blk = b.table.gather(1, (pos // bs)[:, None])[:, 0]  # nb holds every position the replay reaches (_ready)
        off = pos % bs
        at = pos.clamp(max=self.positions - 1)
        rope = {lt: (self.cos[lt].index_select(0, at), self.sin[lt].index_select(0, at)) for lt in self.cos}
        masks = {w: m[:, None, None, :] for w, m in window_masks(pos, self.ar[: nb * bs], st.windows).items()}
        x = self.embed(tok.view(B, 1))
        for i, ly in enumerate(st.layers):
            q, k, v = project_qkv(ly, x, H, KV, D, *rope[ly.rope])
            kv.K[i, blk, :, off] = k
            kv.V[i, blk, :, off] = v
            kk = kv.K[i][b.table].permute(0, 2, 1, 3, 4).reshape(B, KV, nb * bs, D)
            vv = kv.V[i][b.table].permute(0, 2, 1, 3, 4).reshape(B, KV, nb * bs, D)
            o = F.scaled_dot_product_attention(q.view(B, KV, G, D), kk, vv, attn_mask=masks[ly.window], scale=ly.scale)
            x = finish_layer(ly, x, o.reshape(B, 1, H * D))
        h = st.final_norm(x).view(B, x.shape[-1])
        return st.lm.arch.apply_softcap(project(self.head, h).float())

    @property
    def label(self) -> str:
        """What serves decode passes, for the engine's name."""
        return "decode passes as CUDA graphs" if self.capture else "decode graphs' body run eagerly"

    def report(self) -> dict:
        """What the graphs did so far (bench/gpu_check.py, the engine's stats)."""
        return {
            "graphs": self.captures,
            "capture_s": round(self.capture_s, 3),
            "replays": self.replays,
            "buckets": sorted(self._buckets),
            "problems": self.problems[-3:],
            "eager": not self.capture,
            "trimmed_buckets": sorted(k for k, b in self._buckets.items() if b.trimmed),
            "trimmed_check": self.trimmed_err,
        }
