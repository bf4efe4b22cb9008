"""LLM inference pipeline explorer: navigation and the shared sidebar (model, prompt, chat, device)."""

import streamlit as st

st.set_page_config(page_title="LLM pipeline explorer", page_icon=":material/biotech:", layout="wide")

from views import widgets  # noqa: E402  (after set_page_config)

PAGES = [
    st.Page("views/0_overview.py", title="Overview", icon=":material/explore:", default=True),
    st.Page("views/1_tokens.py", title="1 · Prompt & tokens", icon=":material/content_cut:", url_path="tokens"),
    st.Page("views/2_embeddings.py", title="2 · Embeddings & positions", icon=":material/scatter_plot:", url_path="embeddings"),
    st.Page("views/3_attention.py", title="3 · Attention", icon=":material/visibility:", url_path="attention"),
    st.Page("views/4_layer.py", title="4 · Inside a layer", icon=":material/layers:", url_path="layer"),
    st.Page("views/5_next_token.py", title="5 · Next token", icon=":material/casino:", url_path="next-token"),
]
AFTER = [
    st.Page("views/6_generation.py", title="6 · Generation", icon=":material/autorenew:", url_path="generation"),
    st.Page("views/7_prefill_decode.py", title="7 · Prefill vs decode", icon=":material/speed:", url_path="prefill-decode"),
    st.Page("views/8_kv_cache.py", title="8 · KV cache", icon=":material/memory:", url_path="kv-cache"),
    st.Page("views/9_hardware.py", title="9 · Hardware", icon=":material/developer_board:", url_path="hardware"),
]
FASTER = [
    st.Page("views/10_roofline.py", title="10 · Roofline", icon=":material/show_chart:", url_path="roofline"),
    st.Page("views/11_attention_kernels.py", title="11 · Attention kernels", icon=":material/bolt:", url_path="attention-kernels"),
    st.Page("views/12_production.py", title="12 · Production mode", icon=":material/factory:", url_path="production"),
    st.Page("views/13_speculative.py", title="13 · Speculative decoding", icon=":material/fast_forward:", url_path="speculative"),
    st.Page("views/14_streaming_sharding.py", title="14 · Streaming & sharding", icon=":material/lan:", url_path="streaming-sharding"),
    st.Page("views/15_batching.py", title="15 · Continuous batching", icon=":material/groups:", url_path="batching"),
]
page = st.navigation({"Before the first token": PAGES, "After it": AFTER, "Faster inference": FASTER}, expanded=True)
widgets.sidebar()
page.run()
