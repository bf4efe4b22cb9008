import pandas as pd
import streamlit as st

from components.generation import kernels_figure
from pipeline.lab import available_kernels, checks, kernel_sweep, sweep_doubts
from views import guard, loading, proof, render, runs

render.intro(
    "Plain (**eager**) attention computes the full T × T matrix of query·key scores in every layer, applies the "
    "softmax, then multiplies by the values: memory that grows with the square of the prompt. **Fused kernels** "
    "such as FlashAttention compute the same result in tiles, keeping a running softmax, so the T × T matrix is "
    "never stored and far less memory traffic is needed. Below, the whole model's prefill with each kernel "
    "this device offers (PyTorch SDPA backends), measured."
)
lm = loading.get_model()
gpu = lm.device.type == "cuda"
kernels = available_kernels(lm)
lengths = guard.sweep_lengths([512, 1024, 2048, 4096, 8192] if gpu else [128, 512, 1024], "kern_max")
st.caption(
    f"Kernels available here: {', '.join(kernels)}. Prompt lengths {', '.join(f'{n:,}' for n in lengths)}"
    + ("" if gpu else " (CPU: shorter; up to 8,192 on a GPU)")
    + f". {guard.cap('repeats', 3)} interleaved repeats after a warm-up (each repeat times every kernel at every length): the median, bars from the lowest to the highest repeat."
    + guard.cap_note("sweep_tokens", "prompt tokens")
)
if st.button("Run the kernels", type="primary", key="kern_go"):
    with runs.heavy("the kernel sweep", slot="kernels"):
        bar = st.progress(0.0, text="prefill with each kernel")
        loading.remember("kernels", kernel_sweep(lm, lengths, kernels, progress=lambda f, m: bar.progress(f, text=m), repeats=guard.cap("repeats", 3)))
        bar.empty()
rows = loading.recall("kernels")
if rows is None:
    st.info("Press **Run the kernels** (about a minute on a CPU).")
    st.stop()
render.figure(kernels_figure(rows), "kernels", main=True)
doubts = sweep_doubts(rows)
if doubts:
    st.warning(
        "This machine was too noisy to compare these times: "
        + "; ".join(doubts[:3])
        + ". Other work shared the processor while they were measured; run the kernels again when it is quieter. The logits below are exact either way.",
        icon=":material/help:",
    )
render.busy_note("kernels", noisy=bool(doubts))
agree = checks.check_kernels_agree(rows, lm.arch.tol)
st.markdown(proof.verdict(agree.ok) + f" **Every kernel gives the same logits**: {agree.detail}, {str(lm.dtype).removeprefix('torch.')}.")
errors = [r for r in rows if r.error]
for r in errors:
    st.warning(f"{r.kernel} at {r.tokens} tokens did not run: {r.error}")
render.table(
    "kernels",
    pd.DataFrame(
        [
            {
                "kernel": r.kernel,
                "tokens": r.tokens,
                "prefill ms (median)": None if r.seconds is None else round(r.seconds * 1000, 1),
                "prefill ms (range)": None if r.runs is None else f"{r.runs.lo * 1000:.1f}–{r.runs.hi * 1000:.1f}",
                "peak MiB": None if r.peak_mb is None else round(r.peak_mb, 1),
                "T×T scores per layer MiB": round(r.score_matrix_mb, 1),
                "max |Δ logits| vs eager": r.max_diff_vs_eager,
            }
            for r in rows
        ]
    ),
    hide_index=True,
    width="stretch",
)
st.caption(f"Memory: {rows[0].memory_method}.")
proof.evidence([agree])
