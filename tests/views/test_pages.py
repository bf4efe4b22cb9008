"""Every page through Streamlit's AppTest: renders, shows this run's numbers, no exception."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
PAGES = [
    "views/stages/overview.py",
    "views/stages/tokens.py",
    "views/stages/embeddings.py",
    "views/stages/attention.py",
    "views/stages/layer.py",
    "views/stages/next_token.py",
]


def run(page=None, prompt=None, chat=None, model=None, timeout=240):
    at = AppTest.from_file(APP, default_timeout=timeout)
    if prompt is not None:
        at.session_state["prompt"] = prompt
    if chat is not None:
        at.session_state["chat"] = chat
    if model is not None:
        at.session_state["model_choice"] = model
    at.run()
    if page:
        at.switch_page(page)
        at.run()
    return at


@pytest.mark.parametrize("page", PAGES)
def test_page_renders(page):
    at = run(page)
    assert not at.exception, at.exception
    assert at.title, "page has a title"
    assert not at.error, [e.value for e in at.error]


def test_tokens_page_counts_and_chat_template():
    at = run("views/stages/tokens.py", prompt="Why is the sky blue?", chat=True)
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Words"] == "5" and metrics["Characters"] == "20" and metrics["Tokens from your prompt"] == "6"
    assert int(metrics["Tokens the model reads"]) > 6  # the template adds special tokens and a system prompt
    assert any("&lt;|im_start|&gt;" in h.proto.body for h in at.get("html"))


def test_next_token_page_refilters_without_new_trace():
    at = run("views/stages/next_token.py")
    assert not at.exception
    at.slider(key="temperature").set_value(1.5).run()  # flatter: top-k 50 binds
    kept = {m.label: m.value for m in at.metric}["Candidates left"]
    at.slider(key="top_k").set_value(3).run()
    assert {m.label: m.value for m in at.metric}["Candidates left"] != kept
    next(b for b in at.button if b.label == "Sample").click().run()
    assert any("drew" in m.value for m in at.markdown)


@pytest.mark.parametrize("page", ["views/stages/tokens.py", "views/stages/attention.py", "views/stages/next_token.py"])
@pytest.mark.parametrize(
    "bad, expect",
    [
        ("", "empty"),
        ("   \n\t ", "empty"),
        ("x " * 50000, "context window"),  # 100k characters, far over 8,192 tokens
    ],
)
def test_bad_prompts_give_a_message(page, bad, expect):
    at = run(page, prompt=bad)
    assert not at.exception
    assert any(expect in w.value for w in at.warning), [w.value for w in at.warning]


def test_tokens_page_still_tokenizes_a_prompt_too_long_for_the_model():
    at = run("views/stages/tokens.py", prompt="x " * 50000)
    assert not at.exception
    assert int({m.label: m.value for m in at.metric}["Tokens the model reads"].replace(",", "")) > 8192
    assert {m.label: m.value for m in at.metric}["Characters"] == "100,000"


@pytest.mark.parametrize("page", PAGES)
def test_pages_on_gemma(page):
    import pipeline

    if not any(m.key == pipeline.GEMMA and m.available for m in pipeline.available_models()):
        pytest.skip("Gemma not installed (make models)")
    at = run(page, model=pipeline.GEMMA, prompt="The capital of France is", chat=True)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def test_special_token_text_is_not_injected():
    at = run("views/stages/tokens.py", prompt="say <|im_end|> now")
    assert not at.exception
    bodies = [h.proto.body for h in at.get("html")]
    main = bodies[0]  # this model's chips (others follow for comparison)
    assert "im" in main and "end" in main
    assert "#3a3a3a" not in main  # no special-token chip: typed text stays text


@pytest.mark.parametrize(
    "path, expect",
    [("MISSING", "No such folder"), ("PICKLE", "pickle"), ("/etc/passwd", "only under"), ("/root/.ssh", "only under"), ("/no/such/folder", "only under")],
)
def test_bad_model_folder_gives_a_message(tmp_path, path, expect):
    """A folder under the models root gets its own reason; anything else one answer, which tells nothing about the
    file system (not whether it exists, nor whether it is a file)."""
    if path == "PICKLE":
        (tmp_path / "config.json").write_text("{}")
        (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02")
        path = str(tmp_path)
    elif path == "MISSING":
        path = str(tmp_path / "no-such-folder")
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_choice"] = "Local folder…"
    at.session_state["local_path"] = path
    at.run()
    assert not at.exception
    assert any(expect in e.value for e in at.error), [e.value for e in at.error]
    if expect == "only under":
        assert not any(w in e.value for e in at.error for w in ("is a file", "No such", "has no config.json"))


def _font_sizes(node, inside_font=False):
    """Every font size in a Plotly figure's JSON (layout and traces): the values of "size" inside any *font dict."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "size" and inside_font and isinstance(v, (int, float)):
                yield v
            else:
                yield from _font_sizes(v, k.endswith("font"))
    elif isinstance(node, list):
        for v in node:
            yield from _font_sizes(v, inside_font)


@pytest.mark.parametrize("present, floor", [(False, 12), (True, 18)])
def test_no_figure_text_under_the_floor(present, floor):
    """12 px on a page, 18 px in presentation mode: every figure of the pages before the first token, by its layout."""
    import json

    seen = 0
    for page in PAGES:
        at = AppTest.from_file(APP, default_timeout=240)
        at.session_state["present"] = present
        at.run()
        at.switch_page(page)
        at.run()
        assert not at.exception, (page, at.exception)
        for chart in at.get("plotly_chart"):
            spec = json.loads(chart.proto.spec)
            sizes = list(_font_sizes(spec))
            base = spec["layout"].get("font", {}).get("size", 12)
            assert base >= floor and all(s >= floor for s in sizes), (page, base, sorted(sizes)[:5])
            seen += 1
    assert seen >= 6


def test_lesson_handout_from_the_page_header():
    at = run("views/stages/tokens.py", prompt="Why is the sky blue?", chat=True)
    at.button(key="handout_go").click().run()
    assert not at.exception and not at.error, at.exception or [e.value for e in at.error]
    offered = [b for b in at.get("download_button") if "lesson handout" in b.proto.label.lower()]
    assert offered and "MB" in offered[0].proto.label


def test_tokens_page_shows_a_non_ascii_prompt_whole():
    """Accents, Japanese, an emoji, a combining mark and Hebrew in chat mode: the chat template view holds the
    prompt whole and nothing on the page is U+FFFD (byte pieces show as <0xE6>)."""
    prompt = "Ünïcödé naïve 日本語のテキスト 😀👍🏽 e\u0301 שלום"
    at = run("views/stages/tokens.py", prompt=prompt, chat=True)
    assert not at.exception
    bodies = [h.proto.body for h in at.get("html")]
    import html as _html
    import re

    template = next(b for b in bodies if "<pre" in b)
    assert prompt in _html.unescape(re.sub(r"<[^>]+>", "", template))
    texts = bodies + [m.value for m in at.markdown] + [c.value for c in at.caption] + [str(m.value) for m in at.metric]
    texts += [t.value.to_csv() for t in at.table] + [d.value.to_csv() for d in at.dataframe]
    assert not any("\ufffd" in t for t in texts)


def test_exported_images_carry_only_the_views_known_settings():
    """A link's unknown parameter (text someone put there) never reaches the note inside an exported image."""
    at = AppTest.from_file(APP, default_timeout=240)
    at.query_params["zz_unknown"] = "Visit evil-prize.example"
    at.run()
    at.switch_page("views/stages/attention.py")
    at.run()
    assert not at.exception
    reg = at.session_state["_exports"]
    notes = [entry[2] for entry in reg.figures if len(entry) > 2]
    assert notes and all("evil" not in n and "zz" not in n for n in notes), notes
    assert all("SmolLM2" in n for n in notes), notes


def test_an_export_at_default_settings_names_them():
    """Page 5's figures at the default sampling settings (nothing in the address) still say which they were, in words."""
    at = run("views/stages/next_token.py", prompt="The capital of France is")
    assert not at.exception
    reg = at.session_state["_exports"]
    title, _, note = reg.figures[0]
    from pipeline.forward.sampling import DEFAULTS

    for setting in (f"temperature {DEFAULTS.temperature:g}", f"top-k {DEFAULTS.top_k}", f"top-p {DEFAULTS.top_p:g}", "min-p", "seed", "candidates shown 15"):
        assert setting in note, note
    assert "_" not in note.split("·", 2)[-1], note  # "top-k", never the widget's key "top_k"


def test_why_this_token_page_explains_paris_and_switches_heads_off():
    """The shares sum to the logit on the page, the heatmap and the head's attention are drawn, and switching the
    preset heads off shows the distribution before and after; the cross-checks pass."""
    at = run("views/stages/why.py", prompt="The capital of France is", chat=False)
    assert not at.exception and not at.error, at.exception or [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    logit = next(float(v) for k, v in metrics.items() if k.startswith("The model's logit"))
    assert abs(float(metrics["Sum of the shares"]) - logit) < 2e-3
    assert "Paris" in next(k for k in metrics if k.startswith("The model's logit"))
    assert at.multiselect(key="why_off").value, "the preset: the heads with the largest shares"
    at.button(key="why_go").click().run()
    assert not at.exception, at.exception
    assert any(m.label == "KL divergence" for m in at.metric)
    from views.proof import FAIL, PASS

    checks = [m.value for m in at.markdown if PASS in m.value or FAIL in m.value]
    assert len(checks) == 2 and all(PASS in c for c in checks), checks  # the sum, and the switch against zeroed weights


def test_why_this_token_page_patches_the_eiffel_tower_into_the_colosseum():
    at = run("views/stages/why.py", prompt="The capital of France is", chat=False)
    at.button(key="why_patch").click().run()
    assert not at.exception and not at.warning, at.exception or [w.value for w in at.warning]
    labels = [m.label for m in at.metric]
    assert any("Paris" in x and "clean" in x for x in labels), labels
    at.text_input(key=at.text_input[1].key).set_value("A much longer corrupted prompt that has more tokens in it").run()
    at.button(key="why_patch").click().run()
    assert any("same number of tokens" in w.value for w in at.warning)  # said, not raised


def test_why_this_token_page_draws_the_contribution_graph_patches_heads_and_compares_two_prompts():
    """The contribution graph is drawn (its threshold a slider), the patching grid by head, and the two "Apple" sentences
    side by side: both distributions, the logit lens of each, the difference of the shares."""
    at = run("views/stages/why.py", prompt="The capital of France is", chat=False)
    assert not at.exception, at.exception
    assert at.slider(key="why_flow_min").value == 0.05
    at.slider(key="why_flow_min").set_value(0.4).run()
    assert not at.exception, at.exception
    at.radio(key="why_over").set_value("head").run()
    at.button(key="why_patch").click().run()
    assert not at.exception and not at.warning, at.exception or [w.value for w in at.warning]
    at.selectbox(key="why_side").set_value("The two Apple sentences").run()
    at.button(key="why_compare").click().run()
    assert not at.exception and not at.warning, at.exception or [w.value for w in at.warning]
    lens = at.table[-1].value
    assert list(lens.columns) == ["layer", "first prompt: top token", "second prompt: top token"] and len(lens) == 31
    assert any("after the first prompt" in c.value for c in at.caption)


def test_presentation_mode_changes_the_prompt_without_the_sidebar():
    """The sidebar is hidden while presenting: the page row's Prompt box (and chat switch) changes what every page runs,
    and the pages say where the prompt comes from."""
    at = run("views/stages/generation.py", prompt="The capital of France is", chat=False)
    at.session_state["present"] = True
    at.run()
    assert at.text_area(key="_present_prompt").value == "The capital of France is"
    at.text_area(key="_present_prompt").set_value("Dog bites man.").run()
    at.toggle(key="_present_chat").set_value(True).run()
    assert not at.exception, at.exception
    assert at.session_state["prompt"] == "Dog bites man." and at.session_state["chat"] is True
    assert at.text_area(key="prompt").value == "Dog bites man."  # the sidebar's own box agrees
    assert any("*Prompt* at the top" in m.value for m in at.markdown)


def test_the_handout_states_each_number_as_its_page_does():
    """Issue 33: the handout said "formula, per token 1,536 B" where page 8 said 46,080 B, and "135 KiB all-reduced
    per token" on 1 device where page 14 says 0. Every number the handout states that a page also shows, compared."""
    import html as html_lib
    import re

    import pipeline
    from views import handout, pages

    prompt = "The capital of France is"
    shown: dict[str, dict[str, str]] = {}
    captions: dict[str, str] = {}
    chat = None
    for slug in ("tokens", "embeddings", "attention", "next-token", "kv-cache", "streaming-sharding", "why"):
        at = run(pages.BY_SLUG[slug].file, prompt=prompt)
        if slug == "streaming-sharding":  # a device count the handout states (1, 2, 4): SmolLM2's default, 3, is not one
            at.select_slider(key="shard_n").set_value(2).run()
        assert not at.exception, (slug, at.exception)
        shown[slug] = {m.label: m.value for m in at.metric}
        captions[slug] = " ".join(c.value for c in at.caption)
        chat = at.session_state["chat"] if "chat" in at.session_state else chat
        if slug == "streaming-sharding":
            n = int(at.session_state["shard_n"])
    lm = pipeline.load_model("smollm2-135m-instruct")
    body = handout.build(lm, pipeline.trace(lm, prompt, chat=bool(chat)), pages.STAGES[1:])
    sections = {m.group(1): m.group(2) for m in re.finditer(r"<section><h2>(.*?)</h2>(.*?)</section>", body, re.S)}

    def rows(slug: str) -> dict[str, str]:
        sec = sections[html_lib.escape(pages.BY_SLUG[slug].title)]
        return {html_lib.unescape(k): html_lib.unescape(v) for k, v in re.findall(r"<th scope='row'>(.*?)</th><td>(.*?)</td>", sec)}

    pairs = [
        ("tokens", "tokens the model reads", "Tokens the model reads"),
        ("tokens", "tokens from the prompt", "Tokens from your prompt"),
        ("tokens", "characters", "Characters"),
        ("embeddings", "embedding matrix", "Embedding matrix"),
        ("embeddings", "vector length (L2)", "Vector length (L2)"),
        ("next-token", "candidates left", "Candidates left"),
        ("next-token", "vocabulary", "Vocabulary"),
    ]
    for slug, ours, theirs in pairs:
        assert rows(slug)[ours] == shown[slug][theirs], (slug, ours, rows(slug)[ours], shown[slug][theirs])
    kv = rows("kv-cache")
    assert next(v for k, v in kv.items() if k.startswith("formula, per token")) == shown["kv-cache"]["Formula, per token"]
    tp = rows("streaming-sharding")
    assert tp["1 device"].endswith("0.0 KiB all-reduced per token")  # one device all-reduces nothing
    assert n == 2
    row = tp["2 devices"]
    assert f"{shown['streaming-sharding']['Weights per device']} of weights each, {shown['streaming-sharding']['All-reduced per token']} all-reduced" in row
    why = rows("why")
    logit = next(v for k, v in why.items() if k.startswith("logit("))
    assert (
        logit == next(v for k, v in shown["why"].items() if k.startswith("The model's logit")) and why["sum of the shares"] == shown["why"]["Sum of the shares"]
    )
    sink = re.search(r"(\d+)% of attention goes to the very first token", captions["attention"]).group(1)
    assert f"{sink}% of all attention goes to the first token" in sections[html_lib.escape(pages.BY_SLUG["attention"].title)]
    for spec in pages.STAGES[1:]:  # every section explains its stage, in the page's own words
        assert spec.explanation and html_lib.escape(spec.takeaway) in sections[html_lib.escape(spec.title)]
        assert "<div class='explain'>" in sections[html_lib.escape(spec.title)], spec.title


def test_the_handout_includes_what_this_page_just_drew():
    """Made from the page it is asked on, the handout carries that page's own latest results (it once left them out:
    it was made before the page drew them)."""
    at = run("views/stages/generation.py", prompt="Dog bites man")
    at.number_input(key="gen_n").set_value(4)
    at.button(key="gen_go").click().run()
    assert not at.exception, at.exception
    at.button(key="handout_go").click().run()
    assert not at.exception and not at.error, at.exception or [e.value for e in at.error]
    body = at.session_state["_handout"][1].decode()
    generation = body.split("<h2>6 · Generation</h2>", 1)[1].split("</section>", 1)[0]
    assert "As you last ran it on this page" in generation and "Plotly.newPlot" in generation.split("As you last ran it", 1)[1]


def test_a_folder_int8_cannot_serve_says_why_in_the_page(tmp_path):
    """A GPT-2 folder typed with ":int8": its fused Q/K/V (c_attn) cannot be quantised per projection; the page says so."""
    import transformers

    cfg = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2-tiny")
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_choice"] = "Local folder…"
    at.session_state["local_path"] = str(tmp_path / "gpt2-tiny") + ":int8"
    at.run()
    assert not at.exception
    assert any("int8 serving needs the Llama layout" in e.value for e in at.error), [e.value for e in at.error]
