"""pipeline.decode_step.choice: the one place that says which path serves a product, a pass or a step, and why. Each
answer with the C kernels built, without them (no compiler, no AVX2) and with the choice switched off (the bench)."""

import pytest
import torch

from pipeline.decode_step import choice as kc
from pipeline.decode_step.cpu import library

pytestmark = pytest.mark.unit


@pytest.fixture
def without_c(monkeypatch):
    monkeypatch.setattr(library, "_lib", None)


def test_without_the_c_kernels_the_measured_fallbacks_serve(without_c):
    c = kc.CHOICE
    assert not c.c_kernels() and c.library() is None and c.why_not_c()
    assert c.product(1).kernel == kc.SGEMV and c.product(1).path is kc.Path.TORCH
    assert c.product(64).kernel == (kc.ONEDNN_KERNEL if kc.ONEDNN else kc.TALL)
    assert c.product(65).kernel == c.product(128).kernel == kc.TALL and c.product(129).kernel == kc.TORCH_LINEAR
    assert c.row_product(200).kernel == kc.TORCH_LINEAR  # the row step follows the product's choice
    # the engine's pass: the row step for decode tokens only, torch's step for prompts; never the row step without one
    assert c.engine_pass(True, True).kernel == kc.ROW_STEP and not c.engine_pass(True, True).c
    assert c.engine_pass(True, False).kernel == kc.TORCH_STEP and c.engine_pass(False, True).kernel == kc.TORCH_STEP
    assert not c.multi_step(True) and c.one_row_threads(1) and not c.one_row_threads(2)
    assert not c.exact().c and "torch's order" in c.exact().reason
    assert "torch's kernels" in c.precision().reason and "numpy sum" in c.read(2).reason
    # an int8 model's pass: the same path, over its dequantised fp32 weights (no int8 panels without the C kernels)
    assert c.engine_pass(True, True, precision="int8").kernel == kc.ROW_STEP and "dequantised" in c.engine_pass(True, True, precision="int8").reason


def test_with_the_c_kernels_every_row_step_product_and_pass_is_theirs():
    c = kc.CHOICE
    if not c.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built here")
    assert c.product(1).kernel == c.product(64).kernel == kc.PANEL and c.product(65).kernel == kc.TALL
    assert c.row_product(500).kernel == kc.PANEL  # any number of rows: a row's sums never depend on what shares it
    assert c.engine_pass(True, False).kernel == kc.ROW_STEP and c.engine_pass(True, False).c
    assert c.engine_pass(False, True).kernel == kc.TORCH_STEP  # no row step (a GPU, bf16): torch's, C or not
    assert c.multi_step(True) and not c.multi_step(False) and not c.one_row_threads(1) and c.exact().c
    # an int8 model's pass is the same path, reading int8 panels; fp32's answer is unchanged
    int8, fp32 = c.engine_pass(True, False, precision="int8"), c.engine_pass(True, False)
    assert (int8.path, int8.kernel) == (fp32.path, fp32.kernel) and "int8 panels" in int8.reason and "int8" not in fp32.reason
    assert fp32.reason == "the row step on the C kernels: every pass, fixed-order sums"


def test_the_choice_switched_off_is_f_linear_and_torch_everywhere(monkeypatch):
    monkeypatch.setattr(kc.CHOICE, "enabled", False)
    x, w = torch.ones(3, 8), torch.ones(4, 8)
    assert kc.CHOICE.linear(x, w).kernel == kc.TORCH_LINEAR and not kc.CHOICE.c_kernels()
    assert kc.CHOICE.greedy(torch.ones(10)).path is kc.Path.TORCH
    assert "switched off" in kc.CHOICE.why_not_c()


def test_linear_asks_the_dtype_and_device_first():
    w = torch.ones(4, 8)
    assert kc.CHOICE.linear(torch.ones(2, 8, dtype=torch.float64), w.double()).kernel == kc.TORCH_LINEAR
    assert kc.CHOICE.linear(torch.ones(0, 8), w).kernel == kc.TORCH_LINEAR  # no rows
    assert kc.CHOICE.linear(torch.ones(2, 8), w.t().contiguous().t()).kernel == kc.TORCH_LINEAR  # a strided weight
    assert kc.CHOICE.unsupported("GPT-2").path is kc.Path.TRANSFORMERS and "GPT-2" in kc.CHOICE.unsupported("GPT-2").reason
