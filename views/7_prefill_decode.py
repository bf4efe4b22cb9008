import pandas as pd
import streamlit as st

import pipeline
from components.generation import cache_on_off_figure, step_times_figure, sweep_figure
from pipeline import checks
from pipeline.generation import metrics, prefill_decode_sweep
from views import widgets

st.title("7 · Prefill vs decode")
st.markdown(
    "Generation has two phases. **Prefill** runs the whole prompt through the model in one forward pass: "
    "every prompt token is processed in parallel and its keys and values go into the KV cache. Its end is the "
    "**time to first token** (TTFT). **Decode** then produces one token per forward pass, reading the cache "
    "instead of recomputing the past. Prefill does a lot of arithmetic on many tokens at once; a decode step "
    "does little arithmetic but must read every weight of the model for a single token, so its time barely "
    "depends on the context length, until the context gets long."
)
lm = widgets.get_model()

st.subheader("This run")
rec = widgets.last_generation("gen", lm)
if rec is None:
    st.info("Generate something on page 6 to see its first token next to its decode steps; or run the sweep below.")
else:
    ev = rec.events
    m = metrics(ev)
    st.caption(
        f"Page 6's last run: {rec.label}."
        + (" The sidebar's prompt has changed since; generate again on page 6 to measure it." if rec.prompt != st.session_state.get("prompt", "") else "")
    )
    c = st.columns(3)
    c[0].metric("Time to first token (prefill)", f"{m.ttft_s * 1000:.0f} ms", help=f"{rec.prompt_tokens} prompt tokens")
    if cached := ev[0].cached_tokens:
        st.caption(
            f"{cached} of the {rec.prompt_tokens} prompt tokens were not computed: an earlier prompt on this server started with "
            "the same tokens (a chat template's system turn, or the same question again), and the engine shares those KV blocks. "
            "The sweep below measures whole prompts."
        )
    c[1].metric("Mean decode step", f"{m.tpot_s * 1000:.0f} ms" if m.tpot_s else "—")
    c[2].metric("TTFT ÷ decode step", f"{m.ttft_s / m.tpot_s:.1f}×" if m.tpot_s else "—")
    widgets.figure(step_times_figure(ev), "step times")

st.subheader("Prompt length sweep")
gpu = lm.device.type == "cuda"
lengths = widgets.sweep_lengths([16, 64, 256, 1024, 2048] if gpu else [16, 64, 256, 1024], "sweep_max")
reps = widgets.cap("repeats", 3)
st.caption(
    f"Prompt lengths {', '.join(f'{n:,}' for n in lengths)} ({'GPU' if gpu else 'CPU: fewer and shorter'}); each prefill is one forward "
    f"pass, each decode time the mean of 8 steps after it; medians of {reps} runs after a warm-up." + widgets.cap_note("sweep_tokens", "prompt tokens")
)
if st.button("Run the sweep", key="sweep_go"):
    with widgets.heavy("the prompt-length sweep"):
        bar = st.progress(0.0, text="prefill and decode at each length")
        widgets.remember("sweep", prefill_decode_sweep(lm, lengths, decode_steps=8, repeats=reps, progress=lambda f, m: bar.progress(f, text=f"measured {m}")))
        bar.empty()
rows = widgets.recall("sweep")
if rows is not None:
    widgets.figure(sweep_figure(rows), "sweep")
    widgets.table(
        "sweep",
        pd.DataFrame(
            [
                {
                    "prompt tokens": r.tokens,
                    "prefill ms": round(r.prefill_s * 1000, 1),
                    "prefill ms per token": round(r.prefill_per_token_s * 1000, 2),
                    "decode step ms": round(r.decode_step_s * 1000, 1),
                }
                for r in rows
            ]
        ),
        hide_index=True,
    )
    first, last = rows[0], rows[-1]
    gp, gd = last.prefill_s / first.prefill_s, last.decode_step_s / first.decode_step_s
    msg = (
        f"From {first.tokens} to {last.tokens} tokens ({last.tokens // first.tokens}× longer) prefill took {gp:.1f}× as long, a decode step {gd:.2f}× as long."
    )
    if gp > 2 * gd:
        st.caption(msg + " Prefill pays for every prompt token; a decode step mostly pays for reading the weights.")
    else:
        st.warning(msg + " That is not the usual picture: the machine may have been busy. Run the sweep again.")

st.subheader("Without the KV cache")
st.markdown(
    "The same greedy generation twice: with the cache each step feeds one token; without it every step "
    "feeds the whole context again, so step time grows with the length. Same tokens out."
)
n_off, ctx = (24, 256) if not gpu else (64, 1024)
prompt = pipeline.generation.long_prompt(lm, ctx)
ctx = len(pipeline.tokenize(lm.tokenizer, prompt).input_ids)  # what generate will see
if st.button(f"Run {n_off} tokens after a {ctx}-token prompt, with and without the cache", key="cache_go"):
    with widgets.heavy("the cache comparison"), st.spinner("Generating twice…"):
        try:
            on = list(pipeline.generation.generate(lm, prompt, n_off, temperature=0.0))
            off = list(pipeline.generation.generate(lm, prompt, n_off, temperature=0.0, use_cache=False))
            widgets.remember("cache_cmp", (on, off))
        except pipeline.TraceError as e:
            st.warning(str(e))
cmp_ = widgets.recall("cache_cmp")
if cmp_ is not None:
    on, off = cmp_
    widgets.figure(cache_on_off_figure(on, off), "cache on off")
    same = [e.token_id for e in on] == [e.token_id for e in off]
    mo, mf = metrics(on), metrics(off)
    c = st.columns(3)
    c[0].metric("Decode speed, cache on", f"{mo.tokens_per_s:.1f} tok/s" if mo.tokens_per_s else "—")
    c[1].metric("Decode speed, cache off", f"{mf.tokens_per_s:.1f} tok/s" if mf.tokens_per_s else "—")
    c[2].metric("Same tokens", "yes" if same else "NO")

found = []
if cmp_ is not None:
    found.append(
        checks.check_same_tokens(
            "greedy tokens with the cache = without it (every step recomputes the whole context)",
            {"on": [e.token_id for e in on]},
            {"on": [e.token_id for e in off]},
        )
    )
if rows is not None:
    found.append(
        checks.Check(
            "each prefill is one forward pass over the whole prompt, each decode step one token after it",
            all(r.prefill_s > 0 and r.decode_step_s > 0 for r in rows),
            f"{len(rows)} lengths measured ({', '.join(f'{r.tokens:,}' for r in rows)} tokens), medians of {reps} runs after a warm-up, device-synchronised",
        )
    )
if rec is not None:
    widgets.how_do_we_know(lambda: checks.generation_checks(lm, rec), "gen", rec, ask=True, label="How do we know? Page 6's run, cross-checked")
if found:
    widgets.evidence(found, "How do we know? The sweep and the cache experiment")
