import re

import numpy as np
import pytest

from components import bertviz_offline
from components.attention_figures import attention_heads, mosaic_image
from components.figures import drift_figure, lens_figure, pca_figure, sampling_figure, timings_bar
from components.tokens import chips_html, lit, token_rows, visible
from pipeline.forward.tokens import Segment, Token

pytestmark = pytest.mark.unit


def _toks():
    toks = (
        Token(1, "<s>", b"", "<s>", 0, 0, True, 0),
        Token(72, "Hi", b"Hi", "Hi", 0, 2, False, 1),
        Token(5, "\u0120<", b" <", " <", 2, 4, False, 2),
        Token(9, "x", b"\xf0\x9f", "<0xF0><0x9F>", 4, 5, False, 3),
        Token(10, "y", b"\x91\x8b", "<0x91><0x8B>", 4, 5, False, 3),
    )
    segs = (Segment("", 0, 0, (0,)), Segment("Hi", 0, 2, (1,)), Segment(" <", 2, 4, (2,)), Segment("👋", 4, 5, (3, 4)))
    return toks, segs


def test_chips_escape_html_show_ids_and_whitespace():
    toks, segs = _toks()
    html = chips_html(toks, segs)
    assert "&lt;s&gt;" in html and "<s>" not in html  # special token shown, escaped
    assert "👋" in html and "9 10" in html  # one chip, both ids under it
    assert "·&lt;" in html  # the space is a visible glyph
    assert visible("a\tb\n\x00") == "a→b↵\n⟨NUL⟩"
    assert visible("x\u202ey\u200bz") == "x⟨U+202E⟩y⟨ZWSP⟩z" and visible("👨\u200d👩") == "👨\u200d👩"
    assert token_rows(toks)[3]["bytes"] == "f0 9f"


def test_figures_have_data():
    maps = np.random.default_rng(0).dirichlet(np.ones(6), size=(4, 6)).astype(np.float16)
    fig = attention_heads(maps, [f"{i}:t" for i in range(6)])
    assert len(fig.data) == 4
    z = np.array(fig.data[0].z, dtype=float)
    assert np.isnan(z[0, 5]) and not np.isnan(z[5, 0])  # causal upper triangle masked
    img = mosaic_image(np.stack([maps, maps, maps]), cell=12, gap=2)  # 3 layers x 4 heads, 6 -> 12 px tiles
    assert img.shape == (4 * 14 - 2, 3 * 14 - 2, 3) and img.dtype == np.uint8 and img.std() > 0
    f = sampling_figure(["a", "b", "c"], [("softmax", np.array([0.5, 0.3, 0.2])), ("top-k", np.array([0.625, 0.375, 0]))])
    assert f.data[1].text[2] == "✗" and list(f.data[1].marker.color)[2] != list(f.data[1].marker.color)[0]
    assert len(pca_figure(np.zeros((3, 3)), ["a", "b", "c"], ["prompt"] * 2 + ["reference"], dims=3).data) == 2
    assert len(drift_figure({"x": np.ones(4), "y": np.linspace(1, 0, 4)}, "t").data) == 2
    assert len(lens_figure(np.zeros((3, 2), int), np.ones((3, 2)) * 0.5, [["a", "b"]] * 3, ["p0", "p1"]).data) == 1
    assert len(timings_bar({"tokenize": 0.001, "layer 0": 0.002, "layer 1": 0.002, "total": 1}).data[0].y) == 2


def test_bertviz_html_is_offline_and_small():
    att = np.random.default_rng(1).dirichlet(np.ones(8), size=(6, 4, 8)).astype(np.float32)
    html = bertviz_offline.offline_html("head", att, [f"t{i}" for i in range(8)], max_layers=3)
    assert "require.js" not in html and not re.search(r"<script[^>]+src=", html)
    assert "cdnjs" not in html and "d3" in html
    full = bertviz_offline.offline_html("model", att, [f"t{i}" for i in range(8)])
    assert len(html) < len(full)
    assert bertviz_offline.select_layers(30, 3) == [0, 14, 29]


def test_lit_makes_markdown_show_text_verbatim():
    import markdown_it  # the CommonMark parser Streamlit's front end follows (here: its Python port)

    for s in ["# Test the function", "**bold** _it_", ":red[x] :material/check:", "$x^2$", "<b>hi</b>", "a\\b", "1. item", "`code`", "[a](b)"]:
        html = markdown_it.MarkdownIt().renderInline(lit(s))
        assert "<" not in html.replace("&lt;", "") and "&lt;b&gt;" in html if "<b>" in s else True
        text = re.sub(r"<[^>]+>", "", html).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&quot;", '"')
        assert text == s, (s, html)  # every character shows as written: nothing became markup
    assert lit("a\nb") == "a↵b"


def test_figures_name_tokens_without_hover_at_a_readable_size():
    labels = [f"{i}:t{i}" for i in range(80)]
    fig = attention_heads(np.full((4, 80, 80), 1 / 80), labels)
    assert list(fig.data[0].y) == labels  # every token in the data (and its hover)
    assert fig.layout.yaxis.showticklabels and fig.layout.yaxis.dtick == 4  # every 4th named: 20 labels of 12 px, never overlapping
    short = attention_heads(np.full((4, 12, 12), 1 / 12), labels[:12])
    assert short.layout.yaxis.dtick == 1  # a short prompt: every token named
    # page 3 on a projector: one head large (nine 65-px maps were unreadable), its own name in the title
    one = attention_heads(np.random.default_rng(0).random((9, 40, 40)), labels[:40], layer=5, heads=[2])
    assert len(one.data) == 1 and "head 2" in one.layout.title.text and not one.layout.annotations
    assert one.data[0].z[39][0] == pytest.approx(np.round(np.random.default_rng(0).random((9, 40, 40))[2, 39, 0], 3))
    assert one.layout.yaxis.dtick == 3  # at most 16 labels of 18 px on a 430-px figure
    lens = lens_figure(np.zeros((3, 64), int), np.ones((3, 64)) * 0.5, [["a"] * 64] * 3, [f"p{i}" for i in range(64)])
    assert lens.layout.xaxis.dtick == 1 and lens.layout.xaxis.type == "category"


def test_lit_after_visible_draws_one_arrow_per_newline():
    assert lit(visible(" ...\n\n")) == "·\\.\\.\\.↵↵"


def test_a_titled_figure_with_subplot_titles_keeps_them_apart():
    """The figure's title goes above its subplot titles (they sit at the top of the plots): more top margin."""
    from plotly.subplots import make_subplots

    from components.figures import _layout

    plain = _layout(make_subplots(rows=1, cols=2), "Title")
    sub = _layout(make_subplots(rows=1, cols=2, subplot_titles=["left", "right"]), "Title")
    untitled = _layout(make_subplots(rows=1, cols=2, subplot_titles=["left", "right"]))
    assert plain.layout.margin.t == 40 and sub.layout.margin.t == 70 and untitled.layout.margin.t == 10


def test_table_numbers_read_as_measured():
    """Short tables show 10, not 10.0000, a small difference as itself, never as 0.0000, and 0.9998 not as 1."""
    from components.fmt import number

    cases = {10.0: "10", 12288.0: "12,288", 37.9123: "37.91", 1.5: "1.5", 1234.56: "1,234.6", 0.734: "0.734", 0.99981: "0.9998"}
    cases |= {0.0042123: "0.004212", 2.3e-06: "2.3e-06", -0.5: "-0.5", 0.99999: "0.99999"}
    assert {v: number(v) for v in cases} == cases
    assert number(float("nan")) == "" and number(None) == "" and number("fp32") == "fp32" and number(True) == "True"


def test_a_short_table_is_shown_formatted_and_exported_whole():
    from streamlit.testing.v1 import AppTest

    def page():
        import pandas as pd

        from views import render

        render.table("t", pd.DataFrame([{"name": "a", "tok/s": 37.9123, "n": 10.0}]), hide_index=True, width="stretch")

    at = AppTest.from_function(page).run(timeout=120)
    assert not at.exception
    styler = at.table[0].proto.arrow_data.styler
    assert b"37.91" in styler.display_values and b"10.0000" not in styler.display_values
    assert at.table[0].value["tok/s"][0] == 37.9123  # the data (and the page's CSV export) keep every digit
