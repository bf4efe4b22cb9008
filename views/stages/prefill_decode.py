import pandas as pd
import streamlit as st

import pipeline
from components.generation import cache_on_off_figure, step_times_figure, sweep_figure
from pipeline.generation import cache_off_sweep, cache_verdict, metrics, prefill_decode_sweep, sweep_verdict
from pipeline.lab import checks
from views import generating, guard, loading, proof, render, runs

render.intro(
    "Generation has two phases. **Prefill** runs the whole prompt through the model in one forward pass: "
    "every prompt token is processed in parallel and its keys and values go into the KV cache. Its end is the "
    "**time to first token** (TTFT). **Decode** then produces one token per forward pass, reading the cache "
    "instead of recomputing the past. Prefill does a lot of arithmetic on many tokens at once; a decode step "
    "does little arithmetic but must read every weight of the model for a single token, so its time barely "
    "depends on the context length, until the context gets long."
)
lm = loading.get_model()

st.subheader("This run")
rec = generating.last_generation("gen", lm)
if rec is None:
    st.info("Generate something on the Generation page to see its first token next to its decode steps; or run the sweep below.")
else:
    ev = rec.events
    m = metrics(ev)
    st.caption(
        f"The Generation page's last run: {rec.label}."
        + (" The prompt has changed since; generate again on the Generation page to measure it." if rec.prompt != st.session_state.get("prompt", "") else "")
    )
    c = st.columns(3)
    c[0].metric("Time to first token", f"{m.ttft_s * 1000:.0f} ms", help=f"{rec.prompt_tokens} prompt tokens: {m.ttft_parts()} (the first bar below)")
    if cached := ev[0].cached_tokens:
        st.caption(
            f"{cached} of the {rec.prompt_tokens} prompt tokens were not computed: an earlier prompt on this server started with "
            "the same tokens (a chat template's system turn, or the same question again), and the engine shares those KV blocks. "
            "The sweep below measures whole prompts."
        )
    c[1].metric("Mean decode step", f"{m.tpot_s * 1000:.0f} ms" if m.tpot_s else "—")
    c[2].metric("TTFT ÷ decode step", f"{m.ttft_s / m.tpot_s:.1f}×" if m.tpot_s else "—")
    render.figure(step_times_figure(ev), "step times", main=True)
    render.busy_note(rec.busy)

st.subheader("Prompt length sweep")
gpu = lm.device.type == "cuda"
lengths = guard.sweep_lengths([16, 64, 256, 1024, 2048] if gpu else [16, 64, 256, 1024], "sweep_max")
reps = guard.cap("repeats", 3)
st.caption(
    f"Prompt lengths {', '.join(f'{n:,}' for n in lengths)} ({'GPU' if gpu else 'CPU: fewer and shorter'}); each prefill is one forward "
    f"pass, each decode time the mean of 8 steps after it; {reps} interleaved repeats after a warm-up (each repeat measures every length, "
    "in a rotated order): the median, and bars from the lowest to the highest repeat." + guard.cap_note("sweep_tokens", "prompt tokens")
)
if st.button("Run the sweep", key="sweep_go"):
    with runs.heavy("the prompt-length sweep", slot="sweep"):
        bar = st.progress(0.0, text="prefill and decode at each length")
        loading.remember("sweep", prefill_decode_sweep(lm, lengths, decode_steps=8, repeats=reps, progress=lambda f, m: bar.progress(f, text=f"measured {m}")))
        bar.empty()
rows = loading.recall("sweep")
if rows is not None:
    render.figure(sweep_figure(rows), "sweep")
    render.table(
        "sweep",
        pd.DataFrame(
            [
                {
                    "prompt tokens": r.tokens,
                    "prefill ms (median)": round(r.prefill_s * 1000, 1),
                    "prefill ms (range)": f"{r.prefill.lo * 1000:.1f}–{r.prefill.hi * 1000:.1f}",
                    "prefill ms per token": round(r.prefill_per_token_s * 1000, 2),
                    "decode step ms (median)": round(r.decode_step_s * 1000, 1),
                    "decode step ms (range)": f"{r.decode.lo * 1000:.1f}–{r.decode.hi * 1000:.1f}",
                }
                for r in rows
            ]
        ),
        hide_index=True,
    )
    verdict = sweep_verdict(rows)
    render.claim_or_doubt(verdict)
    render.busy_note("sweep", noisy=not verdict.claim)

st.subheader("Without the KV cache")
st.markdown(
    "The same greedy generation twice at each context length: with the cache each step feeds one token; without "
    "it every step feeds the whole context again, so its time grows with the length. Same tokens out."
)
ctx_lengths = [n for n in ([16, 128, 512, 1024] if gpu else [16, 128, 512]) if n <= (guard.cap("sweep_tokens") or n)]
n_new = 3
if st.button(f"Run {n_new} tokens after prompts of {', '.join(map(str, ctx_lengths))} tokens, with and without the cache", key="cache_go"):
    with runs.heavy("the cache comparison", slot="cache_cmp"):
        bar = st.progress(0.0, text="generating with and without the cache")
        try:
            loading.remember("cache_cmp", cache_off_sweep(lm, ctx_lengths, n_new, repeats=reps, progress=lambda f, m: bar.progress(min(f, 1.0), text=m)))
        except pipeline.TraceError as e:
            st.warning(str(e))
        bar.empty()
cmp_ = loading.recall("cache_cmp")
if cmp_ is not None and not isinstance(cmp_, list):
    cmp_ = None  # a result of an older layout kept by this session
if cmp_ is not None:
    render.figure(cache_on_off_figure(cmp_), "cache on off")
    same = all(r.same_tokens for r in cmp_)
    last = cmp_[-1]
    c = st.columns(3)
    for col, what, s in ((c[0], "on", last.on), (c[1], "off", last.off)):
        render.metric_of(
            col,
            f"Decode step at {last.tokens:,} tokens, cache {what}",
            s,
            help=f"The median of {len(s.values)} interleaved repeats, each the mean of the decode steps after the first token",
        )
    c[2].metric("Same tokens", "yes" if same else "NO")
    verdict = cache_verdict(cmp_)
    render.claim_or_doubt(verdict)
    render.busy_note("cache_cmp", noisy=not verdict.claim)

found = []
if cmp_ is not None:
    found.append(
        checks.Check(
            "greedy tokens with the cache = without it (every step recomputes the whole context)",
            all(r.same_tokens for r in cmp_),
            f"{len(cmp_)} context lengths, {n_new} tokens each: " + ", ".join(f"{r.tokens:,}: {'same' if r.same_tokens else 'DIFFERENT'}" for r in cmp_),
        )
    )
if rows is not None:
    found.append(
        checks.Check(
            "each prefill is one forward pass over the whole prompt, each decode step one token after it",
            all(r.prefill_s > 0 and r.decode_step_s > 0 for r in rows),
            f"{len(rows)} lengths measured ({', '.join(f'{r.tokens:,}' for r in rows)} tokens), {len(rows[0].prefill.values)} interleaved repeats after a warm-up, device-synchronised",
        )
    )
if rec is not None:
    proof.how_do_we_know(lambda: checks.generation_checks(lm, rec), "gen", rec, ask=True, label="How do we know? The Generation page's run, cross-checked")
if found:
    proof.evidence(found, "How do we know? The sweep and the cache experiment")
