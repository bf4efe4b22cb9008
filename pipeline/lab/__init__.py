"""The measuring lab: what the pages measure beside the pipeline itself. The roofline and the hardware probes,
attention-kernel experiments, tensor-parallel sharding plans, the batching page's scene, the misconception experiments
and the cross-checks that show each page's numbers are right.

The face: `checks`, `hardware`, `misconceptions` and `roofline` as the modules they are (each a page's namespace:
checks.Check, hardware.matmul_probe, roofline.roofline), and the scene's, the attention kernels' and the sharding
plans' names."""

from pipeline.lab import checks, hardware, misconceptions, roofline
from pipeline.lab.attention_kernels import available_kernels, kernel_sweep, sweep_doubts
from pipeline.lab.scene import (
    POLICIES,
    SCENE_MAX_NEW_TOKENS,
    SCENES,
    VISITOR_PROMPTS,
    ScenePolicy,
    SceneRun,
    User,
    run_alone,
    run_scene,
    run_transformers_batch,
)
from pipeline.lab.sharding import devices_present, even_device_counts, pipeline_plan, sse_lines, tensor_parallel_plan

__all__ = [
    "checks", "hardware", "misconceptions", "roofline",
    "available_kernels", "kernel_sweep", "sweep_doubts",
    "POLICIES", "SCENE_MAX_NEW_TOKENS", "SCENES", "VISITOR_PROMPTS", "ScenePolicy", "SceneRun", "User", "run_alone", "run_scene",
    "run_transformers_batch",
    "devices_present", "even_device_counts", "pipeline_plan", "sse_lines", "tensor_parallel_plan",
]  # fmt: skip
