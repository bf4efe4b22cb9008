"""Running a bench script in a fresh process from a test (imported by test_lifetime.py and test_ray_multinode.py)."""


def bench_json(script: str, *args: str, timeout: float = 900) -> dict:
    """Run bench/<script> with --json in a fresh process (what RSS and a killed Ray node need) and return its JSON."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "bench" / script), *args, "--json"], capture_output=True, text=True, cwd=root, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
