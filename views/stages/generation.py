import streamlit as st

from components.fmt import prob
from components.generation import distribution_figure, step_times_figure, token_labels
from components.tokens import lit, visible
from pipeline.generation import Finish, metrics
from pipeline.lab import checks
from views import generating, loading, proof, render, runs, steps_view

render.intro(
    "After the first token the loop begins: the chosen token is appended to the input and the model runs "
    "again, one token at a time, until it emits an end-of-sequence token or reaches the limit. Thanks to the "
    "**KV cache** each step feeds only the newest token; the keys and values of everything before are reused. "
    "This is our own loop (not `model.generate`), so every step's distribution and timing is visible. Click a "
    "generated token to see the distribution it was drawn from."
)
lm = loading.get_model()
prompt = st.session_state.get("prompt", "")
c1, c2 = st.columns([3, 1])
c1.markdown(f"**Prompt** (from {render.prompt_source()}):")
render.verbatim(prompt, c1, max_lines=6)
chat = runs.chat_mode(lm, c2)
generating.generation_presets()
n_new, sampling = generating.sampling_controls("gen")
b1, b2 = st.columns([1, 5])
go = b1.button("Generate", type="primary", key="gen_go")
if b2.button("Stop", key="gen_stop", help="Stops after the current token; what was generated is kept"):
    generating.stop_generation("gen")
out = st.empty()
if go:
    st.session_state.pop("gen_pick", None)  # a new run: show its last token, not the old selection
    rec = generating.run_generation(lm, prompt, chat, n_new, sampling, "gen", out=out)
    if rec is None:
        st.stop()
rec = generating.last_generation("gen", lm)


def _results(rec) -> None:
    ev = rec.events
    if not go:
        render.verbatim(rec.text(), out)
    st.caption(f"Run: {rec.label}.")
    if not rec.done:
        st.warning(f"Stopped after {len(ev)} tokens; what was generated is shown above.")
    elif ev[-1].finished == Finish.EOS:
        st.caption("Stopped at the end-of-sequence token.")
    m = metrics(ev)
    c = st.columns(5)
    c[0].metric("Tokens generated", m.n)
    c[1].metric("Time to first token", f"{m.ttft_s * 1000:.0f} ms", help=f"Request in → first token out: {m.ttft_parts()} (the first bar below)")
    c[2].metric("Time per output token", f"{m.tpot_s * 1000:.0f} ms" if m.tpot_s else "—", help="(latency − TTFT) / (n − 1)")
    c[3].metric("Decode speed", f"{m.tokens_per_s:.1f} tok/s" if m.tokens_per_s else "—")
    c[4].metric("Prompt tokens", rec.prompt_tokens)
    render.busy_note(rec.busy)
    generating.beside_fp32(lm, rec, "gen")  # an int8 model's answer: its precision, and beside fp32 on request
    pick = st.pills(
        "Generated tokens (click one; the small number is its position)",
        list(range(len(ev))),
        default=len(ev) - 1 if ev else None,
        format_func=render.labeller(token_labels(ev)),
        key="gen_pick",
    )
    if pick is not None:
        e = ev[pick]
        st.markdown(
            f"Token {pick} (**{e.phase}**): {lit(repr(visible(e.text)))}, id {e.token_id}, p = {prob(e.p)} after the "
            f"filters ({prob(e.p_raw)} before); context {e.context_len} tokens; step {e.step_s * 1000:.1f} ms"
        )
        render.figure(distribution_figure(e), "distribution")
    render.figure(step_times_figure(ev), "step times", main=True)
    proof.how_do_we_know(lambda: checks.generation_checks(lm, rec), "gen", rec, ask=True)


if rec is None:
    st.info(f"Press **Generate** to run the loop on the prompt (from {render.prompt_source()}).")
else:
    _results(rec)
steps_view.section(lm)
