"""Memory that comes back: a model dropped is freed with everything built for it (its engine and the engine's thread,
KV pool, row step, fused decoders, panel copies), and the app's model cache, bounded by bytes, really frees what it
evicts. Each measurement in a fresh process (RSS says what that process holds)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from benchrun import bench_json  # noqa: E402

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]


def test_load_use_drop_cycles_keep_memory_flat():
    """Load SmolLM2, one generation through the engine and one through the fused loop, drop it: three times in one
    process. Before: +1.58 GB a cycle (every model ever loaded stayed, with its copies)."""
    out = bench_json("bench_lifetime.py", "--cycles", "3", "--tokens", "4")
    assert out["all_freed"], out
    assert all(c["engine"].startswith(" Paris") and c["fused"].startswith(" Paris") for c in out["cycles"]), out
    assert out["growth_after_first_mb"] < 200, out


SIX = """
import gc, json, os, sys, time, ctypes, psutil
sys.path.insert(0, os.getcwd())
import appstate, pipeline
from pipeline import serving
from pipeline import generation

def rss():
    gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0)
    return psutil.Process().memory_info().rss / 2**20

folders = sys.argv[1:]
start = rss()
ldrs = appstate.Loaders(max_models=4, load=lambda k, progress=None: pipeline.load_model(k), max_bytes=int(os.environ["BUDGET"]))
sizes, after = [], []
for f in folders:
    ldr = ldrs.get(f); ldr.wait()
    assert ldr.error is None, ldr.error
    lm = ldr.result
    sizes.append(lm.footprint_bytes / 2**20)
    text = "".join(e.text for e in serving.stream(lm, generation.prepare(lm, "The capital of France is", 3), pipeline.GREEDY) if isinstance(e, pipeline.StepEvent))
    assert text.startswith(" Paris"), text
    del lm, ldr
    after.append(rss())
print(json.dumps({"start": start, "after": after, "model_mb": max(sizes), "loaded": ldrs.keys(), "evicted": [e.key for e in ldrs.evictions]}))
"""


def test_six_local_folders_one_after_another_end_within_one_model(tmp_path, smol):
    """A server that opens six local model folders in turn (each a copy of SmolLM2's folder, its weights linked) with
    room for one: each evicted model is freed. The process ends within one model's size of where it stood with its
    first model loaded (before: +1.58 GB for every model opened), and within one model and the libraries' one-time
    allocations of where it started with none."""
    src = Path(smol.source)
    folders = []
    for i in range(6):
        d = tmp_path / f"model-{i}"
        d.mkdir()
        for f in src.iterdir():
            if f.is_file():
                (d / f.name).symlink_to(f)
        folders.append(str(d))
    env = {**os.environ, "BUDGET": str(int(smol.footprint_bytes * 1.5))}
    r = subprocess.run([sys.executable, "-c", SIX, *folders], capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["loaded"]) == 1 and len(out["evicted"]) == 5, out
    first, end = out["after"][0], out["after"][-1]
    assert end - first < out["model_mb"] and end - first < 300, out
    assert end - out["start"] < out["model_mb"] + 500, out  # one model (weights, panel copy, KV pool) and transformers' imports
