"""huge_pages.aligned: the memory the weights' panels, the CPU KV pool and the read probe's buffer live in. Arrays of 2 MiB
or more start on a 2 MiB boundary with their whole 2 MiB pages in transparent huge pages (where the kernel allows
them), the tail in 4 KiB pages, and the memory goes back to the system when the array is dropped."""

import gc
from pathlib import Path

import numpy as np
import pytest

from pipeline.decode_step.cpu.bandwidth import Reader
from pipeline.decode_step.cpu.huge_pages import HUGE_PAGE, aligned

pytestmark = pytest.mark.unit

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _mapping(addr: int) -> dict[str, int]:
    """/proc/self/smaps's kB fields of the mapping that holds `addr`."""
    fields, inside = {}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.endswith("kB"):
            fields[head.rstrip(":")] = int(line.split()[1])
    return fields


def _rss_kb() -> int:
    return int(next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmRSS")).split()[1])


def test_large_arrays_start_on_a_huge_page_and_hold_their_values():
    n = (5 * HUGE_PAGE + 12_345) // 4  # five whole huge pages and a tail
    a = aligned(n, np.float32)
    assert a.shape == (n,) and a.dtype == np.float32 and a.flags.writeable and a.flags.c_contiguous
    assert a.ctypes.data % HUGE_PAGE == 0
    a[:] = np.arange(n, dtype=np.float32)
    assert a[0] == 0 and a[-1] == np.float32(n - 1)
    small = aligned(1000, np.float32)  # under 2 MiB: its own small map, page-aligned
    small[:] = 2.0
    assert small.ctypes.data % 4096 == 0 and float(small.sum()) == 2000.0


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages on this kernel")
def test_whole_huge_pages_are_huge_and_the_tail_is_not_padded():
    n = (8 * HUGE_PAGE + 100_000) // 4
    before = _rss_kb()
    a = aligned(n, np.float32)
    a[:] = 1.0
    grown = _rss_kb() - before
    huge = _mapping(a.ctypes.data).get("AnonHugePages", 0)
    # the kernel may refuse a huge page when memory is fragmented; most of the 8 should be huge
    assert huge >= 4 * HUGE_PAGE // 1024, f"only {huge} kB of the array in huge pages"
    tail = _mapping(a.ctypes.data + 8 * HUGE_PAGE)  # the 100 KB tail: a mapping without the advice, 4 KiB pages
    assert tail.get("AnonHugePages", 0) == 0
    assert grown < 8 * HUGE_PAGE // 1024 + 1024, f"{grown} kB for an array of {a.nbytes // 1024} kB: padded"


def test_dropped_arrays_give_their_memory_back():
    before = _rss_kb()
    a = aligned(64 * HUGE_PAGE // 4, np.float32)
    a[:] = 1.0
    grown = _rss_kb() - before
    del a
    gc.collect()
    assert grown > 100_000  # the 128 MiB were there
    assert _rss_kb() - before < grown / 4


def test_the_read_probe_reads_memory_of_the_same_kind():
    r = Reader(4 * HUGE_PAGE)
    assert r._buf.ctypes.data % HUGE_PAGE == 0
    assert r.once() > 0
