"""Eight visitors press Generate at the same moment in real Chromium; a ninth opens the attention page meanwhile.

Each visitor gets their own answer (equal to their prompt's greedy answer generated alone: no cross-talk between
sessions sharing the engine), and the ninth page renders. The ninth page's time next to its time on an idle
server is printed (a figure for bench/, never asserted: these machines are shared and noisy)."""

import time

import pytest
from ui import no_exception, set_prompt, wait_idle

from pipeline.lab.scene import VISITOR_PROMPTS

pytestmark = pytest.mark.load

PROMPTS = VISITOR_PROMPTS
N_TOKENS = 10
SUB = str.maketrans("", "", "₀₁₂₃₄₅₆₇₈₉")


def open_generation(browser, server, prompt):
    page = browser.new_page(viewport={"width": 1300, "height": 1100})
    page.goto(f"{server}/generation?chat=true", wait_until="domcontentloaded")  # the answers are checked in chat mode
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    set_prompt(page, prompt)
    n = page.locator(".st-key-gen_n input").first
    n.fill(str(N_TOKENS))
    n.press("Enter")
    wait_idle(page)
    page.locator(".st-key-gen_t input[type='range']").first.focus()
    page.keyboard.press("Home")  # temperature 0: greedy
    wait_idle(page)
    return page


def pills(page):
    return [t.strip().rsplit(" ", 1)[0].strip() for t in page.locator(".st-key-gen_pick button").all_inner_texts()]


def timed_attention(browser, server):
    page = browser.new_page(viewport={"width": 1300, "height": 1100})
    t = time.perf_counter()
    page.goto(f"{server}/attention?fresh={time.perf_counter()}", wait_until="domcontentloaded")
    page.wait_for_selector(".js-plotly-plot", timeout=600_000)
    wait_idle(page, 600_000)
    dt = time.perf_counter() - t
    no_exception(page)
    page.close()
    return dt


@pytest.mark.load  # minutes: make test-load
def test_eight_visitors_generate_at_once_each_gets_their_own_answer(server, browser):
    import pipeline
    from components.tokens import visible

    lm = pipeline.load_model()
    # a pill is one line: visible()'s ↵ stays, the newline after it does not
    want = {p: [(visible(e.text) or "∅").replace("\n", "").strip() for e in pipeline.generate(lm, p, N_TOKENS, chat=True, cache="dynamic")] for p in PROMPTS}
    timed_attention(browser, server)  # warm: the model loaded, the trace cached
    idle_s = timed_attention(browser, server)
    pages = [open_generation(browser, server, p) for p in PROMPTS]
    for page in pages:  # as close to the same moment as one driver gets
        page.get_by_role("button", name="Generate").first.click()
    ninth_s = timed_attention(browser, server)
    for prompt, page in zip(PROMPTS, pages):
        wait_idle(page, 600_000)
        no_exception(page)
        assert pills(page) == want[prompt], prompt
    print(f"attention page: {idle_s:.1f} s on an idle server, {ninth_s:.1f} s while 8 visitors generate ({ninth_s / idle_s:.2f}x)")
