"""The app's side imports only the faces of pipeline's rooms: `pipeline` and `pipeline.<room>` (each room's
`__init__`, its `__all__`), never a module by its path (`pipeline.engine.scene`). Parsed, not imported: every module
of views/, components/, appstate/, app.py and hosting/."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipeline"
ROOMS = sorted(p.name for p in PIPELINE.iterdir() if (p / "__init__.py").is_file())  # common, cpu, engine, forward, ...
MODULE_FACES = ("serving",)  # a room of one module: its public names are its face

# (file, module it imports) still allowed to reach past a face, each with who removes it
ALLOWED = {
    # the pages another change is converting to enums: their imports move to the faces when it lands
    ("views/stages/hardware.py", "pipeline.common.telemetry"): "enum pass: pipeline.common's face (Sampler)",
    ("views/stages/hardware.py", "pipeline.forward.sampling"): "enum pass: pipeline's face (GREEDY)",
    ("views/stages/kv_cache.py", "pipeline.forward.sampling"): "enum pass: pipeline's face (GREEDY)",
    ("views/stages/kv_cache.py", "pipeline.generation.loop"): "enum pass: pipeline.generation's face",
    ("views/stages/kv_cache.py", "pipeline.lab.checks"): "enum pass: pipeline.lab's face (checks.check_kv_bytes)",
    ("views/stages/roofline.py", "pipeline.lab.roofline"): "enum pass: pipeline.lab's face (roofline.roofline)",
    # the live class's and the guard's own modules, being changed elsewhere
    ("views/live_question.py", "pipeline.forward.tokens"): "live: pipeline's face (text_of)",
}


def scanned() -> list[Path]:
    files = [*ROOT.glob("views/**/*.py"), *ROOT.glob("components/**/*.py"), *ROOT.glob("appstate/**/*.py"), *ROOT.glob("hosting/**/*.py")]
    return sorted(files + [p for p in (ROOT / "app.py", ROOT / "hosting/explorer.py") if p.exists()])


def _bound(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _all(path: Path) -> set[str] | None:
    """A face's `__all__` (None where it has none)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def faces() -> dict[str, set[str]]:
    """What each face offers: `pipeline` its __all__ and the rooms, each room its __all__ (empty without one), a
    one-module room its public names."""
    out = {"pipeline": (_all(PIPELINE / "__init__.py") or set()) | set(ROOMS) | set(MODULE_FACES)}
    for room in ROOMS:
        out[f"pipeline.{room}"] = _all(PIPELINE / room / "__init__.py") or set()
    for mod in MODULE_FACES:
        out[f"pipeline.{mod}"] = {n for n in _bound(ast.parse((PIPELINE / f"{mod}.py").read_text())) if not n.startswith("_")}
    return out


def reaches(tree: ast.Module, face: dict[str, set[str]]) -> list[tuple[int, str, str]]:
    """Every import that reaches past a face: (line, module, why)."""
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("pipeline.") and a.name not in face:
                    bad.append((node.lineno, a.name, f"import {a.name}: a module by its path"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module == "pipeline" or (node.module or "").startswith("pipeline.")):
            if node.module not in face:
                bad.append((node.lineno, node.module, f"from {node.module}: a module by its path"))
                continue
            missing = [a.name for a in node.names if a.name not in face[node.module]]
            if missing:
                bad.append((node.lineno, node.module, f"from {node.module} import {', '.join(missing)}: not in its face's __all__"))
    return bad


def test_every_face_offers_only_what_it_binds():
    """Each room's __all__ names something its __init__ binds (a face that promises a name it lacks fails here)."""
    for init in [PIPELINE / "__init__.py", *(PIPELINE / r / "__init__.py" for r in ROOMS)]:
        promised = _all(init)
        if promised is not None:
            assert promised <= _bound(ast.parse(init.read_text())), (init, promised - _bound(ast.parse(init.read_text())))


def test_the_app_imports_only_the_faces_of_pipelines_rooms():
    face = faces()
    found, used = [], set()
    for path in scanned():
        rel = path.relative_to(ROOT).as_posix()
        for line, module, why in reaches(ast.parse(path.read_text()), face):
            if (rel, module) in ALLOWED:
                used.add((rel, module))
            else:
                found.append(f"{rel}:{line}: {why}")
    assert not found, "import pipeline or pipeline.<room> (its __init__'s __all__), never a module by its path:\n" + "\n".join(found)
    assert not set(ALLOWED) - used, f"these no longer reach past a face: remove them from ALLOWED: {sorted(set(ALLOWED) - used)}"


def test_a_deep_import_is_caught():
    """The control: the check fails on a module imported by its path and on a name a face does not offer."""
    face = faces()
    tree = ast.parse(
        "from pipeline.engine.scene import X\nimport pipeline.decode_step.cpu.matmul\nfrom pipeline.lab import not_in_the_face\nfrom pipeline import text_of"
    )
    assert [m for _, m, _ in reaches(tree, face)] == ["pipeline.engine.scene", "pipeline.decode_step.cpu.matmul", "pipeline.lab"]
