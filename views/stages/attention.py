import numpy as np
import streamlit as st

from components import bertviz_offline
from components.attention_figures import ATTENTION_SCALES, attention_heads, gqa_figure, mosaic_image, without_sink
from components.figures import labels_of, matrix_heatmap, token_texts
from pipeline.forward import analysis, display_maps
from pipeline.lab import checks
from views import proof, render, runs

render.intro(
    "In every layer each token asks which earlier tokens matter to it. It makes a **query** (what am I "
    "looking for?); every token makes a **key** (what do I contain?) and a **value** (what do I pass on?). "
    "Query·key scores, scaled by 1/√(head dim) and passed through a **softmax**, give attention weights that "
    "sum to 1 over the earlier tokens (the upper triangle is masked: a token cannot see the future). Each "
    "**head** does this with its own projections, so heads specialise: previous token, first token, same word…"
)
lm, tr = runs.get_trace()
f = tr.facts
labels = labels_of(tr.tokens)
L, H = f.n_layers, f.n_heads

tr, layer = runs.layer_with_qkv(tr, "Layer", "attn_layer")
render.overview(tr)  # every layer's pooled map (computed with progress the first time, a long prompt's seconds)
maps, block = display_maps(tr, layer)
sink = analysis.sink_share(tr)
hide = st.toggle(
    "Hide the first token (the attention sink) and renormalise",
    value=False,
    key="attn_sink",
    bind="query-params",
    help="Display only; the numbers checked below are the model's own",
)
st.caption(
    f"Across all layers and heads, {sink:.0%} of attention goes to the very first token on average: many "
    "heads use it as a place to 'park' attention when nothing else is relevant. "
    + ("It is hidden now, rows renormalised over the other tokens." if hide else "Switch the toggle to see where the rest goes.")
)
if hide:
    maps = without_sink(maps)
if block > 1:
    st.caption(
        f"{tr.T} tokens: each cell shows a block of {block} tokens (rows averaged, columns summed, so rows "
        "still sum to 1), one picture per head instead of millions of cells."
    )
scale = (
    st.segmented_control(
        "Colour scale",
        list(ATTENTION_SCALES),
        default="log" if tr.T > 64 else "linear",
        format_func=render.labeller({"linear": "linear", "log": "log", "row": "per row"}),
        key="attn_scale",
        bind="query-params",
        help="On a long prompt the first token takes most of the weight, and a linear scale shows little else",
    )
    or "linear"
)
shown = None
if render.presenting():  # a projector: one head large, picked here (every head at once is 65 px a map)
    one = st.segmented_control(
        "Head on screen", list(range(H)), default=0, key="attn_present_head", bind="query-params", help="One head at a time, large enough for the back row"
    )
    shown = [one if one is not None else 0]
render.figure(attention_heads(maps, labels, block=block, layer=layer, scale=scale, heads=shown), "attention heads", main=True, settings={"colour scale": scale})
st.caption(f"Colour scale: {ATTENTION_SCALES[scale]}." + ("" if hide else " The first column is the attention sink; the toggle above hides it."))

st.subheader("Every layer and head at a glance")
overview = tr.acts["blocks.*.attn.hook_pattern|pooled"]  # [L, H, T', T']
render.image(
    mosaic_image(without_sink(overview) if hide else overview),
    "all layers and heads",
    f"Columns: layers 0–{L - 1} (left to right); rows: heads 0–{H - 1}. Each tile is one attention map, "
    "query down, key across (brighter = more weight: square root of the weight over the tile's largest, "
    "so weaker links show next to the first-token sink).",
)

st.subheader("Query, key, value for one head")
head = st.slider("Head", 0, H - 1, 0, key="attn_head", bind="query-params")
hs = analysis.head_scores(tr, layer, head)
q, k, v, kv = hs.q, hs.k, hs.v, hs.kv_head
T = tr.T
show = slice(max(0, T - 48), T)
masked = hs.masked
c1, c2 = st.columns(2)
render.figure(matrix_heatmap(q[show], [f"d{i}" for i in range(q.shape[1])], labels[show], f"Q (head {head}) after RoPE: tokens × {f.head_dim}", zmid=0), "", c1)
render.figure(matrix_heatmap(k[show], [f"d{i}" for i in range(k.shape[1])], labels[show], f"K (shared KV head {kv}) after RoPE", zmid=0), "", c2)
render.figure(matrix_heatmap(masked[show, show], labels[show], labels[show], f"scores = Q·Kᵀ × {f.attn_scaling:.4f} (future masked)", zmid=0), "", c1)
render.figure(matrix_heatmap(v[show], [f"d{i}" for i in range(v.shape[1])], labels[show], f"V (shared KV head {kv})", zmid=0), "", c2)
if T > 48:
    st.caption("Showing the last 48 tokens.")
render.figure(gqa_figure(H, f.n_kv_heads), "gqa")

st.subheader("bertviz: head view and model view")
if T > 128:
    st.info(f"bertviz draws every token pair as a line; with {T} tokens that is unreadable. Use a prompt of at most 128 tokens.")
else:
    kept = tr.acts.layers("blocks.*.attn.hook_pattern") if tr.acts.attn_block == 1 else []
    if len(kept) == L:
        att = without_sink(overview) if hide else overview  # the sink toggle applies here too
        tokens = token_texts(tr.tokens)
        which = st.segmented_control("View", ["head view", "model view"], default="head view", key="bv_view", bind="query-params") or "head view"
        n_layers = st.slider("Layers to include", 1, L, min(L, 4), key="bv_layers", bind="query-params", help="Fewer layers keep the page small")
        html = bertviz_offline.offline_html(
            "head" if which == "head view" else "model", att.astype(np.float32), tokens, max_layers=n_layers, display_mode="light"
        )
        height = 160 + 22 * T if which == "head view" else 150 + 500 * n_layers  # the model view: a row of heads per layer
        st.iframe(html, height=max(420, height))
        render.also_export(f"bertviz {which}", html=html)
        st.caption(f"Drawn offline (d3 and jQuery inlined), {len(html) / 1e6:.2f} MB of HTML, weights rounded to 3 decimals.")
    else:
        st.info("bertviz needs every layer at full resolution; this prompt is too long for that.")


proof.how_do_we_know(lambda: checks.check_attention(lm, tr) + checks.check_head_softmax(tr, hs), f"attn{layer}-{head}", tr)
