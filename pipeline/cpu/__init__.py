"""Our CPU decode path: the C kernels (cpu_decode.c) and the loader that builds and trusts them (native_build, trusted,
library), THE choice of which path computes (kernel_choice: the C kernels, torch's, or transformers' forward, and
why), the products (matmul), norms, paged attention and the greedy summary in C, huge-page memory, the thread plan
(threads), the packed weights and the row and fused steps that use them (fused_measures: what the production page
measures of the fused step), and the lower-precision lesson (precision).

The face, what the app's side uses: the kernel choice (CHOICE, Choice, Path), the fused step's support and measures,
and the precision lesson (the `precision` module: compare, usable, LABELS, N_NEW, kernel_note)."""

from pipeline.cpu import precision
from pipeline.cpu.fused import MIN_BUCKET
from pipeline.cpu.fused_measures import check_against_forward, launches_per_step, mode_label, step_floor
from pipeline.cpu.fused_weights import supported
from pipeline.cpu.kernel_choice import CHOICE, Choice, KernelChoice, Path

__all__ = [
    "CHOICE", "Choice", "KernelChoice", "MIN_BUCKET", "Path", "check_against_forward", "launches_per_step", "mode_label", "precision",
    "step_floor", "supported",
]  # fmt: skip
