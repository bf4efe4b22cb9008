"""The lecture hall's balancer: HAProxy (Debian's package) in front of the app processes hosting.launch starts.

text = haproxy_config(address, port, backends)   # sticky cookie per browser, websockets, health checks, tunnel timeout
proc = start(address, port, backends, log_dir, answers)   # HAProxy running on address:port, answering
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def haproxy_config(address: str, port: int, backends: list[int], stats_port: int | None = None) -> str:
    """The balancer's configuration: sticky cookies, websockets, health checks, a long tunnel timeout."""
    servers = "\n".join(f"    server app{i} 127.0.0.1:{p} check cookie app{i} inter 2s fall 2 rise 1 maxconn 2000" for i, p in enumerate(backends, 1))
    stats = (
        f"""
frontend stats
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /
    stats refresh 5s
"""
        if stats_port
        else ""
    )
    return f"""# written by hosting/balancer.py (for hosting/launch.py): N Streamlit processes of the explorer behind one address
global
    maxconn 8000

defaults
    mode http
    option http-server-close
    option forwardfor
    option redispatch
    retries 2
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-request 30s
    timeout queue 60s
    # a websocket (a student's session) is a tunnel: idle for long stretches between the presenter's moves
    timeout tunnel 4h
    timeout client-fin 10s

frontend explorer
    bind {address}:{port}
    default_backend apps

backend apps
    balance leastconn
    # one browser, one process: its websocket and its page's requests meet its session there
    cookie llmx_app insert indirect nocache httponly
    option httpchk GET /_stcore/health
    http-check expect status 200
{servers}
{stats}"""


def start(address: str, port: int, backends: list[int], log_dir: Path, answers: Callable[[], bool]) -> subprocess.Popen:
    """HAProxy on address:port over `backends` (its configuration and log under `log_dir`), once `answers()` says the
    balancer serves; a clear SystemExit where HAProxy is not installed or does not start."""
    exe = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
    if exe is None:
        raise SystemExit("REPLICAS > 1 needs HAProxy (Debian: apt-get install haproxy)")
    cfg = log_dir / "haproxy.cfg"
    cfg.write_text(haproxy_config(address, port, backends))
    proc = subprocess.Popen([exe, "-f", str(cfg), "-db"], stdout=open(log_dir / "haproxy.log", "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
    for _ in range(100):
        if proc.poll() is not None:
            raise SystemExit(f"HAProxy exited (log: {log_dir / 'haproxy.log'})")
        if answers():
            return proc
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"HAProxy did not answer on port {port}")
