"""Page 17, why this token: the shares of a logit (read from the trace's activations), where a head looked, the
contribution graph, switching components off, patching between two prompts, two prompts side by side. Each experiment
is a `loading.Ask` in the one cache of them (`cached` when reading the trace, `run` when a button changes the model)."""

import numpy as np
import streamlit as st

from components.tokens import lit, plot_text, visible
from components.why import before_after_figure, flow_figure, head_row_figure, largest_figure, patching_figure, shares_heatmap, side_by_side_figure
from pipeline import text_of
from pipeline.forward import FLOW_MAX_TOKENS, Ablation, Component, Kind, PatchOver, UnknownNorm, ablate, attribute, flow, patch
from pipeline.lab import checks
from views import guard, proof, render, runs
from views.loading import Ask, cached, last, run

PAIRS = {
    "The Eiffel Tower / the Colosseum": ("The Eiffel Tower is in the city of", "The Colosseum is in the city of"),
    "Dog bites man / Man bites dog": ("Dog bites man. The one who bit was the", "Man bites dog. The one who bit was the"),
}
SIDE = {"The two Apple sentences": ("Apple released a new", "Apple fell from the"), "Dog bites man / Man bites dog": PAIRS["Dog bites man / Man bites dog"]}


def _name(lm, t: int) -> str:
    return visible(text_of(lm.tokenizer, [t]))


def _candidates(lm, tr):
    """The two pickers: the candidate explained, and the one it is compared with (or None)."""
    probs = np.exp(tr.next_logits - tr.next_logits.max())
    probs /= probs.sum()
    top = [int(i) for i in np.argsort(-probs)[:10]]
    name = {t: f"{_name(lm, t)!r} (p = {probs[t]:.3f})" for t in top}
    c = st.columns(2)
    target = c[0].selectbox(
        "Explain the logit of", top, format_func=render.labeller(name), key="why_target", help="The most likely next token, or another candidate"
    )
    versus = c[1].selectbox(
        "… minus the logit of",
        [None] + [t for t in top if t != target],
        format_func=render.labeller({None: "(nothing: the logit itself)"} | name),
        key="why_versus",
        help="Explain why one candidate beats another: the shares of logit(target) − logit(this one)",
    )
    return target, versus


def _shares(lm, tr, target, versus):
    """The shares of the logit, read from the trace (no forward pass): metrics, the heatmap, the largest."""
    a = cached(Ask("attribution", (tuple(tr.input_ids), target, versus)), lambda: attribute(lm, tr, target, versus))
    what = f"logit({_name(lm, target)!r})" + (f" − logit({_name(lm, versus)!r})" if versus is not None else "")
    m = st.columns(3)
    m[0].metric(f"The model's {what}", f"{a.logit:.3f}")
    m[1].metric("Sum of the shares", f"{a.total:.3f}", help="Embedding + every head + every feed-forward block (+ biases): equal to the logit")
    m[2].metric("Final norm's rms (frozen)", f"{a.final_rms:.2f}")
    render.figure(  # a click on a head's cell opens its attention row below (the last column, the feed-forward block, has none)
        shares_heatmap(a.heads, a.ffn, f"Each component's share of {what}"),
        "shares",
        key="why_shares",
        main=True,
        settings={"target": what},
        click_sets=("why_head", a.heads.shape[1]),
    )
    st.caption("Click a head's cell to open where it looked, below.")
    render.figure(largest_figure([(str(c), v) for c, v in a.largest(15)], "The 15 largest shares (the embedding's included)"), "largest")
    st.caption(f"The embedding's own share: {a.embedding:+.3f}. Red and orange add to {what}, blue takes from it.")
    return a


def _head_row(tr, a, labels):
    st.subheader("Where a head looked")
    heads = [(i, h) for i in range(a.heads.shape[0]) for h in range(a.heads.shape[1])]
    if st.session_state.get("why_head") not in heads:  # another model's head, or none picked yet
        st.session_state.pop("why_head", None)
    best = max(heads, key=lambda ih: abs(a.heads[ih]))
    pick = st.selectbox(
        "Head",
        heads,
        index=None if "why_head" in st.session_state else heads.index(best),
        format_func=render.labeller({ih: f"layer {ih[0]}, head {ih[1]}" for ih in heads}),
        key="why_head",
        help="Starts at the head with the largest share",
    )
    row = tr.acts[f"blocks.{pick[0]}.attn.hook_pattern|last"][pick[1]]
    render.figure(head_row_figure(row, labels, f"Layer {pick[0]}, head {pick[1]} (share {a.heads[pick]:+.3f}): attention from the last token"), "head row")
    st.caption("Attention says where a head read from, not that what it read decided the answer: the switch below is the test.")


def _graph(lm, tr, labels):
    st.subheader("Where the answer's information came from")
    st.markdown(
        "Each layer moves information between positions. An edge from a token after one layer to a position after the next "
        "is as wide as its **share** of what reached that position: attention weight × the size of the token's value vector "
        "after its head's output projection, summed over heads (orange), against the position's own residual stream (grey). "
        "Only edges on a path to the prediction (★) are drawn. **Attention alone is not an explanation**: a wide edge says "
        "information moved, not that the answer needed it; switching components off and patching (below) test that."
    )
    if tr.T > FLOW_MAX_TOKENS:
        st.info(f"The prompt is {tr.T:,} tokens; the graph is drawn for prompts of at most {FLOW_MAX_TOKENS} tokens. Shorten it to see it.")
        return
    fl = cached(Ask("flow", (tuple(tr.input_ids),)), lambda: flow(lm, tr))
    thr = st.slider("Draw edges with a share of at least", 0.02, 0.6, 0.05, 0.01, key="why_flow_min", help="Lower: more, thinner edges")
    edges = fl.graph(thr)
    render.figure(
        flow_figure(edges, labels, tr.facts.n_layers, f"How information reached the prediction (shares ≥ {thr:.2f})"),
        "contribution graph",
        settings={"threshold": thr},
    )
    reads = [(j, float(w)) for layer, j, i, w in edges if j != i]
    st.caption(f"{len(edges)} edges drawn, {len(reads)} of them through attention, read from this trace's patterns and values.")


def _switch_off(lm, tr, a, target):
    st.subheader("Switch components off")
    parts = [c for c, _ in a.largest(30) if c.kind in (Kind.HEAD, Kind.FFN)]
    names = [str(c) for c in parts]
    chosen = st.multiselect("Components", names, default=[str(c) for c in parts if c.kind is Kind.HEAD][:5], key="why_off", help="Among the 30 largest shares")
    mode = st.radio(
        "Switched off to",
        [m.value for m in Ablation],
        horizontal=True,
        key="why_mode",
        help="zero: their output set to 0; mean: replaced by its mean over the prompt's positions",
    )
    ask = Ask("ablation", (tuple(tr.input_ids), tuple(chosen), mode, target))
    if st.button("Switch them off", type="primary", key="why_go", disabled=not chosen) and guard.allowed("an intervention"):
        off = [Component.parse(n) for n in chosen]
        run(ask, lambda: lm.run(lambda progress=None: ablate(lm, tr, off, Ablation(mode), token=target)))
    got = last("ablation")
    if got is None or got[0].inputs[0] != ask.inputs[0]:  # nothing switched off yet for this prompt
        return
    (_, off, md, _), d = got[0].inputs, got[1]
    cands = [int(i) for i in np.argsort(-(d.before.numpy() + d.after.numpy()))[:8]]
    tok = lit(repr(_name(lm, d.token)))
    r = st.columns(3)
    r[0].metric(f"p({tok})", f"{float(d.after[d.token]):.3f}", f"{float(d.after[d.token] - d.before[d.token]):+.3f}")
    r[1].metric("Its rank now", d.new_rank + 1, help="1 = the most likely; the candidate explained above")
    r[2].metric("KL divergence", f"{d.kl:.3f} nats", help="How far the whole distribution moved")
    render.figure(
        before_after_figure(
            [plot_text(repr(_name(lm, t))) for t in cands],
            d.before.numpy()[cands],
            d.after.numpy()[cands],
            f"Next token with {len(off)} component(s) switched off ({md})",
        ),
        "ablation",
        settings={"switched off": ", ".join(off), "mode": md},
    )


def _patching(lm):
    st.subheader("Patching between two prompts")
    st.markdown(
        "Run a **clean** prompt and a **corrupted** one that differs in a few words, then put the clean run's residual "
        "stream back at one (layer, position) of the corrupted run, and see how much of the clean answer's lead comes "
        "back. Where restoring one position brings the answer back, the model carried what it needed there."
    )
    pair = st.selectbox("Patching preset", list(PAIRS), key="why_pair")
    pc = st.columns(2)
    clean = pc[0].text_input("Clean prompt", PAIRS[pair][0], key=f"why_clean_{pair}")
    corrupt = pc[1].text_input("Corrupted prompt", PAIRS[pair][1], key=f"why_corrupt_{pair}")
    over = st.radio(
        "Restore",
        [o.value for o in PatchOver],
        format_func=render.labeller({"position": "one position's residual stream (layer × position)", "head": "one head's output everywhere (layer × head)"}),
        horizontal=True,
        key="why_over",
    )
    if st.button("Patch every layer and " + over, key="why_patch"):
        (_, ct), (_, kt) = runs.get_trace(clean, False), runs.get_trace(corrupt, False)
        if ct.T != kt.T:
            st.warning(
                f"The clean prompt is {ct.T} tokens and the corrupted one {kt.T}: patching restores one position at a time, so they "
                "need the same number of tokens. Swap a word for one that is as many tokens (page 1 shows the pieces)."
            )
        else:
            with runs.heavy("activation patching", slot="patch"):
                bar = st.progress(0.0, text="patching")
                ask = Ask("patching", (clean, corrupt, tuple(text_of(lm.tokenizer, [t]) for t in ct.input_ids), over))
                run(ask, lambda: patch(lm, ct, kt, progress=lambda f, m: bar.progress(f, text=m), over=PatchOver(over)))
                bar.empty()
    got = last("patching")
    if got is None:
        return
    (cl, co, toks, _), pt = got[0].inputs, got[1]
    ca, ka = (_name(lm, t) for t in (pt.clean_token, pt.corrupt_token))
    q = st.columns(2)
    q[0].metric(f"logit({ca!r}) − logit({ka!r}), clean", f"{pt.clean_diff:.2f}")
    q[1].metric("… corrupted", f"{pt.corrupt_diff:.2f}")
    by_position = pt.over is PatchOver.POSITION
    cols = [plot_text(visible(t)[:10]) for t in toks] if by_position else [f"H{h}" for h in range(pt.grid.shape[1])]
    render.figure(
        patching_figure(pt.grid, cols, f"How much of {ca!r} over {ka!r} comes back", by_position=by_position),
        "patching",
        settings={"clean": cl, "corrupted": co, "restored": pt.over.value},
    )


def _side_by_side(lm):
    st.subheader("Two prompts side by side")
    side = st.selectbox("Side-by-side preset", list(SIDE), key="why_side")
    sc = st.columns(2)
    pa = sc[0].text_input("First prompt", SIDE[side][0], key=f"why_a_{side}")
    pb = sc[1].text_input("Second prompt", SIDE[side][1], key=f"why_b_{side}")
    if st.button("Compare them", key="why_compare") and guard.allowed("comparing two prompts"):
        (_, ta), (_, tb) = runs.get_trace(pa, False), runs.get_trace(pb, False)
        run(Ask("comparison", (ta.prompt, tb.prompt)), lambda: _compare(lm, ta, tb))  # numbers only, not the traces
    got = last("comparison")
    if got is None:
        return
    prompts, (t0, tops, lens, aa, ab) = got[0].inputs, got[1]
    render.figure(
        side_by_side_figure([plot_text(q) for q in prompts], tops, "The next token after each prompt"),
        "side by side",
        settings={"prompts": " | ".join(prompts)},
    )
    st.caption("Logit lens: the token each layer's residual stream at the last position would predict (the final norm and LM head applied early).")
    render.table("logit lens, two prompts", lens, hide_index=True)
    what0 = f"logit({_name(lm, t0)!r})"
    st.caption(f"{what0}: {aa.logit:.2f} after the first prompt, {ab.logit:.2f} after the second. Which components make the difference:")
    render.figure(shares_heatmap(aa.heads - ab.heads, aa.ffn - ab.ffn, f"Shares of {what0}: first prompt minus second"), "attribution difference")


def _compare(lm, ta, tb):
    """The first prompt's answer explained after both (read from the two traces), their next tokens and lenses."""
    t0 = int(np.argmax(ta.next_logits))
    dists = [np.exp(t.next_logits - t.next_logits.max()) for t in (ta, tb)]
    tops = [[(plot_text(repr(_name(lm, int(i)))), float(p[i] / p.sum())) for i in np.argsort(-p)[:8]] for p in dists]
    lens = {"layer": [f"L{i - 1}" if i else "embedding" for i in range(len(ta.lens_last_top))]}
    lens |= {f"{which} prompt: top token": [_name(lm, r[0][0]) for r in t.lens_last_top] for which, t in (("first", ta), ("second", tb))}
    return t0, tops, lens, attribute(lm, ta, t0), attribute(lm, tb, t0)


render.intro(
    "Why did the model pick this token? The last position's residual stream is the embedding plus what every attention head and every feed-forward block added, and the logit of a token is (after the final norm, whose scale is frozen at this run's value) a sum of one **share** per component. The shares below add up exactly to the model's own logit. Which heads and blocks carry the answer? Then **switch them off** and see whether the answer really changes: a large share is a claim, switching it off is the test."
)
lm, tr = runs.get_trace()
labels = [plot_text(f"{i}:{visible(t.text)[:12]}") for i, t in enumerate(tr.tokens)]
target, versus = _candidates(lm, tr)
try:
    a = _shares(lm, tr, target, versus)
except UnknownNorm as e:  # a family whose norm has no formula here yet: said in the page, the app keeps serving
    st.warning(f"Why this token cannot split this model's logit: {e}. Its norm's formula is one row in pipeline/model/arch.py's NORM_KINDS.")
    st.stop()
_head_row(tr, a, labels)
_graph(lm, tr, labels)
_switch_off(lm, tr, a, target)
_patching(lm)
_side_by_side(lm)
first_head = next((c for c, _ in a.largest(None) if c.kind is Kind.HEAD), Component(Kind.HEAD, 0, 0))
proof.how_do_we_know(lambda: [checks.check_attribution(a), checks.check_ablation(lm, tr, first_head.layer, first_head.head)], "why", a)
