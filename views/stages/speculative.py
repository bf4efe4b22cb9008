import streamlit as st

import pipeline
from components.speculative import legend_html, steps_html
from pipeline import Sampling, text_of
from pipeline.generation import DraftKind, EarlyExit, compare_with_plain, expected_tokens_per_call
from pipeline.lab import checks
from views import generating, guard, loading, proof, render, runs

COPY_PROMPT = "Rewrite this code with better names:\ndef f(a, b):\n    c = a + b\n    d = c * 2\n    return d\n"

render.intro(
    "A decode step of a big model costs about the same for one token as for a handful, because it is bound by "
    "reading the weights. **Speculative decoding** exploits this: a cheap **draft** guesses γ tokens, the "
    "**target** model checks all of them in ONE forward pass, keeps the longest agreeing prefix and adds one "
    "token of its own. With greedy decoding the output is exactly what the target alone would write; with "
    "sampling, rejection sampling keeps the target's distribution. It pays off only when the draft is cheap "
    "and often right, and a draft that is rarely right makes things slower: that is shown honestly here."
)
lm = loading.get_model()
c1, c2 = st.columns([3, 1])
own = c2.toggle(
    "This page's own prompt",
    key="spec_own",
    bind="query-params",
    help="Off: the prompt every page runs. On: a prompt for this page only (it starts with a copy-style "
    "one: rewrite, edit and quote prompts give prompt lookup a lot to copy).",
)
if own:
    prompt = c1.text_area("Prompt for this page only (overrides the shared one)", COPY_PROMPT, height=140, key="spec_prompt", bind="query-params")
else:
    prompt = generating.generation_prompt()
    if prompt is None:
        st.stop()
    c1.markdown(f"**Prompt** (from {render.prompt_source()}; switch on *This page's own prompt* for a copy-style example):")
    render.verbatim(prompt, c1, max_lines=6)
chat = runs.chat_mode(lm, c2)
L = lm.facts.n_layers
kinds = {
    "prompt lookup (n-gram copy)": DraftKind.PROMPT_LOOKUP,
    f"early exit: first {max(1, L // 4)} layers": EarlyExit(max(1, L // 4)),
    f"early exit: first {L // 2} layers": EarlyExit(L // 2),
}
if guard.policy().caps.draft_folders:  # a typed folder is a server path: not on a demo server
    kinds["a local model folder…"] = "folder"
c = st.columns([2, 1, 1, 1])
kind = c[0].selectbox(
    "Draft",
    list(kinds),
    key="spec_kind",
    bind="query-params",
    help="Prompt lookup copies the tokens that followed the last n-gram's earlier occurrence in "
    "the context. Early exit runs only the target's first layers and its LM head. A local "
    "folder: a smaller model with the same tokenizer.",
)
gamma = c[1].slider("γ (proposals per call)", 1, 8, 4, key="spec_gamma", bind="query-params")
n = c[2].number_input(
    "Max new tokens", 1, guard.cap("new_tokens", 512), 32, key="spec_n", bind="query-params", help=guard.cap_note("new_tokens").strip() or None
)
reps = guard.cap("repeats", 5)
temperature = c[3].slider("Temperature", 0.0, 1.5, 0.0, 0.05, key="spec_t", bind="query-params", help="0 = greedy (exact equality check)")
draft = kinds[kind]
if draft == "folder":
    path = st.text_input("Draft model folder (Hugging Face, safetensors, same tokenizer as the target)", key="spec_folder")
    draft = None
    if path.strip():
        ldr = loading.load_other_model(path.strip())
        if ldr is not None:
            draft = ldr
if st.button("Run plain and speculative", type="primary", key="spec_go", disabled=draft is None) and guard.prompt_fits(lm, prompt, chat):
    with runs.heavy("the speculative comparison", slot="spec"):
        bar = st.progress(0.0, text=f"plain and speculative decoding, {reps} interleaved repeats")
        try:
            loading.remember(
                "spec",
                compare_with_plain(
                    lm,
                    prompt,
                    draft,
                    gamma=gamma,
                    max_new_tokens=n,
                    sampling=Sampling(temperature=temperature, seed=0),
                    chat=chat,
                    reps=reps,
                    progress=lambda f, m: bar.progress(f, text=m),
                ),
            )
        except (pipeline.TraceError, ValueError) as e:
            st.warning(str(e))
        bar.empty()
got = loading.recall("spec")
if got is None:
    st.info(f"Press **Run** to decode the prompt plainly and with the draft, {reps} times each, interleaved.")
    st.stop()
res, gamma_run, plain_s, speedup = got.spec, got.gamma, got.plain_s, got.speedup
a = res.acceptance_rate
m = st.columns(5)
m[0].metric("Acceptance rate α", f"{a:.0%}", help=f"{res.accepted} of {res.proposed} proposed tokens")
calls = len(res.steps)
m[1].metric("Accepted per call", f"{res.mean_accepted:.2f}", help=f"proposals accepted: {res.accepted} over {calls} verify calls")
m[2].metric(
    "Tokens per verify call",
    f"{(len(res.tokens) - 1) / calls:.2f}" if calls else "—",
    help=f"measured: {len(res.tokens) - 1} tokens after the first, in {calls} verify calls (accepted "
    "proposals + the target's own token; the prefill pass that gave the first token is not counted)",
)
m[3].metric(
    "Expected per verify call",
    f"{expected_tokens_per_call(a, gamma_run):.2f}",
    help="(1 − α^(γ+1)) / (1 − α): what α predicts if every proposal were accepted independently",
)
sp = got.speedups
m[4].metric(
    "Speedup vs plain",
    f"{speedup:.2f}× ({sp.spread[0]:.2f}–{sp.spread[1]:.2f})" if sp.values else f"{speedup:.2f}×",
    delta=("too noisy to tell: a tie" if sp.noisy else f"{speedup - 1:+.0%} tokens/s" + ("" if speedup >= 1 else ": slower")),
    delta_color="off" if sp.noisy else "normal",
    help=f"{sp} over {len(sp.values)} interleaved repeats (the median of plain time ÷ speculative time within each repeat, "
    f"their range); plain {plain_s:.2f} s median, this machine, this run",
)
if sp.noisy and sp.values:
    st.warning(
        f"This machine was too noisy to say whether speculative decoding was faster here: over {len(sp.values)} interleaved repeats "
        f"the speedup ranged from {sp.spread[0]:.2f}× to {sp.spread[1]:.2f}×, on both sides of 1× (or fewer than 3 repeats). The token counts "
        "above are exact either way; run again when the server is quieter.",
        icon=":material/help:",
    )
render.busy_note("spec", noisy=sp.noisy and bool(sp.values))
render.html_view(
    legend_html() + steps_html(res.steps, lambda t: text_of(lm.tokenizer, [t]), first_token=res.tokens[0] if res.tokens else None),
    "speculative calls",
    main=True,
)
st.markdown("**Output:**")
render.verbatim(text_of(lm.tokenizer, res.tokens, specials=False))
if got.sampling.greedy:
    st.markdown(
        proof.verdict(got.identical) + f" **Greedy output identical to plain greedy decoding**: "
        f"{len(res.tokens)} vs {len(got.plain_tokens)} tokens, {'all equal' if got.identical else 'they differ'}."
    )
else:
    st.caption("With sampling the two runs draw different tokens; rejection sampling keeps the distribution, not the exact sequence.")
found = [
    checks.Check(
        "accepted per call and tokens per call recomputed from the call rows drawn above",
        sum(s.accepted for s in res.steps) == res.accepted and sum(len(s.proposed) for s in res.steps) == res.proposed,
        f"{len(res.steps)} verify calls: {sum(s.accepted for s in res.steps)} of {sum(len(s.proposed) for s in res.steps)} proposals accepted",
    )
]
if got.sampling.greedy:
    found.insert(
        0,
        checks.check_same_tokens(
            "speculative greedy output = plain greedy decoding (the target's own argmax at every position)", {"s": res.tokens}, {"s": got.plain_tokens}
        ),
    )
proof.evidence(found)
