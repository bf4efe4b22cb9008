"""Code the server runs from disk: only what this server's user built, verified before it is loaded.

pipeline/decode_step/cpu/cpu_decode.c is compiled by gcc (8-9 s on the 2-core build machine, -O3) once per source and machine
into the model cache, `<cache>/kernels/<name>-<hash of source and flags>.so`. A library found there is loaded
only when

  1. the folder and the file belong to this process's user and nobody else can write them (a shared
     LLM_EXPLORER_CACHE, a mounted volume or a careless chmod is refused, with a log line, and the kernels
     fall back to the libraries' own), and
  2. its bytes have the SHA-256 recorded when this user's server built it. The record lives in a private
     folder outside the cache (`state_dir()`: ~/.local/state/llm-explorer, mode 0700, checked the same way),
     so whoever can write the cache cannot also rewrite the record. A file that does not match (planted,
     cut short, damaged) is never loaded: it is rebuilt, and the log says why.

The verified bytes are copied into a fresh private temporary folder and loaded from there (then unlinked), so the
file cannot change between the check and the load. Builds of the same library take a file lock (two processes
starting at once build it once); a failed build logs gcc's own message and leaves no half-written file.

torch.compile's generated code (production mode's "fused+compile") is cached the same way: in a private folder
of ours (`inductor_cache()`), not in inductor's default /tmp/torchinductor_<user>, which anyone on the machine
could create first.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

STATE_ENV = "LLM_EXPLORER_STATE"
_lock = threading.Lock()


class Untrusted(RuntimeError):
    """A folder or file that someone other than this server's user could have written."""


def check_private(path: Path, *, strict: bool = False) -> None:
    """Raise Untrusted unless `path` belongs to this process's user and neither its group nor others can write it
    (`strict`: nor read or enter it: the trust record's folder)."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise Untrusted(f"{path} is a symbolic link")
    if st.st_uid != os.geteuid():
        raise Untrusted(f"{path} belongs to user id {st.st_uid}, not to this server's ({os.geteuid()})")
    mask = 0o077 if strict else 0o022
    if st.st_mode & mask:
        raise Untrusted(f"{path} has mode {stat.S_IMODE(st.st_mode):o}: other users can {'reach' if strict else 'write'} it")


def check_parent(path: Path) -> None:
    """Raise Untrusted unless nobody but this user (or root) can replace the entries of folder `path`: it belongs to
    this user or root, and if others can write it, it has the sticky bit (as /tmp does: only an entry's owner may
    rename or delete it)."""
    st = path.stat()
    if st.st_uid not in (os.geteuid(), 0):
        raise Untrusted(f"{path} belongs to user id {st.st_uid}: its owner could replace what we keep in it")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise Untrusted(f"{path} has mode {stat.S_IMODE(st.st_mode):o}: other users can write it")


def state_dir() -> Path:
    """This user's private folder for what must not share the cache's trust (created 0700; checked on every use)."""
    root = os.environ.get(STATE_ENV) or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "llm-explorer"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_parent(path.parent)
    check_private(path, strict=True)
    return path


def _records_path() -> Path:
    return state_dir() / "built-libraries.json"


def _records() -> dict:
    try:
        path = _records_path()
        check_private(path)
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("the record of built libraries could not be read (%s): every library will be rebuilt", e)
        return {}


def _record(name: str, digest: str, size: int) -> None:
    path = _records_path()
    recs = _records()
    recs[name] = {"sha256": digest, "size": size}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(recs, f, indent=1)
    os.replace(tmp, path)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BuildError(RuntimeError):
    """The compiler failed; the message is its own."""


def _compile(cc: str, source: Path, flags: list[str], out: Path) -> None:
    tmp = out.with_name(f"{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        r = subprocess.run([cc, *flags, str(source), "-o", str(tmp), "-lm"], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise BuildError(f"{cc} exited with {r.returncode}: {(r.stderr or r.stdout).strip()[-2000:]}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)  # atomic: a reader sees the old file or the whole new one
    finally:
        tmp.unlink(missing_ok=True)


def _load_bytes(data: bytes, name: str) -> ctypes.CDLL:
    """dlopen a private copy of verified bytes (in a fresh 0700 folder, unlinked once loaded)."""
    d = tempfile.mkdtemp(prefix="llm-explorer-lib-")
    try:
        path = Path(d) / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o500)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return ctypes.CDLL(str(path))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def library(source: Path, flags: list[str], folder: Path, name: str, cc: str) -> ctypes.CDLL | None:
    """`source` compiled with `flags` as `folder/name`: reused only when verified (see the module's docstring),
    else built; None (with the reason logged) when it cannot be built or trusted."""
    out = folder / name
    with _lock:
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o755)
            check_parent(folder.parent)
            check_private(folder)
            lock_fd = os.open(folder / ".build.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)  # another process building the same library: wait for it
                rec = _records().get(name)  # read under the lock: the other process may just have recorded it
                data = None
                if out.exists():
                    check_private(out)
                    data = out.read_bytes()
                    if rec is None:
                        log.warning("%s was not built by this server's user (no digest recorded in %s): rebuilding it", out, _records_path())
                        data = None
                    elif len(data) != rec["size"] or _sha256(data) != rec["sha256"]:
                        log.warning(
                            "%s does not match the digest recorded when this server built it (%d bytes, expected %d): not loaded, rebuilding it",
                            out,
                            len(data),
                            rec["size"],
                        )
                        data = None
                if data is None:
                    _compile(cc, source, flags, out)
                    data = out.read_bytes()
                    _record(name, _sha256(data), len(data))
                    log.info("built %s (%d bytes)", out, len(data))
            finally:
                os.close(lock_fd)
            return _load_bytes(data, name)
        except Untrusted as e:
            log.warning("%s is not loaded: %s. The CPU kernels fall back to the libraries' own.", out, e)
        except BuildError as e:
            log.warning("%s did not build: %s. The CPU kernels fall back to the libraries' own.", source.name, e)
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("%s could not be built or loaded (%s: %s). The CPU kernels fall back to the libraries' own.", out, type(e).__name__, e)
        return None


def inductor_cache() -> str | None:
    """Point torch.compile's caches (inductor's generated code, and on a GPU Triton's) at a private folder of ours
    unless the operator chose one; returns the folder (None when no private folder can be had)."""
    try:
        d = state_dir() / "inductor"
        d.mkdir(exist_ok=True, mode=0o700)
        check_private(d, strict=True)
    except (OSError, Untrusted) as e:
        log.warning("no private folder for torch.compile's code (%s)", e)
        return None
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(d))
    os.environ.setdefault("TRITON_CACHE_DIR", str(d / "triton"))
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
