"""Streamlit's private API, as this app uses it (every use is listed in views/st_private.py USES): each name still
exists in the installed Streamlit with the shape we use (the attribute, a callable with the parameters we pass), the
functions of views/st_private.py work in a script run, and requirements.txt pins the Streamlit that is installed. A
Streamlit upgrade that moves a name fails here, naming the function in views/st_private.py and our callers to fix."""

import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest
import streamlit

from views import st_private

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _owner(path: str):
    module, _, cls = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, cls) if cls else obj


def _has(owner, name: str) -> bool:
    """`name` on a module or class: a class attribute or method, a dataclass field, a protobuf field, or an instance
    attribute its methods assign (self.name = ...)."""
    if hasattr(owner, name):
        return True
    if dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}:
        return True
    fields = getattr(getattr(owner, "DESCRIPTOR", None), "fields_by_name", None)
    if fields is not None:
        return name in fields
    return inspect.isclass(owner) and re.search(rf"self\.{name}\s*[:=]", inspect.getsource(owner)) is not None


@pytest.mark.parametrize("use", st_private.USES, ids=lambda u: f"{u.owner}.{u.name}")
def test_each_private_name_we_use_is_there_with_its_shape(use):
    fix = f"Streamlit {streamlit.__version__} moved it: fix views/st_private.py ({use.ours})"
    try:
        owner = _owner(use.owner)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{use.owner} cannot be imported ({e}). {fix}")
    assert _has(owner, use.name), f"{use.owner} has no {use.name}. {fix}"
    if use.params is not None:
        thing = getattr(owner, use.name)
        assert callable(thing), f"{use.owner}.{use.name} is not callable. {fix}"
        params = [p for p in inspect.signature(thing).parameters if p not in ("self", "cls")]
        missing = [p for p in use.params if p not in params]
        assert not missing, f"{use.owner}.{use.name}{inspect.signature(thing)} takes no {missing}. {fix}"


PRIVATE_ATTRIBUTES = {"_session_mgr", "_client_state", "_call_soon_on_event_loop", "_script_hash", "_bindings_by_param", "request_rerun", "context_info"}
PUBLIC_MODULES = ("streamlit.components.v1", "streamlit.testing.v1")  # Streamlit's documented modules


def test_every_private_name_in_our_code_goes_through_st_private():
    """Our code (app.py, views, components, appstate; views/st_private.py apart) imports no module under streamlit.*
    but the documented ones, and reads none of the private attributes in USES itself: a new use goes in st_private."""
    found = []
    for path in [ROOT / "app.py", *(ROOT / "views").rglob("*.py"), *(ROOT / "components").rglob("*.py"), *(ROOT / "appstate").rglob("*.py")]:
        if path.name == "st_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(m.startswith("streamlit.") and not m.startswith(PUBLIC_MODULES) for m in modules):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {modules}")
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES and not (isinstance(node.value, ast.Name) and node.value.id == "st_private"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr") and len(node.args) > 1:
                name = node.args[1]
                if isinstance(name, ast.Constant) and name.value in PRIVATE_ATTRIBUTES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.id}(..., {name.value!r})")
    assert not found, "a private Streamlit name used outside views/st_private.py:\n" + "\n".join(found)


def test_a_private_value_we_copy_is_still_streamlits():
    from streamlit.elements.lib.image_utils import MAXIMUM_CONTENT_WIDTH

    from views.ready import MAX_IMAGE_WIDTH

    assert MAX_IMAGE_WIDTH == MAXIMUM_CONTENT_WIDTH, (
        f"Streamlit {streamlit.__version__} sends images up to {MAXIMUM_CONTENT_WIDTH} px: fix views/ready.py MAX_IMAGE_WIDTH"
    )


def test_requirements_pin_the_installed_streamlit_exactly():
    pins = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines() if re.match(r"streamlit\b", line)]
    assert len(pins) == 1 and re.fullmatch(r"streamlit==[\w.]+", pins[0]), (
        f"requirements.txt must pin one exact Streamlit (views/st_private.py uses its internals): {pins}"
    )
    assert pins[0] == f"streamlit=={streamlit.__version__}", (
        f"installed Streamlit {streamlit.__version__}, requirements.txt says {pins[0]}: check tests/app/test_streamlit_private.py first"
    )


def _script():
    """Runs in AppTest: what views.st_private reads in a script run, written to the page."""
    import streamlit as st

    from views import st_private

    st.text_input("bound", key="bound_key", bind="query-params")
    ctx = st_private.run_context()
    st.write(f"context={ctx is not None}")
    st.write(f"bindings={st_private.page_bindings()}")
    st.write(f"page={st_private.browser_page() is not None}")
    st.write(f"fragment_run={st_private.fragment_run()}")
    st.write(f"address={st_private.browser_address()}")
    st.write(f"session={st_private.this_session()}")

    @st.fragment
    def inside():
        st.write(f"fragment={st_private.fragment_id() is not None}")

    inside()
    st.write(f"outside={st_private.fragment_id()}")
    st.write(f"hash={bool(st_private.page_hash(st.Page(lambda: None, title='A page', url_path='a-page')))}")


def test_the_functions_work_in_a_script_run():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_script, default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    said = [m.value for m in at.markdown]
    expected = [
        "context=True",
        "bindings=['bound_key']",
        "page=True",
        "fragment_run=False",
        "address=None",  # AppTest sends no browser context
        "session=None",  # AppTest has no server session to wake: the live class's heartbeat follows alone
        "fragment=True",
        "outside=None",
        "hash=True",
    ]
    assert said == expected, f"views/st_private.py against Streamlit {streamlit.__version__}: {said}"
    assert st_private.run_context() is None and st_private.page_bindings() is None and st_private.this_session() is None  # outside a run


def test_the_package_pins_the_same_streamlit():
    """`pip install .` takes the Streamlit the private names were checked against, never a newer one unchecked."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if re.match(r"streamlit\b", d)] == [f"streamlit=={streamlit.__version__}"], deps
