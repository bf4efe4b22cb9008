import threading
import time

import pytest
import torch

from pipeline.common.telemetry import Sampler
from pipeline.lab import hardware

pytestmark = pytest.mark.unit


def test_cpu_fallback_records_samples_and_stops_cleanly():
    with Sampler(interval_s=0.02, force_cpu=True) as s:
        t = time.perf_counter()
        x = torch.randn(300, 300)
        for _ in range(50):
            x = x @ x / 300
        s.mark("work", t, time.perf_counter())
        time.sleep(0.1)
    tl = s.timeline
    assert tl.source.startswith("psutil")
    assert len(tl.samples) >= 3 and {"cpu_percent", "per_core", "rss_mb"} <= set(tl.samples[-1])
    assert [x["t"] for x in tl.samples] == sorted(x["t"] for x in tl.samples)
    assert tl.marks and tl.marks[0][2] == "work" and tl.marks[0][0] >= 0
    # the sampler's own thread is gone (other tests' background threads may come and go meanwhile, so the
    # process's thread count is not the measure)
    assert not s.alive and not [t for t in threading.enumerate() if t.name == "telemetry"]


def test_without_nvml_the_sampler_says_so(monkeypatch):
    """Whatever this machine has: with NVML unavailable (no driver), the sampler records the CPU and says why."""
    from pipeline.common import telemetry

    monkeypatch.setattr(telemetry, "_nvml", lambda: (None, "no NVIDIA driver on this machine"))
    s = Sampler()
    assert s.timeline.source == "psutil (NVML unavailable: no NVIDIA driver on this machine)"


@pytest.mark.model
def test_matmul_probe_and_decode_profile(smol):
    r = hardware.matmul_probe(torch.device("cpu"), torch.float32, n=256, reps=2)
    assert r.n == 256 and r.dtype == "float32" and r.tflops == pytest.approx(2 * 256**3 / r.seconds / 1e12)
    p = hardware.decode_step_profile(smol, context=16)
    assert 0 < p.matmul_share <= 1 and p.top
    assert any(row.matmul for row in p.top)


def test_mean_utilisation_prefers_nvml_buffered_samples():
    from pipeline.common.telemetry import Timeline

    cpu = Timeline(source="psutil", t0=0.0, samples=[{"t": 0, "cpu_percent": 0.0}, {"t": 1, "cpu_percent": 150.0}, {"t": 2, "cpu_percent": 50.0}])
    assert cpu.mean_utilisation() == (100.0, "process CPU % (psutil; 100 % = one core)")
    gpu = Timeline(source="nvml", t0=0.0, samples=[{"t": 0, "gpu_util": 10}], nvml_util=[(0.1, 80.0), (0.2, 90.0)])
    assert gpu.mean_utilisation()[0] == 85.0 and "NVML samples" in gpu.mean_utilisation()[1]
    assert Timeline(source="nvml", t0=0.0, samples=[{"t": 0, "gpu_util": 40}]).mean_utilisation()[0] == 40
