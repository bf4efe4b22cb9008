"""The house's sizes, as docs/architecture.md states them: no function over 60 lines in pipeline/ and components/, no
module over 450 lines, no view over 250, hosting/demo.py and its modules under 300."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def py(*globs: str) -> list[Path]:
    return sorted(p for g in globs for p in ROOT.glob(g) if "__pycache__" not in p.parts)


def long_functions(path: Path, limit: int) -> list[str]:
    return [
        f"{path.name}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit
    ]


def too_long(paths: list[Path], limit: int) -> list[str]:
    return [f"{p.relative_to(ROOT)}: {n} lines" for p in paths if (n := len(p.read_text().splitlines())) > limit]


def test_no_function_over_60_lines_in_pipeline_and_components():
    found = [f"{p.parent.relative_to(ROOT)}/{f}" for p in py("pipeline/**/*.py", "components/**/*.py") for f in long_functions(p, 60)]
    assert not found, "split these into named steps:\n" + "\n".join(found)


def test_module_sizes():
    assert not too_long(py("pipeline/**/*.py", "components/**/*.py", "appstate/**/*.py", "views/**/*.py", "hosting/**/*.py", "*.py"), 450)
    assert not too_long(py("views/**/*.py"), 250)
    assert not too_long(py("hosting/demo.py", "hosting/limits.py", "hosting/operator_state.py"), 300)


def test_a_long_function_is_caught(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n" + "    x = 1\n" * 59 + "\n\ndef g():\n" + "    x = 1\n" * 60)
    assert long_functions(f, 60) == ["m.py:63 g (61 lines)"]  # f (60 lines) passes, g (61) does not


def test_rooms_are_named_for_what_they_hold():
    """The root holds app.py and the project's files only (the hosted demo is the hosting package); the fast decode
    step is one package with its device-specific parts as sub-rooms (issue 58)."""
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["app.py"]
    assert not (ROOT / "pipeline" / "cpu").exists()
    step = ROOT / "pipeline" / "decode_step"
    assert (step / "choice.py").is_file() and (step / "cpu" / "cpu_decode.c").is_file() and (step / "gpu" / "triton_step.py").is_file()
    for name in ("demo.py", "limits.py", "operator_state.py", "store.py", "launch.py", "balancer.py", "explorer.py"):
        assert (ROOT / "hosting" / name).is_file(), name
    # the CPU sub-room names no GPU part, and the GPU sub-room no C kernel
    for f in (step / "cpu").glob("*.py"):
        assert "decode_step.gpu" not in f.read_text().split('"""', 2)[-1], f
    for f in (step / "gpu").glob("*.py"):
        assert "decode_step.cpu" not in f.read_text().split('"""', 2)[-1], f
