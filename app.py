"""LLM inference pipeline explorer: navigation and the shared sidebar (model, prompt, chat, device)."""

from pathlib import Path

import streamlit as st

# a favicon of our own: a :material/...: icon is fetched from fonts.gstatic.com, and no page may reach another host
st.set_page_config(page_title="LLM pipeline explorer", page_icon=str(Path(__file__).parent / "components" / "favicon.png"), layout="wide")

from views import guard, header, loading, sidebar  # noqa: E402  (after set_page_config)

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
    st.Page("views/16_misconceptions.py", title="16 · Misconceptions, tested", icon=":material/fact_check:", url_path="misconceptions"),
]
# each page's one-sentence takeaway (shown on top in presentation mode), in the seed's order of stages
TAKEAWAYS = {
    "Overview": "A real model runs on your prompt; every number on these pages is measured on that very run, and each page shows how we know it is right.",
    "1 · Prompt & tokens": "The model never sees letters or words: your text becomes a list of token ids, wrapped in a chat template.",
    "2 · Embeddings & positions": "Each token id picks one row of a big matrix: a vector of numbers; RoPE then rotates it by its position.",
    "3 · Attention": "Each token looks back at the tokens before it and takes a weighted mix of what they carry; each head looks for something else.",
    "4 · Inside a layer": "Every layer adds what attention and the feed-forward network found to a running sum, and the answer forms layer by layer.",
    "5 · Next token": "The last layer gives a score to every token in the vocabulary; softmax, temperature and top-k/top-p turn the scores into one choice.",
    "6 · Generation": "The chosen token is appended and the model runs again, one token at a time, until it stops.",
    "7 · Prefill vs decode": "Prefill reads the whole prompt in one pass; each decode step then pays mostly for reading the weights, for one token.",
    "8 · KV cache": "Keys and values of past tokens are kept, so each step computes only the newest: memory that grows with every token.",
    "9 · Hardware": "Generation is mostly matrix multiplication; at batch 1 it waits on memory, not on arithmetic.",
    "10 · Roofline": "Prefill is compute-bound, decode is memory-bound: the ridge point of this device says where one turns into the other.",
    "11 · Attention kernels": "Fused attention kernels give the same numbers without writing the T×T score matrix to memory.",
    "12 · Production mode": "A static cache and a fused step cut the overheads around the same arithmetic.",
    "13 · Speculative decoding": "A cheap draft guesses several tokens, the big model checks them all in one pass: same output, fewer passes.",
    "14 · Streaming & sharding": "Tokens are sent the moment they are sampled; a model too big for one device is split across several.",
    "15 · Continuous batching": "One engine serves everyone: requests join and leave the batch at every step, so nobody waits for the longest answer.",
    "16 · Misconceptions, tested": "It writes one token at a time, reads tokens not words, knows no more when hotter, pays for every token of context, and forgets you.",
}
ORDER = PAGES + AFTER + FASTER
OPERATOR = st.Page("views/operator.py", title="Operator", icon=":material/admin_panel_settings:", url_path="operator", visibility="hidden")
# One flat list (the stage numbers carry the order): with section headers Streamlit draws headers and items as
# children of a <div> inside its <ul>, which screen readers cannot read as a list (axe-core: list, listitem).
page = st.navigation([*ORDER, OPERATOR], expanded=True)
demo_mode = guard.policy().enabled
if demo_mode:
    loading.warm()  # the operator's models load at the first visit, in the background
sidebar.sidebar()
at = next((i for i, p in enumerate(ORDER) if p.title == page.title), 0)
header.page_header(
    page.title,
    TAKEAWAYS.get(page.title, ""),
    ORDER[at - 1] if at > 0 else None,
    ORDER[at + 1] if at + 1 < len(ORDER) else None,
    stages=[(p.title, TAKEAWAYS[p.title]) for p in ORDER[1:]],
)
if demo_mode:  # a visitor never sees a traceback: the server logs it under a request id, the page shows the id
    try:
        page.run()
    except Exception as e:  # noqa: BLE001 - st.stop and st.rerun are BaseExceptions and pass through
        guard.fail(e, "draw this page", level="error")
else:
    page.run()
