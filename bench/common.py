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
