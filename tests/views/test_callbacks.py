"""No widget callback is defined in a page script (unit tier: reads the source, runs nothing).

Streamlit keeps a widget's format_func / on_change / on_click in the session's widget metadata for as long as
the session lives, and a function defined in a page script holds that page's whole namespace (its trace,
~220 MB for a long prompt) through __globals__. Callbacks come from views/render.py and the other view modules, closing over plain data."""

import ast
from pathlib import Path

import pytest

from views import pages

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
VIEWS = [ROOT / p.file for p in pages.ALL]  # every page script (views/pages.py), not the modules
assert len(VIEWS) >= 18, VIEWS  # a moved folder must not leave this test with nothing to read
CALLBACK_ARGS = {"format_func", "on_change", "on_click", "on_select", "on_submit"}


@pytest.mark.unit
@pytest.mark.parametrize("path", VIEWS, ids=lambda p: p.name)
def test_no_page_defined_callbacks(path):
    tree = ast.parse(path.read_text())
    local_funcs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in CALLBACK_ARGS and (isinstance(kw.value, ast.Lambda) or isinstance(kw.value, ast.Name) and kw.value.id in local_funcs):
                    bad.append(f"line {node.lineno}: {kw.arg}")
    assert not bad, f"{path.name}: callbacks defined in the page: {bad}"
