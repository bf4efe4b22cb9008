"""pipeline/decode_step/cpu/cpu_decode.c through its checked entry points (pipeline.decode_step.cpu.matmul, norms, paged_attention, greedy): random shapes against numpy, every argument
mismatch a ValueError naming the argument (never a read out of bounds), and the same random shapes once more with
the library built with -fsanitize=address,undefined, reporting nothing (with a control that shows the sanitizer
does catch an out-of-bounds read). Needs gcc and an AVX2 CPU (skipped otherwise); model tier: the first build takes
~9 s of gcc."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu import matmul as cm
from pipeline.decode_step.cpu import norms
from pipeline.decode_step.cpu.paged_attention import paged_attend

sys.path.insert(0, str(Path(__file__).parent))
from kernel_shapes import run  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.skipif(not CHOICE.c_kernels(), reason="pipeline/decode_step/cpu/cpu_decode.c is not built here")]

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def test_random_shapes_against_numpy():
    assert run(seed=7, cases=80) == 80


def f32(*shape):
    return np.ones(shape, dtype=np.float32)


@pytest.mark.parametrize(
    "call, names",
    [
        (lambda: cm.panel_rows(f32(2, 5), torch.ones(4, 6)), "x: shape"),  # x's width is not the weight's
        (lambda: cm.panel_rows(f32(2, 6), torch.ones(4, 6), torch.ones(3)), "b: shape"),
        (lambda: cm.panel_rows(f32(2, 6), torch.ones(4, 6), torch.ones(4, dtype=torch.float64)), "b: dtype"),
        (lambda: cm.panel_rows(f32(2, 6), torch.ones(4, 6, dtype=torch.float64)), "w: a 2-D float32"),
        (lambda: cm.panel_product(f32(2, 6), cm.packed_panels(f32(4, 6)), 17, 6), "p: the panels"),
        (lambda: cm.panel_product(f32(2, 4), cm.packed_panels(f32(4, 6)), 4, 6), "x: shape"),
        (lambda: cm.panel_product(np.ones((6, 2), np.float32).T, cm.packed_panels(f32(4, 2)), 4, 2), "x: not C-contiguous"),
        (lambda: cm.panel_product(f32(2, 6), cm.packed_panels(np.ones((4, 6), np.int8)), 4, 6), "scale: needed"),
        (lambda: cm.panel_product(f32(2, 6), cm.packed_panels(f32(4, 6))[1:-15], 4, 6), "p: the panels"),
        (lambda: cm.packed_panels(np.ones((4, 6), np.float64)), "w: a 2-D"),
        (lambda: norms.rms_norm(f32(3, 8), f32(7), 1e-6), "scale: shape"),
        (lambda: norms.rms_norm(np.ones((3, 8), np.float64), f32(8), 1e-6), "x: dtype"),
        (lambda: norms.rms_norm(_misaligned(), f32(8), 1e-6), "x: data not aligned"),
        (lambda: norms.silu_mul(f32(3, 7)), "gu: an even width"),
        (lambda: paged_attend(f32(1, 1, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 4, 8), np.array([[2]], np.int32), *_win(0, 3), 4, 1.0, 1), "tables: a block number"),
        (lambda: paged_attend(f32(1, 1, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 4, 8), np.array([[0]], np.int32), *_win(0, 5), 4, 1.0, 1), "lo, hi"),
        (lambda: paged_attend(f32(1, 1, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 4, 8), np.array([[0]], np.int32), *_win(2, 2), 4, 1.0, 1), "lo, hi"),
        (lambda: paged_attend(f32(1, 2, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 4, 8), np.array([[0]], np.int32), *_win(0, 3), 4, 1.0, 1), "K: 1 KV heads"),
        (lambda: paged_attend(f32(1, 1, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 3, 8), np.array([[0]], np.int32), *_win(0, 3), 4, 1.0, 1), "K, V"),
        (lambda: paged_attend(f32(1, 1, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 4, 8), np.array([[0]], np.int64), *_win(0, 3), 4, 1.0, 1), "tables: dtype"),
        (lambda: paged_attend(f32(1, 1, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 4, 8), np.array([[0]], np.int32), *_win(0, 3), 5, 1.0, 1), "bs:"),
        (lambda: paged_attend(f32(2, 1, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 4, 8), np.array([[0]], np.int32), *_win(0, 3), 4, 1.0, 1), "tables: shape"),
        (
            lambda: paged_attend(f32(1, 1, 1, 8), f32(2, 1, 4, 16)[..., ::2], f32(2, 1, 4, 16)[..., ::2], np.array([[0]], np.int32), *_win(0, 3), 4, 1.0, 1),
            "K: each position",
        ),
    ],
)
def test_a_mismatch_is_an_exception_naming_the_argument(call, names):
    with pytest.raises(ValueError, match=names.replace("(", r"\(")):
        call()


def _win(lo, hi):
    return np.array([lo], np.int32), np.array([hi], np.int32)


def _misaligned():
    """float32 values 2 bytes off their alignment."""
    return np.frombuffer(bytearray(4 * 24 + 2), np.float32, 24, 2).reshape(3, 8)


def test_empty_calls_return_empty_arrays():
    assert cm.panel_rows(f32(0, 6), torch.ones(4, 6)).shape == (0, 4)
    assert norms.rms_norm(f32(0, 8), f32(8), 1e-6).shape == (0, 8)
    assert norms.silu_mul(f32(0, 8)).shape == (0, 4)
    empty = np.zeros((0, 1), np.int32)
    assert paged_attend(f32(0, 1, 1, 8), f32(2, 1, 4, 8), f32(2, 1, 4, 8), empty, np.zeros(0, np.int32), np.zeros(0, np.int32), 4, 1.0, 1).shape == (0, 8)


def _sanitized(tmp_path, code: list[str]) -> subprocess.CompletedProcess:
    cc = shutil.which("gcc")
    libs = [subprocess.run([cc, f"-print-file-name={n}"], capture_output=True, text=True).stdout.strip() for n in ("libasan.so", "libubsan.so")]
    if not all(os.path.isabs(x) and os.path.exists(x) for x in libs):
        pytest.skip("gcc's sanitizer runtimes are not installed")
    env = {
        **os.environ,
        "LLM_EXPLORER_KERNEL_SANITIZE": "1",
        "LLM_EXPLORER_KERNELS": str(tmp_path / "kernels"),
        "LLM_EXPLORER_STATE": str(tmp_path / "state"),
        "LD_PRELOAD": " ".join(libs),  # the sanitizers' runtime must come first in a python that was not built with them
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run([sys.executable, *code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)


def test_sanitizers_find_nothing(tmp_path):
    """The random shapes again, with the library built with -fsanitize=address,undefined: zero findings."""
    r = _sanitized(tmp_path, [str(HERE / "kernel_shapes.py"), "3", "40"])
    assert r.returncode == 0 and "ok 40" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
    assert "runtime error" not in r.stderr and "AddressSanitizer" not in r.stderr
    assert any(p.name.endswith("-san.so") for p in (tmp_path / "kernels").iterdir())


def test_sanitizers_do_catch_a_read_out_of_bounds(tmp_path):
    """The control: the raw C function called past the end of an array (what the wrappers refuse) is reported."""
    code = (
        "import numpy as np; from pipeline.decode_step.cpu import library; lib = library.loaded(); assert lib is not None; "
        "x = np.ones((1, 8), np.float32); s = np.ones(8, np.float32); y = np.empty((1, 8), np.float32); "
        "lib.rms_norm(library.ptr(x), library.ptr(s), library.ptr(y), 1, 4096, 1e-6)"
    )
    r = _sanitized(tmp_path, ["-c", code])
    assert r.returncode != 0 and "AddressSanitizer" in r.stderr, r.stderr[-3000:]


PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen(getenv("PLANT_MARK"), "w"); if (f) { fputs("ran", f); fclose(f); } }
void pack(void) {}
"""

DECODE = """
import logging, os, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import pipeline
from pipeline import serving
from pipeline.decode_step.cpu import library
from pipeline.decode_step.choice import CHOICE
from pipeline import generation
lm = pipeline.load_model()
for round in (1, 2):
    if round == 2:  # planted again after this server built and recorded the library: the digest catches it
        library._lib = False
        os.system(os.environ["PLANT_CMD"])
    text = "".join(ev.text for ev in serving.stream(lm, generation.prepare(lm, "The capital of France is", 4), pipeline.GREEDY) if isinstance(ev, pipeline.StepEvent))
    print(round, repr(text), CHOICE.c_kernels(), flush=True)
"""


def test_a_planted_kernel_library_never_runs_and_decoding_still_answers(tmp_path):
    """A library planted where the kernels are kept (before the server ever built it, and again after) is never
    loaded: the server rebuilds it, says why in the log, and the decode answers " Paris" on our own kernels."""
    kernels, mark = tmp_path / "kernels", tmp_path / "planted-code-ran"
    kernels.mkdir()
    src = tmp_path / "planted.c"
    src.write_text(PLANTED)
    env = {**os.environ, "LLM_EXPLORER_KERNELS": str(kernels), "LLM_EXPLORER_STATE": str(tmp_path / "state"), "PLANT_MARK": str(mark)}
    env.pop("LLM_EXPLORER_KERNEL_SANITIZE", None)
    name = subprocess.run(
        [sys.executable, "-c", "from pipeline.decode_step.cpu import native_build; print(native_build.library_name())"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    ).stdout.strip()
    cmd = f"{shutil.which('gcc')} -shared -fPIC {src} -o {kernels / name}"
    subprocess.run(cmd, shell=True, check=True)
    r = subprocess.run([sys.executable, "-c", DECODE], capture_output=True, text=True, env={**env, "PLANT_CMD": cmd}, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 ' Paris" in r.stdout and "2 ' Paris" in r.stdout and r.stdout.count("True") == 2, r.stdout
    assert not mark.exists()
    assert "no digest recorded" in r.stderr and "does not match the digest" in r.stderr


def test_the_read_probe_reads_every_float_once_and_refuses_a_cache_sized_buffer():
    """read_sum over lengths that are not a multiple of its 32-float stride or its 65,536-float chunk equals numpy's
    sum; the probe checks its own read and says what read it."""
    from pipeline.decode_step.cpu.bandwidth import read_probe

    rng = np.random.default_rng(3)
    for n in (1, 31, 33, 65_535, 65_536 + 17, 300_001):
        a = rng.standard_normal(n).astype(np.float32)
        got = CHOICE.library().read_sum(a.ctypes.data, n, 2)
        assert abs(got - float(a.astype(np.float64).sum())) < 1e-3 * max(1.0, float(np.abs(a).sum())) ** 0.5, n
    r = read_probe(8 << 20, reps=3)
    assert r.bytes == 8 << 20 and r.gb_per_s > 0 and "read_sum" in r.kernel
    with pytest.raises(ValueError, match="1 MiB"):
        read_probe(4096)
