"""What the lesson handout (views.handout) says for each stage it computes from the prompt: fn(lm, trace) for a page
whose views.pages row says handout="trace", fn(lm, generation record) for "run", each a piece of HTML with the
stage's numbers, main figure and "How do we know?" checks, measured on this run. Streamlit-free."""

from __future__ import annotations

import html
import re

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

import pipeline
from components import export
from components.attention_figures import attention_heads
from components.figures import copy_figure, labels_of, residual_figure, rope_heatmap, sampling_figure, vector_strip
from components.fmt import prob
from components.tokens import chips_html, plot_text, template_html, visible
from components.why import largest_figure
from pipeline import text_of
from pipeline.forward import Kind, ablate, analysis, attribute, display_maps, sampling
from pipeline.lab import checks


def table_html(rows: dict) -> str:
    return "<table>" + "".join(f"<tr><th scope='row'>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows.items()) + "</table>"


def checks_html(found) -> str:
    if not found:
        return ""
    items = []
    for c in found:
        mark = ("pass", "✓ pass") if c.ok else (("skip", "– not run") if c.ok is None else ("fail", "✗ FAIL"))
        items.append(f"<li><span class='{mark[0]}'>{mark[1]}</span> <b>{html.escape(c.name)}</b> — {html.escape(c.detail)}</li>")
    return "<h3>How do we know?</h3><ul>" + "".join(items) + "</ul>"


def figure_html(fig: go.Figure, title: str) -> str:
    fig = export.floor_fonts(copy_figure(fig))
    body = pio.to_html(fig, include_plotlyjs=False, full_html=False, config={"displaylogo": False, "responsive": True})
    return f"<figure role='group' aria-label='{html.escape(export.alt_text(fig, title))}'>{body}</figure>"


def prose_html(markdown: str) -> str:
    """Our own explanations (a page's intro: **bold**, `code`, *italic*) as HTML; everything else escaped."""
    out = html.escape(markdown, quote=False)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"`(.+?)`", r"<code>\1</code>", out)
    out = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", out)
    return "".join(f"<p>{p}</p>" for p in out.split("\n\n") if p.strip())


def recalled_html(items) -> str:
    """What this session last drew on a page, for the handout: figures, tables (as HTML tables) and views."""
    import pandas as pd

    out = []
    for name, obj in items:
        if isinstance(obj, go.Figure):
            out.append(figure_html(obj, name))
        elif isinstance(obj, pd.DataFrame):
            out.append(f"<p><b>{html.escape(name)}</b></p>" + obj.to_html(index=False, border=0, na_rep="—"))
        elif isinstance(obj, str):
            out.append(obj)
    return "".join(out)


def safely(fn, *a, **k):
    try:
        return fn(*a, **k)
    except Exception as e:  # noqa: BLE001 - one stage failing leaves the others; the handout says what failed
        return f"<p class='note'>Could not be drawn here: {html.escape(type(e).__name__)}: {html.escape(str(e)[:200])}</p>"


def stage_tokens(lm, tr):
    tk = pipeline.tokenize(lm.tokenizer, tr.prompt, chat=tr.chat)
    out = [table_html({"tokens the model reads": len(tk.tokens), "tokens from the prompt": len(tk.prompt_tokens), "characters": len(tk.prompt)})]
    out.append(chips_html(tk.tokens, tk.segments, max_segments=600))
    if tk.chat:
        out.append("<p>The chat template: exactly the text the model reads (dark: special tokens).</p>" + template_html(tk.tokens))
    return "".join(out) + checks_html(checks.token_checks(lm.tokenizer, tk))


def stage_embeddings(lm, tr):
    i = tr.last_prompt_index if tr.last_prompt_index is not None else tr.T - 1
    tok, f = tr.tokens[i], lm.facts
    out = [
        table_html(
            {
                "embedding matrix": f"{f.vocab:,} × {f.d_model}",
                "token": f"{visible(tok.text)!r} (id {tok.id})",
                "vector length (L2)": f"{analysis.embedding_norm(tr, i):.3f}",
            }
        )
    ]
    out.append(figure_html(vector_strip(tr.acts["hook_embed"][i], f"embedding of {visible(tok.text)!r}: {f.d_model} numbers"), "embedding vector"))
    if f.positional == "rope" and analysis.rope_inv_freq(lm, 0) is not None:
        rd = analysis.rope_demo(lm, tr, 0)
        if rd is not None:
            out.append(f"<p>RoPE, θ base {rd.theta:,.0f}: each pair of the query and key is rotated by position × θ^(−2i/{f.head_dim}).</p>")
            out.append(figure_html(rope_heatmap(rd.angles), "RoPE rotation angles"))
    return "".join(out)


def stage_attention(lm, tr):
    layer = lm.facts.n_layers // 2
    maps, block = display_maps(tr, layer)
    fig = attention_heads(maps, labels_of(tr.tokens), block=block, layer=layer, scale="log" if tr.T > 64 else "linear")
    return (
        f"<p>Layer {layer}: {analysis.sink_share(tr):.0%} of all attention goes to the first token (the attention sink).</p>"
        + figure_html(fig, f"attention heads, layer {layer}")
        + checks_html(checks.check_attention(lm, tr))
    )


def stage_layer(lm, tr):
    pos = tr.T - 1
    labels = labels_of(tr.tokens)
    fig = residual_figure(*(tr.acts[f"blocks.*.{s}|norm"][:, pos] for s in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out")), labels[pos])
    lens = [(i, text_of(lm.tokenizer, [t[0][0]]), t[0][1]) for i, t in enumerate(tr.lens_last_top)]
    rows = {("embeddings" if i == 0 else f"after layer {i - 1}"): f"{visible(t)!r} p={prob(p)}" for i, t, p in lens[:: max(1, len(lens) // 8)]}
    return figure_html(fig, "residual stream") + "<p>The logit lens at the last position: the top token if the model stopped there.</p>" + table_html(rows)


def stage_next(lm, tr):
    d = sampling.DEFAULTS
    steps = sampling.filter_steps(tr.next_logits, d)
    order = np.argsort(-steps[0].probs)[:12]
    cands = [plot_text(f"{visible(text_of(lm.tokenizer, [int(i)]))!r}") for i in order]
    fig = sampling_figure(cands, [(s.name + ("" if s.active else " (off)"), s.probs[order]) for s in steps])
    nxt = int(np.argmax(tr.next_logits))
    numbers = {
        "most likely next token": f"{visible(text_of(lm.tokenizer, [nxt]))!r} (id {nxt}), p = {prob(float(steps[0].probs[nxt]))}",
        "settings": f"temperature {d.temperature}, top-k {d.top_k}, top-p {d.top_p}",
        "vocabulary": f"{len(steps[0].probs):,}",
        "candidates left": f"{steps[-1].kept:,}",
    }
    return (
        table_html(numbers)
        + figure_html(fig, "softmax, temperature, top-k, top-p")
        + checks_html([checks.check_filters(tr.next_logits, d), *checks.check_logits(lm, tr)[:1]])
    )


def stage_sharding(lm, _rec):
    from pipeline.lab import tensor_parallel_plan

    rows = {}
    for n in (1, 2, 4):
        tp = tensor_parallel_plan(lm, n)
        rows[f"{n} device{'s' if n > 1 else ''}"] = (
            f"{tp.weights_mb_per_device:,.1f} MiB of weights each, {tp.allreduce_bytes_per_token / 1024:,.1f} KiB all-reduced per token"
        )
    return "<p class='note'>A plan computed on paper for this model, not a measurement.</p>" + table_html(rows)


def stage_myths(lm, tr):
    from pipeline.lab import misconceptions as mc

    temps = mc.temperature_sweep(tr.next_logits)
    rows = {
        f"temperature {r.temperature}": f"top token {visible(text_of(lm.tokenizer, [r.top_id]))!r} p={prob(r.top_p)}, {r.n_for_90} candidates for 90%"
        for r in temps.rows
    }
    return (
        "<p>“A higher temperature makes the model smarter”: the same token leads at every temperature; only the spread changes.</p>"
        + table_html(rows)
        + checks_html(temps.checks)
    )


def stage_why(lm, tr):
    a = attribute(lm, tr)
    tok = visible(text_of(lm.tokenizer, [a.target]))
    heads = [c for c, _ in a.largest(None) if c.kind is Kind.HEAD][:5]
    d = ablate(lm, tr, heads)
    return (
        f"<p>The logit of {html.escape(repr(tok))} is the sum of one share per component: the embedding, every attention head, every "
        "feed-forward block (the final norm's scale frozen at this run's value). A large share is a claim; switching the component "
        "off tests it.</p>"
        + table_html(
            {
                f"logit({tok!r})": f"{a.logit:.3f}",
                "sum of the shares": f"{a.total:.3f}",
                "the 5 heads with the largest shares": ", ".join(map(str, heads)),
                f"p({tok!r}) with them switched off (zero)": f"{float(d.after[d.token]):.3f}, was {float(d.before[d.token]):.3f} (rank now {d.new_rank + 1})",
            }
        )
        + figure_html(largest_figure([(str(c), v) for c, v in a.largest(12)], f"The 12 largest shares of logit({tok!r})"), "largest shares")
        + checks_html([checks.check_attribution(a), checks.check_ablation(lm, tr, heads[0].layer, heads[0].head)])
    )
