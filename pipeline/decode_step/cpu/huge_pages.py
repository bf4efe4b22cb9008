"""Memory for the big CPU arrays (the weights' panel copies, the CPU KV pool, the read probe's buffer): private
anonymous maps, given back the moment they are dropped, in transparent huge pages where they are large enough."""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 2 << 20


def aligned(size: int, dtype) -> np.ndarray:
    """An empty array of `size` elements in its own private anonymous memory map, given back to the system the moment
    the array is dropped (from malloc, freed panel copies stayed in the process: three runs of page 12's precision
    lesson grew a process by 0.74 GB that did not come back). Arrays of 2 MiB or more start on a 2 MiB boundary and
    their whole 2 MiB pages are advised as transparent huge pages (the tail, under 2 MiB, stays in 4 KiB pages, so no
    memory is spent on padding). Why (measured 2026-12-05, this project's 2-core VM, in the read probe's fast minutes):
    the same read_sum over a buffer of 4 KiB pages read 55-58 GB/s where one in huge pages read 62-64 (numpy gives its
    own large arrays huge pages, so the read probe's buffer had them and the panels, from Python's mmap, did not; the
    first pages a process gets are the most scattered: 55 against 62 for later ones). In normal minutes they read
    alike. A shared map (Python mmap's default) never gets huge pages here (shmem_enabled is `never`)."""
    nbytes = max(1, size * np.dtype(dtype).itemsize)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if nbytes < HUGE_PAGE:
        return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=dtype, count=size)
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=flags)  # the part before the boundary is never touched: no memory
    off = -np.frombuffer(m, dtype=np.uint8, count=1).ctypes.data % HUGE_PAGE
    try:
        m.madvise(mmap.MADV_HUGEPAGE, off, nbytes // HUGE_PAGE * HUGE_PAGE)
    except (AttributeError, OSError):  # no transparent huge pages here: 4 KiB pages, as before
        pass
    return np.frombuffer(m, dtype=dtype, count=size, offset=off)
