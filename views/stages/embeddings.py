import streamlit as st

from components.figures import PCA_LABELS, drift_figure, learned_positions_figure, pca_figure, relative_figure, rope_heatmap, token_texts, vector_strip
from components.tokens import plot_text, visible
from pipeline.forward import analysis
from pipeline.lab import checks
from views import proof, render, runs

render.intro(
    "Each token id selects one **row of the embedding matrix**: a vector of numbers that is the token's "
    "starting meaning. Tokens used alike end up near each other. An embedding knows nothing about context "
    "or order: *Apple* gets the same vector in both sentences below, and *Dog bites man* holds the same "
    "vectors as *Man bites dog*. **Positional information** is added next: Llama-style models rotate each "
    "query and key by an angle proportional to its position (**RoPE**), so attention scores depend on how far "
    "apart two tokens are. Context then comes from the transformer layers."
)
lm, tr = runs.get_trace()
f = tr.facts
E = analysis.embedding_matrix(lm)

st.subheader("The lookup: token id → row of the matrix")
opts = [i for i, t in enumerate(tr.tokens)]
i = st.selectbox(
    "Token",
    opts,
    index=tr.last_prompt_index if tr.last_prompt_index is not None else len(opts) - 1,
    format_func=render.labeller([f"{i}: {visible(t.text)!s}  (id {t.id})" for i, t in enumerate(tr.tokens)]),
    key="emb_token",
    bind="query-params",
)
tok = tr.tokens[i]
c = st.columns(3)
c[0].metric("Embedding matrix", f"{E.shape[0]:,} × {E.shape[1]}")
c[1].metric("Row", f"{tok.id:,}")
c[2].metric("Vector length (L2)", f"{analysis.embedding_norm(tr, i):.3f}")
render.figure(vector_strip(tr.acts["hook_embed"][i], f"embedding of {visible(tok.text)!r}: {f.d_model} numbers"), "vector strip")
nn = analysis.nearest_tokens(lm, tok.id, k=10)
st.markdown(
    "**Nearest vocabulary neighbours** (cosine similarity of embedding rows): " + ", ".join(f"`\u2068{visible(t)}\u2069` {s:.2f}" for _, t, s in nn)
)  # isolated: RTL tokens stay put

st.subheader("The prompt in embedding space")
refs = st.text_input("Reference words", "king, queen, Paris, France, London, dog, cat, blue, red, chip, tree", key="emb_refs", bind="query-params")
emap = analysis.embedding_map(lm, tr, refs.split(","))
if emap is not None:
    labels = [plot_text(s) for s in token_texts(tr.tokens) + emap.words]
    groups = ["prompt"] * emap.n_prompt + ["reference"] * len(emap.words)
    dims = st.segmented_control("Projection", [2, 3], default=2, format_func=render.labeller({2: "2D", 3: "3D"}), key="emb_dims", bind="query-params") or 2
    render.figure(pca_figure(emap.coords, labels, groups, dims=dims, var=emap.variance), "pca", main=True)
    if dims == 2:
        st.caption("A label that would cover another is left off, as is a repeated token at the same point; hover a point for its token.")
    if tr.T + len(emap.words) > PCA_LABELS:
        st.caption(f"{tr.T:,} tokens: the reference words and the prompt's last tokens carry labels ({PCA_LABELS} at most); every point has its hover.")
else:
    st.info("PCA needs at least three vectors: add reference words or a longer prompt.")

st.subheader("Context moves a token's vector through the layers")
PAIRS = {
    "Apple after context: laptop vs pie": ("I bought an Apple laptop.", "I ate an Apple pie.", "Apple"),
    "Apple first: chip vs tree": ("Apple released a new chip.", "Apple fell from the tree.", "Apple"),
    "Word order: Dog bites man vs Man bites dog": ("Dog bites man.", "Man bites dog.", "bites"),
}


use_pair = render.on_choice("drift_pair", PAIRS, ("drift_a", "drift_b", "drift_word"))
if "drift_a" not in st.session_state:
    st.session_state["drift_pair"] = next(iter(PAIRS))
    use_pair()
st.selectbox("Example", list(PAIRS), key="drift_pair", on_change=use_pair)
c1, c2, c3 = st.columns([2, 2, 1])
pa = c1.text_input("Sentence A", key="drift_a")
pb = c2.text_input("Sentence B", key="drift_b")
word = c3.text_input("Word", key="drift_word")
_, ta = runs.get_trace(pa, chat=False)
_, tb = runs.get_trace(pb, chat=False)
ia, ib = analysis.find_token(ta, word), analysis.find_token(tb, word)
curves = {}
if ia is not None and ib is not None:
    curves[f"{word!r} (token {ia} in A, {ib} in B)"] = analysis.drift(ta, ia, tb, ib)
else:
    st.warning(f"'{word}' does not start a token in both sentences; showing the last token only.")
curves["last token (has read the whole sentence)"] = analysis.drift(ta, ta.T - 1, tb, tb.T - 1)
render.figure(drift_figure(curves, "Same word, two contexts: cosine similarity layer by layer"), "drift")
if ia is not None and ib is not None:
    cw = next(iter(curves.values()))
    if ia == ib and ta.input_ids[: ia + 1] == tb.input_ids[: ib + 1]:
        st.info(
            f"'{word}' has the same tokens before it in both sentences, and this model is **causal**: a token "
            "only attends to tokens before it. So its vector is identical at every layer "
            f"(cosine {cw.min():.4f}); the context that tells the two meanings apart flows into the *later* "
            "tokens, whose vectors drift apart. Put the word after some context (e.g. *I bought an Apple "
            "laptop* vs *I ate an Apple pie*) to watch the word itself drift."
        )
    else:
        st.caption(
            f"At the embeddings the two are identical: cosine {cw[0]:.4f}. After the last layer they are at "
            f"cosine {cw[-1]:.3f}; the lowest is {cw.min():.3f}, after layer {int(cw.argmin()) - 1}."
        )

st.subheader("Positions")
if f.positional == "rope" and analysis.rope_inv_freq(lm, 0) is not None:
    tq, layer = runs.layer_with_qkv(tr, "Layer", "rope_layer", default=0)
    rd = analysis.rope_demo(lm, tq, layer)
    kind = rd.kind
    st.markdown(
        f"**RoPE** in layer {layer} (θ base {rd.theta:,.0f}{', ' + kind if kind else ''}): the "
        f"{f.head_dim}-dim query and key are cut into {len(rd.inv_freq)} pairs; pair *i* is rotated by "
        f"position × {rd.theta:,.0f}^(−2i/{f.head_dim}). Early pairs spin fast (fine position), late pairs "
        "slowly (coarse position)."
    )
    render.figure(rope_heatmap(rd.angles), "rope heatmap")
    render.figure(relative_figure(rd.scores_at_0, rd.scores_at_100), "relative")
    st.caption(
        f"Head 0 of layer {layer}: this run's query of the last token and key of the first token, placed at "
        "every distance. Moving both by 100 positions gives the same curve: only the distance matters."
    )
    proof.how_do_we_know(lambda: checks.check_rope(lm, tq, rd, i), f"rope{layer}-{i}", tq)
else:
    pe = analysis.learned_positions(lm, max(64, tr.T))
    if pe is not None:
        st.markdown("This model learns one **position embedding** per position and adds it to the token embedding.")
        render.figure(learned_positions_figure(pe), "learned positions")
    else:
        st.info("This model's positional scheme is not one this page can draw.")
