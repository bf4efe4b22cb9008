"""Shared fixtures, and the test tiers. Every test module declares its tier (`pytestmark = pytest.mark.<tier>`); a
test whose needs differ from its module's declares its own tier on the function, which then replaces the
module's. Nothing is guessed from paths or fixture names: a test without a tier, or with two, is a collection
error. How long each tier takes is measured in CONTRIBUTING.md.

    unit     no model, no browser, no network: `make test-fast`, about 40 s. A unit test that loads a
             model fails (the weights loader raises), so the tier stays fast by construction.
    model    loads the embedded SmolLM2 model (directly, or through a page in AppTest)
    browser  the whole app in headless Chromium
    gpu      needs a CUDA device (skipped without one)
    cluster  a local Ray cluster with engine replicas (Ray Serve), in a pytest process of its own
    load     minutes long: memory over many prompts, a class of 32 (make test-load; CI runs a short form)

`gemma` is not a tier but a need: it is added to every test run with the Gemma-3 parameter of the `lm` fixture
(skipped when `make models` has not installed it).
"""

import os
import threading

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the app's store (live classes, links, saved runs, limits' counters) is a file under the state folder: each test process
# gets a folder of its own (AppTest's pages use it), and each server a test starts another (tests/browser/ui.py), so no
# run of the tests meets another's classes or counters
os.environ["LLM_EXPLORER_STATE_DIR"] = __import__("tempfile").mkdtemp(prefix="llmx-state-")
os.environ.pop("LLM_EXPLORER_STORE", None)
# the app opens "Local folder" models only under a models root: the tests' model folders live in the temporary folder
os.environ.setdefault("LLM_EXPLORER_MODELS_ROOT", __import__("tempfile").gettempdir())
# without a GPU, Triton's interpreter runs the trimmed step's kernels (pipeline.decode_step.gpu.triton_step); it has to be switched
# on before anything imports Triton (transformers does)
if not __import__("shutil").which("nvidia-smi"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["pytester"]  # tests/test_tiers.py runs small suites under this conftest

TIERS = ("unit", "model", "browser", "gpu", "cluster", "load")


def _models():
    import pipeline

    return [m.key for m in pipeline.available_models() if m.available]


_shared: dict = {}
_shared_lock = threading.Lock()
_load_warm = None  # appstate.load_warm as the app defines it (kept by _one_instance_per_model before it patches it)


def shared_model(key: str):
    """One loaded, warmed instance of an installed model per test process: the same object for the fixtures below
    and for the app's own loader in AppTest (`_one_instance_per_model`). Each instance holds its weights and, on a
    CPU, the decode kernel's panel copy of them (weights and copy: SmolLM2 1.1 GB, Gemma 2.1 GB): workers that loaded each
    model for their fixtures and again for the pages held 9-10 GB each, and with the browser tests' servers a
    fresh-clone CI run reached 23.5 of the machine's 24 GB."""
    with _shared_lock:
        if key not in _shared:
            _shared[key] = _load_warm(key)
        return _shared[key]


@pytest.fixture(scope="session", autouse=True)
def _one_instance_per_model():
    """The app's loader (appstate.load_warm) hands AppTest the process's shared instance of the embedded model and
    of Gemma; any other key (a folder a test made) loads as it always does."""
    global _load_warm
    import appstate
    from pipeline.model import EMBEDDED, GEMMA, canonical_key

    original = _load_warm = appstate.load_warm

    def load_warm(key, progress=None):
        if canonical_key(key) not in (EMBEDDED, GEMMA):
            return original(key, progress)
        lm = shared_model(canonical_key(key))
        if progress:
            progress(1.0, "ready")
        return lm

    appstate.load_warm = load_warm
    yield
    appstate.load_warm = original


@pytest.fixture(scope="session")
def smol():
    import pipeline

    return shared_model(pipeline.EMBEDDED)


@pytest.fixture(scope="session", params=["smollm2-135m-instruct", "gemma3-270m"])
def lm(request):
    if request.param not in _models():
        pytest.skip(f"{request.param} not installed (make models)")
    return shared_model(request.param)


def _tiers(node) -> list[str]:
    return [m.name for m in node.own_markers if m.name in TIERS]


def pytest_collection_modifyitems(config, items):
    """Each item's tier: its function's own tier marker, else its module's (pytestmark). The module's marker is
    then moved onto the items, so `-m unit` selects exactly the items whose tier is unit."""
    chosen, problems = [], []
    for item in items:
        own = _tiers(item) or (_tiers(item.parent) if isinstance(item.parent, pytest.Class) else [])
        mod = _tiers(item.getparent(pytest.Module))
        tiers = own or mod
        if len(set(tiers)) != 1:
            problems.append(f"{item.nodeid}: {'no tier' if not tiers else 'tiers ' + ', '.join(tiers)}")
        chosen.append(tiers[0] if tiers else None)
    if problems:
        raise pytest.UsageError("every test needs exactly one tier (tests/conftest.py):\n  " + "\n  ".join(problems))
    for item in items:  # strip tiers from modules and classes (after every item has read them) ...
        for node in item.listchain()[:-1]:
            node.own_markers[:] = [m for m in node.own_markers if m.name not in TIERS]
    for item, tier in zip(items, chosen):  # ... and give each item its one tier
        item.own_markers[:] = [m for m in item.own_markers if m.name not in TIERS]
        item.add_marker(getattr(pytest.mark, tier))
        if "gemma3" in getattr(getattr(item, "callspec", None), "id", ""):
            item.add_marker(pytest.mark.gemma)


class UnitLoadedAModel(BaseException):
    """Not an Exception: no `except Exception` on the way (load_model wraps loader errors) can swallow it."""


@pytest.fixture(autouse=True)
def _unit_tests_load_no_model(request, monkeypatch):
    """A unit test that loads model weights fails at once, whatever path it takes to them."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    import transformers

    def refuse(*a, **k):
        raise UnitLoadedAModel(f"{request.node.nodeid} is a unit test but loads a model: declare it `model` tier")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", refuse)
    yield
