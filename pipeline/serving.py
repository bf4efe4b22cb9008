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
from enum import StrEnum

from pipeline.common.timing import ACTIVITY, Busy
from pipeline.engine import Waiting, engine_for
from pipeline.forward.sampling import Sampling
from pipeline.generation.decode import CacheMode
from pipeline.generation.events import StepEvent
from pipeline.generation.loop import Prepared, generate
from pipeline.model.loaded import LoadedModel


class Route(StrEnum):
    """Who serves a request: the shared engine, or its own loop with one of the loop's cache modes (CacheMode)."""

    ENGINE = "engine"
    DYNAMIC = CacheMode.DYNAMIC.value
    STATIC = CacheMode.STATIC.value
    FUSED = CacheMode.FUSED.value
    FUSED_COMPILE = CacheMode.FUSED_COMPILE.value

    @property
    def cache(self) -> CacheMode | None:
        """The own loop's cache mode (None: the engine)."""
        return None if self == Route.ENGINE else CacheMode(self.value)


ENGINE = Route.ENGINE


class Stream:
    """A request being served: iterate it for `Waiting` items (the engine's line) and `StepEvent`s; closing it
    early (a Stop, a closed tab) cancels the request. `busy` says, once it has ended, what else the server ran
    while it ran (the engine's own steps counted this request in their batch; its own loop is one generation)."""

    def __init__(self, lm: LoadedModel, request: Prepared, sampling: Sampling, route: Route | str, use_cache: bool, arrived: float):
        route = Route(route)
        # without a KV cache the engine cannot serve it: its own loop, recomputing the context each step
        self.route = Route.DYNAMIC if route == Route.ENGINE and not use_cache else route
        self.t0, self.busy = arrived, Busy()
        if self.route == Route.ENGINE:
            self._events = engine_for(lm).submit(request.prompt_ids, request.max_new_tokens, sampling, arrived=arrived).stream()
            self._own = None
        else:
            self._events = generate(lm, "", sampling=sampling, use_cache=use_cache, request=request, cache=self.route.cache)
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


def stream(
    lm: LoadedModel, request: Prepared, sampling: Sampling, route: Route | str = Route.ENGINE, use_cache: bool = True, arrived: float | None = None
) -> Stream:
    """Serve one request: through the shared engine (route "engine", the default) or its own loop (route = a cache
    mode of pipeline.generate; use_cache=False always runs its own loop, recomputing the whole context each step).
    Through the engine, a full queue (QueueFull, "Server busy: ..."), a request too large for the KV memory
    (TooLarge) or past the context window (ValueError) raise here, before anything runs."""
    return Stream(lm, request, sampling, route, use_cache, time.perf_counter() if arrived is None else arrived)


__all__ = ["ENGINE", "Route", "Stream", "StepEvent", "Waiting", "stream"]
