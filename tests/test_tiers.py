"""The tier rules of tests/conftest.py, on small suites run under it: a unit test that loads a model fails, a test
without a tier (or with two) stops the collection, and a function's tier replaces its module's for `-m`."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()


def _suite(pytester, body: str):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sample=body)


def test_a_unit_test_that_loads_a_model_fails(pytester):
    _suite(
        pytester,
        """
import pytest
pytestmark = pytest.mark.unit

def test_loads():
    import transformers
    transformers.AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")  # where every loader ends
""",
    )
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*is a unit test but loads a model*"])


def test_a_test_without_a_tier_stops_the_collection(pytester):
    _suite(pytester, "def test_nothing():\n    pass\n")
    res = pytester.runpytest("-p", "no:cacheprovider")
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*every test needs exactly one tier*", "*test_nothing: no tier*"])


def test_a_functions_tier_replaces_its_modules(pytester):
    _suite(
        pytester,
        """
import pytest
pytestmark = pytest.mark.model

def test_heavy():
    pass

@pytest.mark.unit
def test_light():
    pass
""",
    )
    unit = pytester.runpytest("-p", "no:cacheprovider", "-m", "unit", "-q")
    unit.assert_outcomes(passed=1, deselected=1)
    unit.stdout.fnmatch_lines(["*1 passed, 1 deselected*"])
    model = pytester.runpytest("-p", "no:cacheprovider", "-m", "model", "-q")
    model.assert_outcomes(passed=1, deselected=1)
