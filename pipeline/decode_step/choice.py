"""THE choice of what computes a CPU step: our C kernels (pipeline/decode_step/cpu/cpu_decode.c), torch's (with numpy, OpenBLAS
and oneDNN), or transformers' own forward. Every caller asks the one object here, `CHOICE`, and each answer is a
`Choice`: the path, the kernel or step that runs, and a sentence saying why (what the pages print).

    CHOICE.c_kernels()                     # the C kernels serve here: norms, SiLU, attention, whole layers, exactness
    CHOICE.product(rows)                   # which kernel multiplies `rows` rows by a weight ("panel", "sgemv", ...)
    CHOICE.engine_pass(row, decode_only)   # the engine's pass: the row step (C or fallback kernels) or torch's step
                                           # (precision="int8": an int8 model's, its reason says int8 panels;
                                           # graphs=True: a GPU engine's decode passes, one CUDA graph per batch bucket)
    CHOICE.fused_step(lm, row, compile)    # our loop's fused step: the row step, eager, or a CUDA graph
    CHOICE.trimmed_step(fm, compile)       # why that graph is not of the trimmed Triton kernels (None: it is)
    CHOICE.precision(), CHOICE.exact(), CHOICE.read()   # page 12's lesson, the misconception check, the read probe

Why these kernels. A decode step multiplies a few rows of activations by every weight matrix of the model: 538 MB for
SmolLM2 in fp32, read from memory once per step. At 1 row the product is memory-bound (one multiply-add per 4 bytes
read); at 8 rows a kernel must still stream the weight at the memory's speed while doing 8 times the arithmetic; at
32, arithmetic starts to decide. Every weight of the model, back to back, on the project's 2-core build machine (AMD
EPYC, AVX2; medians of 5, one session each; the column on the right from the session that wrote it):

  rows  torch F.linear (MKL)   W @ xᵀ (MKL)   OpenBLAS (numpy)   oneDNN, packed once   pipeline/decode_step/cpu/cpu_decode.c
     1        73-82 ms            72 ms           36-45 ms            40-68 ms              36-42 ms
     8          174 ms           155 ms           81-93 ms            74-91 ms              37-46 ms
    32          257 ms           139 ms          155-168 ms          129-155 ms             86-95 ms

No library kernel does 2-64 rows well on this processor, so 1 to PANEL_MAX_ROWS rows go to our own kernel,
pipeline/decode_step/cpu/cpu_decode.c (C, AVX2 + FMA; its comment says how it works). gcc builds it once per machine into the
model cache (about a second, on the first decode step); the weight is copied once into the kernel's panel layout and
kept beside it (a second copy of the weights: +538 MB for SmolLM2). Each output is one sum over k in order, so a
row's numbers do not depend on how many rows share the call, or which thread computes them: a request gets the same
logits alone as inside any batch, bit for bit. What it gives the whole step and the engine (bench/bench_linear.py,
bench/bench_cpu_anchor.py, 2026-12-02): a decode step of 1, 8 and 12 rows in 28.8, 40.6 and 45.0 ms (the torch step
with F.linear: 61, 126, 142); one request 25.0 tok/s against 19.8 on the fallback kernels below (one row is
bandwidth-bound either way), 8 at once 116 against 69 (in an hour when the machine read 14 GB/s).

Without a C compiler or AVX2/FMA (or with LLM_EXPLORER_PANEL=0), the measured next-best kernels:
  * 1 row: OpenBLAS's matrix-vector kernel (numpy's `W @ x` on the same memory, no copy): 12 GB/s against
    MKL's 7 GB/s, which on this AMD processor never reaches the memory's speed at one row;
  * 2 to PANEL_MAX_ROWS rows: oneDNN with the weight re-laid once in its blocked layout
    (`torch.ops.mkldnn._reorder_linear_weight`, kept beside the weight).
Above: up to TALL_MAX_ROWS rows MKL as W @ xᵀ, then F.linear (a prompt of hundreds of tokens is compute-bound
and MKL's GEMM is good at it). Every path computes the same products in another summation order: within 1e-4
of F.linear on the model's projections (tests/pipeline/test_fused.py and test_row_step.py against float64). On
a GPU, with other dtypes, or with the choice off (`CHOICE.enabled`, bench/bench_linear.py), everything is F.linear.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from dataclasses import dataclass
from enum import StrEnum

import torch

from pipeline.decode_step.cpu import library as _library

PANEL_MAX_ROWS = 64  # 1..64 rows: pipeline/decode_step/cpu/cpu_decode.c (or, without it, 1 row OpenBLAS and 2..64 oneDNN)
TALL_MAX_ROWS = 128  # 65..128 rows: MKL's W @ xᵀ; above: F.linear (252 prompt rows: W @ xᵀ ran 0.89x as fast)

# what runs, in a Choice's `kernel`: the products' kernels, then the steps
PANEL, SGEMV, ONEDNN_KERNEL, TALL, TORCH_LINEAR = "panel", "sgemv", "onednn", "tall", "torch"
ROW_STEP, TORCH_STEP, TRANSFORMERS_STEP, DECODE_GRAPH = "row step", "torch step", "transformers", "decode graph"


def _onednn() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    except Exception:  # noqa: BLE001 - a build without oneDNN: MKL paths only
        return False


ONEDNN = _onednn()


class Path(StrEnum):
    """Who computes: our C kernels, torch's (and numpy's, OpenBLAS's, oneDNN's), or the model's own forward."""

    C = "our C kernels (pipeline/decode_step/cpu/cpu_decode.c)"
    TORCH = "torch's kernels"
    TRANSFORMERS = "transformers' forward"


@dataclass(frozen=True)
class Choice:
    """One answer: the path, what runs on it (a product's kernel: PANEL, SGEMV, ...; a step: ROW_STEP, ...) and why."""

    path: Path
    kernel: str
    reason: str

    @property
    def c(self) -> bool:
        return self.path is Path.C

    def __str__(self) -> str:
        return self.reason


class KernelChoice:
    """The one place that decides which path serves a model's step, a pass or a product on this machine (see the
    module). Its answers depend on the C library (built once, lazily: asked only where a CPU step needs it), the
    shape (rows), dtype and device of what is computed, and `enabled`."""

    enabled = True  # bench/bench_linear.py turns it off to measure what the choice gives: F.linear and torch everywhere

    # -- the C library ---------------------------------------------------------------------------------------------
    def library(self) -> ctypes.CDLL | None:
        """The built C kernels, or None (not built here, or the choice is off)."""
        return _library.loaded() if self.enabled else None

    def c_kernels(self) -> bool:
        """Whether the C kernels serve here (the norms, SiLU, attention, whole layers and every row-step product)."""
        return self.library() is not None

    def why_not_c(self) -> str:
        """Why the C kernels do not serve here (asked only where they do not)."""
        from pipeline.decode_step.cpu.native_build import cpu_has_avx2_fma

        if not self.enabled:
            return "the kernel choice is switched off (a bench's comparison)"
        if os.environ.get("LLM_EXPLORER_PANEL", "1") == "0":
            return "LLM_EXPLORER_PANEL=0 turns them off"
        if not cpu_has_avx2_fma():
            return "this processor has no AVX2 and FMA"
        if (os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")) is None:
            return "there is no C compiler here"
        return "they did not build or were not trusted here (the server's log says why)"

    # -- a product -------------------------------------------------------------------------------------------------
    def product(self, rows: int) -> Choice:
        """THE choice of kernel for `rows` rows times a weight on this CPU, measured fastest (the module's table):
        PANEL (pipeline/decode_step/cpu/cpu_decode.c, 1-64 rows), else SGEMV (one row, OpenBLAS), ONEDNN_KERNEL (2-64 rows,
        packed once), TALL (65-128 rows, MKL's W @ xᵀ) or TORCH_LINEAR (F.linear). Inside torch.compile, never C.
        (Every answer is a constant: torch.compile traces through this.)"""
        if rows <= PANEL_MAX_ROWS and not torch.compiler.is_compiling() and self.c_kernels():
            return _BY_PANEL
        if rows == 1:
            return _BY_SGEMV
        if rows <= PANEL_MAX_ROWS and ONEDNN:
            return _BY_ONEDNN
        return _BY_TALL if rows <= TALL_MAX_ROWS else _BY_GEMM

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> Choice:
        """What computes F.linear(x, w): `product` for x's rows where x and w are float32 on a CPU (w 2-D and
        contiguous) and the choice is on; F.linear otherwise."""
        if not (self.enabled and x.device.type == "cpu" and x.dtype == w.dtype == torch.float32 and w.dim() == 2 and w.is_contiguous()):
            return _BY_F_LINEAR
        rows = x.numel() // max(1, x.shape[-1])
        return _BY_F_LINEAR if rows == 0 else self.product(rows)

    def row_product(self, rows: int) -> Choice:
        """The row step's product: the panel kernel for ANY number of rows where the C kernels serve (its sums run in
        the same order for any number of rows: a row's numbers never depend on what shares it), else `product`."""
        return _BY_PANEL if self.c_kernels() else self.product(rows)

    def greedy(self, logits: torch.Tensor) -> Choice:
        """Who summarises a step's logits (argmax, log-sum-exp, top k): one C call for float32 [V] or [rows, V] on a
        CPU, torch's reductions elsewhere and inside torch.compile (a traced step has no call out to C)."""
        if (
            torch.compiler.is_compiling()
            or logits.device.type != "cpu"
            or logits.dtype != torch.float32
            or logits.ndim not in (1, 2)
            or not logits.shape[-1]
            or not self.c_kernels()
        ):
            return _SUMMARY_TORCH
        return _SUMMARY_C

    def one_row_threads(self, rows: int) -> bool:
        """Whether a row-step pass of `rows` rows runs under the thread plan (pipeline.decode_step.cpu.threads): one row on the
        fallback kernels only; the C kernels and several rows keep torch's threads (they degrade with the load,
        measured in bench_cpu_anchor)."""
        return rows == 1 and not self.c_kernels()

    # -- a step ----------------------------------------------------------------------------------------------------
    def engine_pass(self, row: bool, decode_only: bool, precision: str = "fp32", graphs: bool = False) -> Choice:
        """What runs one pass of the engine's batched step (pipeline.engine.paged): `row` says the model has a CPU row
        step (a CPU, fp32, norms the adapter knows); `decode_only`, that the pass is decode tokens entering at layer 0
        and wants their logits. With the C kernels every pass is the row step, so a request's numbers never depend on
        what shares its passes; without them only decode-only passes are; else torch's batched step. `precision`
        "int8" (an int8 model, pipeline.model.quantised): the same path, its reason says what the weights are read as.
        `graphs` (the engine's decode graphs, pipeline.engine.graphed: on a GPU by default): a decode-only pass replays
        its batch bucket's graph (the caller falls back to this answer without `graphs` where no bucket serves)."""
        if graphs and decode_only:
            return Choice(Path.TORCH, DECODE_GRAPH, "a CUDA graph of the decode pass, one per padded batch size (pipeline.engine.graphed)")
        if precision == "int8":
            return self._int8_pass(self.engine_pass(row, decode_only))
        if not row:
            return Choice(Path.TORCH, TORCH_STEP, "torch's batched step: not a CPU in fp32 with norms the row step knows")
        if self.c_kernels():
            return Choice(Path.C, ROW_STEP, "the row step on the C kernels: every pass, fixed-order sums")
        if decode_only:
            return Choice(Path.TORCH, ROW_STEP, "the row step on the fallback kernels: a pass of decode tokens only")
        return Choice(Path.TORCH, TORCH_STEP, "torch's batched step: a pass with prompt chunks or resumed rows, and no C kernels")

    def _int8_pass(self, fp32: Choice) -> Choice:
        """An int8 model's pass: the fp32 model's path; the C kernels read int8 panels, every other path the
        dequantised fp32 weights (the model's own torch weights)."""
        if fp32.c:
            why = "the row step on the C kernels over int8 panels (1 byte a weight, widened to fp32 in registers and scaled per row): every pass, fixed-order sums"
        else:
            why = f"{fp32.reason}; over the int8 weights dequantised to fp32 (int8 panels need the C kernels)"
        return Choice(fp32.path, fp32.kernel, why)

    def multi_step(self, row: bool, graphs: bool = False) -> bool:
        """Whether several greedy decode tokens may run in one call: one replay of a decode graph (`graphs`, a GPU
        engine's), or one C call (RowStep.decode_steps) with the row step on the C kernels."""
        return graphs or (row and self.c_kernels())

    def unsupported(self, why: str) -> Choice:
        """An architecture the fused step does not implement: transformers' forward, one request at a time."""
        return Choice(Path.TRANSFORMERS, TRANSFORMERS_STEP, f"transformers' forward, one request at a time: {why}")

    def fused_step(self, lm, row: bool, compile: bool = False) -> Choice:
        """How our loop's fused step runs on `lm`'s device: a CUDA graph on a GPU (of the trimmed Triton step where
        trimmed_step allows, else torch.compile'd first with `compile`, else the torch step's kernels); on a CPU the
        row step where `row` (pipeline.decode_step.cpu.row_step.usable) and not compiled, else eager."""
        if lm.device.type == "cuda":
            from pipeline.decode_step.fused_weights import fused_model, supported

            if not compile and supported(lm)[0] and self.trimmed_step(fused_model(lm)) is None:
                return Choice(Path.TORCH, "CUDA graph", "CUDA graph of the trimmed step: 4 Triton kernels a layer (pipeline.decode_step.gpu.triton_step)")
            return Choice(Path.TORCH, "CUDA graph", ("torch.compile + " if compile else "") + "CUDA graph")
        if row and not compile:
            c = self.c_kernels()
            kernel = "our AVX2 kernels, pipeline/decode_step/cpu/cpu_decode.c" if c else "OpenBLAS's sgemv"
            if c and getattr(lm, "precision", "fp32") == "int8":
                kernel += " as int8 panels with one fp32 scale per row"
            reason = f"CPU row step (pipeline.decode_step.cpu.row_step, every matrix read by {kernel}; no CUDA device, so no graph)"
            return Choice(Path.C if c else Path.TORCH, ROW_STEP, reason)
        return Choice(Path.TORCH, "eager", ("torch.compile + " if compile else "") + "eager: no CUDA device, so no graph")

    def trimmed_step(self, fm, compile: bool = False) -> str | None:
        """Why the fused step on `fm`'s model (pipeline.decode_step.fused_weights.FusedModel) does not run as the trimmed
        Triton kernels, 4 a layer (pipeline.decode_step.gpu.triton_step), or None where it does: on a CUDA device, not compiled
        (torch.compile makes kernels of its own), a Llama-layout model. FusedDecoder(trimmed=True) runs them anyway
        (Triton's interpreter on a CPU: the tests)."""
        if fm.lm.device.type != "cuda":
            return "no CUDA device"
        if compile:
            return "torch.compile's kernels asked for"
        from pipeline.decode_step.gpu.triton_step import unusable

        return unusable(fm)

    # -- the lessons and probes ------------------------------------------------------------------------------------
    def precision(self) -> Choice:
        """What computes page 12's bf16 and int8 products (pipeline.decode_step.cpu.precision), with the page's caption."""
        if self.c_kernels():
            return Choice(
                Path.C,
                PANEL,
                "All three run our kernel (pipeline/decode_step/cpu/cpu_decode.c) over the same panel layout, the smaller weights widened to fp32 "
                "in registers: the difference in speed is the bytes each token reads.",
            )
        return Choice(
            Path.TORCH,
            TORCH_LINEAR,
            "bf16 and int8 run torch's kernels here (bf16 linear, _weight_int8pack_mm): on a CPU without native bf16 or tuned "
            "int8 instructions the smaller weights are converted on the fly and can be slower than fp32; a dedicated engine's "
            "int8 GEMM (CTranslate2: docs/benchmarks.md) shows what the bytes can give.",
        )

    def exact(self) -> Choice:
        """Whether every engine pass sums in a fixed order, row by row (a request's logits bit for bit the same
        whatever shares its passes): only with the C kernels."""
        if self.c_kernels():
            return Choice(Path.C, ROW_STEP, "the C kernels sum every row in a fixed order, whatever shares its pass")
        return Choice(
            Path.TORCH, TORCH_STEP, "without pipeline/decode_step/cpu/cpu_decode.c the passes sum in torch's order, which depends on what else is in them"
        )

    def read(self, threads: int) -> Choice:
        """What the read probe (pipeline.decode_step.cpu.bandwidth) reads its buffer with."""
        if self.c_kernels():
            return Choice(Path.C, "read_sum", f"pipeline/decode_step/cpu/cpu_decode.c read_sum, AVX2, {threads} threads x 4 streams")
        return Choice(Path.TORCH, "numpy sum", "numpy sum, 1 thread (cpu_decode.c not built here)")


_BY_PANEL = Choice(Path.C, PANEL, "our panel kernel: the weight streamed once for every row, each row's sums in a fixed order")
_BY_SGEMV = Choice(Path.TORCH, SGEMV, "one row: OpenBLAS's matrix-vector product, measured fastest without the C kernels")
_BY_ONEDNN = Choice(Path.TORCH, ONEDNN_KERNEL, "2-64 rows: oneDNN over the weight packed once, measured fastest without the C kernels")
_BY_TALL = Choice(Path.TORCH, TALL, "65-128 rows: MKL as W @ xᵀ")
_BY_GEMM = Choice(Path.TORCH, TORCH_LINEAR, "over 128 rows: compute-bound, MKL's GEMM through F.linear")
_BY_F_LINEAR = Choice(Path.TORCH, TORCH_LINEAR, "not float32 on a CPU (or the choice is off, or no rows): F.linear")
_SUMMARY_C = Choice(Path.C, "greedy_summary", "one C call on one thread")
_SUMMARY_TORCH = Choice(Path.TORCH, TORCH_STEP, "torch's reductions")

CHOICE = KernelChoice()
