"""AppTest for the pages after the first token: generation, prefill vs decode, KV cache, hardware."""

import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")


@pytest.fixture(autouse=True)
def two_repeats(monkeypatch):
    """Timed experiments with 2 interleaved repeats instead of 3-5 (suite time; 2 still interleave, and a verdict
    reads them): the pages' own repeat count comes through views.guard.cap, as a demo server's cap would."""
    from dataclasses import replace

    from hosting import demo
    from views import guard

    monkeypatch.setattr(guard, "policy", lambda: demo.Policy(caps=replace(demo.UNCAPPED, repeats=2)))


def page(path, prompt="The capital of France is", timeout=300):
    at = AppTest.from_file(APP, default_timeout=timeout)
    at.session_state["prompt"] = prompt
    at.run()
    at.switch_page(path)
    at.run()
    assert not at.exception, at.exception
    return at


def common_pass():
    from views.proof import PASS

    return PASS


def known(at, *names):
    """The page's "How do we know?" boxes: each named check is there and passed."""
    lines = [m.value for e in at.expander if e.label.startswith("How do we know") for m in e.markdown]
    for n in names:
        assert any(n in ln and ln.startswith(common_pass()) for ln in lines), (n, lines)
    return lines


def button(at, key):
    return next(b for b in at.button if b.key == key)


def metric(at, label):
    return {m.label: m.value for m in at.metric}[label]


def test_generation_streams_and_shows_metrics_and_distributions():
    at = page("views/stages/generation.py")
    assert any("Generate" in i.value for i in at.info)
    assert at.toggle(key="chat").value is False  # one switch, the sidebar's: off for this completion-style prompt
    assert any("Chat mode: **off** (the switch under the prompt in the sidebar)" in c.value for c in at.caption)
    at.number_input(key="gen_n").set_value(8)
    at.slider(key="gen_t").set_value(0.0)
    button(at, "gen_go").click().run()
    assert not at.exception, at.exception
    assert int(metric(at, "Tokens generated")) == 8
    assert metric(at, "Time to first token").endswith("ms")
    rec = at.session_state["_runs"]["gen"][1]
    answer = [c.value for c in at.code if "Paris" in c.value]
    assert answer == [rec.text()]  # the answer verbatim, in a code block: never read as Markdown
    assert [c.value for c in at.code][0] == "The capital of France is"  # the prompt too
    button(at, "chk_gen").click().run()
    known(at, "greedy tokens = transformers' model.generate", "time per output token")
    assert len(at.get("plotly_chart")) >= 2  # the chosen token's distribution + step times


def test_generation_caps_and_bad_prompt():
    at2 = page("views/stages/generation.py", prompt="   ")
    button(at2, "gen_go").click().run()
    assert not at2.exception
    assert any("empty" in w.value for w in at2.warning)


def test_prefill_decode_sweep_and_cache_experiment():
    at = page("views/stages/prefill_decode.py")
    at.select_slider(key="sweep_max").set_value(256)  # suite time
    button(at, "sweep_go").click().run()
    assert not at.exception, at.exception
    assert len(frames(at)) == 1 and len(frames(at)[0]) == 3
    button(at, "cache_go").click().run()
    assert not at.exception, at.exception
    assert metric(at, "Same tokens") == "yes"
    known(at, "greedy tokens with the cache = without it", "each prefill is one forward pass")


def test_the_same_question_again_is_prefilled_from_the_prefix_cache_and_page_7_says_so():
    prompt = "Alice, Bob, Charlie and Diana each ordered a different coffee at the small cafe on the corner."
    at = page("views/stages/generation.py", prompt=prompt)
    at.number_input(key="gen_n").set_value(2)
    for _ in range(2):  # the second time, the engine has this prompt's blocks (every one but the last) cached
        button(at, "gen_go").click().run()
        assert not at.exception, at.exception
    cached = at.session_state["_runs"]["gen"][1].events[0].cached_tokens
    assert cached > 0 and cached % 8 == 0
    at.switch_page("views/stages/prefill_decode.py")
    at.run()
    assert not at.exception, at.exception
    assert any(c.value.startswith(f"{cached} of the ") and "not computed" in c.value for c in at.caption)


def test_kv_cache_formula_equals_measured():
    at = page("views/stages/kv_cache.py")
    assert metric(at, "Formula, per token") == "46,080 B"  # SmolLM2 fp32: 2 x 30 x 3 x 64 x 4
    assert metric(at, "Measured, per token") == "46,080 B"
    assert metric(at, "Agree") == "yes"
    known(at, "cache tensors' bytes")


def test_hardware_telemetry_and_probe_on_cpu():
    at = page("views/stages/hardware.py")
    at.slider(key="hw_n").set_value(8)
    button(at, "hw_go").click().run()
    assert not at.exception, at.exception
    assert any("psutil" in c.value for c in at.caption) or at.session_state["hw_timeline"][1].source == "nvml"
    button(at, "hw_probe").click().run()
    assert not at.exception, at.exception
    import re

    share = next(m for m in at.metric if m.label == "Matmul share of a decode step")
    assert "GFLOP/s" in at.metric[0].value and re.fullmatch(r"\d+ %", share.value) and re.fullmatch(r"range \d+–\d+ %", share.delta)
    known(at, "matmul FLOP/s = 2 ×", "matmul share =", "telemetry sampled")


def test_speculative_page_shows_equality_and_speedup():
    at = page("views/stages/speculative.py")
    at.number_input(key="spec_n").set_value(24)
    button(at, "spec_go").click().run()
    assert not at.exception, at.exception
    assert metric(at, "Acceptance rate α").endswith("%")
    assert any("identical to plain greedy" in m.value and m.value.startswith(common_pass()) for m in at.markdown)
    known(at, "speculative greedy output = plain greedy decoding", "accepted per call")
    assert at.toggle(key="spec_own").value is False and at.code[0].value == "The capital of France is"  # the sidebar's prompt


def test_streaming_and_sharding_page_labels_the_plan():
    at = page("views/stages/streaming_sharding.py")
    assert any("event: token" in c.value for c in at.code)
    assert any("plan computed" in m.value for m in at.markdown)
    assert any("its own short generation" in c.value for c in at.caption)  # page 6 has not run here
    assert at.select_slider(key="shard_n").value == 3 and not at.warning  # 9 and 3 heads split by 3
    known(at, "the event stream, parsed back", "the plan places every weight once")
    at.select_slider(key="shard_n").set_value(4).run()
    assert not at.exception
    assert any("query heads" in w.value for w in at.warning)


@pytest.mark.load  # a minute-long experiment through the page (its pipeline function is tested in make test): make test-load
def test_attention_kernels_page():
    at = page("views/stages/attention_kernels.py")
    assert any("Run the kernels" in i.value for i in at.info)
    at.select_slider(key="kern_max").set_value(512)  # the sweep's shorter half (suite time)
    button(at, "kern_go").click().run()
    assert not at.exception, at.exception
    assert any(m.value.startswith(common_pass()) and "same logits" in m.value for m in at.markdown)
    assert len(frames(at)[0]) == 2 * 3  # 2 lengths x (eager, math, flash) on CPU
    known(at, "every kernel gives the same logits")


def test_roofline_page():
    at = page("views/stages/roofline.py")
    at.select_slider(key="roof_T").set_value(64)
    at.select_slider(key="roof_C").set_value(64)
    button(at, "roof_go").click().run()
    assert not at.exception, at.exception
    assert "GFLOP/s" in metric(at, "Peak matmul (measured)") and len(frames(at)) == 2
    known(at, "each operation's bound", "ridge = peak", "matmul FLOP/s")


@pytest.mark.load  # a minute-long experiment through the page (its pipeline function is tested in make test): make test-load
def test_production_page():
    at = page("views/stages/production.py")
    at.slider(key="prod_n").set_value(16)
    button(at, "prod_go").click().run()
    assert not at.exception, at.exception
    table = frames(at)[0]
    assert list(table["mode"]) == ["dynamic cache (transformers)", "static cache (transformers)", "fused step"]
    assert table["same tokens"].all() and (table["tok/s"] > 0).all() and "CPU %" in table.columns
    assert "tok/s" in metric(at, "fused step")
    text = " ".join(m.value for m in at.markdown)
    assert "operators per token" in text and "largest relative difference" in text and ":red[" not in text


def test_speculative_with_a_local_model_folder_as_draft():
    import pipeline

    at = page("views/stages/speculative.py")
    at.selectbox(key="spec_kind").set_value("a local model folder…").run()
    at.text_input(key="spec_folder").set_value("/no/such/folder").run()
    assert any("only under" in e.value for e in at.error)  # outside the models root: nothing said about the path
    at.text_input(key="spec_folder").set_value(f"{tempfile.gettempdir()}/no-such-model-folder").run()
    assert any("No such folder" in e.value for e in at.error)
    folder = pipeline.load_model().source  # the embedded model's converted folder (the explorer's own cache): same tokenizer
    at.text_input(key="spec_folder").set_value(folder).run()
    at.number_input(key="spec_n").set_value(12)
    button(at, "spec_go").click().run()
    assert not at.exception, at.exception
    assert metric(at, "Acceptance rate α") == "100%"  # the same model drafts perfectly


@pytest.mark.load  # a minute-long experiment through the page (its pipeline function is tested in make test): make test-load
def test_batching_page_runs_the_three_policies_and_checks_every_answer():
    at = page("views/stages/batching.py")
    assert any("Run the three policies" in i.value for i in at.info)
    assert "Requests running" in [m.label for m in at.metric]  # the live panel of the shared engine
    at.selectbox(key="batch_preset").set_value("Everyone at once, same length").run()
    button(at, "batch_go").click().run()
    assert not at.exception, at.exception
    labels = [m.label for m in at.metric]
    assert "Throughput, continuous" in labels and "Padding rows computed (static)" in labels
    assert len(at.get("plotly_chart")) >= 5  # gantt, occupancy, 2 x KV, latency
    table = next(d for d in frames(at) if "policy" in d.columns)
    assert list(table["policy"]) == ["one after another", "static", "continuous"]
    assert (table["tokens"] == 4 * 24).all()  # every answer exactly 24 tokens
    assert not any("other generation" in w.value for w in at.warning)  # alone: its own four users are not "others"
    button(at, "chk_scene").click().run()
    assert not at.exception, at.exception
    marks = [m.value for m in at.markdown if "generated alone" in m.value]
    assert len(marks) == 3 and all(m.startswith(common_pass()) for m in marks), marks


def test_misconceptions_page_tests_each_myth():
    at = page("views/stages/misconceptions.py")
    lines = [m.value for m in at.markdown if m.value.startswith((common_pass(), ":red["))]
    assert len(lines) == 7 and all(ln.startswith(common_pass()) for ln in lines), lines  # words 3, temperature 3, memory 1
    button(at, "myth_force").click().run()
    assert not at.exception, at.exception
    assert any("changing one token changes what follows" in m.value for m in at.markdown)
    shown = [h.proto.body for h in at.get("html")]
    assert sum("outline:2px solid" in b for b in shown) == 2  # the answer as generated and with the forced token, the step boxed


def test_misconceptions_page_compares_the_shared_engines_logits_bit_for_bit():
    """Issue 34: the same prompt in the engine every visitor shares, beside other requests and from the prefix cache,
    every step's logits compared with the request alone: 0 differing values (with the C kernels built)."""
    from pipeline.decode_step.choice import CHOICE

    at = page("views/stages/misconceptions.py", prompt="Why is the sky blue? Explain it to a child in two sentences.")  # 2 KV blocks and more
    button(at, "myth_shared").click().run(timeout=300)
    assert not at.exception, at.exception
    table = next(t for t in frames(at) if "differing values" in t.columns)
    assert len(table) == 2 and (table["logits compared"] > 0).all() and table["same tokens"].all()
    assert table["most requests in one pass"].max() > 1, "nothing shared its passes"
    assert table["prompt tokens from the prefix cache"].iloc[1] > 0
    if CHOICE.c_kernels():
        assert (table["differing values"] == 0).all(), table
        assert any("bit for bit as alone" in m.value and m.value.startswith(common_pass()) for m in at.markdown)


def frames(at) -> list:
    """Every table the page drew, as DataFrames: short ones are HTML tables (st.table), long ones data grids."""
    return [t.value for t in at.table] + [d.value for d in at.dataframe]


def test_precision_lesson_on_the_production_page():
    """Page 12's lower-precision section: fp32, bf16 and int8 side by side with tok/s, bytes, differing tokens."""
    at = page("views/stages/production.py")
    button(at, "prec_go").click().run()
    assert not at.exception, at.exception
    table = next(t for t in frames(at) if "precision" in t.columns)
    assert list(table["precision"]) == ["fp32 (default)", "bf16", "int8 weight-only"]
    assert (table["tok/s"] > 0).all() and table["weight MB / token"].iloc[1] * 2 == pytest.approx(table["weight MB / token"].iloc[0], rel=0.01)
    assert table["answer tokens that differ"].iloc[0].startswith("0 of")
    assert "tok/s" in metric(at, "bf16") and "MB of weights a token" in " ".join(m.delta or "" for m in at.metric)


def test_an_int8_model_picked_in_the_sidebar_says_its_precision_and_its_answer_beside_fp32():
    """The picker offers SmolLM2's int8 variant by its label; its answer says it was served in int8, and on request
    the tokens that differ from fp32 and the largest logit difference (both models' forward, teacher-forced)."""
    import re

    from pipeline.model import EMBEDDED

    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["prompt"] = "Why is the sky blue?"
    at.session_state["chat"] = True
    at.session_state["model_choice"] = EMBEDDED + ":int8"
    at.run()
    at.switch_page("views/stages/generation.py")
    at.run()
    assert not at.exception, at.exception
    picker = at.sidebar.selectbox(key="model_choice")
    assert picker.value == EMBEDDED + ":int8" and "SmolLM2-135M (embedded, int8)" in picker.options
    at.number_input(key="gen_n").set_value(12)
    at.slider(key="gen_t").set_value(0.0)
    button(at, "gen_go").click().run()
    assert not at.exception, at.exception
    rec = at.session_state["_runs"]["gen"][1]
    assert rec.model == "SmolLM2-135M-Instruct (int8)" and len(rec.events) == 12
    served = next(c.value for c in at.caption if "served this answer in int8 weight-only" in c.value)
    from pipeline.decode_step import CHOICE

    assert ("int8 panels" in served) == CHOICE.c_kernels()  # the kernel choice's reason for an int8 model's pass
    button(at, "gen_fp32").click().run()
    assert not at.exception, at.exception
    m = re.fullmatch(r"(\d+) of (\d+)", metric(at, "Tokens that differ from fp32"))
    assert m and int(m[2]) == 12 and int(m[1]) <= 12
    assert 0 < float(metric(at, "Largest logit difference")) < 10
    assert any(c.value.startswith("What was compared: the prompt and this answer's 12 tokens") for c in at.caption)
    assert [c.value for c in at.code if c.value == rec.text()]  # the answer verbatim
