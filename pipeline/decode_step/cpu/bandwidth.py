"""The memory's read speed as this CPU streams it: the limit a decode step, which reads every weight once per token,
is measured against (bench/bench_cpu_anchor.py, the roofline page).

    r = read_probe(nbytes)     # a buffer of nbytes (default: 512 MiB) summed front to back, best of `reps`
    r.gb_per_s, r.kernel

With pipeline/decode_step/cpu/cpu_decode.c built, the read is its `read_sum` (AVX2 loads, every thread its own contiguous share
read as four streams side by side: a STREAM-style read; one stream a thread, as until 2026-12-04, read 13-17% less
here, and the limit should be the best read we can write); without it, numpy's sum on one thread, which reads slower
and says so in `kernel`. The buffer is in transparent huge pages (huge_pages.aligned), as the
weights' panels are: measured 2026-12-05 in the probe's fast minutes, the same read over 4 KiB pages gave 55-58 GB/s
where huge pages gave 62-64 (alike in normal minutes). Until then the probe's numpy buffer had huge pages (numpy
advises them for its large arrays) and the panels did not, so the products' share was measured against faster memory
than they were in. Torch summing each weight tensor (the bench's first probe) read 12-22 GB/s where this read
31-54 as one stream a thread (more as four): its many small reductions measured torch's sum, not the memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu.huge_pages import aligned


@dataclass
class ReadProbe:
    bytes: int  # the buffer read each time
    seconds: float  # the fastest read
    gb_per_s: float  # bytes / seconds / 1e9
    threads: int
    kernel: str  # what read it
    reps: int


class Reader:
    """A buffer of `nbytes` (written once, so every page is mapped), kept for repeated reads: `once()` reads it all and
    returns the seconds it took. What read_probe times, and what a bench takes between the requests it measures."""

    def __init__(self, nbytes: int = 512 << 20, threads: int | None = None):
        if nbytes < 1 << 20:
            raise ValueError(f"read_probe: a buffer of at least 1 MiB is needed to measure memory, not {nbytes:,} bytes")
        self.n = n = nbytes // 4
        self.bytes = n * 4
        self._buf = aligned(n, np.float32)  # in huge pages, as the weights' panels are (huge_pages.aligned)
        self._buf[:] = 1.0
        self.threads = threads or torch.get_num_threads()
        how = CHOICE.read(self.threads)  # what reads it, and the sentence saying so
        if how.c:
            lib, addr = CHOICE.library(), self._buf.ctypes.data
            self._read = lambda: lib.read_sum(addr, n, self.threads)
        else:
            self._read, self.threads = self._buf.sum, 1
        self.kernel = how.reason
        total = self._read()  # warm: caches, the thread team; and a check that every float was read
        if abs(float(total) - n) > 1e-3 * n:
            raise RuntimeError(f"read_probe: the read summed {float(total):,.0f}, not {n:,} (the kernel misread the buffer)")

    def once(self) -> float:
        t = time.perf_counter()
        self._read()
        return time.perf_counter() - t


def read_probe(nbytes: int = 512 << 20, reps: int = 15, threads: int | None = None) -> ReadProbe:
    """Read a buffer of `nbytes` `reps` times; the fastest read."""
    r = Reader(nbytes, threads)
    best = min(r.once() for _ in range(reps))
    return ReadProbe(r.bytes, best, r.bytes / best / 1e9, r.threads, r.kernel, reps)
