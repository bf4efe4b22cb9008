"""Several decode steps in one pass (EngineConfig.decode_steps, cpu_decode.c's row_steps): every token, probability
and event the same as with a pass a token, and the call stops where it must (a stop token, the length, a newcomer or
a cancel arriving), never past a row's KV blocks."""

import ctypes

import pytest

from pipeline.decode_step.choice import CHOICE
from pipeline.engine import Engine
from pipeline.engine.blocks import BlockPool
from pipeline.engine.paged import Seq
from pipeline.engine.request import PassOutput, Request
from pipeline.engine.scheduler import Scheduler
from pipeline.forward.sampling import Sampling
from pipeline.generation import generate, prepare
from pipeline.generation.events import StepEvent

pytestmark = pytest.mark.model

TEXTS = ("Why is the sky blue?", "The capital of France is", "Dog bites man.")


def _engine(lm, steps: int) -> Engine:
    return Engine(lm, kv_pool_bytes=32 << 20, background=False, prefix_cache=False, decode_steps=steps)


def _events(eng: Engine, prompts, n: int) -> list[list[tuple]]:
    hs = [eng.submit(p, n, stop_ids=None) for p in prompts]
    while eng.iterate() is not None:
        pass
    return [[(e.index, e.token_id, e.text, e.top_raw, e.p_raw, e.context_len, e.finished) for e in h if isinstance(e, StepEvent)] for h in hs]


def test_several_steps_a_pass_give_every_event_of_a_pass_a_token(lm):
    prompts = [prepare(lm, t, 1, chat=True).prompt_ids for t in TEXTS]
    one = _events(_engine(lm, 1), prompts, 24)
    eng = _engine(lm, 8)
    many = _events(eng, prompts, 24)
    # the same tokens, texts and probabilities (each step's log-sum-exp and top values bit for bit)
    assert many == one
    alone = [e.token_id for e in generate(lm, "", request=prepare(lm, TEXTS[1], 24, chat=True), cache="dynamic") if isinstance(e, StepEvent)]
    assert [t[1] for t in many[1]] == alone  # and the tokens of our own loop, the request alone
    if CHOICE.c_kernels() and eng.step.row is not None and eng.step.row.stack() is not None:
        assert max(r.steps for r in eng.records) == 8, "no pass took several steps"
        assert sum(r.steps for r in eng.records if r.decode) < 24 * 3
    else:  # a model the one call does not cover: a pass a token, as before
        assert all(r.steps == 1 for r in eng.records)


def _after_prefill(smol, n: int = 30):
    eng = _engine(smol, 1)
    h = eng.submit(prepare(smol, TEXTS[0], 1, chat=True).prompt_ids, n, stop_ids=frozenset())
    eng.iterate()  # the prompt, and its first token
    r = h.request
    return eng, r, Seq([r.generated[-1]], r.context_len - 1, list(r.blocks))


def test_the_call_stops_at_a_stop_token_the_length_and_news(smol):
    if not CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine")
    eng, r, seq = _after_prefill(smol)
    run = lambda stops=frozenset(), left=8, news=0: eng.step.decode_steps([seq], [stops], [left], ctypes.c_int(news), 8, 5)  # noqa: E731
    free = run()
    assert free.n == 8 and free.argmax.shape == (8, 1) and free.vals.shape == (8, 1, 5)
    tokens = free.argmax[:, 0].tolist()
    # the same K/V are written again at the same positions: the same tokens
    assert run().argmax[:, 0].tolist() == tokens
    assert run(left=3).n == 3
    assert run(news=1).n == 1  # a request arrived or was cancelled: the step under way is the last
    stop = tokens[4]
    assert run(stops=frozenset({stop})).n == tokens.index(stop) + 1
    # each step's summary is its logits': the top value is the argmax's, largest first
    assert (free.ids[:, 0, 0] == free.argmax[:, 0]).all() and (free.vals[:, 0, :-1] >= free.vals[:, 0, 1:]).all()


def test_the_call_never_passes_a_rows_blocks(smol):
    if not CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine")
    eng, r, seq = _after_prefill(smol)
    bs = eng.kv.block_size
    short = Seq(seq.tokens, seq.start, seq.table[: seq.start // bs + 1])  # room up to the end of its current block
    room = len(short.table) * bs - seq.start
    with pytest.raises(ValueError, match="KV blocks"):
        eng.step.decode_steps([short], [frozenset()], [room + 1], ctypes.c_int(0), room + 1, 5)
    assert eng.step.decode_steps([short], [frozenset()], [room], ctypes.c_int(0), room + 1, 5).n == room


def test_the_scheduler_allows_several_steps_only_to_greedy_decode_rows_with_nobody_waiting():
    s = Scheduler(BlockPool(64, 8), decode_steps=8)
    a = Request([1, 2, 3], 4)
    s.submit(a)
    assert s.news.value == 1  # a newcomer: a pass of several steps under way stops after its step
    p = s.plan()
    assert p.prefill and p.steps == 1 and s.news.value == 0
    s.update(p, PassOutput({a.id: 3}, {a.id: 7}, 0.0))
    assert s.plan().steps == 8  # decode rows only, greedy, nobody waiting
    b = Request([4, 5], 4, Sampling(temperature=0.7, seed=1))
    s.submit(b)
    p = s.plan()
    assert p.prefill and p.steps == 1  # b's prompt in the pass
    s.update(p, PassOutput({b.id: 2}, {b.id: 9}, 0.0))
    assert s.plan().steps == 1  # b samples: a token a pass
    s.cancel(b)
    assert s.news.value == 1  # a cancel stops a pass of several steps too
    assert s.plan().steps == 8  # b retired: a alone again
