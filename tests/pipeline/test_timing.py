"""Claims only where the repeats hold them, and what else ran: the verdicts pages 7, 9, 11, 12 print, fed repeats
that agree and repeats that contradict; the activity record that flags an inflated time. No model."""

import threading

import pytest

from pipeline.common.timing import Activity, Busy, Ratios, Samples, interleaved
from pipeline.generation import CacheModeComparison, CacheRow, ModeRun, Runner, SweepRow, cache_verdict, growth, sweep_verdict
from pipeline.lab.attention_kernels import KernelRun, sweep_doubts
from pipeline.lab.hardware import DecodeProfile, OpShare

pytestmark = pytest.mark.unit

S = lambda *v: Samples(tuple(v))  # noqa: E731


def test_samples_median_range_and_above():
    s = S(3.0, 1.0, 2.0)
    assert (s.median, s.lo, s.hi) == (2.0, 1.0, 3.0) and s.fmt() == "2,000 ms (1,000–3,000)"
    assert S(5, 6).above(S(1, 4)) and not S(5, 6).above(S(1, 5.5)) and not S(5).above(S(1))  # one repeat proves nothing
    assert growth(S(1, 2), S(4, 4)).values == (4.0, 2.0)


def test_interleaved_rotates_the_order_every_repeat():
    order = []
    got = interleaved({k: (lambda k=k: order.append(k) or 1.0) for k in "abc"}, 3)
    assert order == list("abcbcacab") and all(len(s.values) == 3 for s in got.values())


def test_page_7_claims_the_textbook_picture_only_when_every_repeat_shows_it():
    flat = [SweepRow(16, S(0.05, 0.05, 0.06), S(0.03, 0.03, 0.03)), SweepRow(1024, S(1.0, 1.1, 1.2), S(0.033, 0.036, 0.04))]
    v = sweep_verdict(flat)
    assert v.claim and "mostly pays for reading the weights" in v.claim and v.doubt is None
    # issue 19: a decode step that "grew" 18x in one repeat and 1.1x in the others is noise, not a finding
    noisy = [SweepRow(16, S(0.05, 0.05, 0.05), S(0.03, 0.03, 0.03)), SweepRow(1024, S(1.0, 1.0, 1.0), S(0.54, 0.033, 0.035))]
    v = sweep_verdict(noisy)
    assert v.claim is None and "too noisy" in v.doubt and "reading the weights" not in v.doubt
    grown = [SweepRow(16, S(0.05, 0.05, 0.05), S(0.03, 0.03, 0.03)), SweepRow(4096, S(9.0, 9.5, 9.2), S(0.09, 0.1, 0.11))]
    assert "grows too" in sweep_verdict(grown).claim  # a consistent growth is a finding of its own
    assert sweep_verdict([SweepRow(16, S(0.05), S(0.03)), SweepRow(1024, S(1.0), S(0.03))]).claim is None  # one repeat


def test_page_7_cache_claim_needs_growth_in_every_repeat():
    rows = [CacheRow(16, S(0.03, 0.03, 0.03), S(0.04, 0.05, 0.04), True), CacheRow(512, S(0.035, 0.04, 0.033), S(0.6, 0.7, 0.65), True)]
    assert "grows with it" in cache_verdict(rows).claim
    rows[1] = CacheRow(512, S(0.035, 0.04, 0.033), S(0.6, 0.05, 0.65), True)  # one repeat without any growth
    assert cache_verdict(rows).claim is None and "too noisy" in cache_verdict(rows).doubt


def _modes(dyn, fused):
    ev = []
    mk = lambda runs: ModeRun(ev, Samples(tuple(runs)).median, list(runs), 0.0, None, "CPU %", Runner.TRANSFORMERS)  # noqa: E731
    return CacheModeComparison({"dynamic": mk(dyn), "fused": mk(fused)}, [1])


def test_page_12_headline_only_when_the_ratio_and_the_rates_agree():
    assert _modes([10, 10, 10, 10, 10], [12, 12.5, 12, 13, 12]).headline("fused").startswith("1.2")
    # issue 19: a headline of 1.39x while the mode's own median rate was below the dynamic loop's
    assert _modes([2.3, 1.0, 2.3, 2.4, 2.3], [2.0, 2.9, 2.0, 3.4, 1.9]).headline("fused") is None
    assert _modes([10, 10, 10], [10.2, 9.9, 10.1]).headline("fused") is None  # a tie


def test_page_11_doubts_a_longer_prompt_measured_faster():
    rows = [KernelRun("eager", 128, 15.0, None, 0, None, runs=S(14.0, 15.0, 16.0)), KernelRun("eager", 512, 3.4, None, 0, None, runs=S(3.3, 3.4, 3.5))]
    assert any("512 tokens measured faster than 128" in d for d in sweep_doubts(rows))
    ok = [KernelRun("eager", 128, 0.2, None, 0, None, runs=S(0.2, 0.21, 0.22)), KernelRun("eager", 512, 1.0, None, 0, None, runs=S(1.0, 1.1, 1.2))]
    assert sweep_doubts(ok) == []


def test_page_9_shares_that_disagree_are_noise():
    top = [OpShare("aten::_scaled_dot_product_flash_attention_for_cpu", 1, 1, 0.62, True, 0.05, 0.62)]
    p = DecodeProfile("CPU", 1, 1, 1, 0.7, top, S(0.7, 0.3, 0.72), S(0.03, 0.03, 0.03))
    assert p.noisy and "disagree" in p.noisy
    calm = DecodeProfile("CPU", 1, 1, 1, 0.7, [OpShare("aten::mm", 1, 1, 0.6, True, 0.58, 0.63)], S(0.7, 0.68, 0.72), S(0.03, 0.03, 0.03))
    assert calm.noisy is None


def test_activity_says_what_else_ran_and_never_counts_itself():
    now = [0.0]
    act = Activity(clock=lambda: now[0])
    engine = act.start("generation", 3)  # an engine step serving 3 requests
    with act.doing("trace") as tr:
        now[0] = 1.0
    act.end(engine)
    assert tr.busy == Busy((("generation", 3),)) and "3 other generations ran" in str(tr.busy) and "inflated" in str(tr.busy)
    now[0] = 5.0
    with act.doing("trace") as alone:
        now[0] = 6.0
    assert not alone.busy and "Nothing else ran" in str(alone.busy)
    assert act.during(0.5, 0.6).less_one("generation") == Busy((("generation", 2), ("trace", 1)))


def test_activity_finds_work_that_overlapped_among_many_later_entries():
    now = [0.0]
    act = Activity(keep=4096, clock=lambda: now[0])
    long = act.start("trace")  # ran from 0 to 50.5
    for i in range(1000):  # then 1,000 short engine steps, 0.1 s each, from 10 to 110
        tok = act.start("generation", 2) if i else None
        now[0] = 10 + i * 0.1
        if i == 405:
            act.end(long)
        if tok is not None:
            act.end(tok)
    assert act.during(50.0, 50.2) == Busy((("generation", 2), ("trace", 1)))
    assert act.during(5.0, 6.0) == Busy((("trace", 1),))  # ended 400 entries before the newest: still found
    assert act.during(60.0, 60.05) == Busy((("generation", 2),))
    assert act.during(200.0, 201.0) == Busy()


def test_five_of_five_slower_is_a_slowdown_not_a_tie():
    """Page 13 called 0.84x with all 5 repeats slower "too noisy to tell: a tie"."""
    slower = Ratios((0.7, 0.84, 0.9, 0.8, 0.95))
    assert not slower.noisy and "tie" not in str(slower)
    assert Ratios((0.9, 1.05, 0.95)).noisy and Ratios((1.2, 1.3)).noisy  # both sides of 1x; too few repeats


def test_a_jobs_own_parts_are_not_something_else_that_ran():
    """Page 15's scene drives its own engine in its thread: the four users' steps are the scene, not other work;
    a step of another thread (the shared engine) still is."""
    now = [0.0]
    act = Activity(clock=lambda: now[0])
    with act.doing("experiment") as scene:
        for _ in range(3):
            with act.doing("generation", 4) as step:  # the scene's own engine step serving its 4 users
                now[0] += 1.0
            assert not step.busy
    assert not scene.busy and "Nothing else ran" in str(scene.busy)
    box = {}

    def other_thread():
        box["token"] = act.start("generation", 2)  # the shared engine's worker

    with act.doing("experiment") as scene:
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        now[0] += 1.0
        act.end(box["token"])
    assert scene.busy == Busy((("generation", 2),))


def test_activity_is_thread_safe():
    act = Activity()

    def work():
        for _ in range(500):
            with act.doing("trace"):
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not act._active


@pytest.mark.parametrize("n,word", [(1, "generation ran"), (2, "generations ran")])
def test_busy_reads_in_the_singular_and_plural(n, word):
    assert f"{n} other {word}" in str(Busy((("generation", n),)))
