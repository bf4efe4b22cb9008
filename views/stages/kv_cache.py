import pandas as pd
import streamlit as st

from components.generation import kv_growth_figure, kv_layers_figure
from pipeline.forward.sampling import GREEDY
from pipeline.generation import Finish
from pipeline.generation.loop import kv_bytes_formula, kv_costs, kv_window, measured_kv_per_token
from pipeline.lab import checks
from pipeline.lab.checks import check_kv_bytes
from pipeline.serving import Route
from views import generating, loading, proof, render, runs

render.intro(
    "Every layer keeps the **keys** and **values** of every token seen so far, so a decode step only computes "
    "them for the newest token. The price is memory that grows with every token: "
    "**2 (K and V) × layers × KV heads × head dim × bytes per value** per token. Models with "
    "**grouped-query attention** (GQA) share each key/value head among several query heads, which divides this "
    "memory. Below, the formula next to the bytes actually held by this run's cache tensors."
)
lm = loading.get_model()
f = lm.facts
chat = runs.chat_mode(lm)
prompt = generating.generation_prompt()
if prompt is None:
    st.stop()
# This page measures transformers' own cache tensors, so it runs its own request through transformers' loop
# (the Generation page's requests go through the shared engine, whose paged KV memory the batching page shows).
rec = generating.last_generation("kv", lm)
source = "a 16-token greedy run of the prompt through transformers' dynamic cache, made by this page"
if rec is None or rec.prompt != prompt or rec.chat != chat:
    with st.spinner("Generating 16 tokens to measure the cache…"):
        rec = generating.run_generation(lm, prompt, chat, 16, GREEDY, "kv", route=Route.DYNAMIC)
        if rec is None:
            st.stop()
st.caption(f"Measured on {source}: {rec.label}.")
if rec.events and rec.events[-1].finished == Finish.EOS and len(rec.events) < rec.max_new_tokens:
    st.info(
        f"The model ended its answer after {len(rec.events)} token(s) (end-of-sequence), so the cache "
        f"stopped growing at {rec.events[-1].context_len} tokens."
        + ("" if chat or not getattr(lm.tokenizer, "chat_template", None) else " Chat mode makes an instruct model answer at length.")
    )
ev = rec.events
per_token = kv_bytes_formula(lm, 1)
bpv = lm.arch.bytes_per_value
last = ev[-1]
measured_per_token = measured_kv_per_token(lm, last)
c = st.columns(4)
c[0].metric("Formula, per token", f"{per_token:,} B", help=f"2 × {f.n_layers} layers × {f.n_kv_heads} KV heads × {f.head_dim} × {bpv} bytes ({lm.dtype})")
c[1].metric("Measured, per token", f"{measured_per_token:,.0f} B" if measured_per_token else "window full", help="bytes of the cache tensors ÷ tokens in them")
c[2].metric("Cache now", f"{last.kv_bytes / 2**20:.2f} MiB", help=f"{last.context_len} tokens")
agree = check_kv_bytes(lm, ev)
c[3].metric("Agree", "yes" if agree.ok else "NO", help=agree.detail)
st.latex(
    rf"2 \times {f.n_layers} \times {f.n_kv_heads} \times {f.head_dim} \times {bpv}\,\mathrm{{B}} = "
    rf"{per_token:,}\ \mathrm{{bytes\ per\ token}}"
)
render.figure(kv_growth_figure(ev, lambda n: kv_bytes_formula(lm, n)), "kv growth", main=True)
render.figure(kv_layers_figure(last.kv_bytes_per_layer), "kv layers")
n_sliding, keep = kv_window(lm)
if n_sliding:
    st.info(
        f"{n_sliding} of {f.n_layers} layers are local: they attend to a sliding window of {keep + 1:,} tokens, "
        f"so their cache keeps at most {keep:,} tokens. The formula above is per token for the global layers "
        "and for local layers until the window fills; after that only the global layers grow."
    )

st.subheader("What a full context would cost (computed from the config)")
rows = [
    {
        "tokens": f"{k.tokens:,}" + (" (this model's context length)" if k.tokens == f.max_positions else ""),
        "KV cache, this model": f"{k.bytes / 2**20:,.0f} MiB",
        f"if every query head had its own KV head ({f.n_heads})": f"{k.bytes_one_kv_per_head / 2**20:,.0f} MiB",
        "weights, for scale": f"{k.weight_bytes / 2**20:,.0f} MiB",
    }
    for k in kv_costs(lm, [1024, 8192, *([f.max_positions] if f.max_positions else []), 32768, 131072])
]
render.table("kv costs", pd.DataFrame(rows), hide_index=True, width="stretch")
st.caption(
    f"GQA: {f.n_heads} query heads share {f.n_kv_heads} KV heads, so the cache is {f.n_heads // f.n_kv_heads}× "
    "smaller than with one KV head per query head. Per user: with many users (batching) each one needs "
    "its own cache."
)
proof.evidence([agree])
proof.how_do_we_know(
    lambda: checks.generation_checks(lm, rec), "kv_gen", rec, ask=True, label="How do we know the tokens are right? This page's run vs transformers"
)
