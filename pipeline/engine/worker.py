"""An engine's background thread (`work`), and every worker stopped cleanly at interpreter exit."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref

log = logging.getLogger(__name__)

_exiting = threading.Event()
_all_engines: weakref.WeakSet = weakref.WeakSet()


def started(eng) -> None:
    """Remember an engine, so that its worker is stopped at exit."""
    _all_engines.add(eng)


def work(ref: weakref.ref) -> None:
    """An engine's background thread: iterates while the engine lives and has work; after 5 s without work it ends
    (a later submit starts another). It holds the engine only during an iteration: while it waits it holds the
    scheduler alone (which knows nothing of the model), so a model dropped by everyone else is freed at once, not
    after the wait."""
    eng = ref()
    if eng is None:
        return
    sched = eng.scheduler
    del eng
    while not _exiting.is_set():
        busy = sched.wait_for_work(5.0)
        eng = ref()
        if eng is None:
            return
        if not busy:
            with eng._thread_lock:
                if not sched.wait_for_work(0.0):
                    eng._thread = None
                    return
        try:
            eng.iterate()
        except Exception:  # noqa: BLE001 - iterate fails its own requests; a bug elsewhere must not end the worker
            log.exception("engine iteration failed")
            time.sleep(0.1)
        del eng


@atexit.register
def _stop_workers() -> None:
    """At interpreter exit, let each worker finish its iteration and stop (a thread killed inside a torch call
    can abort the process: "terminate called without an active exception")."""
    _exiting.set()
    for eng in list(_all_engines):
        eng._wake()
        t = eng._thread
        if t is not None:
            t.join(timeout=10)
