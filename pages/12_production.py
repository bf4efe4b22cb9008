import streamlit as st

from components.generation import cache_modes_figure
from pipeline.generate import compare_cache_modes
from pages import common

st.title("Production mode: a static KV cache")
st.markdown(
    "The loop on page 6 grows its KV cache by concatenation, so every step allocates new, larger tensors. "
    "Production servers **preallocate** the cache for the whole request (a *static* cache) and write each new "
    "key and value in place: no allocation per step, fixed shapes, which is also what lets a GPU capture the "
    "whole decode step once as a **CUDA graph** and replay it without launching hundreds of kernels from Python. "
    "Below: the same greedy generation with both caches, measured on this device.")
lm = common.get_model()
gpu = lm.device.type == "cuda"
n = st.slider("Tokens", 16, 256, 64 if not gpu else 128, key="prod_n")
if st.button("Run both", type="primary", key="prod_go"):
    prompt = st.session_state.get("prompt", "") or "Why is the sky blue?"
    with st.spinner("Dynamic and static cache, interleaved, after a warm-up…"):
        try:
            st.session_state["prod"] = (lm.label, compare_cache_modes(
                lm, prompt, n, chat=bool(getattr(lm.tokenizer, "chat_template", None))))
        except Exception as e:
            st.warning(f"Could not run: {e}")
got = st.session_state.get("prod")
if not got or got[0] != lm.label:
    st.info("Press **Run both**.")
    st.stop()
res = got[1]
d, s = res["dynamic"], res["static"]
same = [e.token_id for e in d["events"]] == [e.token_id for e in s["events"]]
c = st.columns(4)
c[0].metric("Dynamic cache", f"{d['tokens_per_s']:.1f} tok/s" if d["tokens_per_s"] else "—")
c[1].metric("Static cache", f"{s['tokens_per_s']:.1f} tok/s" if s["tokens_per_s"] else "—")
if d["tokens_per_s"] and s["tokens_per_s"]:
    c[2].metric("Static ÷ dynamic", f"{s['tokens_per_s'] / d['tokens_per_s']:.2f}×")
c[3].metric("Same tokens (greedy)", "yes" if same else "NO")
st.plotly_chart(cache_modes_figure(d["events"], s["events"]), width="stretch")
st.caption(f"Static cache memory is reserved up front: {s['events'][-1].kv_bytes / 2**20:.1f} MiB from the first step, "
           f"against {d['events'][-1].kv_bytes / 2**20:.1f} MiB that the dynamic cache reached at the end.")
if gpu:
    st.info("CUDA-graph capture of the decode step is not implemented in this explorer yet; this comparison is the "
            "static cache alone.")
else:
    st.caption("On a CPU there are no kernel launches to save, so the static cache buys little; on a GPU it is the "
               "prerequisite for CUDA graphs (not run here: no CUDA device).")
