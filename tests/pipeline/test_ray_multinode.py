"""Scale-out across real nodes: a head and a worker node as separate `ray start` processes, one engine replica on
each, the worker node killed mid-stream (bench/bench_node_failure.py, in a process of its own). Every request either
finishes on the surviving replica (equal to the same request alone: a greedy request is sent again there and its
stream goes on) or ends with a clear error within seconds;
none hangs; a request sent just after the kill and one after it are served; the replica comes back when the node
does."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from benchrun import bench_json  # noqa: E402

pytestmark = pytest.mark.cluster
pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]


def test_a_node_killed_mid_stream():
    out = bench_json("bench_node_failure.py", "--requests", "6", "--tokens", "200")
    assert out["hung"] == 0, out
    for res in out["results"]:
        assert res["end"] in ("finished", "error"), res
        if res["end"] == "finished":
            assert res["equal_alone"] and res["tokens"] == 200, res
        else:
            assert "replica stopped" in res["message"] and "Press the button again" in res["message"], res
            assert res["prefix_equal_alone"] and res["s_after_kill"] < 30, res
    assert out["finished"] >= 1, out  # the surviving node's replica kept answering
    assert out["finished"] == 6 and out["resent"] >= 1, out  # greedy requests on the dead node went on, on the other
    assert out["sent_after_kill"]["end"] == "finished" and out["sent_after_kill"]["equal_alone"], out
    assert out["new_request"]["equal_alone"], out
    assert len(out["replica_pids_after"]) == 2 and out["after_return_equal_alone"], out
