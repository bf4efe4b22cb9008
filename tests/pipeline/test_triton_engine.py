"""The engine's decode graphs on the trimmed Triton kernels (pipeline.engine.graphed, pipeline.decode_step.gpu.triton_step), run by
Triton's interpreter on the CPU: the kernels read each row's keys and values through its block table in the paged pool.
(test_triton_step checks the kernels in the fused step; bench/gpu_check.py times both on a lent GPU.)"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from families import family_folders  # noqa: E402

pytestmark = pytest.mark.model
SERVED = ("llama", "qwen2", "mistral")  # Llama's layout; q/k/v biases; a window of 4 across blocks of 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return family_folders(tmp_path_factory.mktemp("triton_engine"), SERVED)


@pytest.mark.parametrize("family", SERVED)
def test_the_engines_decode_graphs_run_the_trimmed_kernels_over_the_paged_pool(folders, family):
    """Three requests of different lengths through the engine, its decode passes (a bucket of 4 rows, 8 steps a
    replay) on the trimmed kernels reading each row's keys and values through its block table: every answer equals
    transformers' generate of the request alone."""
    from pipeline.engine import Engine, graphed
    from pipeline.generation import prepare
    from pipeline.generation.events import StepEvent
    from pipeline.model.loaded import load_model

    lm = load_model(str(folders[family]))
    eng = Engine(lm, kv_pool_bytes=4 << 20, background=False, prefix_cache=False, decode_steps=8, graphs=True)
    eng.step.graphs = graphed.DecodeGraphs(eng.step, scratch=eng.kv.n_blocks - 1, trimmed=True)  # the pool's last block
    texts, ns = ("Why is the sky blue?", "The capital of France is", "Dog bites man."), (12, 5, 9)
    prompts = [prepare(lm, t, 1, chat=True).prompt_ids for t in texts]
    hs = [eng.submit(p, n, stop_ids=frozenset()) for p, n in zip(prompts, ns)]
    while eng.iterate() is not None:
        pass
    got = [[e.token_id for e in h if isinstance(e, StepEvent)] for h in hs]
    with torch.inference_mode():
        alone = [lm.model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(p) :].tolist() for p, n in zip(prompts, ns)]
    assert got == alone, family
    report = eng.step.graphs.report()
    assert report["trimmed_buckets"] and any(k[2] == 8 for k in report["trimmed_buckets"]), report
    assert report["trimmed_check"] < lm.arch.tol and not report["problems"], report
