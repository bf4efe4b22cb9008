"""GPU paths: run only where a CUDA device exists (skipped on CPU-only machines and in CI)."""

import pytest
import torch

import pipeline
from pipeline.common.telemetry import Sampler
from pipeline.generation import generate, kv_bytes_formula, metrics

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.fixture(scope="module")
def gpu_lm():
    return pipeline.load_model(pipeline.EMBEDDED, device="cuda")


def test_gpu_trace_and_generate(gpu_lm):
    tr = pipeline.trace(gpu_lm, "The capital of France is")
    assert gpu_lm.tokenizer.decode([int(tr.next_logits.argmax())]) == " Paris"
    ev = list(generate(gpu_lm, "The capital of France is", 16))
    assert ev[-1].kv_bytes == kv_bytes_formula(gpu_lm, ev[-1].context_len)
    assert metrics(ev).tokens_per_s is None or metrics(ev).tokens_per_s > 0


def test_gpu_telemetry_uses_nvml(gpu_lm):
    with Sampler(interval_s=0.02) as s:
        list(generate(gpu_lm, "The capital of France is", 16))
    assert s.timeline.source == "nvml"
    assert "gpu_util" in s.timeline.samples[-1] and "torch_allocated_mb" in s.timeline.samples[-1]
