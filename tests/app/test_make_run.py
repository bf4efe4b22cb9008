"""`make run` serves this machine only: Streamlit binds localhost unless HOST opens it (and then says what a visitor
reaches); the project's own config says the same for a bare `streamlit run app.py`."""

import subprocess
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def dry(*args) -> str:
    return subprocess.run(["make", "-n", "-W", ".venv/.installed", *args, "run"], capture_output=True, text=True, cwd=ROOT).stdout


def test_make_run_listens_on_localhost_only():
    out = dry()
    line = next(x for x in out.splitlines() if "streamlit run app.py" in x)
    assert "--server.address localhost" in line


def test_opening_it_to_the_network_is_explicit_and_says_what_a_visitor_reaches():
    out = dry("HOST=0.0.0.0")
    assert "--server.address 0.0.0.0" in out and "operator page without a password" in out


def test_the_config_binds_localhost():
    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["address"] == "localhost"
