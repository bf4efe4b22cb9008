"""Shared fixtures, and the test tiers: every test gets one marker from what it needs, so
`pytest -m unit` (make test-fast) runs the no-model tier in seconds.

    unit     no model, no browser
    model    loads the embedded SmolLM2 model (directly, or through a page)
    gemma    needs Gemma-3 270M (make models)
    browser  the whole app in headless Chromium
    gpu      needs a CUDA device
    cluster  a local Ray cluster with engine replicas (Ray Serve)
    load     the class load test, minutes long (make test-load; not in make test)
"""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL_FIXTURES = {"smol", "lm"}
TIERS = ("unit", "model", "gemma", "browser", "gpu", "cluster", "load")


def _models():
    import pipeline

    return [m.key for m in pipeline.available_models() if m.available]


@pytest.fixture(scope="session")
def smol():
    import pipeline

    return pipeline.load_model(pipeline.EMBEDDED)


@pytest.fixture(scope="session", params=["smollm2-135m-instruct", "gemma3-270m"])
def lm(request):
    import pipeline

    if request.param not in _models():
        pytest.skip(f"{request.param} not installed (make models)")
    return pipeline.load_model(request.param)


def pytest_collection_modifyitems(config, items):
    """A test marked explicitly keeps its tier; otherwise: tests/browser -> browser, tests/views (pages run the
    model) or a model fixture -> model (+ gemma for Gemma's parameter), anything else -> unit."""
    for item in items:
        own = {m.name for m in item.iter_markers()} & set(TIERS)
        path = str(item.path)
        if "gemma" in item.name.lower() or "gemma3" in getattr(getattr(item, "callspec", None), "id", ""):
            item.add_marker(pytest.mark.gemma)
            own.add("gemma")
        if own:
            continue
        if "/tests/browser/" in path:
            item.add_marker(pytest.mark.browser)
        elif "/tests/views/" in path or MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        else:
            item.add_marker(pytest.mark.unit)
