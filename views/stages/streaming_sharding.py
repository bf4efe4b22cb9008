import time

import pandas as pd
import streamlit as st

from pipeline import GREEDY, text_of
from pipeline.generation import metrics
from pipeline.lab import checks, devices_present, even_device_counts, pipeline_plan, sse_lines, tensor_parallel_plan
from views import generating, loading, proof, render, runs

render.intro(
    "**Streaming.** A server does not wait for the whole answer: each token is sent the moment it is sampled, "
    "as one message of a server-sent event stream. Below: a generation's events as the server would send them, "
    "and a replay at its measured pace."
)
lm = loading.get_model()
rec = generating.last_generation("gen", lm)
if rec is not None:
    st.caption("The stream of the last generation on the Generation page.")
else:
    rec = generating.last_generation("sse", lm)
    if rec is None:
        chat = runs.chat_mode(lm)
        with st.spinner("Generating 24 tokens to stream…"):
            rec = generating.run_generation(lm, st.session_state.get("prompt", "") or "Why is the sky blue?", chat, 24, GREEDY, "sse")
    if rec:
        st.caption(f"The Generation page has not generated anything yet, so this page ran its own short generation: {rec.label}.")
if rec:
    ev = rec.events
    lines = sse_lines(ev)
    m = metrics(ev)
    st.caption(f"{len(ev)} tokens: the first after {m.ttft_parts()}, then one every {(m.tpot_s or 0) * 1000:.0f} ms on average.")
    together = sum(b.t_s == a.t_s for a, b in zip(ev, ev[1:]))
    if together:  # the engine's passes of several decode steps (EngineConfig.decode_steps): said, not hidden
        st.caption(
            f"{together} of these tokens left with the one before them: where nobody else was waiting, the engine ran up to "
            "8 decode steps in one pass (its Python between passes is paid once for them) and sent their tokens together "
            "at the pass's end, as vLLM's multi-step scheduling does. A newcomer stops such a pass after its current step."
        )
    render.busy_note(rec.busy)
    st.container(key="main_figure").code("".join(lines[:12]), language="text", height=380 if render.presenting() else "content")
    if len(lines) > 12:  # said outside the stream's text, which stays exactly what was sent
        st.caption(f"The first 12 of {len(lines)} events.")
    if st.button("Replay at the measured pace", key="sse_replay"):
        out, prev = st.empty(), 0.0
        for n, e in enumerate(ev, 1):
            time.sleep(min(1.0, max(0.0, e.t_s - prev)))
            prev = e.t_s
            render.verbatim(text_of(lm.tokenizer, [x.token_id for x in ev[:n]], specials=False), out, cursor=True)
        render.verbatim(rec.text(), out)

st.subheader("Sharding: a plan computed from the config")
n_dev = devices_present()
st.markdown(
    "A model too big or too slow for one device is split. **Pipeline parallelism** gives each device a "
    "contiguous run of layers; a token passes from device to device. **Tensor parallelism** splits every "
    "layer's matrices: each device holds some heads and some feed-forward columns, and the partial results are "
    "summed across devices (an all-reduce) twice per layer. "
    + (
        f"This machine has {n_dev} CUDA device(s), so the figures below are a **plan computed from the model's parameter shapes, not a measurement**."
        if n_dev < 2
        else f"This machine has {n_dev} CUDA devices; the plan below is computed from the config."
    )
)
even = even_device_counts(lm)
N = st.select_slider(
    "Devices",
    [1, 2, 3, 4, 8],
    value=even[0] if even else 2,
    key="shard_n",
    bind="query-params",
    help="Counts that split this model's heads evenly: " + (", ".join(map(str, even)) or "none"),
)
plan = pipeline_plan(lm, N)
st.markdown(
    "**Pipeline split**: contiguous layers per device, balanced by the bytes of weights each holds "
    '(the goal of accelerate\'s `device_map="balanced"`; its own placement may differ by a layer):'
)
render.table(
    "pipeline plan",
    pd.DataFrame(
        [{"device": r.device, "layers": r.layers, "number of layers": r.n_layers, "also holds": r.also, "weights": f"{r.weights_mb:,.1f} MiB"} for r in plan]
    ),
    hide_index=True,
    width="stretch",
)
tp = tensor_parallel_plan(lm, N)
st.markdown("**Tensor-parallel split** of every layer (heads stay whole):")
render.table("tensor parallel plan", pd.DataFrame(tp.rows), hide_index=True, width="stretch")
c = st.columns(3)
c[0].metric("Weights per device", f"{tp.weights_mb_per_device:,.1f} MiB")
c[1].metric("All-reduced per token", f"{tp.allreduce_bytes_per_token / 1024:,.1f} KiB", help="2 all-reduces per layer × d_model × bytes")
c[2].metric(
    "KV cache per token, busiest device",
    f"{tp.kv_cache_bytes_per_token_per_device:,} B",
    help=f"2 (K and V) × layers × {tp.kv_heads_on_busiest_device} KV head(s) × head dim × bytes",
)
for issue in tp.issues:
    st.warning(issue)
found = [checks.check_plan_params(lm, plan)]
if rec:
    found.insert(0, checks.check_sse(ev, lines, "".join(e.text for e in ev)))
proof.evidence(found)
