"""The lesson handout: the whole path for one prompt in ONE self-contained HTML file that opens offline.

    html = build(lm, trace, stages=views.pages.STAGES[1:], recalled={slug: [(name, figure), …]})

Every stage in the article's order with its takeaway, main figure (Plotly, its plotly.js inlined once), numbers and
"How do we know?" cross-checks, measured on this run. The stages up to the autoregressive loop are computed here
(one trace, one short greedy generation: seconds on a CPU); the minute-long experiments are included as this
session last ran them, or named with the page that runs them. Streamlit-free: the header's button and a test call it."""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime

from plotly.offline import get_plotlyjs

import pipeline
from pipeline import sampling
from views import handout_loop as loop
from views import handout_sections as hs
from views.handout_sections import prose_html, recalled_html, safely
from views.pages import PageSpec

# the stages the handout computes from the prompt, by slug: fn(lm, trace) for a page whose views.pages row says
# handout="trace", fn(lm, generation record) for "run" (tests/views/test_page_registry.py: one for every such row)
SECTIONS = {
    "tokens": hs.stage_tokens,
    "embeddings": hs.stage_embeddings,
    "attention": hs.stage_attention,
    "layer": hs.stage_layer,
    "next-token": hs.stage_next,
    "generation": loop.stage_generation,
    "prefill-decode": loop.stage_prefill,
    "kv-cache": loop.stage_kv,
    "streaming-sharding": hs.stage_sharding,
    "why": hs.stage_why,
    "misconceptions": hs.stage_myths,
}

N_NEW = 16  # greedy tokens the handout generates for the loop's stages

CSS = """body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2rem auto;padding:0 1.5rem;color:#1a1a1a;line-height:1.5}
h1{font-size:2rem}h2{margin-top:2.5rem;border-top:2px solid #0072B2;padding-top:1rem}
.takeaway{background:#e8f1f8;border-left:5px solid #0072B2;padding:.6rem 1rem;font-size:1.1rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:left}
pre.verbatim{white-space:pre-wrap;background:#f6f6f6;padding:.6rem;border-radius:6px}
.pass{color:#006b3c;font-weight:bold}.fail{color:#b00020;font-weight:bold}.skip{color:#555}
.note{color:#444;font-style:italic}"""


def _generation(lm, tr):
    rec = pipeline.generation.GenerationRecord(
        prompt=tr.prompt, chat=tr.chat, model=lm.label, max_new_tokens=N_NEW, sampling=sampling.GREEDY, prompt_tokens=tr.T
    )
    rec.events = list(pipeline.generate(lm, tr.prompt, N_NEW, chat=tr.chat))
    rec.done = True
    return rec


def build(lm, tr, stages: Sequence[PageSpec], recalled: dict[str, list[tuple[str, object]]] | None = None, progress=None) -> str:
    """The handout as one HTML string. `stages`: the pages in the article's order (views.pages); `recalled`: slug ->
    what this session drew there for this prompt, (name, a figure, a table or a piece of HTML): the minute-long
    experiments, and the visitor's own generation beside the handout's greedy one; `progress(fraction, text)`.
    Each section: the takeaway, the page's own explanation, the numbers and figures, the cross-checks."""
    recalled = recalled or {}
    rec = _generation(lm, tr)
    parts = []
    for n, spec in enumerate(stages):
        title = spec.title
        if progress:
            progress(n / len(stages), f"Handout: {title}")
        body = ""
        if spec.handout is not None:
            body = safely(SECTIONS[spec.slug], lm, tr if spec.handout == "trace" else rec)
        if recalled.get(spec.slug) and spec.handout != "trace":  # a traced stage is computed above for this very prompt
            body += "<h3>As you last ran it on this page</h3>" + safely(recalled_html, recalled[spec.slug])
        if not body:
            body = f"<p class='note'>This experiment takes a minute on a CPU: open “{html.escape(title)}” in the explorer and run it; the handout then includes its results.</p>"
        explain = f"<div class='explain'>{prose_html(spec.explanation)}</div>" if spec.explanation else ""
        parts.append(f"<section><h2>{html.escape(title)}</h2><p class='takeaway'>{html.escape(spec.takeaway)}</p>{explain}{body}</section>")
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"<h1>From Enter to the first token, and after</h1><p>Model <b>{html.escape(lm.label)}</b> on {html.escape(str(lm.device))}, "
        f"{'chat template on' if tr.chat else 'plain completion'}, made {when}. The prompt:</p><pre class='verbatim'>{html.escape(tr.prompt)}</pre>"
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>Lesson handout: {html.escape(' '.join(tr.prompt.split())[:60])}</title><style>{CSS}</style>"
        f"<script>{get_plotlyjs()}</script></head><body><main>{head}{''.join(parts)}</main></body></html>"
    )
