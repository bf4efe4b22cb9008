"""Export for slides: file names, figures drawn with every label, a page's ZIP (kaleido drives Chromium)."""

import io
import json
import struct
import zipfile
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from components import export

pytestmark = pytest.mark.unit


def test_slug_is_a_safe_meaningful_file_name():
    assert export.slug("3 · Attention", "Why is the sky blue?") == "3-attention_why-is-the-sky-blue"
    assert export.slug("../../etc/passwd") == "etc-passwd"
    assert export.slug("", "   ") == "figure"
    assert len(export.slug("x" * 500)) <= 80


def test_labelled_draws_the_numbers_and_export_keeps_labels_inside():
    fig = go.Figure([go.Bar(x=["a", "b"], y=[0.25, 0.75]), go.Heatmap(z=[[1, 2], [3, 4]])]).update_layout(title="t", height=300)
    lab = export.labelled(fig)
    assert lab.data[0].texttemplate and lab.data[1].texttemplate and fig.data[0].texttemplate is None  # a copy
    many = export.labelled(go.Figure([go.Bar(y=list(range(31))), go.Bar(y=[5.0] * 30 + [9.5])]))  # 62 bars: each series' largest only
    assert [t for t in many.data[0].text if t] == ["30"] and [t for t in many.data[1].text if t] == ["9.5"]
    big = go.Figure(go.Heatmap(z=[[0] * 40] * 40))
    assert export.labelled(big).data[0].texttemplate is None  # 1,600 cells: too many to read
    ex = export.for_export(fig)
    assert ex.layout.width == export.WIDTH and ex.layout.xaxis.automargin and ex.layout.yaxis.automargin


@pytest.mark.browser
def test_page_zip_has_svg_png_csv_html_and_numbers():
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("apt-get install -y chromium")
    fig = go.Figure(go.Bar(x=["Paris", "Lyon"], y=[0.9, 0.1])).update_layout(title="Next token", height=400)
    import numpy as np

    mosaic = np.zeros((12, 20, 3), np.uint8)  # a picture the page computed (the attention mosaic)
    data = export.page_zip(
        "5-next-token_the-capital",
        [("next token", fig), ("next token", fig)],
        {"rows": pd.DataFrame({"a": [1, 2]})},
        {"chips": "<b>x</b>"},
        images={"mosaic": mosaic},
    )
    z = zipfile.ZipFile(io.BytesIO(data))
    names = sorted(z.namelist())
    stem = "5-next-token_the-capital/"
    assert stem + "next-token.svg" in names and stem + "next-token-2.png" in names and stem + "rows.csv" in names and stem + "chips.html" in names
    assert stem + "mosaic.png" in names
    svg = z.read(stem + "next-token.svg").decode()
    assert svg.startswith("<svg") and "Paris" in svg and "Next token" in svg
    png = z.read(stem + "next-token.png")
    w, h = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert (w, h) == (export.WIDTH * export.SCALE, 400 * export.SCALE)
    numbers = json.loads(z.read(stem + "numbers.json"))
    assert numbers["figures"]["next-token"]["title"] == "Next token"  # the title a reader saw, not the file's name
    assert numbers["schema"].startswith("llm-explorer numbers v1")
    assert numbers["figures"]["next-token"]["series"][0]["y"] == [0.9, 0.1] and numbers["tables"]["rows"] == [{"a": 1}, {"a": 2}]


@pytest.mark.browser
def test_an_exported_figure_says_what_it_shows_and_heatmaps_stay_sharp():
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("apt-get install -y chromium")
    import base64
    import re

    from PIL import Image

    bar = go.Figure(go.Bar(x=["&lt;|im_end|&gt;", "Paris"], y=[0.9, 0.1]))
    note = "SmolLM2-135M-Instruct · prompt “The capital of France is” · temperature 0.7, top k 50"
    svg = export.image(bar, "svg", note=note, title="Next token").decode()
    assert "Next token" in svg and "SmolLM2-135M-Instruct" in svg and "temperature 0.7" in svg  # inside the image
    heat = go.Figure(go.Heatmap(z=[[i * j for j in range(14)] for i in range(14)]))
    svg = export.image(heat, "svg", title="attention").decode()
    bitmaps = re.findall(r'href="data:image/png;base64,([A-Za-z0-9+/=]+)"', svg)
    assert bitmaps and all(Image.open(io.BytesIO(base64.b64decode(b))).width >= export.MIN_RASTER for b in bitmaps)


def test_numbers_and_tables_are_tidy():
    fig = go.Figure(go.Bar(x=["&lt;|im_end|&gt;", "Paris"], y=[0.9, float("nan")]))
    series = export.figure_numbers(fig)[0]
    assert series["x"] == ["<|im_end|>", "Paris"] and series["y"] == [0.9, None]  # decoded labels, NaN as null
    import numpy as np

    heat = export.figure_numbers(go.Figure(go.Heatmap(z=np.arange(6, dtype=np.float32).reshape(2, 3))))[0]
    assert heat["z"] == [[0, 1, 2], [3, 4, 5]]  # plain lists, never Plotly's base64 arrays
    df = pd.DataFrame({"mode": ["a", "b", "c"], "memory": ["45 MiB", "512 KiB", "1.5 GiB"], "time": ["3.2 ms", "1 s", "250 µs"], "x": ["1 MiB", "n/a", "2"]})
    tidy = export.tidy_table(df)
    assert list(tidy.columns) == ["mode", "memory (GiB)", "time (ms)", "x"]
    assert tidy["memory (GiB)"].tolist() == pytest.approx([45 / 1024, 0.5 / 1024, 1.5]) and tidy["time (ms)"].tolist() == pytest.approx([3.2, 1000, 0.25])
    assert tidy["x"].tolist() == ["1 MiB", "n/a", "2"]  # not all numbers with a unit: left as written
    # a count written for reading is a number in the CSV, its words in a column of their own (issue 33: kv-costs.csv)
    kv = export.tidy_table(pd.DataFrame({"tokens": ["1,024", "8,192 (this model's context length)"], "KV": ["45 MiB", "360 MiB"]}))
    assert list(kv.columns) == ["tokens", "tokens note", "KV (MiB)"] and kv["tokens"].tolist() == [1024, 8192]
    assert kv["tokens note"].tolist() == ["", "this model's context length"] and kv.to_csv(index=False).splitlines()[1] == "1024,,45.0"
    # the sampling stages' series are named, and a token is its id and its text, not "'The' (504)"
    from components.figures import sampling_figure

    samp = sampling_figure(["'The' (504)", "' A' (330)"], [("softmax", np.array([0.6, 0.4])), ("top-k", np.array([1.0, 0.0]))], [(504, "The"), (330, " A")])
    series = export.figure_numbers(samp)
    assert [x["name"] for x in series] == ["softmax", "top-k"] and series[1]["token id"] == [504, 330] and series[1]["token"] == ["The", " A"]
    assert samp.layout.title.text  # a human title, not the page's internal name
    alt = export.alt_text(go.Figure(go.Bar(x=["Paris", "Lyon"], y=[0.9, 0.1])), "Next token")
    assert alt.startswith("Figure: Next token.") and "Paris: 0.9" in alt
