"""One call for a request's events, whoever serves it: the shared engine (in this process or on Ray Serve, as
engine.registry decides; continuous batching with every other visitor) or this request's own loop
(pipeline.generation: the measuring pages' dynamic, static and fused modes, or no KV cache at all). The pages only
iterate what `stream()` returns.

    s = stream(lm, prepare(lm, prompt, 48, chat), DEFAULTS)   # QueueFull / TooLarge / ValueError at once
    for ev in s: ...                                           # Waiting items while in line, then StepEvents
    s.busy                                                     # afterwards: what else the server ran meanwhile
"""

from __future__ import annotations

import time

from pipeline.common.timing import ACTIVITY, Busy
from pipeline.engine import Waiting, engine_for
from pipeline.forward.sampling import Sampling
from pipeline.generation import Prepared, generate
from pipeline.generation.events import StepEvent
from pipeline.model import LoadedModel

ENGINE = "engine"  # the route through the shared engine; any other route is one of generation's cache modes


class Stream:
    """A request being served: iterate it for `Waiting` items (the engine's line) and `StepEvent`s; closing it
    early (a Stop, a closed tab) cancels the request. `busy` says, once it has ended, what else the server ran
    while it ran (the engine's own steps counted this request in their batch; its own loop is one generation)."""

    def __init__(self, lm: LoadedModel, request: Prepared, sampling: Sampling, route: str, use_cache: bool, arrived: float):
        self.route = ENGINE if route == ENGINE and use_cache else route
        self.t0, self.busy = arrived, Busy()
        if self.route == ENGINE:
            self._events = engine_for(lm).submit(request.prompt_ids, request.max_new_tokens, sampling, arrived=arrived).stream()
            self._own = None
        else:
            self._events = generate(lm, "", sampling=sampling, use_cache=use_cache, request=request, cache=route)
            self._own = ACTIVITY.start("generation")

    def __iter__(self):
        try:
            yield from self._events
        finally:
            self.close()

    def close(self) -> None:
        """End the request (cancelled in the engine if it is still running) and note what ran meanwhile."""
        if self._events is None:
            return
        self._events.close()
        self._events = None
        if self._own is not None:
            self.busy = ACTIVITY.end(self._own)
        else:
            self.busy = ACTIVITY.during(self.t0, time.perf_counter()).less_one("generation")


def stream(lm: LoadedModel, request: Prepared, sampling: Sampling, route: str = ENGINE, use_cache: bool = True, arrived: float | None = None) -> Stream:
    """Serve one request: through the shared engine (route "engine", the default) or its own loop (route = a cache
    mode of pipeline.generate; use_cache=False always runs its own loop, recomputing the whole context each step).
    Through the engine, a full queue (QueueFull, "Server busy: ..."), a request too large for the KV memory
    (TooLarge) or past the context window (ValueError) raise here, before anything runs."""
    return Stream(lm, request, sampling, route, use_cache, time.perf_counter() if arrived is None else arrived)


__all__ = ["ENGINE", "Stream", "StepEvent", "Waiting", "stream"]
