"""Shared helpers for bench scripts: environment facts and JSON output."""

import json
import os
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the project is installed into .venv (make install)
RESULTS = ROOT / "bench" / "results"


def env() -> dict:
    import torch

    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def write(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"env": env(), **data}, indent=1))
    print(json.dumps(data, indent=1))
    print(f"-> {path}")
    return path


def rotated(configs: list[str], reps: int, run_one, *args) -> dict[str, list[dict]]:
    """Each configuration `reps` times, in an order rotated every repeat (a slow minute on a shared machine hits every
    configuration, not one); `run_one(config, *args)` returns a record (an "error" key when it failed), printed as it
    lands. Returns the records by configuration."""
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for rep in range(reps):
        for c in configs[rep % len(configs) :] + configs[: rep % len(configs)]:
            r = run_one(c, *args)
            print(
                f"rep {rep + 1}/{reps} {c}: "
                + ", ".join(f"{k}={v:.3g}" for k, v in r.items() if isinstance(v, float))
                + (f" ERROR {r['error']}" if "error" in r else ""),
                flush=True,
            )
            runs[c].append(r)
    return runs


def rotated_parser():
    """The arguments of a bench that runs each configuration in a fresh process, rotated over repeats: --reps, --tokens,
    --only (comma-separated configurations), and the worker's own --worker CONFIG --out FILE."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    ap.add_argument("--worker", help="(internal) run one configuration in this process")
    ap.add_argument("--out", help="(internal) where the worker writes its result")
    return ap
