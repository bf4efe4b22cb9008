"""Two ways a fixed-shape step costs the host less per call on a GPU, for any step that is a function without
arguments (its inputs live in device tensors it reads): torch.compile (fewer, fused kernels; no Python between
them) and a CUDA graph (every kernel of the step replayed with one launch). pipeline.decode_step.fused's decoder uses
both; each says what failed rather than raising, so the caller runs the plain step instead."""

from __future__ import annotations

import time

import torch

from pipeline.common.timing import sync


def compile_step(body, lock) -> tuple[object | None, str | None, float]:
    """torch.compile `body` (fullgraph, static shapes) and run it once under `lock` (the model's), which compiles.
    Returns (the compiled step, or None and what failed; seconds spent)."""
    from pipeline.decode_step.trusted import inductor_cache

    t = time.perf_counter()
    inductor_cache()  # the code inductor writes and loads back lives in a private folder of ours, not in /tmp
    try:
        run = torch.compile(body, fullgraph=True, dynamic=False)
        with lock, torch.inference_mode():
            run()
        return run, None, time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - no compiler, an unsupported op: the eager step is the same maths
        return None, f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); the step runs uncompiled", time.perf_counter() - t


def capture_step(run, lock, device) -> tuple[torch.cuda.CUDAGraph | None, object, str | None, float]:
    """Capture `run` as a CUDA graph (three warm-up runs on a side stream first, as torch's docs require), under
    `lock` (while a stream captures, no other thread may run work on the device). Returns (the graph, or None and
    what failed; the graph's static outputs, overwritten by each replay; seconds spent)."""
    t = time.perf_counter()
    try:
        with lock, torch.inference_mode():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    run()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = run()
            sync(device)
        return g, out, None, time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - a driver or capture error: run the same step without a graph
        return None, None, f"CUDA graph capture failed ({type(e).__name__}: {str(e)[:200]}); the step runs without a graph", time.perf_counter() - t
