import numpy as np
import streamlit as st

from components.tokens import lit, plot_text, visible
from components.why import before_after_figure, flow_figure, head_row_figure, largest_figure, patching_figure, shares_heatmap, side_by_side_figure
from pipeline.forward.attribution import FLOW_MAX_TOKENS, ablate, attribute, flow, patch
from pipeline.forward.tokens import text_of
from pipeline.generation.loop import prepare
from pipeline.lab import checks
from views import guard, loading, proof, render, runs

render.intro(
    "Why did the model pick this token? The last position's residual stream is the embedding plus what every "
    "attention head and every feed-forward block added, and the logit of a token is (after the final norm, "
    "whose scale is frozen at this run's value) a sum of one **share** per component. The shares below add up "
    "exactly to the model's own logit. Which heads and blocks carry the answer? Then **switch them off** and see "
    "whether the answer really changes: a large share is a claim, switching it off is the test."
)
lm, tr = runs.get_trace()
ids = list(tr.input_ids)
probs = np.exp(tr.next_logits - tr.next_logits.max())
probs /= probs.sum()
top = [int(i) for i in np.argsort(-probs)[:10]]
name = {t: f"{visible(text_of(lm.tokenizer, [t]))!r} (p = {probs[t]:.3f})" for t in top}
c = st.columns(2)
target = c[0].selectbox(
    "Explain the logit of", top, format_func=render.labeller(name), key="why_target", help="The most likely next token, or another candidate"
)
others = [None] + [t for t in top if t != target]
versus = c[1].selectbox(
    "… minus the logit of",
    others,
    format_func=render.labeller({None: "(nothing: the logit itself)"} | name),
    key="why_versus",
    help="Explain why one candidate beats another: the shares of logit(target) − logit(this one)",
)

key = ("why", lm.label, tuple(ids), target, versus)
a = st.session_state.get("_why") if st.session_state.get("_why_key") == key else None
if a is None:
    if not guard.allowed("explaining the token"):
        st.stop()
    a = lm.run(lambda progress=None: attribute(lm, ids, target, versus))
    st.session_state["_why"], st.session_state["_why_key"] = a, key
what = f"logit({visible(text_of(lm.tokenizer, [target]))!r})" + (f" − logit({visible(text_of(lm.tokenizer, [versus]))!r})" if versus is not None else "")
m = st.columns(3)
m[0].metric(f"The model's {what}", f"{a.logit:.3f}")
m[1].metric("Sum of the shares", f"{a.total:.3f}", help="Embedding + every head + every feed-forward block (+ biases): equal to the logit")
m[2].metric("Final norm's rms (frozen)", f"{a.final_rms:.2f}")
heads = [(i, h) for i in range(a.heads.shape[0]) for h in range(a.heads.shape[1])]
if st.session_state.get("why_head") not in heads:  # another model's head, or none picked yet
    st.session_state.pop("why_head", None)

render.figure(  # a click on a head's cell opens its attention row below (the last column, the feed-forward block, has none)
    shares_heatmap(a.heads, a.ffn, f"Each component's share of {what}"),
    "shares",
    key="why_shares",
    main=True,
    settings={"target": what},
    click_sets=("why_head", a.heads.shape[1]),
)
st.caption("Click a head's cell to open where it looked, below.")
render.figure(largest_figure(a.largest(15), "The 15 largest shares (the embedding's included)"), "largest")
st.caption(f"The embedding's own share: {a.embedding:+.3f}. Red adds to {what}, blue takes from it.")

st.subheader("Where a head looked")
best = max(heads, key=lambda ih: abs(a.heads[ih]))
pick = st.selectbox(
    "Head",
    heads,
    index=None if "why_head" in st.session_state else heads.index(best),
    format_func=render.labeller({ih: f"layer {ih[0]}, head {ih[1]} (share {a.heads[ih]:+.3f})" for ih in heads}),
    key="why_head",
    help="Starts at the head with the largest share",
)
labels = [plot_text(f"{i}:{visible(t.text)[:12]}") for i, t in enumerate(tr.tokens)]
render.figure(head_row_figure(tr.attn_last_row[pick[0], pick[1]], labels, f"Layer {pick[0]}, head {pick[1]}: attention from the last position"), "head row")
st.caption("Attention says where a head read from, not that what it read decided the answer: the switch below is the test.")

st.subheader("Where the answer's information came from")
st.markdown(
    "Each layer moves information between positions. An edge from a token after one layer to a position after the next "
    "is as wide as its **share** of what reached that position: attention weight × the size of the token's value vector "
    "after its head's output projection, summed over heads (orange), against the position's own residual stream (grey). "
    "Only edges on a path to the prediction (★) are drawn. **Attention alone is not an explanation**: a wide edge says "
    "information moved, not that the answer needed it; switching components off and patching (below) test that."
)
if len(ids) > FLOW_MAX_TOKENS:
    st.info(f"The prompt is {len(ids):,} tokens; the graph is drawn for prompts of at most {FLOW_MAX_TOKENS} tokens. Shorten it to see it.")
else:
    fkey = ("flow", lm.label, tuple(ids))
    if st.session_state.get("_why_flow_key") != fkey:
        st.session_state["_why_flow"], st.session_state["_why_flow_key"] = lm.run(lambda progress=None: flow(lm, ids)), fkey
    fl = st.session_state["_why_flow"]
    thr = st.slider("Draw edges with a share of at least", 0.02, 0.6, 0.05, 0.01, key="why_flow_min", help="Lower: more, thinner edges")
    edges = fl.graph(thr)
    render.figure(
        flow_figure(edges, labels, a.heads.shape[0], f"How information reached the prediction (shares ≥ {thr:.2f})"),
        "contribution graph",
        settings={"threshold": thr},
    )
    reads = [(j, float(w)) for layer, j, i, w in edges if j != i]
    st.caption(f"{len(edges)} edges drawn, {len(reads)} of them through attention (pipeline.forward.attribution.flow gives the same numbers).")

st.subheader("Switch components off")
parts = [n for n, _ in a.largest(30) if n != "embedding" and "bias" not in n]
presets = {"the 5 heads with the largest shares": [n for n in parts if "H" in n and "FFN" not in n][:5]}
chosen = st.multiselect("Components", parts, default=presets["the 5 heads with the largest shares"], key="why_off", help="Among the 30 largest shares")
mode = st.radio(
    "Switched off to",
    ["zero", "mean"],
    horizontal=True,
    key="why_mode",
    help="zero: their output set to 0; mean: replaced by its mean over the prompt's positions",
)
if st.button("Switch them off", type="primary", key="why_go", disabled=not chosen) and guard.allowed("an intervention"):
    hs = [(int(n.split()[0][1:]), int(n.split()[1][1:])) for n in chosen if "FFN" not in n]
    ff = [int(n.split()[0][1:]) for n in chosen if "FFN" in n]
    loading.remember(
        "why_ablation", (key, tuple(chosen), mode, lm.run(lambda progress=None: ablate(lm, ids, heads=hs, ffn=ff, mode=mode, before=tr.next_logits)))
    )
got = loading.recall("why_ablation")
if got is not None and got[0] == key:
    _, off, md, d = got
    cands = [int(i) for i in np.argsort(-(d.before.numpy() + d.after.numpy()))[:8]]
    tok = lit(repr(visible(text_of(lm.tokenizer, [d.token]))))
    r = st.columns(3)
    r[0].metric(f"p({tok})", f"{float(d.after[d.token]):.3f}", f"{float(d.after[d.token] - d.before[d.token]):+.3f}")
    r[1].metric("Its rank now", d.new_rank + 1, help="1 = still the most likely")
    r[2].metric("KL divergence", f"{d.kl:.3f} nats", help="How far the whole distribution moved")
    render.figure(
        before_after_figure(
            [plot_text(repr(visible(text_of(lm.tokenizer, [t])))) for t in cands],
            d.before.numpy()[cands],
            d.after.numpy()[cands],
            f"Next token with {len(off)} component(s) switched off ({md})",
        ),
        "ablation",
        settings={"switched off": ", ".join(off), "mode": md},
    )

st.subheader("Patching between two prompts")
st.markdown(
    "Run a **clean** prompt and a **corrupted** one that differs in a few words, then put the clean run's residual "
    "stream back at one (layer, position) of the corrupted run, and see how much of the clean answer's lead comes "
    "back. Where restoring one position brings the answer back, the model carried what it needed there."
)
PAIRS = {
    "The Eiffel Tower / the Colosseum": ("The Eiffel Tower is in the city of", "The Colosseum is in the city of"),
    "Dog bites man / Man bites dog": ("Dog bites man. The one who bit was the", "Man bites dog. The one who bit was the"),
}
pair = st.selectbox("Preset", list(PAIRS), key="why_pair")
pc = st.columns(2)
clean = pc[0].text_input("Clean prompt", PAIRS[pair][0], key=f"why_clean_{pair}")
corrupt = pc[1].text_input("Corrupted prompt", PAIRS[pair][1], key=f"why_corrupt_{pair}")
over = st.radio(
    "Restore",
    ["position", "head"],
    format_func=render.labeller({"position": "one position's residual stream (layer × position)", "head": "one head's output everywhere (layer × head)"}),
    horizontal=True,
    key="why_over",
)
if st.button("Patch every layer and " + over, key="why_patch"):
    ci, ki = prepare(lm, clean, 1).prompt_ids, prepare(lm, corrupt, 1).prompt_ids
    if len(ci) != len(ki):
        st.warning(
            f"The clean prompt is {len(ci)} tokens and the corrupted one {len(ki)}: patching restores one position at a time, so they "
            "need the same number of tokens. Swap a word for one that is as many tokens (page 1 shows the pieces)."
        )
    else:
        with runs.heavy("activation patching", slot="patch"):
            bar = st.progress(0.0, text="patching")
            loading.remember(
                "why_patch",
                (
                    lm.label,
                    clean,
                    corrupt,
                    [text_of(lm.tokenizer, [t]) for t in ci],
                    patch(lm, ci, ki, progress=lambda f, m: bar.progress(f, text=m), over=over),
                ),
            )
            bar.empty()
kept = loading.recall("why_patch")
if kept is not None and kept[0] == lm.label:
    _, cl, co, toks, pt = kept
    ca, ka = (visible(text_of(lm.tokenizer, [t])) for t in (pt.clean_token, pt.corrupt_token))
    q = st.columns(2)
    q[0].metric(f"logit({ca!r}) − logit({ka!r}), clean", f"{pt.clean_diff:.2f}")
    q[1].metric("… corrupted", f"{pt.corrupt_diff:.2f}")
    cols = [plot_text(visible(t)[:10]) for t in toks] if pt.over == "position" else [f"H{h}" for h in range(pt.grid.shape[1])]
    render.figure(
        patching_figure(pt.grid, cols, f"How much of {ca!r} over {ka!r} comes back", over=pt.over),
        "patching",
        settings={"clean": cl, "corrupted": co, "restored": pt.over},
    )

st.subheader("Two prompts side by side")
SIDE = {"The two Apple sentences": ("Apple released a new", "Apple fell from the"), "Dog bites man / Man bites dog": PAIRS["Dog bites man / Man bites dog"]}
side = st.selectbox("Preset", list(SIDE), key="why_side")
sc = st.columns(2)
pa = sc[0].text_input("First prompt", SIDE[side][0], key=f"why_a_{side}")
pb = sc[1].text_input("Second prompt", SIDE[side][1], key=f"why_b_{side}")
if st.button("Compare them", key="why_compare") and guard.allowed("comparing two prompts"):
    (_, ta), (_, tb) = runs.get_trace(pa, False), runs.get_trace(pb, False)
    t0 = int(np.argmax(ta.next_logits))  # the first prompt's answer, explained after both
    both = lm.run(lambda progress=None: (attribute(lm, list(ta.input_ids), t0), attribute(lm, list(tb.input_ids), t0)))
    dists = [np.exp(t.next_logits - t.next_logits.max()) for t in (ta, tb)]
    tops = [[(plot_text(repr(visible(text_of(lm.tokenizer, [int(i)])))), float(p[i] / p.sum())) for i in np.argsort(-p)[:8]] for p in dists]
    lens = {
        "layer": [f"L{i - 1}" if i else "embedding" for i in range(len(ta.lens_last_top))],
        "first prompt: top token": [visible(text_of(lm.tokenizer, [r[0][0]])) for r in ta.lens_last_top],
        "second prompt: top token": [visible(text_of(lm.tokenizer, [r[0][0]])) for r in tb.lens_last_top],
    }
    loading.remember("why_side", (lm.label, (ta.prompt, tb.prompt), t0, tops, lens, both))  # not the traces: numbers only
got = loading.recall("why_side")
if got is not None and got[0] == lm.label:
    _, prompts, t0, tops, lens, (aa, ab) = got
    render.figure(
        side_by_side_figure([plot_text(q) for q in prompts], tops, "The next token after each prompt"),
        "side by side",
        settings={"prompts": " | ".join(prompts)},
    )
    st.caption("Logit lens: the token each layer's residual stream at the last position would predict (the final norm and LM head applied early).")
    render.table("logit lens, two prompts", lens, hide_index=True)
    what0 = f"logit({visible(text_of(lm.tokenizer, [t0]))!r})"
    st.caption(f"{what0}: {aa.logit:.2f} after the first prompt, {ab.logit:.2f} after the second. Which components make the difference:")
    render.figure(shares_heatmap(aa.heads - ab.heads, aa.ffn - ab.ffn, f"Shares of {what0}: first prompt minus second"), "attribution difference")

first_head = next(((int(n.split()[0][1:]), int(n.split()[1][1:])) for n in parts if "FFN" not in n), (0, 0))
proof.how_do_we_know(lambda: [checks.check_attribution(a), checks.check_ablation(lm, ids, *first_head)], "why", a)
