import streamlit as st

import pipeline
from components.tokens import chips_html, template_html, token_rows
from views import loading, proof, render, runs

render.intro(
    "A model never sees characters. The **tokenizer** cuts your text into subword **pieces** from a fixed "
    "vocabulary and replaces each by its **token id**. Common words are one piece; rare words, names, emoji "
    "and other scripts split into several, down to single bytes. In chat mode the **chat template** wraps your "
    "message in **special tokens** that mark who is speaking. Hover a chip for its id, piece and bytes."
)
lm, tr, too_long = runs.get_tokens()
prompt = tr.prompt
if too_long:
    st.warning(too_long + " The tokens are shown here; the later stages need a shorter prompt.")
n_prompt = len(tr.prompt_tokens)
c = st.columns(5)
c[0].metric("Tokens the model reads", f"{len(tr.tokens):,}", help="Everything the model sees: your prompt plus the chat template and BOS/EOS tokens")
c[1].metric("Tokens from your prompt", f"{n_prompt:,}")
c[2].metric("Words", f"{len(prompt.split()):,}", help="Of your prompt, split at whitespace")
c[3].metric("Characters", f"{len(prompt):,}", help=f"Of your prompt, Unicode code points; {len(prompt.encode('utf-8')):,} bytes in UTF-8")
c[4].metric("Characters per token", f"{len(prompt) / max(1, n_prompt):.2f}", help="Of your prompt")
render.html_view(chips_html(tr.tokens, tr.segments), "token chips", main=True)
st.caption(
    "· is a space, ↵ a newline, → a tab, ␀ a NUL. A chip with several ids under it is one character (say an emoji) that the tokenizer split into byte pieces."
)
if tr.chat:
    n_special = sum(t.special for t in tr.tokens)
    st.subheader("The chat template")
    st.markdown(
        f"Chat mode wrapped your {len(prompt)} characters into {len(tr.text)} characters with "
        f"**{n_special} special tokens** (dark chips). This is exactly the text the model reads:"
    )
    render.html_view(template_html(tr.tokens), "chat template")
with st.expander("Every token as a table"):
    st.caption(
        "The piece is the vocabulary's own spelling: byte-level BPE vocabularies (SmolLM2, GPT-2) write a "
        "leading space as Ġ and a newline as Ċ; SentencePiece vocabularies (Gemma) write a space as ▁."
    )
    render.table("tokens", token_rows(tr.tokens), hide_index=True, width="stretch")

st.subheader("Different models use different vocabularies")
rows = []
for m in pipeline.available_models():
    if not m.available:
        rows.append({"model": m.label, "tokens": None, "pieces": f"({m.why})"})
        continue
    try:
        tok = loading.tokenizer_for(m.key)
        tk = pipeline.tokenize(tok, prompt)
        rows.append(
            {
                "model": m.label,
                "tokens": len(tk.tokens),
                "vocabulary": len(tok),
                "pieces": " | ".join(t.piece for t in tk.tokens[:40]) + (" …" if len(tk.tokens) > 40 else ""),
            }
        )
    except Exception as e:
        rows.append({"model": m.label, "tokens": None, "pieces": f"could not tokenize: {e}"})
render.table("tokenizers", rows, hide_index=True, width="stretch")
for m in pipeline.available_models():
    if m.available and m.key != loading.model_key():
        try:
            tk = pipeline.tokenize(loading.tokenizer_for(m.key), prompt)
            st.markdown(f"**{m.label}**")
            st.html(chips_html(tk.tokens, tk.segments, max_segments=400))
        except Exception:
            pass

proof.how_do_we_know(lambda: pipeline.lab.checks.token_checks(lm.tokenizer, tr), "tokens", tr)
