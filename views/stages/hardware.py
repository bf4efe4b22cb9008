import streamlit as st

from components.generation import ops_figure, telemetry_figure
from pipeline.common.telemetry import Sampler
from pipeline.forward.sampling import GREEDY
from pipeline.generation import Finish, metrics
from pipeline.lab import checks, hardware
from views import generating, guard, loading, proof, render, runs

render.intro(
    "What the processor is doing while the model generates, sampled in the background during a real run. A "
    "language model is mostly **matrix multiplication**: every layer multiplies each token's vector by large "
    "weight matrices. GPUs exist to do exactly that in parallel. Below: this machine's measured matmul "
    "throughput and the measured share of a decode step spent in matrix multiplications."
)
lm = loading.get_model()
c1, c2 = st.columns([3, 1])
n = c1.slider(
    "Tokens to generate with telemetry", 8, guard.cap("new_tokens", 128), 32, key="hw_n", bind="query-params", help=guard.cap_note("new_tokens").strip() or None
)
chat = runs.chat_mode(lm, c2)
generating.generation_presets()
prompt = generating.generation_prompt()
if st.button("Run with telemetry", type="primary", key="hw_go", disabled=prompt is None):
    with Sampler(interval_s=0.05 if lm.device.type == "cuda" else 0.1) as sampler:
        rec = generating.run_generation(lm, prompt, chat, n, GREEDY, "hw", sampler=sampler)
    if rec:
        loading.remember("hw_timeline", sampler.timeline)
timeline = loading.recall("hw_timeline")
if timeline is not None:
    if not timeline.source == "nvml":
        st.caption(f"Source: {timeline.source}. On an NVIDIA GPU this shows NVML utilisation, memory, power and clock.")
    render.figure(telemetry_figure(timeline), "telemetry", main=True)
    rec = generating.last_generation("hw", lm)
    if rec:
        m = metrics(rec.events)
        if rec.events[-1].finished == Finish.EOS and m.n < n:
            st.info(f"The model ended its answer after {m.n} tokens (end-of-sequence).")
        st.caption(
            f"Run: {rec.label}. "
            f"{m.n} tokens, TTFT {m.ttft_s * 1000:.0f} ms, {m.tokens_per_s or 0:.1f} tokens/s; "
            f"{len(timeline.samples)} samples every {timeline.interval_s * 1000:.0f} ms."
        )
        render.busy_note(rec.busy)

st.subheader("Why a GPU: matrix multiplication")
if st.button("Measure", key="hw_probe"):
    with runs.heavy("the matmul probe and the decode-step profile", slot="hw_probe"), st.spinner("Timing a matmul and profiling 5 decode steps…"):
        loading.remember("hw_probe", (hardware.matmul_probe(lm.device, lm.dtype), hardware.decode_step_profile(lm)))
pr = loading.recall("hw_probe")
if pr is not None:
    mm, prof = pr
    c = st.columns(3)
    gf = [2 * mm.n**3 / t / 1e9 for t in mm.runs.values] if mm.runs else [mm.tflops * 1000]
    c[0].metric(
        f"Matmul {mm.n}³ ({mm.dtype})",
        f"{mm.tflops * 1000:,.0f} GFLOP/s",
        help=f"{mm.seconds * 1000:.1f} ms, the median of {len(gf)} (range {min(gf):,.0f}–{max(gf):,.0f} GFLOP/s)",
    )
    render.metric_of(
        c[1],
        "Matmul share of a decode step",
        prof.shares,
        100,
        "%",
        help=f"{prof.device_time}; the median of {len(prof.shares.values)} profiled steps and their range",
    )
    render.metric_of(
        c[2],
        "One decode step",
        prof.steps,
        digits=1,
        help=f"The median of {len(prof.steps.values)} steps without the profiler and their range (the profiled step is slower: the profiler's own overhead)",
    )
    render.figure(ops_figure(prof.top), "ops")
    if prof.noisy:
        st.warning(
            f"This machine was too noisy to read these shares as a finding: {prof.noisy}. Other work shared the processor "
            "while the steps were profiled; press Measure again when it is quieter.",
            icon=":material/help:",
        )
    else:
        st.caption(
            f"Measured with torch.profiler on this device, {len(prof.shares.values)} steps: bars are median shares. At batch 1 a decode step "
            "reads every weight once for one token: little arithmetic per byte read, so memory bandwidth, not FLOP/s, usually sets its speed."
        )
    render.busy_note("hw_probe", noisy=bool(prof.noisy))
found = []
if pr is not None:
    found += [checks.check_matmul_probe(mm), checks.check_profile(prof)]
if timeline is not None:
    found.append(
        checks.Check(
            "telemetry sampled throughout the run, in the background",
            len(timeline.samples) >= 2,
            f"{len(timeline.samples)} samples from {timeline.source}, every {timeline.interval_s * 1000:.0f} ms",
        )
    )
if found:
    proof.evidence(found)
