import pandas as pd
import streamlit as st

from components.generation import roofline_figure
from pipeline.generation import Phase, metrics
from pipeline.lab import checks
from pipeline.lab.roofline import roofline
from views import generating, guard, loading, proof, render, runs

render.intro(
    "Every operation does some arithmetic (FLOPs) and moves some bytes. Its **arithmetic intensity** is FLOPs "
    "per byte. A device has a peak FLOP/s and a memory bandwidth; their ratio, the **ridge point**, says how "
    "much work per byte an operation needs before compute, not memory, limits it. **Prefill** pushes many "
    "tokens through each weight (high intensity, near the compute roof); a **decode** step uses each weight "
    "for one token (intensity about 1, far below the ridge): it is memory-bound. Counts come from the shapes; "
    "peaks and times are measured here."
)
lm = loading.get_model()
c = st.columns(2)
top, note = guard.cap("sweep_tokens"), guard.cap_note("sweep_tokens", "tokens").strip() or None
T = c[0].select_slider(
    "Prefill prompt tokens", [n for n in (64, 128, 256, 512, 1024, 2048) if top is None or n <= top], value=512, key="roof_T", bind="query-params", help=note
)
C = c[1].select_slider(
    "Decode context (tokens in the KV cache)",
    [n for n in (64, 256, 512, 1024, 2048, 4096) if top is None or n <= top],
    value=512,
    key="roof_C",
    bind="query-params",
    help=note,
)
if st.button("Measure", type="primary", key="roof_go"):
    with runs.heavy("the roofline measurement", slot="roof"), st.spinner("Probing peak matmul FLOP/s and memory bandwidth, then timing each operation…"):
        try:
            loading.remember("roof", (T, C, roofline(lm, T, C)))
        except ValueError as e:  # a layer layout the per-operation timing does not take (GPT-2, Phi-3): said, not raised
            st.warning(str(e))
            st.stop()
got = loading.recall("roof")
if got is None:
    st.info("Press **Measure** (a few seconds).")
    st.stop()
T_run, C_run, r = got
m = st.columns(4)
mp = r.matmul_probe
gf = [2 * mp.n**3 / t / 1e9 for t in mp.runs.values] if mp.runs else [r.peak_flops / 1e9]
m[0].metric(
    "Peak matmul (measured)",
    f"{r.peak_flops / 1e9:,.0f} GFLOP/s",
    help=f"{mp.n}³ {mp.dtype} matmul: the median of {len(gf)} repeats (range {min(gf):,.0f}–{max(gf):,.0f} GFLOP/s)",
)
m[1].metric("Memory bandwidth (measured)", f"{r.bandwidth / 1e9:,.1f} GB/s", help=f"{r.copy_probe.mb:,} MiB: {r.copy_probe.how}")
m[2].metric("Ridge point", f"{r.ridge:.1f} FLOP/B", help="FLOPs per byte: peak FLOP/s ÷ bandwidth")
m[3].metric(
    "Batch-1 decode ceiling",
    f"{r.decode_ceiling_tokens_per_s:,.0f} tok/s",
    help=f"bandwidth / (weights {r.weight_bytes / 2**20:,.0f} MiB + KV cache {r.kv_bytes / 2**20:,.1f} "
    f"MiB at {C_run} tokens): every decode step reads all of them once",
)
rec = generating.last_generation("gen", lm)
if rec and len(rec.events) > 1:
    mm = metrics(rec.events)
    st.caption(
        f"Measured on the Generation page: {mm.tokens_per_s:.1f} tokens/s, {mm.tokens_per_s / r.decode_ceiling_tokens_per_s:.0%} "
        "of the ceiling (the rest: per-operation overheads, kernel launches, Python)."
    )
render.figure(roofline_figure(r), "roofline", main=True)
st.caption(
    f"Points above the roof are real: the bandwidth roof is {r.copy_probe.how} through main memory, and operands "
    "small enough to stay in the processor's caches (one layer's weights often are) are read faster than "
    "that. Across the whole model the weights do not fit, which is why the decode ceiling uses main memory."
)
for phase in Phase:
    ph = r.phases[phase]
    st.markdown(f"**{phase.capitalize()}**: {ph.tokens} token(s) over a context of {ph.context}")
    render.table(
        f"ops {phase}",
        pd.DataFrame(
            [
                {
                    "operation": o.op,
                    "MFLOPs": round(o.flops / 1e6, 2),
                    "MB moved": round(o.bytes / 1e6, 3),
                    "FLOP/byte": round(o.intensity, 2),
                    "bound by": o.bound_by,
                    "bound µs": round(o.bound_s * 1e6, 1),
                    "measured µs (median)": round(o.measured_s * 1e6, 1),
                    "measured µs (range)": f"{o.measured.lo * 1e6:,.1f}–{o.measured.hi * 1e6:,.1f}" if o.measured else None,
                    "measured / bound": round(o.measured_s / o.bound_s, 1),
                }
                for o in ph.ops
            ]
        ),
        hide_index=True,
        width="stretch",
    )  # an HTML table: every row, no scrolling
st.caption(
    "Each operation's time is the median of 5 interleaved repeats (each repeat times every operation once), with its range; "
    "the peaks are medians of 5 too. On a shared machine they move between runs: compare operations within one run."
)
wide = [
    f"{ph_name} {o.op} ({o.measured.lo * 1e6:,.0f}–{o.measured.hi * 1e6:,.0f} µs)"
    for ph_name, ph in r.phases.items()
    for o in ph.ops
    if o.measured and o.measured.hi > 2 * o.measured.lo
]
if wide:
    st.warning(
        f"This machine was too noisy to place {len(wide)} operation{'s' if len(wide) > 1 else ''} on the chart with confidence: "
        + "; ".join(wide[:4])
        + (" …" if len(wide) > 4 else "")
        + ": the repeats differ by more than 2×. Read their points as rough; measure again when the server is quieter.",
        icon=":material/help:",
    )
render.busy_note("roof", noisy=bool(wide))
proof.evidence(checks.roofline_checks(r) + [checks.check_matmul_probe(r.matmul_probe)])
