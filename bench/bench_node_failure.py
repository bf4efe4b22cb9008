"""A node of a real multi-node Ray cluster goes away mid-answer (the case a hosted demo on two machines meets).

On this machine: a head node and a worker node as separate `ray start` processes, each with its own resources
(1 CPU and one `engine_slot`, so Serve must place one engine replica on each), the embedded model deployed with 2
replicas. N greedy requests of M tokens stream at once; once each has streamed --kill-at tokens the worker node's processes are killed (SIGKILL to its
process group: its raylet, object store and the replica); then a new request is sent; then the node is started
again and we wait for Serve to bring the second replica back.

Recorded: per request, finished (and equal to the same request generated alone: a greedy request whose replica
died is sent again to the surviving one, which repeats the same tokens, and the visitor's stream goes on) or ended
with EngineError, and seconds from the kill to its end; the new request's tokens and time; seconds until the replica runs again.
None may hang (every request ends within `--deadline` s of the kill).

    .venv/bin/python bench/bench_node_failure.py [--requests 6] [--tokens 300] [--out node_failure]
tests/pipeline/test_ray_multinode.py runs it (cluster tier) and asserts on its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


CURRENT = Path("/tmp/ray/ray_current_cluster")  # where `ray start --head` names the machine's current cluster


def node(port: int, head: bool) -> subprocess.Popen:
    """One Ray node as its own process group (`ray start --block`): killing the group takes the node down."""
    args = [str(BIN / "ray"), "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", '--resources={"engine_slot": 1}', "--disable-usage-stats"]
    args += [f"--port={port}", "--head", "--include-dashboard=false"] if head else [f"--address=127.0.0.1:{port}"]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_for(what, test, timeout: float, every: float = 0.5):
    t = time.time()
    while time.time() - t < timeout:
        got = test()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--kill-at", type=int, default=20, help="the node is killed once every request has streamed this many tokens")
    ap.add_argument("--deadline", type=float, default=60.0, help="every request must end within this many seconds of the kill")
    ap.add_argument("--out", default="node_failure")
    ap.add_argument("--json", action="store_true", help="print the result as JSON (no file)")
    a = ap.parse_args(argv)

    import pipeline

    # this cluster is its own, on 127.0.0.1, for the length of the run: no token. (A local ray.init elsewhere on the
    # machine, the cluster tier's Serve test, leaves ~/.ray/auth_token behind; with it Ray turns token
    # authentication on, and `ray status` against a head started without one never answers: the test then failed
    # on any machine where that tier had run before.)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    port, t0 = free_port(), time.time()
    head = node(port, head=True)
    worker = node(port, head=False)
    out: dict = {"nodes": 2, "replicas": 2, "requests": a.requests, "tokens": a.tokens}
    try:
        import ray
        from ray import serve

        wait_for(
            "the head node", lambda: subprocess.run([str(BIN / "ray"), "status", f"--address=127.0.0.1:{port}"], capture_output=True).returncode == 0, 120, 1
        )
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, configure_logging=False)
        wait_for("two nodes", lambda: len([n for n in ray.nodes() if n["Alive"]]) >= 2, 120)
        out["cluster_up_s"] = round(time.time() - t0, 1)

        from pipeline.engine import EngineError, ray_serve

        key = pipeline.EMBEDDED
        ray_serve._connected = f"127.0.0.1:{port}"
        serve.start(proxy_location="Disabled")
        dep = ray_serve.deployment(2, cpus_per_replica=0.5, slot="engine_slot")  # one replica on each node
        t = time.time()
        serve.run(dep.bind(key), name=ray_serve.app_name(key), route_prefix=None)
        out["deploy_s"] = round(time.time() - t, 1)
        eng = ray_serve.RemoteEngine(key, ray_serve._connected)
        pids = {eng._h.pid_of.remote().result(timeout_s=30) for _ in range(16)}
        out["replica_pids_before"] = sorted(pids)

        lm = pipeline.load_model(key)
        prompt_ids = pipeline.generation.prepare(lm, "Why is the sky blue?", a.tokens, chat=True).prompt_ids
        alone = [e.token_id for e in pipeline.generate(lm, "Why is the sky blue?", a.tokens, chat=True, cache="dynamic", stop_ids=set())]
        results: dict[int, dict] = {}
        streamed: dict[int, int] = {}

        def one(i: int) -> None:
            got = []
            try:
                h = eng.submit(prompt_ids, a.tokens, pipeline.GREEDY, stop_ids=[])
                for ev in h:
                    got.append(ev.token_id)
                    streamed[i] = len(got)
                results[i] = {"end": "finished", "tokens": len(got), "equal_alone": got == alone, "at": time.time(), "resent": h.retried}
            except EngineError as e:
                results[i] = {"end": "error", "tokens": len(got), "message": str(e), "prefix_equal_alone": got == alone[: len(got)], "at": time.time()}
            except Exception as e:  # noqa: BLE001 - anything else is a finding
                results[i] = {"end": "unexpected", "tokens": len(got), "message": f"{type(e).__name__}: {e}"[:300], "at": time.time()}

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(a.requests)]
        for th in threads:
            th.start()
        # mid-stream whatever the machine's speed (a fixed 8 s let every request finish first once decode got faster)
        wait_for(f"every request {a.kill_at} tokens in", lambda: all(streamed.get(i, 0) >= a.kill_at for i in range(a.requests)), 120, 0.05)
        out["tokens_at_kill"] = sorted(streamed.get(i, 0) for i in range(a.requests))
        t_kill = time.time()
        kill(worker)
        time.sleep(1.0)  # a visitor who presses Generate just after the node went: served by the surviving replica
        extra = threading.Thread(target=one, args=(a.requests,), daemon=True)
        extra.start()
        threads.append(extra)
        for th in threads:
            th.join(max(0.0, a.deadline - (time.time() - t_kill)))
        out["hung"] = sum(th.is_alive() for th in threads)
        for r in results.values():
            r["s_after_kill"] = round(r.pop("at") - t_kill, 1)
        out["results"] = [results.get(i, {"end": "hung"}) for i in range(a.requests)]
        out["sent_after_kill"] = results.get(a.requests, {"end": "hung"})
        out["finished"] = sum(r["end"] == "finished" for r in out["results"])
        out["errors"] = sum(r["end"] == "error" for r in out["results"])
        out["resent"] = sum(bool(r.get("resent")) for r in out["results"])

        t = time.time()
        new = [ev.token_id for ev in eng.submit(prompt_ids, 8, pipeline.GREEDY)]
        out["new_request"] = {"s": round(time.time() - t, 1), "equal_alone": new == alone[:8], "s_after_kill": round(time.time() - t_kill, 1)}

        worker = node(port, head=False)
        t = time.time()
        app = ray_serve.app_name(key)

        def running():
            reps = serve.status().applications[app].deployments["Engine"].replica_states
            return reps.get("RUNNING", 0) >= 2

        wait_for("the replica back on the restarted node", running, 300, 2)
        out["replica_back_s"] = round(time.time() - t, 1)
        pids = {eng._h.pid_of.remote().result(timeout_s=30) for _ in range(16)}
        out["replica_pids_after"] = sorted(pids)
        again = [ev.token_id for ev in eng.submit(prompt_ids, 8, pipeline.GREEDY)]
        out["after_return_equal_alone"] = again == alone[:8]
        serve.shutdown()
        ray.shutdown()
    finally:
        kill(worker)
        kill(head)
        # the killed head stays named as the machine's current cluster, and a later `ray.init()` without an address
        # (a local Ray: the cluster tier's next test) would try to join it and hang
        try:
            if CURRENT.read_text().strip().endswith(f":{port}"):
                CURRENT.unlink()
        except OSError:
            pass
    out["env"] = {"when": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count()}
    text = json.dumps(out, indent=1)
    if a.json:
        print(json.dumps(out))
    else:
        (ROOT / "bench" / "results" / f"{a.out}.json").write_text(text)
        print(text)
    return out


if __name__ == "__main__":
    main()
