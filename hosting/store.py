"""The one store for what outlives a session: live classes, frozen views, long prompts, saved runs, the demo limits'
counters and the operator's view of every process. Two real backends behind one small interface:

    SQLite (the embedded default): a file under the state folder, in WAL mode, so the app processes of one machine
        share it and it survives a restart. Nothing to install.
    Redis (LLM_EXPLORER_STORE=redis://host:port/db): for processes on several machines, through the `redis` client.

    store = shared()                            # this process's store, from LLM_EXPLORER_STORE (default: the SQLite file)
    store.put("views", key, b"...", ttl_s=7 * DAY); store.get("views", key); store.items("views"); store.delete(...)
    with store.lock("views"): ...               # exclusive across threads and processes (read-modify-write)
    store.bump("classes"); store.number("classes")   # a change number, polled cheaply by every process
    store.stats()                               # what the operator page and the bench show: backend, ops, time spent

A namespace (`ns`) is a flat map of string keys to bytes; an entry may expire (`ttl_s`, the store's wall clock). The
callers (appstate.stores, appstate.classes, the demo's limits) keep their own rules (who may evict what, when a class
expires) in the values they write, with their own clocks. Every operation that cannot reach the store raises
StoreDown with a message a visitor can read; after a failure the store fails fast for `retry_s` (no visitor waits on a
dead socket twice a run) and then tries again, so everything continues when the store is back.

Values are pickled by the callers: the store must be the operator's own (a file in the state folder, a Redis on a
private network), never one that strangers can write."""

from __future__ import annotations

import os
import sqlite3
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STORE_ENV = "LLM_EXPLORER_STORE"
STATE_ENV = "LLM_EXPLORER_STATE_DIR"


class StoreDown(RuntimeError):
    """The store cannot be reached (or refused a write): the message says which store and why, for the page."""


def state_dir() -> Path:
    """Where the embedded store's file lives: LLM_EXPLORER_STATE_DIR, else `state` under the app's cache folder."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("LLM_EXPLORER_CACHE") or Path.home() / ".cache" / "llm-explorer") / "state"


class _Stats:
    """Operations and the seconds spent in them, by kind (thread-safe enough: counters only)."""

    def __init__(self):
        self.ops: dict[str, list] = {}

    def add(self, kind: str, seconds: float) -> None:
        n = self.ops.setdefault(kind, [0, 0.0])
        n[0] += 1
        n[1] += seconds

    def as_dict(self) -> dict:
        return {k: {"n": n, "ms_total": round(s * 1e3, 2), "us_each": round(s * 1e6 / n, 1) if n else None} for k, (n, s) in sorted(self.ops.items())}


class Store:
    """The interface (each backend implements the underscored methods); the failure handling and timing are here."""

    kind = "?"
    where = "?"  # what the operator page names (never a password)
    retry_s = 1.0

    def __init__(self):
        self._stats = _Stats()
        self._down_until = 0.0
        self.last_error: tuple[float, str] | None = None  # (when, why) of the last failure, for the operator page
        self._held = threading.local()

    # -- the face -------------------------------------------------------------------------------------------------
    def get(self, ns: str, key: str) -> bytes | None:
        return self._call("get", self._get, ns, key)

    def put(self, ns: str, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self._call("put", self._put, ns, key, bytes(value), None if ttl_s is None else time.time() + ttl_s)

    def delete(self, ns: str, key: str) -> None:
        self._call("delete", self._delete, ns, key)

    def items(self, ns: str) -> dict[str, bytes]:
        """Every live entry of namespace `ns`."""
        return self._call("items", self._items, ns)

    def drop(self, ns: str) -> None:
        """The whole namespace."""
        self._call("drop", self._drop, ns)

    def bump(self, counter: str) -> int:
        """Add one to a change number; returns the new number."""
        return self._call("bump", self._bump, counter)

    def number(self, counter: str) -> int:
        """A change number (0 before the first bump): one cheap read, what every process polls."""
        return self._call("number", self._number, counter)

    @contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Exclusive across this process's threads and every process on the store, for a read-modify-write; a thread
        that holds it already goes straight in (one level: the outermost releases)."""
        held = getattr(self._held, "names", None)
        if held is None:
            held = self._held.names = set()
        if name in held:
            yield
            return
        t = time.perf_counter()
        self._check()
        try:
            release = self._acquire(name)
        except StoreDown:
            raise
        except Exception as e:  # noqa: BLE001 - the backend's own error: said as StoreDown
            raise self._failed(e) from e
        self._stats.add("lock", time.perf_counter() - t)
        held.add(name)
        try:
            yield
            ok = True
        except BaseException:
            ok = False
            raise
        finally:
            held.discard(name)
            try:
                release(ok)
            except Exception as e:  # noqa: BLE001
                raise self._failed(e) from e

    def ping(self) -> None:
        """Raises StoreDown when the store cannot be reached now (a real round trip, not the fail-fast window)."""
        self._down_until = 0.0
        self._call("ping", self._ping)

    def stats(self) -> dict:
        """For the operator page and the bench: the backend, where it is, whether it answers, and its own time."""
        err = self.last_error
        return {
            "backend": self.kind,
            "where": self.where,
            "down": time.time() < self._down_until,
            "last_error": None if err is None else {"at": time.strftime("%H:%M:%S", time.localtime(err[0])), "why": err[1]},
            "ops": self._stats.as_dict(),
        }

    # -- failures ---------------------------------------------------------------------------------------------------
    def _check(self) -> None:
        if time.time() < self._down_until and self.last_error is not None:
            raise StoreDown(self._message(self.last_error[1]))

    def _message(self, why: str) -> str:
        return f"The server's store ({self.kind}, {self.where}) cannot be reached: {why}"

    def _failed(self, e: BaseException) -> StoreDown:
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        self.last_error = (time.time(), why)
        self._down_until = time.time() + self.retry_s
        return StoreDown(self._message(why))

    def _call(self, kind: str, fn, *args):
        self._check()
        t = time.perf_counter()
        try:
            out = fn(*args)
        except StoreDown:
            raise
        except Exception as e:  # noqa: BLE001 - the backend's own error (a socket, a locked or full disk)
            raise self._failed(e) from e
        self._stats.add(kind, time.perf_counter() - t)
        return out

    def close(self) -> None:
        pass


class SQLiteStore(Store):
    """A file (or ":memory:", one process's, for tests) in WAL mode: every process of one machine opens the same file;
    one connection per process, its operations serialised by a lock (each takes tens of microseconds); `lock()` is a
    write transaction (BEGIN IMMEDIATE), so a read-modify-write is atomic across processes."""

    kind = "sqlite"

    def __init__(self, path: str | Path = ":memory:"):
        super().__init__()
        self.path = str(path)
        self.where = self.path
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._mu = threading.RLock()
        self._depth = 0
        self._db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint, never corrupt
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.execute("CREATE TABLE IF NOT EXISTS kv (ns TEXT NOT NULL, key TEXT NOT NULL, value BLOB, expires REAL, PRIMARY KEY (ns, key)) WITHOUT ROWID")
        self._db.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID")
        self._purged = 0.0

    def _purge(self) -> None:
        now = time.time()
        if now - self._purged > 60 and self._depth == 0:
            self._purged = now
            self._db.execute("DELETE FROM kv WHERE expires IS NOT NULL AND expires < ?", (now,))

    def _get(self, ns, key):
        with self._mu:
            row = self._db.execute("SELECT value, expires FROM kv WHERE ns=? AND key=?", (ns, key)).fetchone()
        if row is None or (row[1] is not None and row[1] < time.time()):
            return None
        return row[0]

    def _put(self, ns, key, value, expires):
        with self._mu:
            self._purge()
            self._db.execute("INSERT OR REPLACE INTO kv (ns, key, value, expires) VALUES (?, ?, ?, ?)", (ns, key, value, expires))

    def _delete(self, ns, key):
        with self._mu:
            self._db.execute("DELETE FROM kv WHERE ns=? AND key=?", (ns, key))

    def _items(self, ns):
        now = time.time()
        with self._mu:
            rows = self._db.execute("SELECT key, value, expires FROM kv WHERE ns=?", (ns,)).fetchall()
        return {k: v for k, v, e in rows if e is None or e >= now}

    def _drop(self, ns):
        with self._mu:
            self._db.execute("DELETE FROM kv WHERE ns=?", (ns,))

    def _bump(self, counter):
        with self._mu:
            return self._db.execute(
                "INSERT INTO counters (name, n) VALUES (?, 1) ON CONFLICT(name) DO UPDATE SET n = n + 1 RETURNING n", (counter,)
            ).fetchone()[0]

    def _number(self, counter):
        with self._mu:
            row = self._db.execute("SELECT n FROM counters WHERE name=?", (counter,)).fetchone()
        return 0 if row is None else int(row[0])

    def _acquire(self, name):
        self._mu.acquire()
        try:
            if self._depth == 0:
                self._db.execute("BEGIN IMMEDIATE")
            self._depth += 1
        except BaseException:
            self._mu.release()
            raise

        def release(ok: bool) -> None:
            try:
                self._depth -= 1
                if self._depth == 0:
                    self._db.execute("COMMIT" if ok else "ROLLBACK")
            finally:
                self._mu.release()

        return release

    def _ping(self):
        with self._mu:
            self._db.execute("SELECT 1").fetchone()

    def close(self) -> None:
        with self._mu:
            self._db.close()


_EXP = struct.Struct("<d")  # a Redis field's value: its expiry time (0: never) then the bytes


class RedisStore(Store):
    """A Redis server (the `redis` client, its connection pool shared by threads): a namespace is one hash (`llmx:ns`),
    each field's value its expiry time then its bytes (Redis 7.0 expires whole keys only, so an expired field is
    skipped on read and deleted then; a hash whose fields all expire expires itself); `lock()` is redis-py's Lock
    (SET NX with a timeout, released by a token), one per name; change numbers are INCR counters."""

    kind = "redis"

    def __init__(self, url: str, prefix: str = "llmx:"):
        super().__init__()
        from urllib.parse import urlsplit

        import redis

        u = urlsplit(url)
        self.where = f"{u.scheme}://{u.hostname}:{u.port or 6379}{u.path or '/0'}"  # never the password
        self.prefix = prefix
        self.r = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0, health_check_interval=10)

    def _k(self, ns: str) -> str:
        return self.prefix + ns

    @staticmethod
    def _live(raw: bytes | None, now: float) -> bytes | None:
        if raw is None:
            return None
        (exp,) = _EXP.unpack_from(raw)
        return None if exp and exp < now else raw[_EXP.size :]

    def _get(self, ns, key):
        return self._live(self.r.hget(self._k(ns), key), time.time())

    def _put(self, ns, key, value, expires):
        k = self._k(ns)
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(k, key, _EXP.pack(expires or 0.0) + value)
        if expires is None:
            pipe.persist(k)
        else:
            pipe.expireat(k, int(expires) + 1, gt=True)  # never shortens a hash with longer-lived (or lasting) fields
        pipe.execute()

    def _delete(self, ns, key):
        self.r.hdel(self._k(ns), key)

    def _items(self, ns):
        now = time.time()
        out, gone = {}, []
        for f, raw in self.r.hgetall(self._k(ns)).items():
            v = self._live(raw, now)
            name = f.decode()
            if v is None:
                gone.append(name)
            else:
                out[name] = v
        if gone:
            self.r.hdel(self._k(ns), *gone)
        return out

    def _drop(self, ns):
        self.r.delete(self._k(ns))

    def _bump(self, counter):
        return int(self.r.incr(self.prefix + "#n:" + counter))

    def _number(self, counter):
        v = self.r.get(self.prefix + "#n:" + counter)
        return 0 if v is None else int(v)

    def _acquire(self, name):
        lk = self.r.lock(self.prefix + "#lock:" + name, timeout=10, blocking_timeout=10)
        if not lk.acquire():
            raise StoreDown(self._message(f"its lock {name!r} was held by another process for 10 s"))
        return lambda ok: lk.release()

    def _ping(self):
        self.r.ping()

    def close(self) -> None:
        self.r.close()


def open_store(url: str | None = None) -> Store:
    """A store from its address: `redis://host:port/db` (or rediss://), `sqlite:///path/to/file` or a path, `:memory:`;
    None or "" for the embedded default (state.sqlite3 in the state folder)."""
    url = (url or "").strip()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url)
    if url.startswith("sqlite://"):
        url = url[len("sqlite://") :]
    if url == ":memory:":
        return SQLiteStore(":memory:")
    return SQLiteStore(url or state_dir() / "state.sqlite3")


_shared: dict[str, Store] = {}
_shared_lock = threading.Lock()


def shared() -> Store:
    """This process's store (one per LLM_EXPLORER_STORE value, so a test that switches it gets another)."""
    key = os.environ.get(STORE_ENV, "") + "|" + os.environ.get(STATE_ENV, "")
    with _shared_lock:
        s = _shared.get(key)
        if s is None:
            s = _shared[key] = open_store(os.environ.get(STORE_ENV))
        return s
