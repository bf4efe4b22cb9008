import streamlit as st

import pipeline
from components.figures import timings_bar
from views import widgets

st.title("What happens between Enter and the first token")
st.markdown(
    "This explorer runs a **real language model** on your prompt with hooks on every stage and shows the "
    "numbers measured from that very run. Follow the stages in the order a prompt meets them: "
    "**tokenize** → **embeddings** → **positions** (RoPE) → **transformer layers** (norm, query/key/value, "
    "multi-head attention, feed-forward, residual) → **logits** → **softmax** → **temperature** → "
    "**top-k / top-p** → **sample** → the first token. Every page has a *How do we know?* box that re-checks "
    "its numbers against an independent computation."
)
lm, tr = widgets.get_trace()
f = tr.facts
nxt = int(tr.next_logits.argmax())
c = st.columns(4)
c[0].metric("Tokens in", tr.T)
c[1].metric("Most likely next token", repr(lm.tokenizer.decode([nxt])))
c[2].metric("Forward pass", f"{tr.timings['forward total'] * 1000:.0f} ms")
c[3].metric("Parameters", f"{f.n_params / 1e6:.0f} M")
st.subheader("The model")
facts = {
    "architecture": f.arch,
    "layers": f.n_layers,
    "query heads": f.n_heads,
    "KV heads": f.n_kv_heads,
    "head dim": f.head_dim,
    "d_model": f.d_model,
    "feed-forward": f.d_ff,
    "vocabulary": f"{f.vocab:,}",
    "context": f"{f.max_positions:,}",
    "positions": f.positional.upper() + (f" θ={f.rope_theta:,.0f}" if f.rope_theta else ""),
    "norm": f.norm,
    "tied embeddings": "yes" if f.tied_embeddings else "no",
}
half = (len(facts) + 1) // 2
cols = st.columns(2)
for col, items in zip(cols, [list(facts.items())[:half], list(facts.items())[half:]]):
    col.dataframe([{"": k, "value": str(v)} for k, v in items], hide_index=True, width="stretch")
st.caption(f"Running on {tr.device}. Loaded from `{lm.source}` in {lm.load_seconds:.1f} s.")
st.plotly_chart(timings_bar(tr.timings), width="stretch")
st.caption(
    "Stage times come from forward hooks on this run (device-synchronised on GPU). The logit lens is an "
    "extra read-out this explorer adds; a plain model does not compute it."
)

widgets.how_do_we_know(lambda: pipeline.checks.all_checks(lm, tr), "overview", tr)
