"""Every use this app makes of Streamlit's private API, in one place. Streamlit is pinned to one version
(requirements.txt); tests/app/test_streamlit_private.py imports each name in USES and checks its shape (the attribute,
that it is callable, the parameters we pass), and runs these functions in a script, so an upgrade that moves one fails
there with the function here and our callers named. Each function has a fallback where the name is missing (None,
False, nothing done) and its callers say what they do then: the app keeps working, with less.

Callers: views/live_wake.py (waking a live class's followers: a session, its event loop, its last client state, a
rerun), views/live.py (the follower's heartbeat: its fragment, the page and address the browser reported), app.py (each
page's hash for the wake-ups), views/exports.py (the page's bound widgets, for the note inside exported images).
views/ready.py copies one private constant by value (MAX_IMAGE_WIDTH: Streamlit's MAXIMUM_CONTENT_WIDTH, the widest image it
sends)."""

from __future__ import annotations

from typing import NamedTuple


class Use(NamedTuple):
    """One private name: `owner` (module, or module:Class) holds `name`; `params` are the parameters we pass (a call),
    or None for an attribute we read; `ours` is the function here that uses it and who calls that."""

    owner: str
    name: str
    params: tuple[str, ...] | None
    ours: str


_CTX = "streamlit.runtime.scriptrunner_utils.script_run_context"
USES: tuple[Use, ...] = (
    Use(_CTX, "get_script_run_ctx", ("suppress_warning",), "run_context (every function here)"),
    Use(f"{_CTX}:ScriptRunContext", "session_id", None, "this_session (views/live_wake.py register)"),
    Use(f"{_CTX}:ScriptRunContext", "page_script_hash", None, "browser_page, page_bindings (views/live.py, views/exports.py)"),
    Use(f"{_CTX}:ScriptRunContext", "session_state", None, "page_bindings (views/exports.py page_settings)"),
    Use(f"{_CTX}:ScriptRunContext", "context_info", None, "browser_address (views/live.py _check)"),
    Use(f"{_CTX}:ScriptRunContext", "fragment_ids_this_run", None, "fragment_run (views/live.py _check)"),
    Use(f"{_CTX}:ThreadState", "get", (), "fragment_id (views/live_wake.py register)"),
    Use(f"{_CTX}:FragmentThreadState", "fragment_id", None, "fragment_id (views/live_wake.py register)"),
    Use("streamlit.runtime", "exists", (), "this_session (views/live_wake.py register)"),
    Use("streamlit.runtime:Runtime", "instance", (), "this_session (views/live_wake.py register)"),
    Use("streamlit.runtime:Runtime", "get_app_session", ("session_id",), "this_session (views/live_wake.py register)"),
    Use("streamlit.runtime.app_session:AppSession", "request_rerun", ("client_state",), "request_rerun (views/live_wake.py _rerun)"),
    Use("streamlit.runtime.app_session:AppSession", "_call_soon_on_event_loop", ("callback",), "on_event_loop (views/live_wake.py wake)"),
    Use("streamlit.runtime.app_session:AppSession", "_client_state", None, "client_state (views/live_wake.py _rerun)"),
    Use("streamlit.proto.ClientState_pb2:ClientState", "page_script_hash", None, "views/live_wake.py _rerun"),
    Use("streamlit.proto.ClientState_pb2:ClientState", "query_string", None, "views/live_wake.py _rerun"),
    Use("streamlit.proto.ClientState_pb2:ClientState", "fragment_id", None, "views/live_wake.py _rerun"),
    Use("streamlit.proto.ClientState_pb2:ClientState", "widget_states", None, "views/live_wake.py _rerun"),
    Use("streamlit.proto.ClientState_pb2:ClientState", "is_auto_rerun", None, "views/live_wake.py _rerun"),
    Use("streamlit.proto.ClientState_pb2:ClientState", "context_info", None, "browser_address (views/live.py _check)"),
    Use("streamlit.proto.ClientState_pb2:ContextInfo", "url", None, "browser_address (views/live.py _check)"),
    Use("streamlit.runtime.state.safe_session_state:SafeSessionState", "query_params", (), "page_bindings (views/exports.py)"),
    Use("streamlit.runtime.state.query_params:QueryParams", "_bindings_by_param", None, "page_bindings (views/exports.py)"),
    Use("streamlit.runtime.state.query_params:WidgetBinding", "script_hash", None, "page_bindings (views/exports.py)"),
    Use("streamlit.navigation.page:Page", "_script_hash", None, "page_hash (app.py, for views/live_wake.py)"),
    Use("streamlit.elements.lib.image_utils", "MAXIMUM_CONTENT_WIDTH", None, "views/ready.py MAX_IMAGE_WIDTH (the same value, 1460 px)"),
)


def run_context():
    """The running script's context (Streamlit's ScriptRunContext), or None outside a script run."""
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

        return get_script_run_ctx(suppress_warning=True)
    except Exception:  # noqa: BLE001 - another Streamlit: no context
        return None


def fragment_id() -> str | None:
    """The fragment this run draws (None: the whole page, or unknown)."""
    try:
        from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState

        return ThreadState.get().fragment_id or None
    except Exception:  # noqa: BLE001
        return None


def fragment_run() -> bool:
    """Whether this run draws only fragments, at the browser's request (a heartbeat): its page and address are then the
    ones the browser reported with it, not a server-started run's copy of an older message."""
    return bool(getattr(run_context(), "fragment_ids_this_run", None))


def this_session():
    """This run's AppSession on a Streamlit server, or None (AppTest, bare mode, another Streamlit) or one that cannot
    be asked to rerun."""
    try:
        from streamlit.runtime import Runtime, exists
        from streamlit.runtime.app_session import AppSession

        ctx = run_context()
        session = Runtime.instance().get_app_session(ctx.session_id) if exists() and ctx else None
    except Exception:  # noqa: BLE001
        return None
    return session if isinstance(session, AppSession) else None  # AppTest's runtime is a stand-in: no session


def on_event_loop(session, callback) -> None:
    """Run `callback()` on the server's event loop, where the session's browser messages are handled."""
    session._call_soon_on_event_loop(callback)


def client_state(session):
    """A copy of the session's last ClientState (the browser's address, page and widget values as the server holds
    them; the copy is ours to change)."""
    from streamlit.proto.ClientState_pb2 import ClientState

    state = ClientState()
    state.CopyFrom(session._client_state)
    return state


def request_rerun(session, state) -> None:
    """Run the session's script now with `state` (a ClientState), as a browser's message would (on the event loop)."""
    session.request_rerun(state)


def page_hash(page) -> str:
    """An st.Page's hash (the page Streamlit runs for a rerun that names it), "" where it has none."""
    try:
        return str(page._script_hash)
    except Exception:  # noqa: BLE001
        return ""


def page_bindings() -> list[str] | None:
    """The keys of the widgets this run's page script bound to the link so far (the sidebar's are not the page's),
    or None where Streamlit's binding registry cannot be read."""
    try:
        ctx = run_context()
        with ctx.session_state.query_params() as qp:
            return [k for k, b in qp._bindings_by_param.items() if b.script_hash == ctx.page_script_hash]
    except Exception:  # noqa: BLE001
        return None


def browser_page() -> str | None:
    """The hash of the page this run is on: in a fragment's run, the page the browser showed when it sent the run's
    message (None outside a run)."""
    ctx = run_context()
    return getattr(ctx, "page_script_hash", None) or None


def browser_address() -> str | None:
    """The address (with its page's path; st.context.url drops the page) the browser showed when it sent this run's
    message: in a heartbeat fragment's run, what the student's address bar says. None where it is not known (AppTest)."""
    try:
        info = run_context().context_info
        return info.url if info is not None and info.HasField("url") and info.url else None
    except Exception:  # noqa: BLE001
        return None
