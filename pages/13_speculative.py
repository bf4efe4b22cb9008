import time

import streamlit as st

import pipeline
from components.speculative import legend_html, steps_html
from pipeline.speculative import expected_tokens_per_call, speculative_generate
from pages import common

COPY_PROMPT = ("Rewrite this code with better names:\ndef f(a, b):\n    c = a + b\n    d = c * 2\n    return d\n")

st.title("Speculative decoding")
st.markdown(
    "A decode step of a big model costs about the same for one token as for a handful, because it is bound by "
    "reading the weights. **Speculative decoding** exploits this: a cheap **draft** guesses γ tokens, the "
    "**target** model checks all of them in ONE forward pass, keeps the longest agreeing prefix and adds one "
    "token of its own. With greedy decoding the output is exactly what the target alone would write; with "
    "sampling, rejection sampling keeps the target's distribution. It pays off only when the draft is cheap "
    "and often right, and a draft that is rarely right makes things slower: that is shown honestly here.")
lm = common.get_model()
has_template = bool(getattr(lm.tokenizer, "chat_template", None))
c1, c2 = st.columns([3, 1])
prompt = c1.text_area("Prompt", COPY_PROMPT, height=140, key="spec_prompt",
                      help="Copy-style prompts (rewrite, edit, quote) give prompt lookup a lot to copy")
chat = c2.toggle("Chat mode", value=has_template, disabled=not has_template, key="spec_chat")
L = lm.facts.n_layers
kinds = {"prompt lookup (n-gram copy from the context)": "prompt_lookup",
         f"early exit: the target's first {max(1, L // 4)} layers": f"early_exit:{max(1, L // 4)}",
         f"early exit: the target's first {L // 2} layers": f"early_exit:{L // 2}",
         "a local model folder with the same tokenizer…": "folder"}
c = st.columns(4)
kind = c[0].selectbox("Draft", list(kinds), key="spec_kind")
gamma = c[1].slider("γ (proposals per call)", 1, 8, 4, key="spec_gamma")
n = c[2].number_input("Max new tokens", 1, 512, 64, key="spec_n")
temperature = c[3].slider("Temperature", 0.0, 1.5, 0.0, 0.05, key="spec_t", help="0 = greedy (exact equality check)")
draft = kinds[kind]
if draft == "folder":
    path = st.text_input("Draft model folder (Hugging Face, safetensors, same tokenizer as the target)",
                         key="spec_folder")
    draft = None
    if path.strip():
        ldr = common.load_other_model(path.strip())
        if ldr is not None:
            draft = ldr
if st.button("Run plain and speculative", type="primary", key="spec_go", disabled=draft is None):
    with st.spinner("Plain decoding first, then speculative, same settings…"):
        try:
            t = time.perf_counter()
            plain = [e.token_id for e in pipeline.generate_mod.generate(lm, prompt, n, temperature=temperature,
                                                                         chat=chat, seed=0)]
            plain_s = time.perf_counter() - t
            res = speculative_generate(lm, prompt, draft, gamma=gamma, max_new_tokens=n,
                                       temperature=temperature, chat=chat, seed=0)
            st.session_state["spec_result"] = (lm.label, kind, gamma, temperature, plain, plain_s, res)
        except (pipeline.TraceError, ValueError) as e:
            st.warning(str(e))
got = st.session_state.get("spec_result")
if not got or got[0] != lm.label:
    st.info("Press **Run** to decode the prompt twice: plainly and with the draft.")
    st.stop()
_, kind_run, gamma_run, temp_run, plain, plain_s, res = got
a = res.acceptance_rate
speedup = plain_s / res.seconds if res.seconds else 0
m = st.columns(5)
m[0].metric("Acceptance rate α", f"{a:.0%}", help=f"{res.accepted} of {res.proposed} proposed tokens")
m[1].metric("Mean accepted per call", f"{res.mean_accepted:.2f}")
m[2].metric("Tokens per target call", f"{len(res.tokens) / res.target_calls:.2f}",
            help=f"measured: {len(res.tokens)} tokens in {res.target_calls} target forward passes")
m[3].metric("Expected per call", f"{expected_tokens_per_call(a, gamma_run):.2f}", help="(1 − α^(γ+1)) / (1 − α)")
m[4].metric("Speedup vs plain", f"{speedup:.2f}×", delta="slower" if speedup < 1 else None, delta_color="inverse",
            help=f"plain {plain_s:.2f} s, speculative {res.seconds:.2f} s, this machine, this run")
st.html(legend_html())
st.html(steps_html(res.steps, lambda t: lm.tokenizer.decode([t])))
st.markdown("**Output:**")
st.code(lm.tokenizer.decode(res.tokens, skip_special_tokens=True), language=None)
if temp_run == 0:
    same = res.tokens == plain
    st.markdown(common.verdict(same) + f" **Greedy output identical to plain greedy decoding**: {len(res.tokens)} "
                f"vs {len(plain)} tokens, {'all equal' if same else 'they differ'}.")
else:
    st.caption("With sampling the two runs draw different tokens; rejection sampling keeps the distribution, not "
               "the exact sequence.")
