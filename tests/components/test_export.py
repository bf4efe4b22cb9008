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
    big = go.Figure(go.Heatmap(z=[[0] * 40] * 40))
    assert export.labelled(big).data[0].texttemplate is None  # 1,600 cells: too many to read
    ex = export.for_export(fig)
    assert ex.layout.width == export.WIDTH and ex.layout.xaxis.automargin and ex.layout.yaxis.automargin


@pytest.mark.browser
def test_page_zip_has_svg_png_csv_html_and_numbers():
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("apt-get install -y chromium")
    fig = go.Figure(go.Bar(x=["Paris", "Lyon"], y=[0.9, 0.1])).update_layout(title="Next token", height=400)
    data = export.page_zip("5-next-token_the-capital", [("next token", fig), ("next token", fig)], {"rows": pd.DataFrame({"a": [1, 2]})}, {"chips": "<b>x</b>"})
    z = zipfile.ZipFile(io.BytesIO(data))
    names = sorted(z.namelist())
    stem = "5-next-token_the-capital/"
    assert stem + "next-token.svg" in names and stem + "next-token-2.png" in names and stem + "rows.csv" in names and stem + "chips.html" in names
    svg = z.read(stem + "next-token.svg").decode()
    assert svg.startswith("<svg") and "Paris" in svg and "Next token" in svg
    png = z.read(stem + "next-token.png")
    w, h = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert (w, h) == (export.WIDTH * export.SCALE, 400 * export.SCALE)
    numbers = json.loads(z.read(stem + "numbers.json"))
    assert numbers["next-token"][0]["y"] == [0.9, 0.1]
