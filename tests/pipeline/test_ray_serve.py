"""The engine on Ray Serve (a local Ray, 2 replicas of the embedded model): the same events as in-process, every
answer equal to the same request alone, cancellation frees the replica's slot, a killed replica ends its requests
with a clear message and Serve brings it back."""

import os
import signal
import threading
import time

import pytest

pytestmark = pytest.mark.cluster  # its own pytest process (make test-cluster): Serve's sync handle calls refuse a thread
# with a running asyncio loop, which the browser tests' Playwright leaves in the main thread of a shared session
ray = pytest.importorskip("ray")


PROMPTS = ["The capital of France is", "Dog bites man.", "Why is the sky blue?", "Apple released a new chip."]


@pytest.fixture(scope="module")
def remote(smol):
    from ray import serve

    from pipeline.engine import ray_serve

    ray_serve.deploy(smol.key, replicas=2, address="auto", cpus_per_replica=0.5)
    eng = ray_serve.RemoteEngine(smol.key, "auto")
    yield eng
    serve.shutdown()
    ray.shutdown()
    ray_serve._remotes.clear()
    ray_serve._connected = None


def alone(lm, prompt, n):
    import pipeline

    return [e.token_id for e in pipeline.generate(lm, prompt, n, cache="dynamic")]


def ids(lm, prompt):
    from pipeline.generation import prepare

    return prepare(lm, prompt, 8).prompt_ids


def test_remote_answers_equal_the_same_request_alone_and_the_events_are_the_same_type(smol, remote):
    from pipeline.engine import Sampling
    from pipeline.generation.events import StepEvent

    got = {}

    def one(p):
        got[p] = list(remote.submit(ids(smol, p), 12, Sampling(temperature=0.0)))

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for p in PROMPTS:
        assert all(isinstance(e, StepEvent) for e in got[p])
        assert [e.token_id for e in got[p]] == alone(smol, p, 12), p
    # a seeded sampled request is reproducible across replicas
    s = Sampling(temperature=0.9, top_k=40, seed=7)
    a = [e.token_id for e in remote.submit(ids(smol, PROMPTS[0]), 10, s)]
    b = [e.token_id for e in remote.submit(ids(smol, PROMPTS[0]), 10, s)]
    assert a == b


def test_a_client_that_stops_listening_frees_its_slot(smol, remote):
    from pipeline.engine import Sampling

    h = remote.submit(ids(smol, PROMPTS[2]), 200, Sampling(temperature=0.0), stop_ids=[])  # exactly 200 tokens
    it = iter(h)
    next(it)
    next(it)
    it.close()  # the tab closed
    deadline = time.time() + 30
    while time.time() < deadline:
        s = [remote.stats() for _ in range(6)]  # both replicas, whichever answers
        if all(x.running == 0 and x.waiting == 0 for x in s):
            break
        time.sleep(0.5)
    assert all(x.running == 0 for x in s), s


def test_bad_requests_fail_at_submit_as_in_process(smol, remote):
    from pipeline.engine import Sampling

    with pytest.raises(ValueError):
        remote.submit([], 4, Sampling())


def test_a_killed_replica_ends_its_requests_clearly_and_serve_restarts_it(smol, remote):
    from pipeline.engine import EngineError, Sampling

    # an unseeded sampled request (no other replica can repeat its tokens; a greedy or seeded one is sent again:
    # tests/pipeline/test_ray_multinode.py)
    h = remote.submit(ids(smol, PROMPTS[2]), 2000, Sampling(temperature=0.8, seed=None), stop_ids=[])
    it = iter(h)
    next(it)
    victim = remote.stats().engine
    # every replica's process, from Ray's actor table: asking the replicas themselves (pid_of) is routed to the idle
    # one while this request keeps the other busy, and a fresh-clone CI run once killed only the idle replica
    from ray._private.state import actors

    pids = {a["Pid"] for a in actors(actor_state_name="ALIVE").values() if "ServeReplica" in a["ActorClassName"] and a["Pid"]}
    pids |= {remote._h.pid_of.remote().result(timeout_s=30) for _ in range(4)}
    t0 = time.time()
    for pid in pids:  # kill every replica the requests can be on: this request's included
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineError, match="replica stopped"):
        for _ in it:
            pass
    # Serve restarts them; a new request is answered
    deadline, answered = time.time() + 240, None
    while time.time() < deadline and answered is None:
        try:
            answered = [e.token_id for e in remote.submit(ids(smol, PROMPTS[0]), 6, Sampling(temperature=0.0))]
        except Exception:  # noqa: BLE001 - still restarting
            time.sleep(1.0)
    assert answered == alone(smol, PROMPTS[0], 6), victim
    print(f"replicas back and answering {time.time() - t0:.1f} s after the kill")
