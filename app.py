"""LLM inference pipeline explorer: navigation and the shared sidebar (model, prompt, chat, device)."""
import streamlit as st

st.set_page_config(page_title="LLM pipeline explorer", page_icon=":material/biotech:", layout="wide")

from pages import common  # noqa: E402  (after set_page_config)

PAGES = [
    st.Page("pages/0_overview.py", title="Overview", icon=":material/explore:", default=True),
    st.Page("pages/1_tokens.py", title="1 · Prompt & tokens", icon=":material/content_cut:", url_path="tokens"),
    st.Page("pages/2_embeddings.py", title="2 · Embeddings & positions", icon=":material/scatter_plot:", url_path="embeddings"),
    st.Page("pages/3_attention.py", title="3 · Attention", icon=":material/visibility:", url_path="attention"),
    st.Page("pages/4_layer.py", title="4 · Inside a layer", icon=":material/layers:", url_path="layer"),
    st.Page("pages/5_next_token.py", title="5 · Next token", icon=":material/casino:", url_path="next-token"),
]
page = st.navigation(PAGES)
common.sidebar()
page.run()
