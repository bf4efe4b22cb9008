"""The operator's page (/operator, not in the navigation): who is here, what waits, what the engine serves,
memory, the live classes running (and ending one), the errors visitors hit. Behind the password in .streamlit/secrets.toml ([demo] operator_password)."""

import hmac
import os

import pandas as pd
import psutil
import streamlit as st

from hosting.store import StoreDown
from views import guard, live, runs

pol = guard.policy()
if pol.operator_password is None and pol.enabled:
    st.info('No operator password is set. Put one in .streamlit/secrets.toml:\n\n```toml\n[demo]\noperator_password = "..."\n```')
    st.stop()
if pol.operator_password is not None and not st.session_state.get("_operator"):
    pw_guard, address = guard.password_guard(), guard.client_address()
    wait = pw_guard.wait(address)
    if pw_guard.locked(address):
        st.error(
            f"Locked: {pw_guard.max_failures} wrong passwords from your network address in {pw_guard.window_s / 60:.0f} minutes. "
            f"The page accepts no password from it, the right one included, for {wait / 60:.0f} more minute{'s' if wait >= 90 else ''}. "
            "Each attempt is in the server's log with its address."
        )
        st.stop()
    typed = st.text_input("Password", type="password", key="op_password")
    if not typed:
        st.stop()
    if wait > 0:
        st.warning(f"A wrong password was typed recently from your network address: the next attempt is taken in {wait:.0f} s.")
        st.stop()
    if not pw_guard.attempt(hmac.compare_digest(typed.encode(), pol.operator_password.encode()), address):
        recent = pw_guard.recent(address)
        st.error(
            "Wrong password."
            + (
                " The page is now locked for your network address."
                if pw_guard.locked(address)
                else f" {pw_guard.max_failures - recent} more wrong in {pw_guard.window_s / 60:.0f} minutes lock it for your address."
            )
        )
        st.stop()
    st.session_state["_operator"] = True


@st.fragment(run_every="3s")
def status():
    s = runs.server_status()
    c = st.columns(4) + st.columns(4)  # two rows: each note fits its column
    c[0].metric("Demo mode", "on" if pol.enabled else "off")
    c[1].metric("Browsers, last 5 min", "?" if s["sessions"] is None else s["sessions"], help="On every process of this server (from its store)")
    c[2].metric("Heavy experiments", f"{len(s['heavy']['running'])} running", f"{len(s['heavy']['waiting'])} waiting", delta_color="off", delta_arrow="off")
    c[3].metric("Server memory (RSS)", f"{psutil.Process(os.getpid()).memory_info().rss / 2**30:.2f} GiB")
    c[4].metric(
        "Trace cache", f"{s['trace_bytes'] / 2**20:,.0f} MiB", f"{s['traces']} trace{'' if s['traces'] == 1 else 's'}", delta_color="off", delta_arrow="off"
    )
    c[5].metric(
        "Generations running",
        sum(e["running"] for e in s["engines"]),
        f"{sum(e['waiting'] for e in s['engines'])} waiting",
        delta_color="off",
        delta_arrow="off",
    )
    c[6].metric(
        "Generations cancelled",
        sum(e["cancelled"] for e in s["engines"]),
        help="Since the server started: Stop pressed, a reload or a closed tab. Each frees its KV blocks at the next iteration.",
    )
    st.subheader("The store (live classes, links, saved runs, limits)")
    store = s["store"]
    if store["unreachable"]:
        st.error(f"{store['unreachable']}. Visitors are told; classes, links and limits go on when it is back.")
    st.caption(
        f"{store['backend']} at {store['where']}, shared by every process of this server"
        f"{' (this one: ' + os.environ['LLM_EXPLORER_PROCESS'] + ')' if os.environ.get('LLM_EXPLORER_PROCESS') else ''}"
        + (f"; last failure at {store['last_error']['at']}: {store['last_error']['why']}" if store["last_error"] else "")
        + ". Its own time on this process, by operation:"
    )
    st.dataframe(pd.DataFrame([{"operation": k, **v} for k, v in store["ops"].items()]), hide_index=True, width="stretch")
    st.subheader("Engines (one per loaded model)")
    if s["engines"]:
        st.dataframe(pd.DataFrame(s["engines"]), hide_index=True, width="stretch")
    else:
        st.caption("No model loaded yet.")
    st.caption(
        f"Loaded models may hold {s['model_budget_gb']:.1f} GB together (LLM_EXPLORER_MODEL_BUDGET_GB) and at most 4 of them; "
        "the least recently used is unloaded to make room, and its memory comes back."
    )
    if s["evictions"]:
        st.dataframe(pd.DataFrame(s["evictions"], columns=["time", "model unloaded", "GB", "bound"]), hide_index=True, width="stretch")
    st.subheader("Heavy experiments")
    rows = [{"state": "running", "what": w, "for s": t} for w, t in s["heavy"]["running"]] + [
        {"state": "waiting", "what": w, "for s": t} for w, t in s["heavy"]["waiting"]
    ]
    st.dataframe(pd.DataFrame(rows, columns=["state", "what", "for s"]), hide_index=True, width="stretch")
    st.caption(f"{s['heavy']['served']} served since the server started.")
    st.subheader("Errors visitors hit (newest first)")
    st.dataframe(pd.DataFrame(s["errors"], columns=["time", "request id", "where", "error"]), hide_index=True, width="stretch")
    st.caption("Each error's traceback is in the server's log under its request id.")


@st.fragment
def classes() -> None:
    """The running live classes, and the operator's way to end one (drawn again when the page or this part is used:
    not on a timer, so the choice of class stays put)."""
    try:
        rows = live.classes().running()
    except StoreDown as e:
        st.subheader("Live classes")
        st.error(str(e))
        return
    st.subheader(f"Live classes ({len(rows)} of at most {live.classes().max_classes})")
    if not rows:
        st.caption("None running.")
    else:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        c = st.columns([2, 1, 3], vertical_alignment="bottom")
        c[0].selectbox("Class", [r["code"] for r in rows], key="op_class")
        c[1].button("End this class", key="op_class_end", on_click=live.close_chosen, args=("op_class",), icon=":material/stop_circle:")
    if st.session_state.get("op_class_msg"):
        st.caption(st.session_state["op_class_msg"])
    st.caption(
        f"A class ends when its presenter ends it, when you do, or {live.classes().idle_s / 60:.0f} minutes after its presenter's "
        "page was closed (LLM_EXPLORER_CLASS_IDLE_MIN); a start beyond the limit (LLM_EXPLORER_MAX_CLASSES) is refused, and "
        "no running class is ended to make room."
    )


status()
classes()
