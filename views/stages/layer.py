import numpy as np
import streamlit as st

from components.figures import labels_of, layer_labels, lens_figure, matrix_heatmap, norm_effect_figure, residual_figure
from components.tokens import plot_text, visible
from pipeline import text_of
from pipeline.forward import LENS_GRID_MAX, lens_grid
from pipeline.lab import checks
from views import proof, render, runs

render.intro(
    "Each transformer layer reads the **residual stream** (one vector per token), adds what **attention** "
    "found and then what the **feed-forward network** computed, and passes the sum on. Before each of the two "
    "sub-layers a **norm** (RMSNorm here) rescales the vector, so a stream that grows layer after layer is "
    "read at a steady size. The **logit lens** applies the model's final norm and output matrix after every "
    "layer: it shows what the model would predict if it stopped there, and how the answer forms."
)
lm, tr = runs.get_trace()
f = tr.facts
labels = labels_of(tr.tokens)
pos = st.selectbox(
    "Token position",
    list(range(tr.T)),
    format_func=render.labeller(labels),
    index=tr.last_prompt_index if tr.last_prompt_index is not None else tr.T - 1,
    key="layer_pos",
    bind="query-params",
    help="Starts at your prompt's last token (in chat mode the template adds a few after it); the "
    "logit lens below reads the very last position, whose prediction is the answer's first token",
)
resid, added_attn, added_ffn, normed = (tr.acts[f"blocks.*.{s}|norm"] for s in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "ln1.hook_normalized"))
render.figure(residual_figure(resid[:, pos], added_attn[:, pos], added_ffn[:, pos], labels[pos]), "residual", main=True)
c = st.columns(3)
c[0].metric("|residual| after embedding → last layer", f"{resid[0, pos]:.2f} → {resid[-1, pos]:.1f}")
c[1].metric("Layer where attention adds most", int(added_attn[:, pos].argmax()))
c[2].metric("Layer where feed-forward adds most", int(added_ffn[:, pos].argmax()))
render.figure(norm_effect_figure(resid[:, pos], normed[:, pos]), "norm effect")
show = slice(max(0, tr.T - 64), tr.T)
render.figure(
    matrix_heatmap(
        np.log10(resid[:, show].T + 1e-6),
        layer_labels(f.n_layers + 1),
        labels[show],
        "log10 |residual stream| by layer and token",
        colorscale="Viridis",
        height=max(300, 16 * (show.stop - show.start) + 100),
    ),
    "residual stream",
)

st.subheader("Logit lens")
rows = []
for i, top in enumerate(tr.lens_last_top):
    rows.append(
        {"after layer": str(i - 1) if i else "embeddings", **{f"#{r + 1}": f"{visible(text_of(lm.tokenizer, [t]))} ({p:.2f})" for r, (t, p) in enumerate(top)}}
    )
st.markdown(f"At the last position ({labels[-1]}), the top 5 guesses after every layer:")
render.table("layers", rows, hide_index=True, width="stretch")  # every layer, no scrolling (an HTML table up to 40 rows)
auto = tr.T <= 32
if auto or st.button(
    f"Compute the lens at the last {min(tr.T, LENS_GRID_MAX)} positions",
    help="(layers + 1) × positions rows through the output matrix: a few seconds for long prompts",
):
    with st.spinner("Reading the stored hidden states through the final norm and output matrix…"):
        positions, ids, probs = lens_grid(lm, tr)
    texts = [[plot_text(visible(text_of(lm.tokenizer, [int(t)]))[:8]) for t in row] for row in ids]
    render.figure(lens_figure(ids, probs, texts, [labels[p] for p in positions]), "lens")


proof.how_do_we_know(lambda: checks.check_logits(lm, tr) + [checks.check_lens(lm, tr)], "layer", tr)
