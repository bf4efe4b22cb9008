"""The fused step trimmed to four Triton kernels a layer (pipeline.decode_step.gpu.triton_step), run here by Triton's interpreter
on the CPU (tests/conftest.py switches it on where no GPU is): the kernels a CUDA graph replays on a GPU, checked
against `generate` and the torch step on SmolLM2 and on the Llama-layout families (q/k/v biases, a sliding window);
the families it does not serve said why. bench/gpu_check.py times them on a lent GPU."""

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from families import family_folders  # noqa: E402

pytestmark = pytest.mark.model
PROMPT = "The capital of France is"
SERVED = ("llama", "qwen2", "mistral")
NOT_SERVED = {"qwen3": "norms are not Llama's", "gemma3_text": "scales its embeddings"}  # and why


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return family_folders(tmp_path_factory.mktemp("triton_families"), SERVED + tuple(NOT_SERVED))


def _tokens(lm, n: int, steps: int):
    """The trimmed decoder's greedy tokens after PROMPT (prefill, then `steps` steps), generate's, and the decoder."""
    from pipeline.decode_step.fused import FusedDecoder, fused_model
    from pipeline.forward.tokens import tokenize

    dec = FusedDecoder(fused_model(lm), n, graph=False, trimmed=True)
    ids = torch.tensor([tokenize(lm.tokenizer, PROMPT, chat=False).input_ids])
    T = ids.shape[1]
    with torch.inference_mode():
        _, s = dec.prefill(ids)
        toks = [int(s.token)]
        for p in range(T, T + steps):
            toks.append(int(dec.step(toks[-1], p)[1].token))
        ref = lm.model.generate(ids, max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False)[0, T:].tolist()
    return toks, ref, dec


def test_interpreter_is_on_here():
    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()


def test_smollm2_through_the_trimmed_kernels_gives_generates_tokens(smol):
    from pipeline.decode_step.choice import CHOICE

    toks, ref, dec = _tokens(smol, 64, 1)
    assert dec.trimmed is not None and dec.mode == "Triton kernels + eager", dec.problems
    assert dec.trimmed_err < 1e-5  # one token's logits against the torch step's (relative, fp32)
    assert toks == ref
    assert CHOICE.trimmed_step(dec.fm) == "no CUDA device"  # on a CPU it runs only when asked (trimmed=True)


@pytest.mark.parametrize("family", SERVED)
def test_llama_layout_families_through_the_trimmed_kernels(folders, family):
    """Eight tokens: past the window of 4 (mistral), with q/k/v biases (qwen2); the logits of each step within
    the fp32 tolerance of the torch step's."""
    from pipeline.decode_step.fused import fused_model
    from pipeline.decode_step.gpu.triton_step import unusable
    from pipeline.model.loaded import load_model

    lm = load_model(str(folders[family]))
    assert unusable(fused_model(lm)) is None
    toks, ref, dec = _tokens(lm, 32, 8)
    assert dec.trimmed is not None, dec.problems
    assert toks == ref, family
    with torch.inference_mode():  # one more step both ways at the same position
        dec.tok.fill_(toks[-1])
        a = dec._trimmed_body()[0]
        b = dec._body()[0]
    assert float((a - b).abs().max()) < lm.arch.tol


@pytest.mark.parametrize("family", NOT_SERVED)
def test_other_families_keep_the_torch_step_and_say_why(folders, family):
    from pipeline.decode_step.fused import fused_model
    from pipeline.decode_step.gpu.triton_step import unusable
    from pipeline.model.loaded import load_model

    why = unusable(fused_model(load_model(str(folders[family]))))
    assert why and NOT_SERVED[family] in why, why


def test_a_wrong_kernel_is_caught_and_the_torch_step_serves(smol, monkeypatch):
    """The decoder's own check: a trimmed step whose logits differ is dropped, the torch step runs, problems say so."""
    from pipeline.decode_step.fused import FusedDecoder, fused_model
    from pipeline.decode_step.gpu import triton_step

    body = triton_step.TrimmedStep.body
    monkeypatch.setattr(triton_step.TrimmedStep, "body", lambda self, *a: body(self, *a) * 1.5)
    dec = FusedDecoder(fused_model(smol), 64, graph=False, trimmed=True)
    assert dec.trimmed is None and dec._run == dec._body
    assert "differs from the torch step" in dec.problems[-1]
