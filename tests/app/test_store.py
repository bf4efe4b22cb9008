"""The one store (hosting.store) on both backends: the SQLite file the processes of one machine share, and a real
redis-server (Debian's package, started here; skipped with the reason when it is absent). What each entry's lifetime
promises holds across two "processes" (two store objects on the same file or server) and across a restart (the
store closed and opened again); an unreachable store says so (StoreDown, with the store named) and everything goes on
when it is back."""

import shutil
import socket
import subprocess
import time

import pytest

from appstate import RunStore, SharedTexts, recall, remember
from appstate.classes import Classes, Ended
from hosting.limits import AddressSlots, Busy, RateLimiter
from hosting.store import SQLiteStore, StoreDown, open_store

pytestmark = pytest.mark.unit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server on a free port, its data (append-only) in `folder`: stop() and start() keep it."""

    def __init__(self, folder):
        self.folder, self.port, self.proc = folder, _free_port(), None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--appendonly", "yes", "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    r = RedisServer(tmp_path).start()
    yield r
    if r.proc.poll() is None:
        r.stop()


@pytest.fixture(params=["sqlite", "redis"])
def backend(request, tmp_path):
    """(open a store, restart): two opens are two processes on one store; restart stops and starts the server."""
    if request.param == "sqlite":
        path = tmp_path / "state.sqlite3"
        yield (lambda: open_store(f"sqlite://{path}")), (lambda: None)
    else:
        r = request.getfixturevalue("redis_server")

        def restart():
            r.stop()
            r.start()

        yield (lambda: open_store(r.url)), restart


def test_two_processes_share_one_class_and_a_restart_keeps_it(backend):
    open_, restart = backend
    a, b = Classes(store=open_()), Classes(store=open_())  # the presenter's process and a student's
    c = a.start("teacher")
    a.publish(c.code, "teacher", "attention", {"prompt": "Dog bites man.", "heads": (1, 2)})
    n = a.store.number("classes")
    view = b.follow(c.code, "student")
    assert view.slug == "attention" and view.state == {"prompt": "Dog bites man.", "heads": (1, 2)}  # types kept (a tuple)
    assert a.followers(c.code) == 1, "a follower on another process is counted"
    with pytest.raises(Ended):
        b.publish(c.code, "student", "tokens", {})
    restart()
    again = Classes(store=open_())  # every process started again
    assert again.of_owner("teacher").code == c.code, "the presenter still owns the class"
    again.publish(c.code, "teacher", "layer", {"prompt": "Dog bites man."})
    assert again.store.number("classes") > n, "a publish moves the change number every process polls"
    assert b.follow(c.code, "student").slug == "layer"
    again.end(c.code, "teacher")
    with pytest.raises(Ended, match="presenter closed it") as e:
        b.follow(c.code, "student")
    assert e.value.member


def test_links_runs_and_limits_survive_a_restart_and_count_once_across_processes(backend):
    open_, restart = backend
    texts = SharedTexts(store=open_())
    pid = texts.put("a long prompt " * 500, "b" * 16, "10.0.0.1")
    runs = RunStore(store=open_())
    mine: dict = {}
    runs.attach(mine, "b" * 16, lambda: "?", "10.0.0.1")
    remember(mine, "gen", "smol", {"tokens": [1, 2, 3]})
    assert runs.save(mine, "10.0.0.1") and not runs.save(mine, "10.0.0.1"), "written once, when it changed"
    vid = runs.freeze(mine, lambda: "abcdefabcdef", "10.0.0.1")
    p1, p2 = RateLimiter(3, store=open_(), ns="rate:browser"), RateLimiter(3, store=open_(), ns="rate:browser")
    assert [p1.allow("x"), p2.allow("x"), p1.allow("x")] == [0.0, 0.0, 0.0]
    assert p2.allow("x") > 0, "a script landing on another process meets the same limit"
    restart()
    assert SharedTexts(store=open_()).get(pid) == "a long prompt " * 500
    later = RunStore(store=open_())  # a new process: only the store has this browser's runs
    back: dict = {}
    later.attach(back, "b" * 16, lambda: "?", "10.0.0.1")
    assert recall(back, "gen", "smol") == {"tokens": [1, 2, 3]}
    visitor: dict = {}
    assert later.thaw(visitor, vid) and recall(visitor, "gen", "smol") == {"tokens": [1, 2, 3]}
    assert RateLimiter(3, store=open_(), ns="rate:browser").wait("x") > 0, "a restart does not reset a limit"
    slots_a, slots_b = AddressSlots(store=open_()), AddressSlots(store=open_())
    with slots_a.hold("10.0.0.9", 1):
        with pytest.raises(Busy):
            with slots_b.hold("10.0.0.9", 1):
                pass
    with slots_b.hold("10.0.0.9", 1):
        pass


def test_redis_stopped_mid_class_says_so_and_the_class_goes_on_when_it_is_back(redis_server):
    cs = Classes(store=open_store(redis_server.url))
    c = cs.start("teacher")
    cs.publish(c.code, "teacher", "tokens", {"prompt": "The capital of France is"})
    redis_server.stop()
    with pytest.raises(StoreDown, match=r"redis.*cannot be reached"):
        cs.follow(c.code, "student")
    with pytest.raises(StoreDown):
        RateLimiter(2, store=cs.store).allow("x")
    t = time.perf_counter()
    with pytest.raises(StoreDown):
        cs.follow(c.code, "student")
    assert time.perf_counter() - t < 0.5, "a store that just failed fails fast (no visitor waits on a dead socket twice)"
    assert cs.store.stats()["last_error"] is not None, "the operator page can say why"
    redis_server.start()
    time.sleep(cs.store.retry_s + 0.1)
    assert cs.follow(c.code, "student").slug == "tokens", "the class is still there"
    cs.publish(c.code, "teacher", "attention", {"prompt": "The capital of France is"})
    assert cs.follow(c.code, "student").slug == "attention"


def test_a_locked_read_modify_write_is_atomic_across_processes(tmp_path):
    """Two SQLite connections (two processes' stores) racing on one counter under the store's lock lose nothing."""
    import threading

    path = tmp_path / "s.sqlite3"
    stores = [SQLiteStore(path), SQLiteStore(path)]

    def add(s):
        for _ in range(100):
            with s.lock("n"):
                v = int(s.get("t", "n") or b"0")
                s.put("t", "n", str(v + 1).encode())

    ts = [threading.Thread(target=add, args=(s,)) for s in stores]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert stores[0].get("t", "n") == b"200"
