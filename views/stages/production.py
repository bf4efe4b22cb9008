import pandas as pd
import streamlit as st

from components.generation import MODE_LABELS, cache_modes_figure, cache_modes_table, launches_figure
from pipeline import text_of
from pipeline.decode_step import MIN_BUCKET, check_against_forward, launches_per_step, mode_label, precision, supported
from pipeline.generation import CacheMode, compare_cache_modes, prepare
from pipeline.lab import checks
from views import generating, guard, loading, proof, render, runs

render.intro(
    "The loop on the Generation page calls transformers' forward once per token. That forward is general: every step it "
    "builds masks and position tensors in Python, grows the KV cache by concatenation, and dispatches well over "
    "a thousand operators. At batch 1 a small model's matrices are tiny, so on a GPU the step is bounded by "
    "the **CPU launching kernels**, not by the GPU computing them. Production servers fix this in three moves:\n"
    "1. a **static KV cache**, preallocated for the whole request and written in place;\n"
    "2. a **decode step with fixed shapes**: fused matrices (Q, K, V in one matmul; gate and up in one), the "
    "token and its position kept in device tensors, attention over the whole buffer with a mask;\n"
    "3. on a GPU, that step **captured once as a CUDA graph** and replayed with a single launch per token "
    "(optionally compiled by `torch.compile` first, which fuses small operators into fewer kernels).\n\n"
    "Below, the same greedy request in each mode, measured on this device."
)
lm = loading.get_model()
gpu = lm.device.type == "cuda"
ok, why = supported(lm)
c1, c2 = st.columns([3, 1])
reps = guard.cap("repeats", 5)
top = guard.cap("new_tokens", 256)
n = c1.slider(
    "Tokens",
    16,
    top,
    min(top, 32 if not gpu else 128),
    key="prod_n",
    bind="query-params",
    help=f"Each mode runs {reps} times, interleaved." + guard.cap_note("new_tokens"),
)
chat = runs.chat_mode(lm, c2)
generating.generation_presets()
compile_step = (
    gpu
    and ok
    and st.checkbox(
        "torch.compile the fused step too (compiles once: about a minute)",
        key="prod_compile",
        disabled=not guard.policy().caps.compile,
        help=None if guard.policy().caps.compile else "Off on this demo server: compiling holds the whole server for a minute.",
    )
)
modes = (CacheMode.DYNAMIC, CacheMode.STATIC) + ((CacheMode.FUSED,) if ok else ()) + ((CacheMode.FUSED_COMPILE,) if compile_step else ())
if not ok:
    st.info(f"The fused step is not available for this model: {why}")
st.caption(
    "Fused step on this device: "
    + mode_label(lm)
    + (
        ""
        if gpu
        else ". On a CPU there is no graph: the fused mode runs pipeline.decode_step.cpu.row_step, the same maths with the small work "
        "in numpy (a torch operator costs 4-7 µs to dispatch here, ~600 of them a token) and each matrix read once, "
        "in one stream, by a kernel written for it, so the step is bounded by how fast memory streams the weights."
    )
)
if st.button("Run all modes", type="primary", key="prod_go") and guard.prompt_fits(lm, st.session_state.get("prompt", "") or "Why is the sky blue?", chat):
    prompt = st.session_state.get("prompt", "") or "Why is the sky blue?"
    with runs.heavy("production mode", slot="prod"):
        bar = st.progress(0.0, text="warm-up")
        try:
            res = compare_cache_modes(lm, prompt, n, chat=chat, reps=reps, modes=modes, progress=lambda f, m: bar.progress(min(f, 1.0), text=m))
            bar.progress(1.0, text="counting the operators of one step (torch.profiler)")
            counts = launches_per_step(lm) if ok else None
            loading.remember("prod", (res, counts))
        except Exception as e:  # noqa: BLE001 - a model the fused step cannot run, out of memory: say so, keep serving
            guard.fail(e, "run the modes")
        bar.empty()


def _precision():
    """The lower-precision lesson: fp32, bf16 and int8 row steps on this prompt (pipeline.decode_step.cpu.precision)."""
    st.subheader("Lower precision: what production engines trade")
    st.markdown(
        "A decode token reads every weight once, so fewer bytes per weight can mean more tokens per second. Production "
        "engines serve in **bf16** (2 bytes a weight) and often quantise weights to **int8** (1 byte, plus a scale per "
        "row). Below, the CPU row step with its matrices in each precision, on this prompt: fp32 answers greedily, then "
        "each variant is fed the same prompt and answer token by token, so every position compares the same context. "
        "fp32 stays the default everywhere else in the app."
    )
    if not precision.usable(lm):
        st.info("This lesson runs the CPU row step: it needs a CPU in fp32 and an architecture the fused step implements.")
    elif st.button("Compare fp32, bf16 and int8", key="prec_go") and guard.prompt_fits(lm, st.session_state.get("prompt", "") or "Why is the sky blue?", chat):
        with runs.heavy("the precision comparison", slot="prec"):
            bar = st.progress(0.0, text="building the bf16 and int8 weights")
            try:
                req = prepare(lm, st.session_state.get("prompt", "") or "Why is the sky blue?", precision.N_NEW, chat)
                loading.remember("prec", precision.compare(lm, req.prompt_ids, req.max_new_tokens, progress=lambda f, m: bar.progress(min(f, 1.0), text=m)))
            except Exception as e:  # noqa: BLE001 - out of memory, a kernel this torch lacks: say so, keep serving
                guard.fail(e, "compare precisions")
            bar.empty()
    prec = loading.recall("prec")
    if prec is not None:
        answer, pruns = prec
        base = pruns[0]
        for c, r in zip(st.columns(len(pruns)), pruns):
            c.metric(
                precision.LABELS[r.kind],
                f"{r.tokens_per_s:.1f} tok/s",
                f"{r.bytes_per_token / 1e6:,.0f} MB of weights a token",
                delta_color="off",
                delta_arrow="off",
                help="Median decode step over the answer's positions; bytes: the matrices one token reads (embedding row, norms excluded).",
            )
        render.table(
            "precision",
            pd.DataFrame(
                [
                    {
                        "precision": precision.LABELS[r.kind],
                        "tok/s": round(r.tokens_per_s, 1),
                        "× fp32": round(r.tokens_per_s / base.tokens_per_s, 2),
                        "weight MB / token": round(r.bytes_per_token / 1e6),
                        "answer tokens that differ": f"{r.flips} of {r.positions}",
                        "first at": "—" if r.first_flip is None else r.first_flip + 1,
                        "largest logit difference": round(r.max_logit_diff, 4),
                    }
                    for r in pruns
                ]
            ),
            hide_index=True,
            width="stretch",
        )
        st.caption(
            "Answer tokens that differ: positions of fp32's greedy answer where this precision, given the same context, "
            "would pick another token. Largest logit difference: over those positions and the whole vocabulary, against fp32. "
            "bf16 rounds weights and activations to 8 bits of mantissa; int8 keeps fp32 activations and multiplies by int8 "
            "weights with one fp32 scale per row. " + precision.kernel_note()
        )
        st.markdown("fp32's answer (verbatim):")
        st.code(text_of(lm.tokenizer, answer), language=None)


got = loading.recall("prod")
if got is None:
    st.info("Press **Run all modes**.")
    _precision()
    st.stop()
res, counts = got
ref_tokens = res.modes[CacheMode.DYNAMIC].token_ids
cols = st.columns(len(res.modes))
untold = []
for c, (m, r) in zip(cols, res.modes.items()):
    ratios = res.ratios(m)
    head = res.headline(m) if m != CacheMode.DYNAMIC else None
    if m != CacheMode.DYNAMIC and ratios.values and head is None:
        untold.append(f"{MODE_LABELS.get(m, m)} (ratios {ratios.spread[0]:.2f}–{ratios.spread[1]:.2f}×)")
    c.metric(
        MODE_LABELS.get(m, m),
        f"{r.tokens_per_s:.1f} tok/s" if r.tokens_per_s else "—",
        (head or "vs dynamic: too noisy to tell") if ratios.values and m != CacheMode.DYNAMIC else None,
        delta_color="off",
        delta_arrow="off",
        help=f"tok/s: the median of {len(r.runs)} runs ({min(r.runs, default=0):.1f}–{max(r.runs, default=0):.1f}). The ratio: the median of the "
        "per-repeat ratios (each mode's run against the dynamic run of the same repeat), their range in brackets; shown only when "
        "the repeats agree (every repeat on the same side of 1x, pointing the same way as the medians).",
    )
if untold:
    st.warning(
        "This machine was too noisy to tell these modes from the dynamic loop: "
        + "; ".join(untold)
        + ". Their repeats disagree by more than the difference, so no mode is called faster here. Other work shared the processor; run again when it is quieter.",
        icon=":material/help:",
    )
render.busy_note("prod", noisy=bool(untold))
for m, r in res.modes.items():
    if r.problems:
        st.warning(f"{MODE_LABELS.get(m, m)} ran as {r.engine}: " + "; ".join(r.problems))
render.figure(cache_modes_figure(res.modes), "cache modes", main=True)
util_of = res.modes[CacheMode.DYNAMIC].utilisation_of
util_col = "GPU util %" if util_of.startswith("GPU") else "CPU %"
render.table("cache modes", cache_modes_table(res, util_col), hide_index=True, width="stretch")
st.caption(
    f"Request: {len(res.prompt_ids)} prompt tokens + {len(ref_tokens)} generated. tok/s: decode rate, "
    "(tokens − 1) / (time from first to last token), the median of the 5 runs listed (interleaved, the order "
    "alternating, after a warm-up of each mode). A ratio is flagged noisy when its repeats fall on both sides of "
    "1x: a shared machine moves by 10-20 % between runs. "
    f"{util_col}: {util_of}, mean over the last run. KV MiB set aside: the dynamic cache grows to what it holds; the static "
    "cache reserves prompt + new tokens up front; the fused step reserves a power of two of at least "
    f"{MIN_BUCKET} positions, so a few captured graphs serve every request. Same tokens: identical greedy "
    "output to the dynamic loop."
)
if counts:
    st.subheader("Why a graph helps: what one step asks of the host")
    render.figure(launches_figure(counts), "launches")
    k = counts.kernels
    st.markdown(
        f"transformers' forward dispatches **{counts.ops['transformers']:,}** operators per token "
        f"({counts.compute_ops['transformers']:,} that do work, the rest are views); the fused step "
        f"**{counts.ops['fused']:,}** ({counts.compute_ops['fused']:,})."
        + (
            f" On this GPU they launch {k['transformers']:,} and {k['fused']:,} kernels; captured as a CUDA "
            "graph, the fused step's kernels are replayed by **one** launch."
            if k
            else " On a GPU each operator that does work is at least one kernel launch costing the CPU a few "
            "microseconds, which at batch 1 is longer than the GPU needs to run it: the CUDA graph replaces "
            "them all with one launch. Counted here on the CPU by torch.profiler."
        )
    )
_precision()


def _checks():
    out = []
    ids = res.prompt_ids[:64]  # the request that ran (its first 64 tokens)
    r = check_against_forward(lm, ids) if ok else None
    if r:
        tol = lm.arch.tol
        out.append(
            checks.Check(
                "the fused step equals a plain transformers forward",
                r.max_rel_err < tol and r.same_argmax,
                f"this request's {r.positions} prompt tokens fed one at a time through our step vs one forward over all of "
                f"them: largest relative difference of the logits {r.max_rel_err:.1e} (tolerance {tol:g}), "
                f"same top token at every position: {r.same_argmax}",
                r.max_rel_err,
            )
        )
    for m, rr in res.modes.items():
        if m != CacheMode.DYNAMIC:
            out.append(
                checks.Check(f"{MODE_LABELS.get(m, m)}: same greedy tokens as the dynamic loop", res.same_tokens(m), f"{len(rr.events)} tokens compared")
            )
    return out


proof.how_do_we_know(_checks, "production", res)
