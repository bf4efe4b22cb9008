import streamlit as st

import pipeline
from components.figures import timings_bar
from pipeline import text_of
from pipeline.forward import forward_repeats
from views import guard, loading, pages, proof, render, runs

lm, tr = runs.get_trace()  # first: the forward pass runs before the browser has the rest of the page to draw
render.intro(
    "This explorer runs a **real language model** on your prompt with hooks on every stage and shows the "
    "numbers measured from that very run. Follow the stages in the order a prompt meets them: "
    "**tokenize** → **embeddings** → **positions** (RoPE) → **transformer layers** (norm, query/key/value, "
    "multi-head attention, feed-forward, residual) → **logits** → **softmax** → **temperature** → "
    "**top-k / top-p** → **sample** → the first token. Every page that shows a number has a *How do we know?* "
    "box that re-checks it against an independent computation."
)
with st.expander("The stages, in order: each opens on this model and prompt", expanded=True):
    cols = st.columns(2)
    stages = pages.STAGES[1:]
    for i, spec in enumerate(stages):
        cols[i * 2 // len(stages)].page_link(spec.file, label=spec.stage)
f = tr.facts
nxt = int(tr.next_logits.argmax())
c = st.columns(4)
c[0].metric("Tokens in", tr.T)
c[1].metric("Most likely next token", repr(text_of(lm.tokenizer, [nxt])))
wall = tr.timings["forward total"]
c[2].metric(
    "Forward pass",
    f"{tr.forward_s * 1000:.0f} ms",
    help=(
        f"This run's forward pass, with the hooks that record every stage: the {tr.forward_s * 1000:.0f} ms the processor spent on it "
        f"(one thread ran it); wall clock {wall * 1000:.0f} ms."
        if tr.forward_cpu_s is not None
        else "This run's forward pass, wall clock, with the hooks that record every stage."
    )
    + " 'Time it again' below repeats it without them.",
)
c[3].metric("Parameters", f"{f.n_params / 1e6:.0f} M")
render.busy_note(tr.busy)
if tr.shared_s > 0.15 * tr.forward_s:
    st.caption(
        f"Wall clock: {wall * 1000:,.0f} ms. For {tr.shared_s * 1000:,.0f} ms of it the processor ran something else (another program, "
        f"another visitor, or the browser drawing this page on the same machine): the model's own time is the {tr.forward_s * 1000:,.0f} ms it ran. "
        "The stage times below are wall clock, so they include that wait."
    )
elif tr.forward_cpu_s is not None:
    st.caption(
        f"Forward pass: the processor time of the one thread that ran it. Its wall clock, {wall * 1000:,.0f} ms, is what the stage bars below add up to."
    )
again = loading.recall("fwd_again")
if again is not None and again[0] == (tuple(tr.input_ids), tr.model_label):
    samples, busy = again[1]
    st.caption(
        f"The same forward pass timed {len(samples.values)} more times without the recording hooks, measured the same way "
        f"(the same threads, and the processor time when one thread runs it): median {samples.fmt()} (range), against "
        f"{tr.forward_s * 1000:,.0f} ms with them. The difference is what recording every stage costs (and the machine's noise)."
    )
    render.busy_note(busy)
elif st.button("Time it again (5 repeats)", key="fwd_again_go", help="One run is one sample: five more give the median and the spread"):
    if guard.allowed("timing the forward pass"):
        bar = st.progress(0.0, text="timing the forward pass")
        got = lm.run(forward_repeats, lm, tr.input_ids, 5, progress=lambda p, m: bar.progress(p, text=m))
        bar.empty()
        loading.remember("fwd_again", ((tuple(tr.input_ids), tr.model_label), got))
        st.rerun()
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
    "context": f"{f.max_positions:,}" if f.max_positions else "not stated",
    "positions": {"rope": "RoPE"}.get(f.positional, f.positional) + (f" θ={f.rope_theta:,.0f}" if f.rope_theta else ""),
    "norm": f.norm,
    "tied embeddings": "yes" if f.tied_embeddings else "no",
}
render.also_export("model facts", [{"fact": k, "value": v} for k, v in facts.items()])
half = (len(facts) + 1) // 2
cols = st.columns(2)
for col, items in zip(cols, [list(facts.items())[:half], list(facts.items())[half:]]):
    col.table([{"fact": k, "value": str(v)} for k, v in items], hide_index=True, width="stretch")
where = "" if guard.policy().enabled else f" from `{lm.source}`"  # a demo server never shows its paths
st.caption(f"Running on {tr.device}. Loaded{where} in {lm.load_seconds:.1f} s." + (f" Before it loaded: {lm.size_note}" if lm.size_note and where else ""))
render.figure(timings_bar(tr.timings), "timings bar", main=True)
st.caption(
    "Stage times come from forward hooks on this run (device-synchronised on GPU). The logit lens is an "
    "extra read-out this explorer adds when a page shows it; a plain model does not compute it."
)
st.caption(
    f"This trace keeps {tr.nbytes / 2**20:,.1f} MB: the residual stream entering every layer, every layer's queries, keys and "
    f"values after RoPE ({'float16' if tr.T > pipeline.forward.LONG_T else 'float32'}), the last token's attention row per head "
    "and the norms. The model ran its fast attention (SDPA); an attention map is computed from the kept queries and keys "
    "when a page shows it, with the model's own eager attention (its scaling, mask and window)."
)

proof.how_do_we_know(lambda: pipeline.lab.checks.all_checks(lm, tr), "overview", tr)
