import plotly.graph_objects as go
import streamlit as st

from components.tokens import lit, marked_html, visible
from pipeline import text_of
from pipeline.lab import misconceptions as mc
from views import guard, loading, proof, render, runs

render.intro(
    "The article ends by separating popular myths from what really happens. Each one below is put to the test "
    "on the loaded model and the prompt: what the article claims, then what this run shows."
)
lm, tr = runs.get_trace()
tok = lm.tokenizer


def myth(title: str, claim: str) -> None:
    st.subheader(title)
    st.markdown(f"**The article:** {claim}")


# 1 ------------------------------------------------------------------------------------------------------
myth(
    '"The model writes the whole answer internally, then streams it."',
    "It doesn't: it generates one token, appends it and runs again. Below, the runner-up token is forced at one "
    "step and the model goes on from there: if the answer existed in advance, the rest would not change.",
)
at = st.slider("Force the runner-up at step", 0, 8, 2, key="myth_at", bind="query-params")
if st.button("Generate, then force one token", key="myth_force", type="primary") and guard.allowed("this experiment"):
    with st.spinner("Generating twice, 12 greedy tokens…"), runs.timed("myth_force"):
        try:
            loading.remember("myth_force", mc.force_token(lm, tr.prompt, n=12, at=at, chat=tr.chat))
        except Exception as e:  # noqa: BLE001 - a bad prompt: say so, keep serving
            guard.fail(e, "run this experiment")
forced = loading.recall("myth_force")
if forced is not None:
    k, orig = forced.at, forced.original
    st.markdown(f"**The prompt** (from {render.prompt_source()}):")
    render.verbatim(tr.prompt, max_lines=4)
    st.markdown("**As generated** (greedy):")
    render.html_view(
        marked_html(text_of(tok, orig[:k]), text_of(tok, orig[k : k + 1]), text_of(tok, orig[k + 1 :]), f"step {k}: the model's own choice"), "as generated"
    )
    st.markdown(f"**With the runner-up {lit(repr(visible(text_of(tok, [forced.forced]))))} forced at step {k}**, then greedy again:")
    render.html_view(
        marked_html(text_of(tok, orig[:k]), text_of(tok, [forced.forced]), text_of(tok, forced.after), f"step {k}: the runner-up, forced"), "forced"
    )
    st.caption(f"The box marks step {k} (drawn by this page, not part of either text): the model's own choice above, the forced runner-up below.")
    render.figure(
        go.Figure(go.Bar(x=list(range(len(forced.step_ms))), y=forced.step_ms, marker_color="#0072B2")).update_layout(
            title="Each token its own forward pass: time per step (ms)", xaxis_title="step", yaxis_title="ms", height=300
        ),
        "steps",
        main=True,
    )
    render.busy_note("myth_force")
    proof.show_checks(forced.checks)
else:
    st.caption("Press the button: two short greedy generations (seconds on a CPU).")

# 2 ------------------------------------------------------------------------------------------------------
myth('"The model reads words."', "Models don't process words: they process tokens and vectors. The same word in another form is another token.")
words = mc.word_pieces(tok)
render.table(
    "word pieces",
    [{"text": repr(r["text"]), "pieces": " | ".join(visible(p) for p in r["pieces"]), "ids": ", ".join(map(str, r["ids"]))} for r in words.rows],
    hide_index=True,
    width="stretch",
)
proof.show_checks(words.checks)

# 3 ------------------------------------------------------------------------------------------------------
myth('"A higher temperature makes the model smarter."', "Temperature changes randomness, not knowledge: a model at temperature 2.0 does not know more.")
temps = mc.temperature_sweep(tr.next_logits)
top = text_of(tok, [temps.rows[0].top_id])
render.table(
    "temperature",
    [
        {
            "temperature": r.temperature,
            "most likely token": repr(text_of(tok, [r.top_id])),
            "its probability": r.top_p,
            "entropy (bits)": r.entropy_bits,
            "candidates for 90%": r.n_for_90,
        }
        for r in temps.rows
    ],
    hide_index=True,
    width="stretch",
)
st.caption(f"The next token after the prompt: {lit(repr(visible(top)))} is first at every temperature; only the spread changes.")
proof.show_checks(temps.checks)

# 4 ------------------------------------------------------------------------------------------------------
myth(
    '"A longer context is free."',
    "The first token is the most expensive: the entire prompt must be read first, and every token of context is kept in the KV cache.",
)
gpu = lm.device.type == "cuda"
lengths = [64, 512, 2048] if gpu else [32, 128, 512]
if st.button(f"Measure prefill and KV cache at {', '.join(map(str, lengths))} tokens", key="myth_ctx"):
    with st.spinner("Prefill at each length, medians of 3…"), runs.timed("myth_ctx"):
        loading.remember("myth_ctx", mc.context_cost(lm, lengths))
cost = loading.recall("myth_ctx")
if cost is not None:
    render.table("context cost", cost.rows, hide_index=True, width="stretch")
    render.busy_note("myth_ctx")
    proof.show_checks(cost.checks)
else:
    st.caption("Press the button (seconds on a CPU).")

# 5 ------------------------------------------------------------------------------------------------------
myth(
    '"The model remembers earlier chats."',
    "Nothing is learned while you chat: the weights are fixed. A conversation's memory is its earlier turns sent "
    "again in the prompt (and, within one request, the KV cache).",
)
mem = loading.recall("myth_mem")
if mem is None or mem[0] != tr.text:  # three forward passes: once per prompt, not on every slider move
    mem = (tr.text, mc.no_memory(lm, tr.text, "Dog bites man. Remember this sentence."))
    loading.remember("myth_mem", mem)
mem = mem[1]
st.caption(f"The prompt (from {render.prompt_source()}), run, then {mem.other_prompt!r}, then the same prompt again.")
proof.show_checks(mem.checks)
st.markdown(
    "**And on a server full of visitors?** The same prompt's every step, served by the engine that answers everyone "
    "(its passes shared with other requests' tokens and prompt chunks, its prompt read from the prefix cache), "
    "compared bit for bit with the same request served alone."
)
if st.button("Run it in the shared engine while others generate", key="myth_shared") and guard.allowed("this experiment"):
    from pipeline.engine import Engine, engine_for

    engine = engine_for(lm)
    if not isinstance(engine, Engine):
        st.info("This server's engine runs on Ray Serve: the comparison runs in this process only, where the logits can be read.")
    else:
        with st.spinner("The prompt alone, then beside three other visitors' requests, then from the prefix cache…"), runs.timed("myth_shared"):
            try:
                loading.remember("myth_shared", (tr.text, mc.same_in_engine(lm, engine, list(tr.input_ids), n=8)))
            except Exception as e:  # noqa: BLE001 - a full engine, a bad prompt: say so, keep serving
                guard.fail(e, "run this experiment")
shared = loading.recall("myth_shared")
if shared is not None and shared[0] == tr.text:
    render.table("the same prompt in the shared engine", shared[1].rows, hide_index=True, width="stretch")
    proof.show_checks(shared[1].checks)
