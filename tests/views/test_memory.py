"""One visitor, many long prompts, every page: the server's memory levels off.

Measured before the fix: one session, 12 prompts of ~1,300 tokens through pages 2 and 5 grew RSS 1.7 -> 4.1 GB
and never levelled off; widgets whose format_func was a lambda in a page script kept that page's whole
namespace (its trace, ~220 MB) in Streamlit's widget metadata, one entry per distinct prompt. Now every cache
has a bound in bytes and widget callbacks hold plain data only (views/render.py)."""

import ctypes
import gc
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from streamlit.testing.v1 import AppTest

from views import pages

pytestmark = pytest.mark.load

ROOT = Path(__file__).resolve().parents[2]
PAGES = [p.file for p in pages.STAGES if p.slug != "misconceptions"]  # every stage but the misconceptions (their own test)
N_PROMPTS = 12
BUDGET_GB = 4.5  # the README's figure for one server with the embedded model
WORDS = ("sky light blue scatter wave air sun red evening molecule colour photon short long violet eye atmosphere noon dusk cloud").split()


def long_prompt(i: int) -> str:
    """~1,300 distinct tokens: a different word order for every i, so no cache can answer it."""
    words = [WORDS[(i * 7 + j * (i + 3)) % len(WORDS)] for j in range(1100)]
    return f"Note {i}. " + " ".join(words) + "."


def rss_gb() -> float:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back: count what is held, not fragmentation
    except OSError:
        pass
    return psutil.Process().memory_info().rss / 2**30


def one_session() -> list[float]:
    """Run in a process of its own (as a server is): one AppTest session, every page, N_PROMPTS long prompts."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.session_state["chat"] = False
    at.run()
    seen = []
    for i in range(N_PROMPTS):
        at.session_state["prompt"] = long_prompt(i)
        for page in PAGES:
            at.switch_page(page)
            at.run()
            if at.exception:
                raise RuntimeError(f"{page}: {at.exception}")
        seen.append(rss_gb())
    return seen


@pytest.mark.load  # minutes: make test-load (the class load test checks the server stays flat too)
def test_one_session_many_long_prompts_every_page_memory_levels_off():
    out = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=3000, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    half = N_PROMPTS // 2
    growth = max(seen[half:]) - seen[half - 1]
    print("RSS of the server process after each prompt, GB:", [round(x, 2) for x in seen])
    assert growth < 0.35, f"still growing over the last {N_PROMPTS - half} prompts: {seen}"
    assert max(seen) < BUDGET_GB, seen


if __name__ == "__main__":
    print(json.dumps(one_session()))
