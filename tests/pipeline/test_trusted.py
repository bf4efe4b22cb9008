"""Only code this server's user built is loaded (pipeline/decode_step/trusted.py): a planted, cut-short or damaged library is
rebuilt, never loaded; a folder others can write is refused; a failed build says gcc's message and leaves nothing
behind. Unit tier: a tiny C source, each test with its own cache and state folders."""

import ctypes
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.decode_step import trusted

pytestmark = pytest.mark.unit

CC = shutil.which("gcc") or shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler")

GOOD = "int answer(void) { return 42; }\n"
PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen(getenv("PLANT_MARK"), "w"); if (f) { fputs("ran", f); fclose(f); } }
int answer(void) { return 666; }
"""


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(trusted.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.setenv("PLANT_MARK", str(tmp_path / "planted-code-ran"))
    src = tmp_path / "k.c"
    src.write_text(GOOD)
    (tmp_path / "cache").mkdir()
    return tmp_path, src, tmp_path / "cache" / "kernels"


def build(src, folder, name="k.so"):
    return trusted.library(src, ["-O1", "-shared", "-fPIC"], folder, name, CC)


def plant(path: Path, tmp: Path) -> None:
    c = tmp / "planted.c"
    c.write_text(PLANTED)
    subprocess.run([CC, "-shared", "-fPIC", str(c), "-o", str(path)], check=True)


@needs_cc
def test_built_then_reused_from_the_record(dirs, caplog):
    tmp, src, folder = dirs
    lib = build(src, folder)
    assert lib.answer() == 42
    mtime = (folder / "k.so").stat().st_mtime_ns
    assert build(src, folder).answer() == 42
    assert (folder / "k.so").stat().st_mtime_ns == mtime  # verified, not rebuilt
    rec = (tmp / "state" / "built-libraries.json").read_text()
    assert "k.so" in rec and oct((tmp / "state").stat().st_mode & 0o777) == "0o700"
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


@needs_cc
def test_a_planted_library_never_runs(dirs, caplog):
    tmp, src, folder = dirs
    build(src, folder)
    plant(folder / "k.so", tmp)
    with caplog.at_level(logging.WARNING):
        lib = build(src, folder)
    assert lib.answer() == 42
    assert not (tmp / "planted-code-ran").exists()
    assert "does not match the digest" in caplog.text


@needs_cc
def test_a_library_without_a_record_is_rebuilt(dirs, caplog):
    """Planted before the server ever built it (no digest recorded): rebuilt, not loaded."""
    tmp, src, folder = dirs
    folder.mkdir(parents=True)
    plant(folder / "k.so", tmp)
    with caplog.at_level(logging.WARNING):
        assert build(src, folder).answer() == 42
    assert not (tmp / "planted-code-ran").exists()
    assert "no digest recorded" in caplog.text


@needs_cc
@pytest.mark.parametrize("damage", ["cut", "flipped", "empty"])
def test_a_damaged_library_is_rebuilt(dirs, caplog, monkeypatch, damage):
    """A library whose bytes no longer match the digest recorded at its build (cut short, one byte flipped: same
    length, empty) is found out by its digest, never loaded, and compiled again: the file in the cache is then the
    new build, whose digest is the record's."""
    tmp, src, folder = dirs
    build(src, folder)
    path = folder / "k.so"
    data = path.read_bytes()
    damaged = {"cut": data[:1000], "flipped": data[:500] + bytes([data[500] ^ 0xFF]) + data[501:], "empty": b""}[damage]
    path.write_bytes(damaged)
    compiled, loaded = [], []
    compile_, load = trusted._compile, trusted._load_bytes
    monkeypatch.setattr(trusted, "_compile", lambda *a: compiled.append(a) or compile_(*a))
    monkeypatch.setattr(trusted, "_load_bytes", lambda b, name: loaded.append(b) or load(b, name))
    with caplog.at_level(logging.WARNING):
        assert build(src, folder).answer() == 42
    assert "does not match the digest recorded" in caplog.text and f"({len(damaged)} bytes, expected {len(data)})" in caplog.text
    assert len(compiled) == 1  # rebuilt, once
    assert damaged not in loaded and loaded == [path.read_bytes()]  # what was loaded is the new build, not the damaged file
    rec = json.loads((tmp / "state" / "built-libraries.json").read_text())["k.so"]
    assert rec == {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "size": len(path.read_bytes())}


@needs_cc
@pytest.mark.parametrize("what", ["folder", "file"])
def test_a_place_others_can_write_is_refused(dirs, caplog, what):
    tmp, src, folder = dirs
    build(src, folder)
    target = folder if what == "folder" else folder / "k.so"
    os.chmod(target, 0o777)
    with caplog.at_level(logging.WARNING):
        assert build(src, folder) is None
    assert "other users can write" in caplog.text and "fall back" in caplog.text


@needs_cc
def test_a_state_folder_others_can_read_is_refused(dirs, caplog):
    tmp, src, folder = dirs
    (tmp / "state").mkdir(mode=0o755)
    os.chmod(tmp / "state", 0o755)
    with caplog.at_level(logging.WARNING):
        assert build(src, folder) is None
    assert "other users can reach" in caplog.text


@needs_cc
def test_a_failed_build_says_why_and_leaves_nothing(dirs, caplog):
    tmp, src, folder = dirs
    src.write_text("int broken(void) { return nope; }\n")
    with caplog.at_level(logging.WARNING):
        assert build(src, folder) is None
    assert "nope" in caplog.text and "undeclared" in caplog.text  # gcc's own message
    assert not [p for p in folder.iterdir() if p.suffix in (".tmp", ".so")]


@needs_cc
def test_loaded_from_a_private_copy(dirs):
    """What is loaded is a copy of the verified bytes: the library in the cache can change after the check."""
    tmp, src, folder = dirs
    lib = build(src, folder)
    assert not Path(lib._name).exists()  # the private copy is unlinked once loaded
    assert ctypes.CDLL(str(folder / "k.so")).answer() == 42


def test_inductor_cache_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv(trusted.STATE_ENV, str(tmp_path / "state"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    d = trusted.inductor_cache()
    assert d == os.environ["TORCHINDUCTOR_CACHE_DIR"] and Path(d).is_relative_to(tmp_path / "state")
    assert Path(d).stat().st_mode & 0o077 == 0


@needs_cc
def test_two_processes_building_at_once_build_once(dirs):
    """The file lock: two servers starting together compile the library once, and both load it."""
    tmp, src, folder = dirs
    log = tmp / "cc-calls"
    cc = tmp / "cc"
    cc.write_text(f'#!/bin/sh\necho x >> {log}\nsleep 1\nexec {CC} "$@"\n')
    cc.chmod(0o755)
    code = (
        "import sys; from pathlib import Path; from pipeline.decode_step import trusted; "
        f"lib = trusted.library(Path({str(src)!r}), ['-O1', '-shared', '-fPIC'], Path({str(folder)!r}), 'k.so', {str(cc)!r}); "
        "print(lib.answer())"
    )
    env = {**os.environ}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["42", "42"] and log.read_text().count("x") == 1


@pytest.mark.unit
def test_the_native_kernel_is_built_wherever_it_can_be():
    """A machine with gcc and AVX2 + FMA must run pipeline/decode_step/cpu/cpu_decode.c, not the fallback: the kernel tests that
    skip without it would otherwise pass silently over a failed build (CI runs this on its machine)."""
    import shutil

    from pipeline.decode_step.cpu import library, native_build

    cc = shutil.which(os.environ.get("CC", "gcc"))
    if cc is None or not native_build.cpu_has_avx2_fma() or os.environ.get("LLM_EXPLORER_PANEL", "1") == "0":
        pytest.skip(f"no C compiler or no AVX2/FMA here: the fallback kernels serve (cc={cc})")
    assert library.loaded() is not None, "gcc and AVX2 are here, but pipeline/decode_step/cpu/cpu_decode.c did not build or load: see the log"
