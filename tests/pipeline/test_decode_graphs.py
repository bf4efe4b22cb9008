"""The engine's decode graphs (pipeline.engine.graphed): on a CPU their body runs eagerly, the numbers a CUDA graph
replays on a GPU (bench/gpu_check.py captures and measures them on a lent device). Every answer equals our own loop
alone, on both models (Gemma's sliding-window layers included); several steps a replay give the tokens of a step a
pass; padding rows and rows past their blocks write only into the scratch block; a request's logits do not move
when others pad its bucket."""

import pytest
import torch

from pipeline.decode_step.choice import CHOICE, DECODE_GRAPH, ROW_STEP
from pipeline.engine import Engine, graphed
from pipeline.engine.paged import Seq
from pipeline.generation import generate, prepare
from pipeline.generation.events import StepEvent

pytestmark = pytest.mark.model

TEXTS = ("Why is the sky blue?", "The capital of France is", "Dog bites man.")


def _engine(lm, steps: int = 1, graphs: bool = True, **kw) -> Engine:
    return Engine(lm, kv_pool_bytes=32 << 20, background=False, prefix_cache=False, decode_steps=steps, graphs=graphs, **kw)


def _tokens(eng: Engine, prompts, ns) -> list[list[int]]:
    hs = [eng.submit(p, n, stop_ids=None) for p, n in zip(prompts, ns)]
    while eng.iterate() is not None:
        pass
    return [[e.token_id for e in h if isinstance(e, StepEvent)] for h in hs]


def _alone(lm, text: str, n: int) -> list[int]:
    return [e.token_id for e in generate(lm, "", request=prepare(lm, text, n, chat=True), cache="dynamic") if isinstance(e, StepEvent)]


def test_every_answer_equals_the_request_alone_a_step_a_pass_and_eight_a_replay(lm):
    prompts = [prepare(lm, t, 1, chat=True).prompt_ids for t in TEXTS]
    ns = (20, 9, 14)  # rows end at different passes, one in the middle of a replay of 8
    alone = [_alone(lm, t, n) for t, n in zip(TEXTS, ns)]
    one = _engine(lm, 1)
    assert one.step.graphs is not None and "decode graphs" in one.name
    assert _tokens(one, prompts, ns) == alone
    assert one.step.graphs.report()["buckets"], "no decode pass went through the graphs' body"
    many = _engine(lm, 8)
    assert _tokens(many, prompts, ns) == alone
    assert max(r.steps for r in many.records) == 8, "no pass took several steps in one replay"
    assert any(b[2] == 8 for b in many.step.graphs.report()["buckets"])


def test_padding_and_rows_past_their_blocks_write_only_the_scratch_block(smol):
    eng = _engine(smol, 8)
    a = eng.submit(prepare(smol, TEXTS[0], 1, chat=True).prompt_ids, 20, stop_ids=frozenset())  # the pool's first blocks
    b = eng.submit(prepare(smol, TEXTS[1], 1, chat=True).prompt_ids, 3, stop_ids=frozenset())  # 3 tokens, a replay makes 8
    eng.iterate()  # the prompts and their first tokens
    blocks, kept = list(a.request.blocks), len(a.request.prompt_ids)
    owned = set(blocks) | set(b.request.blocks)
    before = eng.kv.K[:, blocks].clone()  # a's blocks: what its prompt wrote stays as it is
    while eng.iterate() is not None:
        pass
    assert [len([e for e in h if isinstance(e, StepEvent)]) for h in (a, b)] == [20, 3]
    assert max(r.steps for r in eng.records) == 8 and eng.step.graphs.report()["buckets"][-1][0] == 2
    scratch = eng.step.graphs.scratch
    assert scratch == eng.scheduler.pool.n_blocks and scratch not in owned  # the pool's extra block, never handed out
    after = eng.kv.K[:, blocks]
    bs = eng.kv.block_size
    for p in range(kept):  # every position of a's prompt, unchanged by b's writes past its own blocks
        assert torch.equal(after[:, p // bs, :, p % bs], before[:, p // bs, :, p % bs]), p
    written = {int(x) for x in torch.nonzero(eng.kv.K.abs().sum(dim=(0, 2, 3, 4))).flatten()}
    assert written <= owned | {scratch}, written - owned
    assert scratch in written  # b's writes after its end went somewhere: there


def test_a_rows_logits_do_not_move_when_others_pad_or_share_its_bucket(smol):
    """The same decode token alone (bucket 1) and beside two others (bucket 4, one padding row): its logits within
    float32 rounding of each other (the products' kernels differ by row count here: ~3e-5 on logits of ~15; a
    padding row that leaked into a real one would move them by whole units), and within 1e-4 of the engine's torch
    step without graphs. Bit for bit on a GPU is bench/gpu_check.py's "exact" section."""
    eng = _engine(smol, 1)
    hs = [eng.submit(prepare(smol, t, 1, chat=True).prompt_ids, 4, stop_ids=frozenset()) for t in TEXTS]
    eng.iterate()
    eng.iterate()  # every prompt prefilled, a token each
    seqs = [Seq([h.request.generated[-1]], h.request.context_len - 1, list(h.request.blocks)) for h in hs]
    g = eng.step.graphs
    with torch.inference_mode():
        alone = g.forward(seqs[:1])
        together = g.forward(seqs)
        eng.step.graphs = None
        eng.step.attention = "gather"
        torch_step = eng.step.forward(seqs)
    assert together.shape[0] == 3 and alone.shape[0] == 1
    assert (g.report()["buckets"][0][0], g.report()["buckets"][-1][0]) == (1, 4)
    assert torch.allclose(alone[0], together[0], atol=1e-4, rtol=0), float((alone[0] - together[0]).abs().max())
    assert torch.allclose(together, torch_step, atol=1e-4, rtol=0), float((together - torch_step).abs().max())


def test_where_no_bucket_serves_the_pass_runs_without_graphs(smol, monkeypatch):
    monkeypatch.setattr(graphed, "MAX_GATHERED", 1)  # every pass too large for a graph
    eng = _engine(smol, 8)
    assert _tokens(eng, [prepare(smol, TEXTS[0], 1, chat=True).prompt_ids], [12]) == [_alone(smol, TEXTS[0], 12)]
    assert eng.step.graphs.report()["buckets"] == []
    assert graphed.batch_bucket(1) == 1 and graphed.batch_bucket(3) == 4 and graphed.batch_bucket(256) == 256 and graphed.batch_bucket(257) is None


def test_the_kernel_choice_names_the_graph():
    c = CHOICE.engine_pass(True, True, graphs=True)
    assert c.kernel == DECODE_GRAPH and "CUDA graph" in c.reason
    assert CHOICE.engine_pass(True, False, graphs=True).kernel != DECODE_GRAPH  # a pass with prompt chunks: eager
    assert CHOICE.multi_step(False, graphs=True) and (CHOICE.engine_pass(True, True).kernel == ROW_STEP)
