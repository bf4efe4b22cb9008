"""`llm-explorer`: the app from an installed copy (pip install .), with the same options as `make run`.

    llm-explorer                      # http://localhost:8501, this machine only
    llm-explorer --port 8600
    llm-explorer --host 0.0.0.0       # open to the network: says what a visitor can reach (use --demo for a class)
    llm-explorer --demo               # the locked-down hosted demo: the operator's models built and loaded first
    llm-explorer --demo --replicas 2 --port 8700 [--store redis]   # a lecture: 2 processes behind HAProxy (hosting.launch)

Streamlit's settings travel as flags (an installed copy has no .streamlit/config.toml beside it); SETTINGS holds
the same values as the project's .streamlit/config.toml (tests/app/test_install.py keeps the two equal)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # the project (or site-packages): app.py beside hosting/
LOCAL = ("localhost", "127.0.0.1", "::1")
SETTINGS = {
    "server.headless": "true",
    "server.fileWatcherType": "none",
    "server.maxMessageSize": "200",
    "browser.gatherUsageStats": "false",
    "client.toolbarMode": "minimal",
    "theme.base": "light",
    "theme.primaryColor": "#0072B2",
    "runner.postScriptGC": "false",  # a full gc.collect() after every run: 0.29 s with the GIL held (.streamlit/config.toml)
}


def open_warning(host: str, demo: bool) -> str | None:
    """What a visitor can reach when the server listens beyond this machine (None when it does not)."""
    if host in LOCAL:
        return None
    if demo:
        return f"listening on {host}: the hosted demo (caps, per-visitor limits, the operator page behind its password)."
    root = os.environ.get("LLM_EXPLORER_MODELS_ROOT", "~/models")
    return (
        f"WARNING: listening on {host}: anyone who can reach this machine gets the full explorer, not demo mode: the operator "
        f"page without a password, uncapped generations and sweeps, and model folders under {root}. For a class use --demo."
    )


def command(port: int, host: str, demo: bool) -> list[str]:
    flags = [f"--{k}={v}" for k, v in SETTINGS.items()] + [f"--server.port={port}", f"--server.address={host}"]
    if demo:
        flags.append("--client.showErrorDetails=none")
    return [sys.executable, "-m", "streamlit", "run", str(HERE / "app.py"), *flags]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llm-explorer", description="The LLM inference pipeline explorer (a Streamlit app).")
    ap.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8501)))
    ap.add_argument("--host", default=os.environ.get("HOST", "localhost"), help="the address to listen on (default: this machine only)")
    ap.add_argument("--demo", action="store_true", help="the locked-down hosted demo (LLM_EXPLORER_DEMO=1)")
    ap.add_argument("--replicas", type=int, default=1, help="app processes behind HAProxy (1: one process, no balancer)")
    ap.add_argument("--store", default=None, help="where classes, links and limits live: '' the SQLite file, 'redis', or a redis:// URL")
    a = ap.parse_args(argv)
    env = dict(os.environ)
    if a.store is not None:
        env["LLM_EXPLORER_STORE"] = a.store
    if a.replicas > 1 or a.store == "redis":
        cmd = [sys.executable, "-m", "hosting.launch", f"--replicas={a.replicas}", f"--port={a.port}", f"--address={a.host}", *(["--demo"] if a.demo else [])]
        if a.store is not None:
            cmd.append(f"--store={a.store}")
        if warning := open_warning(a.host, a.demo):
            print(f"==> {warning}", file=sys.stderr)
        os.execve(cmd[0], cmd, env)
    if a.demo:
        env["LLM_EXPLORER_DEMO"] = "1"
        subprocess.run([sys.executable, "-m", "hosting.demo"], env=env, check=True)  # the operator's models, warmed first
    if warning := open_warning(a.host, a.demo):
        print(f"==> {warning}", file=sys.stderr)
    print(f"==> starting the explorer on http://{'localhost' if a.host in LOCAL else a.host}:{a.port} (Ctrl-C stops it)", file=sys.stderr)
    cmd = command(a.port, a.host, a.demo)
    os.execve(cmd[0], cmd, env)  # Streamlit takes this process's place: a signal to it (Ctrl-C, SIGTERM) reaches the server
    return 0


if __name__ == "__main__":
    sys.exit(main())
