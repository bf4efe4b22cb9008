"""A non-editable install carries everything: the wheel holds every module of the project, the C source and the
vendored JavaScript; every module imports from the installed copy (not this checkout); `llm-explorer` is its entry
point and takes the same settings as `make run`."""

import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from hosting import explorer

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "components", "views", "appstate", "hosting")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def project_files() -> set[str]:
    """Every file the app needs at run time, as paths inside the wheel."""
    files = {p.name for p in ROOT.glob("*.py")}  # the one top-level module: app.py
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix in (".py", ".c", ".js", ".png"):
                files.add(f.relative_to(ROOT).as_posix())
    return files


@pytest.mark.unit
def test_the_launcher_has_make_runs_settings():
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    flat = {f"{sec}.{k}": str(v).lower() if isinstance(v, bool) else str(v) for sec, kv in config.items() for k, v in kv.items()}
    for k, v in explorer.SETTINGS.items():
        assert flat.get(k) == v, (k, v, flat.get(k))
    assert explorer.open_warning("localhost", False) is None and "full explorer" in explorer.open_warning("0.0.0.0", False)
    cmd = explorer.command(8600, "localhost", False)
    assert cmd[-2:] == ["--server.port=8600", "--server.address=localhost"] and cmd[4].endswith("app.py")


@pytest.mark.model
def test_the_wheel_carries_every_file_and_imports_from_where_it_is_installed(tmp_path):
    wheels, site, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "src"
    # built from a copy of the checkout's files (pip builds in the source folder: build/ and *.egg-info stay out of it)
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)], check=True, timeout=600)
    (wheel,) = wheels.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = project_files() - names
    assert not missing, f"the wheel leaves out {sorted(missing)[:10]}"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "llm-explorer = hosting.explorer:main" in zipfile.ZipFile(wheel).read(entry).decode()
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)], check=True, timeout=600)
    modules = sorted(
        ".".join(Path(n).with_suffix("").parts).removesuffix(".__init__")
        for n in names
        if n.endswith(".py") and n.split("/")[0] in PACKAGES and "/stages/" not in n and not n.endswith("__main__.py")
    )
    code = (
        "import importlib, sys\n"
        f"site = {str(site)!r}\n"
        "bad = [(m, getattr(importlib.import_module(m), '__file__', '')) for m in sys.argv[1:]]\n"
        "bad = [(m, f) for m, f in bad if not f.startswith(site)]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", code, *modules], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert (site / "pipeline" / "decode_step" / "cpu" / "cpu_decode.c").is_file() and (site / "components" / "vendor" / "d3.min.js").is_file()
    r = subprocess.run([sys.executable, "-m", "hosting.explorer", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--demo" in r.stdout
    # the installed entry point serves: the installed app.py answers its health check on localhost
    port, answered = free_port(), True
    proc = subprocess.Popen(
        [sys.executable, "-m", "hosting.explorer", "--port", str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=2) as h:
                    if h.read() == b"ok":
                        break
            except OSError:
                time.sleep(0.5)
        else:
            answered = False
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode()
    assert answered, f"the installed llm-explorer never answered: {out[-2000:]}"
