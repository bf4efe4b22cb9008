"""How many threads a CPU decode step uses, decided from what the last steps actually got: for the fallback
kernels only (OpenBLAS for one row), where pipeline/decode_step/cpu/cpu_decode.c is not built.

With pipeline/decode_step/cpu/cpu_decode.c (every product and attention call on torch's OpenMP pool) a lone request under a
second process keeping both cores busy kept 24 tok/s of its 38 quiet with both threads (bench/bench_cpu_anchor.py, engine-1-loaded, 2026-12-02),
where two runs with this plan had kept 12.5-14.3: there, both threads always. What follows is the
fallback's story, still measured in the bench (engine-1-fallback-loaded, with and without the plan).

A decode step is ~120 matrix products, each split over the cores (OpenBLAS for one row, oneDNN on torch's
OpenMP pool for several) and ending in a barrier: the calling thread waits until every helper has done its
share. On a quiet machine two threads read the weights ~1.6x faster than one. On a busy one (other processes
on both cores), a helper is often descheduled, and each of the ~120 barriers waits for the scheduler to run it
again: measured on the 2-core build machine with a second process keeping both cores busy, one request's decode
fell from 18 to 1.5 tok/s with two threads, where one thread keeps going at the share of a core it is given.

Several rows (oneDNN on torch's OpenMP pool) degrade gracefully instead: 8 decode rows took 113 ms quiet and
146-167 ms under the same load with both threads, so the plan is for one-row steps only (pipeline.decode_step.cpu.row_step).
Measured per step with both threads (processor seconds per wall second, involuntary context switches): one row
quiet 1.9-2.0 and 1-4, loaded 1.0 and 146-184 (594-736 ms a step instead of 55-59).

So each one-row step is timed, wall clock against the process's processor time: with k threads busy the process gets
about k seconds of processor per second of wall clock; a step that got less than 0.75 x k was waiting to be
scheduled, and the steps after it run on one thread. Every PROBE_EVERY steps on one thread, one step tries
all of them again, and keeps them if it gets its share. The choice is process-wide (OpenBLAS's and torch's
thread counts are), so it is made inside the model's lock, where every decode step runs.
"""

from __future__ import annotations

import ctypes
import glob
import os
import time
from contextlib import contextmanager

import torch

ADAPTIVE = os.environ.get("LLM_EXPLORER_THREAD_PLAN", "1") != "0"  # 0: always every thread (the bench's A/B)
PROBE_EVERY = 32  # steps on one thread between two tries of all of them
SHARE = 0.75  # a step that got less than this share of k cores' time was waiting to be scheduled


def _openblas_setter():
    """numpy's OpenBLAS `set_num_threads` (None if not found: its thread count then stays as it is)."""
    try:
        import numpy as np

        libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
        libs += glob.glob(os.path.join(os.path.dirname(np.__file__), ".dylibs", "*openblas*"))
        for path in libs:
            lib = ctypes.CDLL(path)
            for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads"):
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.argtypes = [ctypes.c_int]
                    return fn
    except Exception:  # noqa: BLE001 - another BLAS, a sandbox: leave its threads alone
        return None
    return None


class ThreadPlan:
    """The decode step's thread count for one process (see the module)."""

    def __init__(self, most: int | None = None):
        self.most = most or torch.get_num_threads()
        self.threads = self.most
        self._set_blas = _openblas_setter()
        self._since_probe = 0
        self.switches = 0  # how many times the plan changed (the bench reports it)

    def _apply(self, n: int) -> None:
        if self._set_blas is not None:
            self._set_blas(n)
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)

    @contextmanager
    def step(self):
        """Run one decode step under the plan; afterwards, judge whether it got the cores it asked for."""
        probing = self.threads == 1 and self.most > 1 and self._since_probe >= PROBE_EVERY
        k = self.most if probing else self.threads
        old = torch.get_num_threads()
        self._apply(k)
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            yield k
        finally:
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            torch.set_num_threads(old)
            if k > 1 and wall > 0.002 and ADAPTIVE:
                got = cpu / wall
                new = self.most if got >= SHARE * k else 1
                if new != self.threads:
                    self.switches += 1
                self.threads = new
                self._since_probe = 0
            elif k == 1:
                self._since_probe += 1


PLAN = ThreadPlan()
