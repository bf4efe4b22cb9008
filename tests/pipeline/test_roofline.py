import pytest

from pipeline.generation import Phase
from pipeline.lab.roofline import layer_ops, roofline

pytestmark = pytest.mark.model


def test_q_projection_counted_by_hand(smol):
    ops = {o.op: o for o in layer_ops(smol, tokens=10, context=10)}
    q = ops["q projection"]
    # 10 tokens x (576 -> 9 heads x 64): 2 FLOPs per multiply-add; fp32 weights + input + output
    assert q.flops == 2 * 10 * 576 * 576
    assert q.bytes == (576 * 576 + 10 * 576 + 10 * 576) * 4
    k = ops["k projection"]
    assert k.flops == 2 * 10 * 576 * 192  # 3 KV heads x 64
    dec = {o.op: o for o in layer_ops(smol, tokens=1, context=100)}
    assert dec["scores Q·Kᵀ"].flops == 2 * 9 * 1 * 100 * 64


def test_roofline_measures_peaks_and_times(smol):
    r = roofline(smol, prompt_tokens=32, context=32)
    assert r.peak_flops > 0 and r.bandwidth > 0 and r.ridge > 0
    assert r.ridge == pytest.approx(r.peak_flops / r.bandwidth)
    assert list(r.phases) == [Phase.PREFILL, Phase.DECODE]
    for phase in Phase:
        for o in r.phases[phase].ops:
            assert o.measured_s > 0
            assert o.bound_s == pytest.approx(max(o.flops / r.peak_flops, o.bytes / r.bandwidth))  # the roof, from the counts
            assert o.bound_by == ("compute" if o.flops / r.peak_flops > o.bytes / r.bandwidth else "memory")
            assert o.intensity == pytest.approx(o.flops / o.bytes)
    dec = {o.op: o for o in r.phases[Phase.DECODE].ops}
    pre = {o.op: o for o in r.phases[Phase.PREFILL].ops}
    assert dec["q projection"].intensity < pre["q projection"].intensity  # decode: little work per byte
    # every decode step reads all weights (fp32) and the KV cache at 32 tokens (46,080 B per token) once
    assert r.weight_bytes == smol.facts.n_params * 4 and r.kv_bytes == 46_080 * 32
    assert r.decode_ceiling_tokens_per_s == pytest.approx(r.bandwidth / (r.weight_bytes + r.kv_bytes))
