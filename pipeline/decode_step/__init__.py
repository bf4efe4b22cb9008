"""The fast decode step, on every device: one token per row through every layer at the speed of reading the weights.

    choice.py         THE choice of what computes a step (CHOICE: our C kernels, torch's, transformers' forward; on a GPU
                      the fused step, CUDA graphs or Triton) and why; every caller asks it, pages print its reason
    fused_weights.py  a model's fused layers, norms and RoPE tables, built once (FusedModel: the start of every step)
    fused.py          the static-shape step (fused_measures.py: what the production page measures of it)
    kv_layout.py      which keys and values a query reads (the rules every attention path shares)
    cpu/              the CPU sub-room: cpu_decode.c (AVX2 kernels) and what builds, loads and calls it (trusted.py, beside choice.py, verifies what is loaded from disk); the
                      row step over numpy views and where its keys and values lie; threads, huge pages, the read
                      probe (bandwidth) and the lower-precision lesson (precision)
    gpu/              the GPU sub-room: torch.compile and CUDA-graph capture (graphs), the step as four Triton kernels
                      a layer (triton_step, triton_kernels)

The face, what the app's side uses: the kernel choice (CHOICE, Choice, Path), the fused step's support and measures,
and the precision lesson (the `precision` module: compare, usable, LABELS, N_NEW, kernel_note)."""

from pipeline.decode_step.choice import CHOICE, Choice, KernelChoice, Path
from pipeline.decode_step.cpu import precision
from pipeline.decode_step.fused import MIN_BUCKET
from pipeline.decode_step.fused_measures import check_against_forward, launches_per_step, mode_label, step_floor
from pipeline.decode_step.fused_weights import supported

__all__ = [
    "CHOICE", "Choice", "KernelChoice", "MIN_BUCKET", "Path", "check_against_forward", "launches_per_step", "mode_label", "precision",
    "step_floor", "supported",
]  # fmt: skip
