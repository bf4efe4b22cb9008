"""The engine scaled out on Ray Serve: N replicas, each owning its model and its KV budget, autoscaled on the
number of requests in flight. The front ends (any number of Streamlit servers) submit generations to it and
stream back the same StepEvents and Waiting items the in-process engine yields: pages cannot tell.

    LLM_EXPLORER_ENGINE=auto                   # start a local Ray in this process and deploy the app on it
    LLM_EXPLORER_ENGINE=ray://head:10001       # a running cluster (Ray Client), the app deployed by `make cluster`
    (unset)                                    # in-process, the default

    python -m pipeline.engine.ray_serve deploy --replicas 2 [--model KEY] [--address ray://...]

Why our engine inside Serve rather than Serve's LLM stack (ray.serve.llm): that stack runs vLLM, which gives no
per-step candidates, per-request filters or hooks, and has no CPU path here; Serve itself gives what a class
server needs: replicas, routing, autoscaling, restarts of a dead replica, streaming responses.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import asdict

from pipeline.engine.handle import EngineError, EngineStats, Waiting
from pipeline.engine.request import QueueFull, TooLarge
from pipeline.forward.sampling import GREEDY, Sampling
from pipeline.generation.events import StepEvent

log = logging.getLogger(__name__)
APP = "llm-explorer"
_lock = threading.Lock()
_remotes: dict[str, RemoteEngine] = {}
_connected: str | None = None


def app_name(model_key: str) -> str:
    """One Serve application per model (a key may be a folder path: reduced to a safe name)."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in model_key)[-60:]
    return f"{APP}-{safe}"


class EngineReplica:
    """One Serve replica: a model and its engine (continuous batching inside the replica; Serve spreads requests
    over replicas)."""

    def __init__(self, model_key: str, kv_pool_bytes: int | None = None):
        from pipeline.engine.core import Engine
        from pipeline.model.loaded import load_model

        self.lm = load_model(model_key)
        self.engine = Engine(self.lm, kv_pool_bytes=kv_pool_bytes)
        self.pid, self.started = os.getpid(), time.time()

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling: dict, stop_ids: list[int] | None = None, name: str = ""):
        """The request's Waiting items and StepEvents, streamed. A client that goes away (a closed tab, Stop)
        cancels this generator: the request is cancelled in the engine and its KV freed at the next step."""
        h = self.engine.submit(prompt_ids, max_new_tokens, Sampling(**sampling), stop_ids=stop_ids, name=name)
        it = h.stream()
        try:
            while True:
                ev = await asyncio.to_thread(next, it, None)
                if ev is None:
                    return
                yield ev
        finally:
            h.cancel()

    def stats(self) -> dict:
        return self.engine.stats().as_dict() | {"pid": self.pid, "up_s": round(time.time() - self.started, 1)}

    def pid_of(self) -> int:
        return self.pid

    def check_health(self) -> None:
        """Serve calls this periodically: a replica whose engine worker died is restarted."""
        if not self.engine.healthy():
            raise RuntimeError("the engine worker stopped with requests running")


def deployment(replicas: int = 2, max_replicas: int | None = None, cpus_per_replica: float = 1.0, gpus_per_replica: float = 0.0, slot: str | None = None):
    """The Serve deployment: `replicas` to start with, autoscaling up to `max_replicas` on requests in flight. `slot`:
    a custom resource each replica needs one of (`ray start --resources='{"engine_slot": 1}'` on each node that
    may hold one): one replica per node, so a node that goes away takes one replica, not all."""
    from ray import serve

    auto = {"min_replicas": replicas, "initial_replicas": replicas, "max_replicas": max(replicas, max_replicas or replicas), "target_ongoing_requests": 8}
    return serve.deployment(
        EngineReplica,
        name="Engine",
        autoscaling_config=auto,
        max_ongoing_requests=64,  # the engine batches them; its own bounded queue says "server busy" beyond
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica} | ({"resources": {slot: 1}} if slot else {}),
        health_check_period_s=5,
        graceful_shutdown_timeout_s=5,
    )


def connect(address: str) -> None:
    """Join the Ray cluster at `address` ("auto" starts a local one), once per process."""
    global _connected
    import ray

    if _connected is None:
        if not ray.is_initialized():
            if address == "auto":
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False)
        _connected = address


def deploy(model_key: str, replicas: int = 2, max_replicas: int | None = None, address: str = "auto", **kw) -> None:
    """Deploy (or update) the model's application on the cluster; returns when its replicas are up."""
    from ray import serve

    connect(address)
    serve.start(proxy_location="Disabled")  # handles only: no HTTP ingress to expose
    serve.run(deployment(replicas, max_replicas, **kw).bind(model_key), name=app_name(model_key), route_prefix=None)


class RemoteHandle:
    """A request running on a replica, as its visitor sees it (the same surface as core.Handle).

    When the replica dies mid-answer (its node went away, the process was killed), a greedy or seeded request is
    sent once more, to whichever replica Serve routes it to, and the events the visitor already has are skipped: the
    same settings give the same tokens on any replica (tested), so the answer continues where it stopped, after a
    pause. An unseeded sampled request, or a second failure, ends with a clear error instead."""

    def __init__(self, gen, first, resubmit=None):
        self._gen, self._first, self._resubmit = gen, first, resubmit
        self._pos = first.position if first is not None and isinstance(first, Waiting) else 0
        self.retried = False

    def _events(self):
        from ray.exceptions import RayError

        n, skip = 0, 0  # StepEvents the visitor has; those a resent request repeats
        try:
            while True:
                try:
                    if self._first is not None:
                        first, self._first = self._first, None
                        if not (isinstance(first, StepEvent) and first.index < skip):
                            n += isinstance(first, StepEvent)
                            yield first
                    for ev in self._gen:
                        self._pos = ev.position if isinstance(ev, Waiting) else 0
                        if isinstance(ev, StepEvent):
                            if ev.index < skip:
                                continue
                            n += 1
                        yield ev
                    return
                except RayError as e:  # the replica died (Serve restarts it) or the cluster went away
                    if self._resubmit is not None and not self.retried:
                        self.retried, skip = True, n
                        log.warning("a replica stopped after %d tokens of a request (%s): sent again to another replica", n, type(e).__name__)
                        self._gen.cancel()
                        try:
                            self._gen, self._first = self._resubmit()
                            continue
                        except Exception as e2:  # noqa: BLE001 - no replica takes it: the clear error below
                            e = e2
                    raise EngineError(
                        f"The server's engine replica stopped while serving this request ({type(e).__name__}), after {n} tokens. Press the button "
                        "again: another replica takes it."
                    ) from e
        finally:
            self._gen.cancel()  # a no-op when it ended; otherwise the replica cancels the request

    def stream(self, wait_every: float = 0.5):
        return self._events()

    def __iter__(self):
        return (ev for ev in self._events() if not isinstance(ev, Waiting))

    def cancel(self) -> None:
        self._gen.cancel()

    def position(self) -> int:
        return self._pos

    def eta_s(self) -> float | None:
        return None


RESEND_S = 15.0  # how long a request whose replica died may wait for another to take it


def _try(fn):
    try:
        return True, fn()
    except Exception as e:  # noqa: BLE001 - handed to the waiting thread
        return False, e


class RemoteEngine:
    """The engine of a model on Ray Serve, for pages and the CLI: submit() / stats() as the in-process engine."""

    def __init__(self, model_key: str, address: str):
        from ray import serve

        connect(address)
        self.model_key, self.address = model_key, address
        self.name = f"engine on Ray Serve ({address})"
        try:
            self._h = serve.get_deployment_handle("Engine", app_name(model_key))
        except Exception:  # noqa: BLE001 - not deployed yet: a local Ray ("auto") deploys it here
            if address != "auto":
                raise
            deploy(model_key, replicas=int(os.environ.get("LLM_EXPLORER_REPLICAS", "2")), address=address)
            self._h = serve.get_deployment_handle("Engine", app_name(model_key))

    def submit(self, prompt_ids, max_new_tokens, sampling: Sampling = GREEDY, stop_ids=None, name: str = "", arrived: float | None = None):
        """Queue a request on a replica. As in-process: QueueFull / TooLarge / ValueError at once."""
        from ray.exceptions import RayError

        def send():
            gen = self._h.options(stream=True).generate.remote(
                list(prompt_ids), int(max_new_tokens), asdict(sampling), None if stop_ids is None else list(stop_ids), name
            )
            try:
                return gen, next(iter(gen), None)  # the first event: the replica has admitted it (or said why not)
            except (QueueFull, TooLarge, ValueError):
                raise
            except RayError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, QueueFull | TooLarge | ValueError):
                    raise cause from None
                raise EngineError(f"The serving cluster could not take the request: {type(e).__name__}") from e

        def send_until(deadline: float):
            """send(), again while the cluster fails it (a replica Serve has not yet seen die is still routed to)."""
            while True:
                try:
                    return send()
                except EngineError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)

        def send_again():  # after a replica died: another must take it within RESEND_S, or the visitor is told
            import queue

            got: queue.Queue = queue.Queue()
            deadline = time.monotonic() + RESEND_S
            threading.Thread(target=lambda: got.put(_try(lambda: send_until(deadline))), daemon=True, name="resend").start()
            try:
                ok, value = got.get(timeout=RESEND_S + 1.0)
            except queue.Empty:
                raise EngineError(f"no replica took the request again within {RESEND_S:.0f} s") from None
            if not ok:
                raise value
            return value

        try:
            gen, first = send()
        except EngineError as e:
            # the replica it was routed to died before admitting it (its node just went away, and Serve has not
            # noticed yet): nothing was streamed, so any request, sampled ones included, can go to another replica
            log.warning("the cluster failed a new request (%s): sent again", e)
            gen, first = send_again()
        # the same tokens again on another replica only where the settings fix them: greedy, or seeded sampling
        return RemoteHandle(gen, first, resubmit=send_again if sampling.greedy or sampling.seed is not None else None)

    def stats(self) -> EngineStats:
        s = self._h.stats.remote().result(timeout_s=10)
        s["engine"] = f"{self.name}: replica pid {s.pop('pid')}, up {s.pop('up_s')} s"
        return EngineStats(**s)


def remote_engine(model_key: str, address: str) -> RemoteEngine:
    """The process's client of `model_key`'s application (made once)."""
    with _lock:
        eng = _remotes.get(model_key)
        if eng is None:
            eng = _remotes[model_key] = RemoteEngine(model_key, address)
        return eng


def main(argv=None) -> int:
    import argparse

    from pipeline.model.registry import DEFAULT

    ap = argparse.ArgumentParser(prog="python -m pipeline.engine.ray_serve")
    ap.add_argument("command", choices=["deploy"])
    ap.add_argument("--model", default=DEFAULT)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--max-replicas", type=int, default=None)
    ap.add_argument("--gpus-per-replica", type=float, default=0.0)
    ap.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "auto"))
    ap.add_argument(
        "--slot",
        default=None,
        help="a custom resource each replica needs one of (e.g. engine_slot: one replica per node started with --resources='{\"engine_slot\": 1}')",
    )
    ap.add_argument("--cpus-per-replica", type=float, default=1.0)
    a = ap.parse_args(argv)
    t = time.perf_counter()
    deploy(a.model, a.replicas, a.max_replicas, address=a.address, gpus_per_replica=a.gpus_per_replica, cpus_per_replica=a.cpus_per_replica, slot=a.slot)
    print(f"{app_name(a.model)}: {a.replicas} replicas up in {time.perf_counter() - t:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
