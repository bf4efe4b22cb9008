"""The docs name what exists, and the README is a first screen.

Every file path (`pipeline/decode_step/cpu/matmul.py`, `docs/img/house.png`), source file (`cpu_decode.c`, `trusted.py` in the
house plan's room listing), module (`pipeline.forward.tracing`) and module's name (`pipeline.model.thread_safe`,
`views/session.keep_runs`, `memo.shared`, `LoadedModel.run`) that README.md, CONTRIBUTING.md or docs/*.md mention
must exist in the repository as the code stands: a rename or a move that forgets a doc fails here, naming the doc,
its line and the stale name. Test files cited by the views (the handout's comments) are held to the same rule.
The README stays a first screen: at most 900 words, the prerequisites, the two commands, the installed launcher,
the benchmarks link, and every relative link pointing at a file that exists."""

from __future__ import annotations

import ast
import functools
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("pipeline", "appstate", "views", "components", "hosting", "app")  # the repo's importable roots
FILE_EXT = ("py", "md", "c", "txt", "toml", "json", "png", "js", "sh", "html", "yml", "yaml", "cfg")
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "artifacts", "build", "dist"}
# named in a doc on purpose, never in the repository
ELSEWHERE = {".streamlit/secrets.toml": "the operator's secrets, never in git"}
# modules from before pipeline/ was grouped into rooms: a doc that names one points at nothing
RETIRED = ("cpu_matmul", "cpu_threads", "kernels", "widgets")

URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PATH = re.compile(r"(?<![\w$~/.<*{@-])(\.{0,2}/?[\w.-]*[\w-](?:/[\w.*<>{}-]+)+/?)")
BARE_SOURCE = re.compile(r"(?<![\w/.-])([\w-]+\.(?:py|c))\b(?![\w/-]|\.\w)")
DOTTED = re.compile(rf"(?<![\w/.-])((?:{'|'.join(PACKAGES)})(?:\.\w+)+)")
SHORT_DOTTED = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\(.*\))?")


# ---- the repository as the code stands ----
@functools.cache
def source_files() -> tuple[Path, ...]:
    """Every .py and .c file of the checkout (not the environment, not build output)."""
    out = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        out += [Path(top) / f for f in files if f.endswith((".py", ".c"))]
    return tuple(out)


@functools.cache
def by_stem() -> dict[str, list[Path]]:
    """Module stem -> its files (`registry` -> pipeline/model/registry.py, pipeline/engine/registry.py), packages too."""
    out: dict[str, list[Path]] = {}
    for f in source_files():
        if f.suffix == ".py":
            stem = f.parent.name if f.name == "__init__.py" else f.stem
            out.setdefault(stem, []).append(f)
    return out


@functools.cache
def by_name() -> set[str]:
    return {f.name for f in source_files()}


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _top_names(body) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For):
            for part in ("body", "orelse", "finalbody", "handlers"):
                names |= _top_names(getattr(node, part, []))
        elif isinstance(node, ast.ExceptHandler):
            names |= _top_names(node.body)
    return names


@functools.cache
def defined(path: Path) -> frozenset[str]:
    """What `module.<name>` can reach: the module's top-level names, and a package's submodules."""
    names = _top_names(tree(path).body)
    if path.name == "__init__.py":
        names |= {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if (p / "__init__.py").exists()}
    return frozenset(names)


@functools.cache
def classes() -> dict[str, list[set[str]]]:
    """Class name -> the members of each class of that name: its methods, class attributes and fields, self.x."""
    out: dict[str, list[set[str]]] = {}
    for f in source_files():
        if f.suffix != ".py":
            continue
        for node in ast.walk(tree(f)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(_members(node))
    return out


def _members(cls: ast.ClassDef) -> set[str]:
    return _top_names(cls.body) | {a.attr for a in ast.walk(cls) if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self"}


def module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.exists():
            return f
    return None


# ---- what a doc names ----
def names_module(dotted: str) -> bool:
    """`pipeline.forward.tracing`, `pipeline.model.thread_safe`, `pipeline.decode_step.fused.supported`: the longest
    prefix that is a module, then one name it defines (what follows may be a method or an attribute)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        f = module_file(parts[:i])
        if f is not None:
            return i == len(parts) or parts[i] in defined(f)
    return False


def names_short(dotted: str) -> bool | None:
    """`memo.shared`, `models.threads_for`, `LoadedModel.run`: True/False where the head is one of this repo's modules
    (by its stem) or classes, then a name it defines; False for a retired module; None for anything else (another
    project's name, `st.context`, or a variable, `page.run`)."""
    head, *rest = dotted.split(".")
    if head in by_stem():
        return any(names_module(".".join([*_dotted(f), *rest])) or any(rest[0] in c for c in _classes_in(f)) for f in by_stem()[head])
    if head in classes():
        return any(rest[0] in members for members in classes()[head])
    return False if head in RETIRED else None  # another project's (`st.context`, `torch.mm`) or a variable (`page.run`)


def _dotted(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _classes_in(path: Path) -> list[set[str]]:
    return [_members(n) for n in tree(path).body if isinstance(n, ast.ClassDef)]


def names_path(doc: Path, path: str) -> bool | None:
    """True/False for a path into the repository (tried from the doc's folder, then the root; `dir/module.name`
    for a module's name); None for what is not one (prose with a slash, a path outside the repository)."""
    path = path.rstrip(".")
    if any(c in path for c in "*<>{}") or path.startswith(("../", "/")) or path in ELSEWHERE:
        return None
    parts = path.removeprefix("./").rstrip("/").split("/")
    if parts[0] in SKIP_DIRS:
        return None  # .venv/bin/ray: made by `make install`, not in the repository
    in_repo = (ROOT / parts[0]).exists() or (doc.parent / parts[0]).exists()
    if all((ROOT / p).exists() or (ROOT / f"{p}.py").exists() for p in parts) and not (ROOT / path).exists():
        return None  # "appstate/demo/components": a list of the root's entries
    if not in_repo and not path.endswith(tuple(f".{e}" for e in FILE_EXT)):
        return None  # "p50/p95", "bf16/int8", "tok/s"
    if (doc.parent / path).exists() or (ROOT / path).exists():
        return True
    if m := re.fullmatch(r"(.+)\.(\w+)", path):  # views/session.keep_runs
        f = ROOT / f"{m[1]}.py"
        return f.exists() and m[2] in defined(f)
    return False


def room_of(line: str, room: str) -> str:
    """In a fenced listing of the house, a line that opens with a folder (`pipeline/decode_step/    ...`) is that room's; its
    continuation lines (indented) stay in it; a line that opens with a root file (`hosting/demo.py ...`) is the root's."""
    if not line.strip() or line[0].isspace():
        return room
    head = line.split()[0]
    return head.rsplit("/", 1)[0] + "/" if "/" in head else ""


def stale_names(doc: Path) -> list[str]:
    """Every name in `doc` that points at nothing in the repository, as "doc:line: name (why)"."""
    text = doc.read_text()
    label = doc.relative_to(ROOT) if doc.is_relative_to(ROOT) else doc.name
    found: list[str] = []

    def say(pos: int, name: str, why: str):
        found.append(f"{label}:{text.count(chr(10), 0, pos) + 1}: {name} ({why})")

    clean = URL.sub(lambda m: " " * len(m[0]), text)
    for m in PATH.finditer(clean):
        if names_path(doc, m[1]) is False:
            say(m.start(), m[1], "no such file")
    for m in DOTTED.finditer(clean):
        name = m[1]
        if name.rsplit(".", 1)[-1] in FILE_EXT:
            continue  # hosting/demo.py: a file, checked below
        if not names_module(name):
            say(m.start(), name, "no such module or name")
    fenced = [(f.start(), f.end()) for f in FENCE.finditer(clean)]
    for m in BARE_SOURCE.finditer(clean):
        block = next((b for b in fenced if b[0] <= m.start() < b[1]), None)
        if block is None:
            if m[1] not in by_name():
                say(m.start(), m[1], "no source file of that name")
            continue
        room = ""
        for line in clean[block[0] : m.end()].splitlines():
            room = room_of(line, room)
        if not (ROOT / room / m[1]).exists():
            say(m.start(), m[1], f"not in {room or 'the root'}")
    for m in CODE_SPAN.finditer(clean):
        span = m[1].strip()
        if span in RETIRED:
            say(m.start(), span, "a module from before the regroup")
            continue
        short = SHORT_DOTTED.fullmatch(span)
        if short is None or short[1].split(".")[0] in PACKAGES or short[1].rsplit(".", 1)[-1] in FILE_EXT:
            continue  # a dotted name of the repo's packages: checked above
        if names_short(short[1]) is False:
            say(m.start(), short[1], "no module or class of that name defines it")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_name_in_the_docs_exists(doc):
    stale = stale_names(doc)
    assert not stale, "names that point at nothing:\n" + "\n".join(stale)


def test_the_views_cite_test_files_that_exist():
    """The handout's and the page registry's comments cite the test that holds them to it: that test exists."""
    cited = {(f.relative_to(ROOT), m[0]) for f in (ROOT / "views").rglob("*.py") for m in re.finditer(r"tests/[\w/]+\.py", f.read_text())}
    assert cited and [c for c in cited if not (ROOT / c[1]).exists()] == []


def test_a_stale_name_is_caught(tmp_path):
    """The extraction is not vacuous: a doc naming a moved file, a retired module, a module's missing name, a class's
    missing member and a source file in the wrong room fails, and the same doc with true names passes."""
    doc = tmp_path / "planted.md"
    stale = (
        "The split lives in pipeline/decode_step/kernels_gone.py, see `pipeline.forward.tokens.thread_safe`, `cpu_matmul`,\n"
        "`models.threads_for`, `LoadedModel.no_such_member`, and tests/views/test_handout.py.\n"
        "```\npipeline/engine/    core.py, trusted.py\n```\n"
    )
    doc.write_text(stale)
    said = "\n".join(stale_names(doc))
    for name in (
        "kernels_gone.py",
        "pipeline.forward.tokens.thread_safe",
        "cpu_matmul",
        "models.threads_for",
        "no_such_member",
        "test_handout.py",
        "trusted.py",
    ):
        assert name in said
    assert "core.py" not in said
    doc.write_text("pipeline/decode_step/cpu/matmul.py, `pipeline.model.thread_safe`, `pipeline.forward.tracing`, `memo.shared`, views/session.keep_runs.\n")
    assert stale_names(doc) == []


def test_every_make_target_the_docs_name_exists():
    """`make run`, `make test-fast`, `make screenshots`...: as code in a doc (in backticks or a command block)."""
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = {(doc.name, t) for doc in DOCS for t in re.findall(r"(?:`|^\s*)make ([a-z][\w-]*)", doc.read_text(), re.M)}
    assert {"run", "test", "test-fast"} <= targets and [n for n in named if n[1] not in targets] == []


def test_the_makefile_points_at_sections_that_exist():
    """Its comments send a reader to a doc's section by name: the doc has that heading."""
    comments = "\n".join(line for line in (ROOT / "Makefile").read_text().splitlines() if line.lstrip().startswith("#"))
    refs = re.findall(r'see ([\w/.-]+), "([^"]+)"', comments)
    assert refs
    for doc, section in refs:
        assert (ROOT / doc).is_file(), doc
        assert section in re.findall(r"^#+ (.+)$", (ROOT / doc).read_text(), re.M), (doc, section)


# ---- the house plan: a plan, not a diary ----
def test_the_house_plan_reads_in_ten_minutes_and_findings_live_apart():
    plan = (ROOT / "docs" / "architecture.md").read_text()
    assert len(plan.split()) <= 5000, f"{len(plan.split())} words"
    for room in ("pipeline/decode_step", "hosting/", "appstate/", "views/", "components/"):
        assert room in plan, room
    findings = (ROOT / "docs" / "findings.md").read_text()
    dated = re.findall(r"^- \*\*.+?\((\d{4}-\d{2}-\d{2})[;,)]", findings, re.M)
    bullets = re.findall(r"^- \*\*", findings, re.M)
    assert bullets and len(dated) == len(bullets), f"{len(bullets) - len(dated)} findings without a date"


# ---- the README's first screen ----
def test_the_readme_is_a_first_screen():
    text = README.read_text()
    assert len(text.split()) <= 900, f"{len(text.split())} words"
    assert max(len(line) for line in text.splitlines()) <= 200
    for needed in ("make run", "make test", "pip install .", "llm-explorer", "docs/benchmarks.md"):
        assert needed in text, needed


def test_the_readme_has_one_row_per_page():
    """The page table follows views/pages.py: each stage's number and name, one line each."""
    from views import pages

    rows = [line for line in README.read_text().splitlines() if line.startswith("| ")]
    for p in pages.STAGES:
        row = re.compile(rf"\|\s*{p.number if p.number is not None else ''}\s*\|\s*{re.escape(p.name)}\s*\|")
        assert sum(bool(row.match(line)) for line in rows) == 1, p.title


def test_the_readme_names_the_prerequisites():
    text = README.read_text().split("## Prerequisites", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"Python (>=|≥) ?3\.11", text)
    for needed in ("make", "gcc", "AVX2", "Chromium", "/usr/bin/chromium"):
        assert needed in text, needed
    assert re.search(r"\d+(\.\d+)? ?GB", text), "memory and disk, in GB"


def anchors(doc: Path) -> set[str]:
    """GitHub's ids for a doc's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", doc.read_text(), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    """A link to a file or folder of the repository (an image too) finds it, and a #section finds its heading."""
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if URL.match(link):
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path) if path else doc
        if not target.exists() or (anchor and anchor not in anchors(target)):
            broken.append(link)
    assert broken == []


def test_the_readme_links_to_the_docs():
    links = set(re.findall(r"\]\(([^)\s#]+)", README.read_text()))
    assert {"docs/guide.md", "docs/hosting.md", "docs/architecture.md", "docs/benchmarks.md", "CONTRIBUTING.md"} <= links
