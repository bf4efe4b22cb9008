"""A lecture hall on one link: N Streamlit processes of the explorer behind HAProxy, one store shared by all of them.

    python -m hosting.launch --replicas 2 --port 8700 [--address 0.0.0.0] [--store redis|redis://host:6379/0]
    make demo REPLICAS=2 PORT=8700            # the same, in demo mode, the operator's models warmed first
    llm-explorer --demo --replicas 2 --port 8700

What it starts, in order:
  1. the store: the embedded SQLite file (the default; every process of this machine opens it), or with `--store redis`
     a redis-server of its own (Debian's package; its data under the state folder, append-only, so a restart keeps it),
     or the Redis at the URL given (processes on several machines);
  2. N Streamlit processes on 127.0.0.1 (free ports), each with its own model and its share of the trace budget, each
     trusting the X-Forwarded-For that HAProxy adds (they listen on loopback only, so nobody else can send it);
  3. HAProxy (Debian's package) on ADDRESS:PORT: a sticky cookie per browser (`llmx_app`: a websocket stays on the
     process that holds its session), websocket upgrades with a long tunnel timeout, health checks on
     /_stcore/health every 2 s (a process that stops answering is taken out within ~4 s; its students' pages reconnect
     to another, which follows the same class from the store), least connections first.
It then watches the processes: one that exits is started again (the store keeps everything that outlives a session),
and Ctrl-C or SIGTERM stops them all. With --replicas 1 there is no balancer: one process on PORT, as `make demo`.

Why our own launcher, not Ray Serve: the app processes are Streamlit servers (websocket sessions that must stay on one
process), which a balancer with sticky cookies serves as they are; the engine may still run on Ray Serve
(LLM_EXPLORER_ENGINE), independently of this.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hosting import balancer

HERE = Path(__file__).resolve().parents[1]
TRUST_PROXY_ENV = "LLM_EXPLORER_TRUST_PROXY"  # set for processes behind our HAProxy: the client's address from X-Forwarded-For


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
        return True
    except Exception:  # noqa: BLE001 - not up (yet)
        return False


def start_redis(state: Path, port: int) -> subprocess.Popen:
    """A redis-server of our own: data under `state`/redis (append-only file: a restart keeps every class and link)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("--store redis needs redis-server (Debian: apt-get install redis-server), or give a redis:// URL")
    d = state / "redis"
    d.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d), "--appendonly", "yes", "--save", "", "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(50):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"redis-server did not start on port {port}")


class Hall:
    """The processes of one hall: the store's server (if ours), the app processes, the balancer."""

    def __init__(self, replicas: int, port: int, address: str, env: dict, streamlit_flags: list[str], log_dir: Path):
        self.replicas, self.port, self.address, self.env, self.flags, self.log_dir = replicas, port, address, env, streamlit_flags, log_dir
        self.ports = [free_port() for _ in range(replicas)]
        self.apps: list[subprocess.Popen | None] = [None] * replicas
        self.balancer: subprocess.Popen | None = None
        self.extra: list[subprocess.Popen] = []

    def start_app(self, i: int) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "streamlit", "run", str(HERE / "app.py"), *self.flags, f"--server.port={self.ports[i]}", "--server.address=127.0.0.1"]
        log = open(self.log_dir / f"app{i + 1}.log", "ab")  # noqa: SIM115 - the child's, for its life
        env = dict(self.env, **{TRUST_PROXY_ENV: "1", "LLM_EXPLORER_PROCESS": f"app{i + 1}"})
        self.apps[i] = subprocess.Popen(cmd, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self.apps[i]

    def start(self, wait_s: float = 300.0) -> None:
        for i in range(self.replicas):
            self.start_app(i)
        end = time.time() + wait_s
        while not all(_healthy(p) for p in self.ports):
            for i, a in enumerate(self.apps):
                if a.poll() is not None:
                    raise SystemExit(f"app process {i + 1} exited while starting (log: {self.log_dir / f'app{i + 1}.log'})")
            if time.time() > end:
                raise SystemExit(f"the app processes did not answer within {wait_s:.0f} s (logs under {self.log_dir})")
            time.sleep(0.5)
        self.balancer = balancer.start(self.address, self.port, self.ports, self.log_dir, lambda: _healthy(self.port))

    def supervise(self, stop) -> None:
        """Start again an app process that exited (a crash, a kill), until `stop()`."""
        while not stop():
            for i, a in enumerate(self.apps):
                if a is not None and a.poll() is not None:
                    print(f"==> app process {i + 1} exited ({a.returncode}); starting it again", file=sys.stderr, flush=True)
                    self.start_app(i)
            if self.balancer is not None and self.balancer.poll() is not None:
                raise SystemExit("HAProxy exited")
            time.sleep(1.0)

    def stop(self) -> None:
        procs = [p for p in [self.balancer, *self.apps, *self.extra] if p is not None]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def main(argv: list[str] | None = None) -> int:
    from hosting.store import STORE_ENV, state_dir

    ap = argparse.ArgumentParser(prog="python -m hosting.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=int(os.environ.get("REPLICAS", 2)))
    ap.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8700)))
    ap.add_argument("--address", default=os.environ.get("ADDRESS", "0.0.0.0"))
    ap.add_argument("--store", default=os.environ.get(STORE_ENV, ""), help="'' (the SQLite file), 'redis' (a redis-server of ours), or a redis:// URL")
    ap.add_argument("--demo", action="store_true", help="demo mode (LLM_EXPLORER_DEMO=1; the operator's models warmed first)")
    a = ap.parse_args(argv)
    env = dict(os.environ)
    state = state_dir()
    state.mkdir(parents=True, exist_ok=True)
    hall_dir = state / f"hall-{a.port}"
    hall_dir.mkdir(exist_ok=True)
    extra = []
    if a.store == "redis":
        rport = free_port()
        extra.append(start_redis(state, rport))
        env[STORE_ENV] = f"redis://127.0.0.1:{rport}/0"
    elif a.store:
        env[STORE_ENV] = a.store
    if a.demo:
        env["LLM_EXPLORER_DEMO"] = "1"
        subprocess.run([sys.executable, "-m", "hosting.demo"], env=env, check=True, cwd=HERE)
    from hosting.explorer import SETTINGS

    flags = [f"--{k}={v}" for k, v in SETTINGS.items()] + (["--client.showErrorDetails=none"] if a.demo else [])
    if a.replicas <= 1:
        cmd = [sys.executable, "-m", "streamlit", "run", str(HERE / "app.py"), *flags, f"--server.port={a.port}", f"--server.address={a.address}"]
        os.execve(cmd[0], cmd, env)
    hall = Hall(a.replicas, a.port, a.address, env, flags, hall_dir)
    hall.extra = extra
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        print(f"==> starting {a.replicas} app processes behind HAProxy (logs: {hall_dir})", file=sys.stderr, flush=True)
        hall.start()
        print(
            f"==> serving on http://{'localhost' if a.address in ('0.0.0.0', '127.0.0.1') else a.address}:{a.port} "
            f"({a.replicas} processes, store: {env.get(STORE_ENV) or state / 'state.sqlite3'}; Ctrl-C stops it)",
            file=sys.stderr,
            flush=True,
        )
        hall.supervise(lambda: bool(stopping))
    except KeyboardInterrupt:
        pass
    finally:
        hall.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
