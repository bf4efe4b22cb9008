import re

import pandas as pd
import streamlit as st

from components.batching import gantt_figure, kv_figure, latency_figure, occupancy_figure
from components.generation import telemetry_figure
from components.tokens import lit
from pipeline import text_of
from pipeline.common import Samples
from pipeline.lab import POLICIES, SCENE_MAX_NEW_TOKENS, SCENES, ScenePolicy, User, checks, run_alone, run_scene, run_transformers_batch
from views import generating, guard, loading, proof, render, runs

render.intro(
    "Alice, Bob, Charlie and Diana send requests to the same model. Served **one after another**, each waits "
    "for everyone before them. **Static batching** waits until the batch is complete, runs it together, and "
    "keeps every slot busy until the longest answer is done: short answers sit in the batch as padding. "
    "**Continuous batching** (iteration-level scheduling, as vLLM and TGI do) decides at *every* decode step: a "
    "request joins at the next step after it arrives and leaves the step it finishes, so one forward pass "
    "serves everyone running at that moment and the weights are read once for all of them. Below, the three "
    "policies run on the loaded model, measured, each on an engine of its own."
)
lm = loading.get_model()

COLUMNS = ["user", "arrives after (s)", "prompt", "max new tokens"]


load_preset = render.on_choice("batch_preset", {k: pd.DataFrame(v, columns=COLUMNS) for k, v in SCENES.items()}, ("batch_users",))
if "batch_users" not in st.session_state:
    st.session_state["batch_preset"] = next(iter(SCENES))
    load_preset()
st.selectbox("Scene", list(SCENES), key="batch_preset", on_change=load_preset)
table = st.data_editor(
    st.session_state["batch_users"],
    num_rows="dynamic",
    hide_index=True,
    width="stretch",
    key="batch_editor",
    column_config={
        "arrives after (s)": st.column_config.NumberColumn(min_value=0.0, max_value=30.0, step=0.1),
        "max new tokens": st.column_config.NumberColumn(
            min_value=1,
            max_value=guard.cap("new_tokens", SCENE_MAX_NEW_TOKENS),
            step=1,
            help=f"At most {guard.cap('new_tokens', SCENE_MAX_NEW_TOKENS)}." + guard.cap_note("new_tokens"),
        ),
    },
)
c1, c2, c3 = st.columns(3)
chat = runs.chat_mode(lm, c1)
lib = c3.toggle(
    "Also transformers' engine",
    value=False,
    key="batch_lib",
    bind="query-params",
    help="Also run transformers' own continuous batching, model.generate_batch, all requests at once (it takes no arrival times): a well-kept library on the same requests, "
    "for comparison. Its manager starts a worker and allocates a paged cache each call: seconds more.",
)
eos = c2.toggle(
    "Stop at end-of-sequence",
    value=False,
    key="batch_eos",
    bind="query-params",
    help="Off: every answer is exactly its max new tokens long, so the lengths above are the lengths that run. On: an answer may end earlier, as in real use.",
)


def _users() -> list[User] | None:
    users = []
    for _, row in table.iterrows():
        # a name is a label on the figures and in the text: letters, digits, spaces and . ' - only
        name, prompt = re.sub(r"[^\w .'-]", "", str(row["user"] or "")).strip()[:40], str(row["prompt"] or "")
        if not name and not prompt.strip():
            continue
        if not prompt.strip():
            st.warning(f"{lit(name) or 'A user'} has an empty prompt.")
            return None
        try:
            users.append(
                User(
                    name or f"user {len(users) + 1}",
                    float(row["arrives after (s)"] or 0.0),
                    prompt,
                    max(1, min(guard.cap("new_tokens", SCENE_MAX_NEW_TOKENS), int(row["max new tokens"] or 1))),
                )
            )
        except (TypeError, ValueError):
            st.warning(f"{lit(name)}: arrival and max new tokens must be numbers.")
            return None
    top = guard.cap("users", 8)
    if not 1 <= len(users) <= top:
        st.warning(f"The scene needs between one and {top} users.")
        return None
    for u in users:
        if not guard.tokens_fit(len(lm.tokenizer(u.prompt)["input_ids"]), f"{lit(u.name)}'s prompt"):
            return None
    return users


if st.button("Run the three policies", type="primary", key="batch_go"):
    users = _users()
    if users:
        with runs.heavy("the batching scene", slot="scene"):
            bar = st.progress(0.0, text=ScenePolicy.ONE_BY_ONE)
            reps, pols = guard.cap("repeats", 3), list(POLICIES)
            last, tps, lat = {}, {}, {}
            try:
                for rep in range(reps):  # interleaved repeats: every policy once per repeat, in a rotated order
                    for k, policy in enumerate(pols[rep % len(pols) :] + pols[: rep % len(pols)]):
                        i = rep * len(pols) + k
                        run = run_scene(
                            lm,
                            users,
                            policy,
                            chat=chat,
                            stop_at_eos=eos,
                            progress=lambda f, m, i=i, rep=rep: bar.progress((i + f) / (reps * len(pols)), text=f"repeat {rep + 1} of {reps}: {m}"),
                        )
                        last[run.policy] = run
                        tps.setdefault(run.policy, []).append(run.tokens_per_s)
                        lat.setdefault(run.policy, []).append(run.mean_latency_s)
                runs = [last[p] for p in POLICIES]
                if lib:
                    bar.progress(1.0, text="transformers' generate_batch")
                library = run_transformers_batch(lm, users, chat=chat, stop_at_eos=eos) if lib else None
                spread = {p: (Samples(tuple(tps[p])), Samples(tuple(lat[p]))) for p in tps}
                loading.remember("scene", (users, chat, eos, runs, library, spread))
            except Exception as e:  # noqa: BLE001 - out of memory, a prompt too long: say so, keep serving
                guard.fail(e, "run the scene")
            bar.empty()

got = loading.recall("scene")
if got is None:
    st.info("Press **Run the three policies** (a few seconds per policy on a CPU).")
else:
    users, chat_run, eos_run, runs, library, spread = got
    by = {r.policy: r for r in runs}
    seq, static, cont = by[ScenePolicy.ONE_BY_ONE], by[ScenePolicy.STATIC], by[ScenePolicy.CONTINUOUS]
    tps = {p: s[0] for p, s in spread.items()}
    lat = {p: s[1] for p, s in spread.items()}
    n_reps = len(tps[cont.policy].values)
    m = st.columns(4)
    for col, run in zip(m, (cont, static)):
        mine, base = tps[run.policy], tps[seq.policy]
        col.metric(
            f"Throughput, {run.policy}",
            f"{mine.median:.1f} tok/s",
            f"{mine.median / base.median:.2f}× one after another" if base.median else None,
            delta_color="off",
            delta_arrow="off",
            help=f"The median of {n_reps} interleaved repeats (range {mine.lo:.1f}–{mine.hi:.1f} tok/s)",
        )
    m[2].metric(
        "Mean time to the whole answer",
        f"{lat[cont.policy].median:.2f} s",
        f"static {lat[static.policy].median:.2f} s, one by one {lat[seq.policy].median:.2f} s",
        delta_color="off",
        delta_arrow="off",
        help=f"Continuous batching; the median of {n_reps} interleaved repeats (range {lat[cont.policy].lo:.2f}–{lat[cont.policy].hi:.2f} s)",
    )
    m[3].metric("Padding rows computed (static)", f"{static.padded_rows:,}", help="Decode rows static batching ran for answers that were already finished")
    render.figure(gantt_figure(runs), "gantt", main=True)
    render.figure(occupancy_figure(runs), "occupancy")
    c1, c2 = st.columns(2)
    render.figure(kv_figure(static), "kv memory, static", c1)
    render.figure(kv_figure(cont), "kv memory, continuous", c2)
    render.figure(latency_figure(runs), "latency")
    util_col = "GPU util %" if seq.utilisation_of.startswith("GPU") else "CPU %"
    rows = [
        {
            "policy": r.policy,
            "tokens": r.tokens,
            "wall s": round(r.wall_s, 2),
            "tok/s (median)": round(tps[r.policy].median, 1),
            "tok/s (range)": f"{tps[r.policy].lo:.1f}–{tps[r.policy].hi:.1f}",
            "mean TTFT s": round(r.mean_ttft_s, 2),
            "mean answer s": round(r.mean_latency_s, 2),
            "iterations": len(r.records),
            "padding rows": r.padded_rows,
            util_col: None if r.utilisation is None else round(r.utilisation),
        }
        for r in runs
    ]
    if library is not None:
        rows.append(
            {
                "policy": "transformers generate_batch (all at once)",
                "tokens": library.tokens,
                "wall s": round(library.wall_s, 2),
                "tok/s (median)": round(library.tokens_per_s, 1),
            }
        )
        if library.error:
            st.warning(f"transformers' generate_batch did not run: {library.error}")
    render.table("summary", pd.DataFrame(rows), hide_index=True, width="stretch")

    def better(a: Samples, b: Samples, more: str = "higher", less: str = "lower") -> str:
        """A comparison only where every repeat agrees; otherwise the page says the machine could not tell."""
        return f"{more} than" if a.above(b) else f"{less} than" if b.above(a) else "within this machine's noise of (the repeats overlap)"

    c_t, s_t, q_t = tps[cont.policy], tps[static.policy], tps[seq.policy]
    c_l, s_l, q_l = lat[cont.policy], lat[static.policy], lat[seq.policy]
    st.markdown(
        f"**The seed's promise, on this machine's numbers** (medians of {n_reps} interleaved repeats). Throughput: continuous batching "
        f"{c_t.median:.1f} tok/s, {better(c_t, q_t)} one after another ({q_t.median:.1f}) and "
        f"{better(c_t, s_t)} static batching ({s_t.median:.1f}). "
        f"Average response time (arrival to whole answer): {c_l.median:.2f} s, {better(c_l, q_l, 'longer', 'shorter')} one after another "
        f"({q_l.median:.2f} s) and {better(c_l, s_l, 'longer', 'shorter')} static ({s_l.median:.2f} s). "
        + (
            f"{util_col.split()[0]} utilisation: {cont.utilisation:.0f}% continuous vs {seq.utilisation:.0f}% one after another."
            if cont.utilisation is not None and seq.utilisation is not None
            else ""
        )
    )
    st.caption(
        f"{util_col}: {seq.utilisation_of}, mean over each run. Times are wall-clock on this machine, shared "
        "with other work: compare the policies within one run. On a CPU a decode step for several requests "
        "costs more than for one (the arithmetic grows with the batch), so the gain is smaller than on a GPU, "
        "where a small batch costs about the same as one request."
    )
    untold = not all(a.tells_apart(b) for a, b in ((c_t, q_t), (c_t, s_t), (c_l, q_l), (c_l, s_l)))
    if untold:
        st.warning(
            "Where the repeats overlap this machine was too noisy to tell the policies apart: other work shared the processor "
            "(or the repeats were too few). Run the scene again when it is quieter.",
            icon=":material/help:",
        )
    render.busy_note("scene", noisy=untold)
    with st.expander("Utilisation over the continuous run"):
        render.figure(telemetry_figure(cont.timeline), "telemetry")
    with st.expander("The answers"):
        for u in cont.users:
            st.markdown(f"**{lit(u.name)}** ({len(u.token_ids)} tokens)")
            render.verbatim(text_of(lm.tokenizer, u.token_ids, specials=False))

    def scene_checks():
        alone = {u.name: run_alone(lm, u, chat=chat_run, stop_at_eos=eos_run) for u in users}
        out = [
            checks.check_same_tokens(f"{r.policy}: every answer = the same request generated alone", {u.name: u.token_ids for u in r.users}, alone)
            for r in runs
        ]
        if library is not None and not library.error:
            out.append(checks.check_same_tokens("transformers generate_batch: every answer = the same request alone", library.token_ids, alone))
        return out

    proof.how_do_we_know(scene_checks, "scene", runs[0], label="How do we know? Each answer against the same request alone", ask=True)


generating.engine_panel(lm)
