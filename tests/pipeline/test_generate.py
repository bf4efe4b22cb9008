import threading

import numpy as np
import pytest
import torch

import pipeline
from pipeline.forward.sampling import Sampling
from pipeline.forward.tracing import TraceError
from pipeline.generation import MAX_NEW_TOKENS, Finish, Phase, Runner, generate, kv_bytes_formula, metrics, prefill_decode_sweep, prepare

pytestmark = pytest.mark.model


def test_greedy_equals_transformers_generate(lm):
    prompt = "The capital of France is"
    ev = list(generate(lm, prompt, 20))
    ids = torch.tensor([pipeline.tokenize(lm.tokenizer, prompt).input_ids])
    with lm.lock, torch.inference_mode():
        ref = lm.model.generate(ids, max_new_tokens=20, do_sample=False)[0, ids.shape[1] :].tolist()
    mine = [e.token_id for e in ev]
    assert mine == ref[: len(mine)]
    assert len(mine) == len(ref) or ev[-1].finished is Finish.EOS


def test_cache_off_gives_the_same_tokens(smol):
    a = [e.token_id for e in generate(smol, "Why is the sky blue?", 12, chat=True)]
    b = [e.token_id for e in generate(smol, "Why is the sky blue?", 12, chat=True, use_cache=False)]
    assert a == b


def test_seeded_sampling_is_reproducible(smol):
    kw = dict(temperature=1.0, top_k=50, top_p=0.95, seed=7)
    a = [e.token_id for e in generate(smol, "Once upon a time", 15, Sampling(**kw))]
    b = [e.token_id for e in generate(smol, "Once upon a time", 15, Sampling(**kw))]
    c = [e.token_id for e in generate(smol, "Once upon a time", 15, Sampling(**{**kw, "seed": 8}))]
    assert a == b and a != c


def test_events_are_well_formed_and_kv_bytes_match_the_formula(lm):
    ev = list(generate(lm, "Dog bites man because", 10, Sampling(temperature=0.7, top_k=5, seed=1)))
    assert ev[0].phase is Phase.PREFILL and all(e.phase is Phase.DECODE for e in ev[1:])
    assert [e.index for e in ev] == list(range(len(ev)))
    ts = [e.t_s for e in ev]
    assert ts == sorted(ts) and all(e.step_s > 0 for e in ev)
    assert ev[-1].finished in (Finish.EOS, Finish.LENGTH) and all(e.finished is None for e in ev[:-1])
    n_prompt = len(pipeline.tokenize(lm.tokenizer, "Dog bites man because").input_ids)
    for e in ev:
        assert e.context_len == n_prompt + e.index
        # after step i the cache holds the context the step attended over
        assert e.kv_bytes == kv_bytes_formula(lm, e.context_len), (e.index, e.kv_bytes)
        assert len(e.kv_bytes_per_layer) == lm.facts.n_layers
        # top-k 5 leaves 5 candidates, all reported: their probabilities after the filters sum to 1
        assert 1 <= len(e.top) <= 5 and abs(sum(p for _, _, p in e.top) - 1) < 1e-4
        assert e.token_id in [i for i, _, p in e.top if p > 0] and e.p == pytest.approx(dict((i, p) for i, _, p in e.top)[e.token_id])
        assert e.top[0][2] >= e.top[-1][2]
    m = metrics(ev)
    assert m.ttft_s == ev[0].t_s and len(m.itl_s) == len(ev) - 1
    assert m.tpot_s == pytest.approx((ev[-1].t_s - ev[0].t_s) / (len(ev) - 1))
    # TTFT and the prefill bar agree (a fresh server's first TTFT once stood at 1,566 ms beside an 820 ms bar)
    assert m.prefill_s == pytest.approx(min(ev[0].step_s, ev[0].t_s)) and m.before_s + m.prefill_s == pytest.approx(m.ttft_s)
    from components.generation import step_times_figure

    fig = step_times_figure(ev)
    first_bar = sum(tr.y[list(tr.x).index(0)] for tr in fig.data if 0 in tr.x)
    assert first_bar == pytest.approx(m.ttft_s * 1000, abs=0.5)
    assert f"{m.ttft_s * 1000:,.0f} ms = " in m.ttft_parts()


def test_smollm_kv_bytes_per_token(smol):
    assert kv_bytes_formula(smol, 1) == 2 * 30 * 3 * 64 * 4 == 46_080  # fp32


def test_bad_generation_requests(smol):
    assert prepare(smol, "Hi", 0).max_new_tokens == 1
    r = prepare(smol, "Hi", 10**9)
    assert r.max_new_tokens == MAX_NEW_TOKENS and "capped" in r.notes[0]
    with pytest.raises(TraceError, match="empty"):
        prepare(smol, "  ", 5)
    with pytest.raises(TraceError, match="context window"):
        prepare(smol, "word " * 8300, 5)
    near = prepare(smol, "word " * 8180, 100)
    assert near.max_new_tokens == smol.facts.max_positions - len(near.prompt_ids)
    one = list(generate(smol, "Hi", 5, Sampling(temperature=1.0, top_p=0.0, seed=3)))  # top-p 0 keeps only the top token
    greedy = list(generate(smol, "Hi", 5))
    assert [e.token_id for e in one] == [e.token_id for e in greedy]


def test_stopping_midway_leaves_no_thread(smol):
    before = threading.active_count()
    g = generate(smol, "Count to one hundred: 1, 2, 3,", 200)
    got = [next(g) for _ in range(3)]
    g.close()
    assert len(got) == 3 and threading.active_count() == before
    assert smol.lock.acquire(timeout=1)  # the lock is free again
    smol.lock.release()


def test_sweep_prefills_the_whole_prompt_then_decodes_one_token_per_step(smol):
    """What the sweep times is what it says: a prefill feeds all T tokens in one forward, each decode step
    feeds ONE token over a cache that already holds T (counted by a hook on the embedding, not by a clock)."""
    fed = []
    h = smol.arch.decoder.embed_tokens.register_forward_pre_hook(lambda m, a: fed.append(a[0].shape[1]))
    try:
        rows = prefill_decode_sweep(smol, [8, 64], decode_steps=2, repeats=1)
    finally:
        h.remove()
    assert [r.tokens for r in rows] == [8, 64]
    # warm-up (8) then per length: [T, 1, 1] (prefill, two decode steps)
    assert fed == [8, 1, 1, 8, 1, 1, 64, 1, 1]
    assert all(r.prefill_s > 0 and r.decode_step_s > 0 for r in rows)
    assert rows[1].prefill_per_token_s == rows[1].prefill_s / 64


def test_traces_stay_correct_while_a_generation_runs(smol):
    """Another tab generating must not disturb a trace (hooks are registered and removed under the lock,
    and generation takes the lock one step at a time)."""
    solo = pipeline.trace(smol, "The capital of France is")
    done = threading.Event()
    out = []

    def gen():
        out.extend(generate(smol, "Count slowly: one, two, three,", 40))
        done.set()

    th = threading.Thread(target=gen)
    th.start()
    traces = [pipeline.trace(smol, "The capital of France is") for _ in range(3)]
    th.join()
    assert done.is_set() and len(out) > 3
    for tr in traces:
        assert np.array_equal(tr.next_logits, solo.next_logits)
        assert np.array_equal(tr.acts["blocks.*.hook_resid_pre"], solo.acts["blocks.*.hook_resid_pre"])


def test_kv_formula_counts_sliding_window_layers(lm):
    from pipeline.generation import kv_window

    n_sliding, keep = kv_window(lm)
    prompt = "word " * ((keep or 100) + 40)
    ev = list(generate(lm, prompt, 2))
    for e in ev:
        assert e.kv_bytes == kv_bytes_formula(lm, e.context_len)
    if n_sliding:  # Gemma: local layers stop growing at the window
        assert min(ev[-1].kv_bytes_per_layer) < max(ev[-1].kv_bytes_per_layer)


def test_static_cache_gives_the_same_greedy_tokens(lm):
    from pipeline.generation import compare_cache_modes

    res = compare_cache_modes(lm, "The capital of France is", 12, reps=1)
    assert res.modes["dynamic"].token_ids == res.modes["static"].token_ids and res.same_tokens("static")
    static = res.modes["static"].events
    assert static[0].kv_reserved_bytes == static[-1].kv_reserved_bytes > static[-1].kv_bytes  # preallocated, set aside whole
    assert [e.kv_bytes for e in static] == [e.kv_bytes for e in res.modes["dynamic"].events]  # one meaning on every path


@pytest.mark.unit
def test_mode_ratios_pair_runs_of_the_same_repeat_and_flag_noise():
    from pipeline.generation import CacheModeComparison, ModeRun

    def run(rates):
        return ModeRun(events=[], tokens_per_s=None, runs=rates, warmup_s=0.0, utilisation=None, utilisation_of="", engine=Runner.TRANSFORMERS)

    res = CacheModeComparison({"dynamic": run([10, 20, 10, 20, 10]), "fused": run([15, 30, 15, 30, 15]), "static": run([9, 22, 11, 19, 10])}, [])
    assert res.ratios("fused").values == (1.5,) * 5 and res.ratio("fused") == 1.5 and res.ratios("fused").spread == (1.5, 1.5)
    assert not res.ratios("fused").noisy and str(res.ratios("fused")) == "1.50× (1.50–1.50)"  # the machine drifted 2x; the ratio did not
    assert res.ratios("static").noisy and str(res.ratios("static")).endswith("noisy: a tie")  # 0.9 .. 1.1 around 1.0
    assert CacheModeComparison({"dynamic": run([10]), "fused": run([20])}, []).ratios("fused").noisy  # one repeat cannot tell


def test_page_12s_table_names_the_reference_instead_of_nan(lm):
    """The dynamic cache's own ratio column said "nan" on page 12: it is the reference, and the table says so."""
    from components.generation import cache_modes_table
    from pipeline.generation import compare_cache_modes

    table = cache_modes_table(compare_cache_modes(lm, "The capital of France is", 4, reps=1), "CPU %")
    col = table["× dynamic (median, range)"]
    assert col.notna().all() and not col.astype(str).str.contains("nan|None").any()
    assert col.iloc[0] == "1 (the reference)"
