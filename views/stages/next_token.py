import numpy as np
import streamlit as st

from components.figures import sampling_figure
from components.fmt import prob
from components.tokens import lit, plot_text, visible
from pipeline import sampling, text_of
from pipeline.lab import checks
from views import generating, live_question, loading, proof, render, runs

render.intro(
    "The last layer's vector is multiplied by the output matrix: one score, a **logit**, for every token in the "
    "vocabulary. **Softmax** turns logits into probabilities. **Temperature** divides the logits first "
    "(below 1 sharpens, above 1 flattens; 0 means always take the top). **Top-k** keeps the k most likely, "
    "**top-p** the smallest set whose probability reaches p, **min-p** those at least min-p × the top "
    "probability. What survives is renormalised and one token is **sampled**. Moving a slider re-filters this "
    "run's cached logits; the model is not run again."
)
lm, tr = runs.get_trace()
c = st.columns(6)
# the generation pages' controls, from the same defaults (pipeline.forward.sampling.DEFAULTS)
chosen = generating.sampling_sliders(c, ("temperature", "top_k", "top_p", "min_p", "seed"))
n_show = c[5].slider("Candidates shown", 5, 40, 15, key="n_show", bind="query-params")

steps = sampling.filter_steps(tr.next_logits, chosen)
first, last = steps[0].probs, steps[-1].probs
order = np.argsort(-first)[:n_show]
cands = [plot_text(f"{visible(text_of(lm.tokenizer, [int(i)]))!r} ({int(i)})") for i in order]
render.figure(
    sampling_figure(
        cands, [(s.name + ("" if s.active else " (off)"), s.probs[order]) for s in steps], [(int(i), text_of(lm.tokenizer, [int(i)])) for i in order]
    ),
    "filters",
    key="sampling_bars",
    main=True,
)
live_question.presenter(lm, tr)  # in a live class: "what comes next?", asked of the class
live_question.follower(lm, tr)
m = st.columns(4)
m[0].metric("Vocabulary", f"{len(first):,}")
m[1].metric("Candidates left", f"{steps[-1].kept:,}")
m[2].metric(
    "Entropy, bits",
    f"{sampling.entropy_bits(first):.2f} → {sampling.entropy_bits(last):.2f}",
    help="Uncertainty of the distribution before any filter → after all filters",
)
m[3].metric("Top candidate now", f"{last.max():.3f}")
st.caption(
    "✗ marks a candidate filtered out at that stage; the bars are renormalised over the survivors. "
    f"Logits range {tr.next_logits.min():.1f} … {tr.next_logits.max():.1f}."
)
if steps[-1].kept == 1 and not chosen.greedy:
    st.info("Only one candidate survives these filters, so sampling always draws it. Raise the temperature or top-p to let more through.")

s1, s2 = st.columns([1, 3])
if s1.button("Sample", type="primary", help=f"Draw one token from the filtered distribution with seed {chosen.seed}"):
    tid = sampling.sample(tr.next_logits, chosen)
    loading.remember("sampled", (tr.text, tid, float(last[tid]), float(first[tid]), chosen.seed))
sampled = loading.recall("sampled")
if sampled is not None and sampled[0] == tr.text:
    _, tid, p, p_raw, sd = sampled
    s2.markdown(
        f"Seed {sd} drew **{lit(repr(visible(text_of(lm.tokenizer, [tid]))))}** (id {tid}): p = {prob(p)} after the filters, {prob(p_raw)} before them:"
    )
    render.verbatim(text_of(lm.tokenizer, [*tr.input_ids, tid]), s2, max_lines=8)

proof.how_do_we_know(
    lambda: [checks.check_filters(tr.next_logits, chosen), checks.check_logits(lm, tr)[0]],
    f"next{chosen.temperature}-{chosen.top_k}-{chosen.top_p}-{chosen.min_p}",
    tr,
)
