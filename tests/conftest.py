import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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
