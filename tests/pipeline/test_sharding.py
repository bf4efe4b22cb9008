import json

import pytest

from pipeline.generation import generate
from pipeline.lab.sharding import pipeline_plan, sse_lines, tensor_parallel_plan

pytestmark = pytest.mark.model


def test_pipeline_plan_covers_every_layer_and_weight(smol):
    for n in (1, 2, 3, 4, 8):
        plan = pipeline_plan(smol, n)
        assert len(plan) == n and sum(r.n_layers for r in plan) == 30
        total = sum(r.weights_mb for r in plan) * 2**20 / 4  # fp32
        assert abs(total - smol.facts.n_params) < 1
        assert "embeddings" in plan[0].also and "LM head" in plan[-1].also
        if n in (2, 3):  # balanced: no other contiguous split has a lighter heaviest device
            import itertools

            layer_mb = plan[-1].weights_mb / plan[-1].n_layers  # SmolLM2's layers are all alike
            first = plan[0].weights_mb - plan[0].n_layers * layer_mb
            best = min(
                max(first + a * layer_mb, *[c * layer_mb for c in rest])
                for cuts in itertools.combinations(range(31), n - 1)
                for a, *rest in [[b - a for a, b in zip((0,) + cuts, cuts + (30,))]]
                if all(c >= 0 for c in rest) and list(cuts) == sorted(cuts)
            )
            assert max(r.weights_mb for r in plan) <= best + 0.1


@pytest.mark.unit
def test_balanced_split_by_hand():
    from pipeline.lab.sharding import _balanced_split

    assert _balanced_split([1] * 6, 0, 0, 3) == [2, 2, 2]
    assert _balanced_split([1] * 6, 3, 0, 2) == [1, 5]  # 3 + 1 vs 5: the first device is heavy already
    assert _balanced_split([1] * 4, 0, 0, 1) == [4]


def test_tensor_parallel_plan_by_hand(smol):
    tp = tensor_parallel_plan(smol, 3)
    assert tp.allreduce_bytes_per_token == 2 * 30 * 576 * 4
    assert tp.ring_bytes_sent_per_device_per_token == 2 * 30 * 576 * 4 * 2 * 2 / 3
    assert tp.kv_cache_bytes_per_token_per_device == 2 * 30 * 1 * 64 * 4  # 3 KV heads / 3 devices
    assert not tp.issues
    tp4 = tensor_parallel_plan(smol, 4)
    assert any("9 query heads" in i for i in tp4.issues) and any("KV heads" in i for i in tp4.issues)
    assert tensor_parallel_plan(smol, 1).allreduce_bytes_per_token == 0  # one device: nothing to all-reduce
    tp2 = tensor_parallel_plan(smol, 2)  # 3 KV heads on 2 devices: the busiest holds 2
    assert tp2.kv_cache_bytes_per_token_per_device == 2 * 30 * 2 * 64 * 4
    assert "5 on 1 device, 4 on 1" in tp2.rows[0]["per device"]
    from pipeline.lab.sharding import even_device_counts

    assert even_device_counts(smol) == [3]


def test_sse_stream_is_one_message_per_token(smol):
    ev = list(generate(smol, "Hi", 5))
    lines = sse_lines(ev)
    assert len(lines) == len(ev) + 1 and lines[-1].endswith("[DONE]\n\n")
    first = json.loads(lines[0].split("data: ", 1)[1])
    assert first["phase"] == "prefill" and first["token"] == ev[0].token_id
