"""What the hardware does during a run: a background sampler with phase markers.

On an NVIDIA GPU (nvidia-ml-py, imported as pynvml): utilisation, memory used, power and SM clock, plus
torch.cuda allocated/reserved memory; NVML's own buffered, timestamped utilisation samples
(nvmlDeviceGetSamples) are merged in afterwards because NVML averages utilisation over 1/6-1 s and polling
faster only repeats values. Without a GPU, or without NVML, it records process CPU %, per-core load and RSS
via psutil and says so in `source`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil
import torch

from pipeline.common.timing import sync


@dataclass
class Timeline:
    source: str  # "nvml" or "psutil (NVML unavailable: why)"
    t0: float  # perf_counter at start; all t are seconds since t0
    samples: list[dict] = field(default_factory=list)
    nvml_util: list[tuple[float, float]] = field(default_factory=list)  # (t, %) from nvmlDeviceGetSamples
    marks: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, label) phase spans
    interval_s: float = 0.1

    def mean_utilisation(self) -> tuple[float | None, str]:
        """(mean %, what it is): GPU utilisation from NVML's own buffered samples (else the polled ones), or
        without a GPU the process's CPU % (100 % = one core busy)."""
        if self.nvml_util:
            return sum(v for _, v in self.nvml_util) / len(self.nvml_util), "GPU utilisation % (NVML samples)"
        vals = [s["gpu_util"] for s in self.samples if "gpu_util" in s]
        if vals:
            return sum(vals) / len(vals), "GPU utilisation % (NVML, polled)"
        vals = [s["cpu_percent"] for s in self.samples[1:] if "cpu_percent" in s]  # the first reads 0 by design
        return (sum(vals) / len(vals) if vals else None), "process CPU % (psutil; 100 % = one core)"


def _nvml():
    """(pynvml module, handle) or (None, reason)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        idx = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(idx)
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    except Exception as e:  # NVMLError_LibraryNotFound without a driver, others for a broken install
        name = type(e).__name__
        return None, ("no NVIDIA driver on this machine" if "LibraryNotFound" in name or "DriverNotLoaded" in name else f"NVML did not start ({name})")


class Sampler:
    """Use as a context manager around a run; call `mark(label, start, end)` for phase spans
    (times from time.perf_counter()). `timeline` holds the result."""

    def __init__(self, interval_s: float = 0.1, force_cpu: bool = False):
        self.interval_s = interval_s
        self.nv, handle = (None, "forced") if force_cpu else _nvml()
        self.handle = handle if self.nv else None
        src = "nvml" if self.nv else f"psutil (NVML unavailable: {handle})"
        self.timeline = Timeline(source=src, t0=time.perf_counter(), interval_s=interval_s)
        self.proc = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv_ts0 = 0

    def mark(self, label: str, start: float, end: float):
        t0 = self.timeline.t0
        self.timeline.marks.append((start - t0, end - t0, label))

    def _sample(self) -> dict:
        t = time.perf_counter() - self.timeline.t0
        if self.nv:
            nv, h = self.nv, self.handle
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            s = {"t": t, "gpu_util": util.gpu, "mem_util": util.memory, "mem_used_mb": mem.used / 2**20}
            for key, fn in (
                ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000),
                ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            ):
                try:
                    s[key] = fn()
                except Exception:
                    pass
            if torch.cuda.is_available():
                s["torch_allocated_mb"] = torch.cuda.memory_allocated() / 2**20
                s["torch_reserved_mb"] = torch.cuda.memory_reserved() / 2**20
            return s
        per_core = psutil.cpu_percent(percpu=True)
        return {"t": t, "cpu_percent": self.proc.cpu_percent(), "per_core": per_core, "rss_mb": self.proc.memory_info().rss / 2**20}

    def _run(self):
        while not self._stop.wait(self.interval_s):
            try:
                self.timeline.samples.append(self._sample())
            except Exception:
                pass

    def __enter__(self):
        self.timeline.t0 = time.perf_counter()
        if self.nv:
            try:
                self._nv_ts0 = self.nv.nvmlDeviceGetSamples(self.handle, self.nv.NVML_GPU_UTILIZATION_SAMPLES, 0)[1][-1].timeStamp
            except Exception:
                self._nv_ts0 = 0
            self._wall0 = time.time()
        else:
            self.proc.cpu_percent()
            psutil.cpu_percent(percpu=True)
        self.timeline.samples.append(self._sample())
        self._thread = threading.Thread(target=self._run, daemon=True, name="telemetry")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.timeline.samples.append(self._sample())
        if self.nv:
            self._merge_nvml_samples()
        return False

    @property
    def alive(self) -> bool:
        return bool(self._thread and self._thread.is_alive())

    def _merge_nvml_samples(self):
        try:
            _, samples = self.nv.nvmlDeviceGetSamples(self.handle, self.nv.NVML_GPU_UTILIZATION_SAMPLES, self._nv_ts0)
        except Exception:
            return
        # NVML timestamps are microseconds of wall-clock time; map them onto our perf_counter axis
        for s in samples:
            t = s.timeStamp / 1e6 - self._wall0
            if t >= 0:
                self.timeline.nvml_util.append((t, float(s.sampleValue.uiVal)))


class PeakMemory:
    """Peak memory while a block runs, above the level at entry (`.extra_mb`).

    CUDA: torch's allocator (max_memory_allocated), exact. CPU, `what="tensors"` (default): every tensor
    allocation and free inside the block as recorded by torch.profiler (profile_memory), summed in time order:
    the exact peak of live tensor bytes, independent of the allocator's reuse (the block runs slower while
    recorded, so do not time it). CPU, `what="rss"`: the process's resident memory sampled every 2 ms, which
    includes everything (Python objects, allocator slack) but misses memory the allocator reuses."""

    def __init__(self, device: torch.device, what: str = "tensors"):
        self.device, self.what, self.extra_mb = device, what, 0.0
        self._stop = threading.Event()

    def __enter__(self):
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        elif self.what == "tensors":
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
        else:
            self.proc = psutil.Process()
            self.base = self.peak = self.proc.memory_info().rss
            self._t = threading.Thread(target=self._poll, daemon=True)
            self._t.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            sync(self.device)
            self.extra_mb = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        elif self.what == "tensors":
            self._prof.__exit__(*exc)
            events = sorted(
                (e.start_ns(), e.nbytes())
                for e in self._prof.profiler.kineto_results.events()
                if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
            )
            cur = peak = 0
            for _, b in events:  # allocations positive, frees negative
                cur += b
                peak = max(peak, cur)
            self.extra_mb = peak / 2**20
        else:
            self._stop.set()
            self._t.join()
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self.extra_mb = (self.peak - self.base) / 2**20
        return False

    @property
    def method(self) -> str:
        if self.device.type == "cuda":
            return "torch.cuda.max_memory_allocated"
        if self.what == "tensors":
            return (
                "tensor allocations and frees recorded by torch.profiler, summed in time order: the exact peak "
                "of live tensor bytes (in a separate, untimed run)"
            )
        return "process RSS sampled every 2 ms (a lower bound: memory the allocator reuses does not show)"
