"""Who a visitor is, and what a link carries: the browser's own runs (a cookie, never the address), a frozen copy
of them for a link (?view=), a long prompt kept on the server under an id (?p=), every id from an address checked.
The state itself lives in appstate (RunStore, SharedTexts); this module only wires it to Streamlit. Design:
docs/architecture.md, "Who a visitor is"."""

from __future__ import annotations

import os
import re
import secrets

import streamlit as st

import appstate
from hosting.store import StoreDown, shared

MAX_URL_PROMPT_CHARS = 2000  # longer prompts make links that browsers and chat apps cut: shared another way


@st.cache_resource(show_spinner=False)
def _shared_texts() -> appstate.SharedTexts:
    return appstate.SharedTexts(store=shared())


ID12 = re.compile(r"[0-9a-f]{12}")  # a shared prompt's or a frozen view's id: 12 hex digits, nothing else
BROWSER_COOKIE = "llm_explorer_browser"  # this browser's id: its runs and its rate limit, never in a link
BROWSER_ID = re.compile(r"[0-9a-f]{16}")


def client_address() -> str:
    """The connection's address ("local" for localhost, where Streamlit gives none). Behind our own balancer
    (hosting.launch sets LLM_EXPLORER_TRUST_PROXY for processes that listen on loopback only, so only HAProxy reaches
    them) the last address of X-Forwarded-For, the one HAProxy appended: a visitor's own header cannot name another."""
    if os.environ.get("LLM_EXPLORER_TRUST_PROXY") == "1":
        try:
            fwd = st.context.headers.get("X-Forwarded-For")
        except Exception:  # noqa: BLE001 - no client context
            fwd = None
        last = fwd.split(",")[-1].strip() if isinstance(fwd, str) and fwd else ""
        if last:
            return "local" if last in ("127.0.0.1", "::1") else last
    try:
        ip = st.context.ip_address
    except Exception:  # noqa: BLE001 - no client context (a bare script run)
        ip = None
    return ip if isinstance(ip, str) and ip else "local"  # AppTest gives a mock


def link_id(name: str) -> str | None:
    """A ?p= / ?view= id from the address: returned when it is 12 hex digits; anything else is removed from the
    address and said in the page as plain text (never echoed: a link's text is never rendered)."""
    v = st.query_params.get(name)
    if v is None:
        return None
    if ID12.fullmatch(v):
        return v
    del st.query_params[name]
    st.sidebar.warning(f"This link's ?{name}= is not a valid id (12 hex digits), so it was ignored.")
    return None


def shared_prompt() -> bool:
    """Links carry the prompt (?prompt=...) up to MAX_URL_PROMPT_CHARS; a longer one is kept on this server and
    the link carries its id (?p=...). Opens a link's stored prompt once; returns whether the prompt is long."""
    pid = link_id("p")
    if pid and st.session_state.get("_shared_id") != pid:
        try:
            text = _shared_texts().get(pid)
        except StoreDown as e:  # the link stays in the address: tried again at the next run
            st.sidebar.warning(f"This link's prompt cannot be read now: {e}. The page tries again when you rerun it.")
            return False
        st.session_state["_shared_id"] = pid
        if text is None:
            st.sidebar.warning(
                "This link's prompt is not stored on this server (the link is from another server, or its prompt is older than the store keeps): the prompt below is the default."
            )
        else:
            st.session_state["prompt"] = text
            st.rerun()  # the widgets are drawn from the restored prompt (drawn in this first run, the box could stay blank)
    prompt = st.session_state.get("prompt") or ""
    long = len(prompt) > MAX_URL_PROMPT_CHARS
    if long:
        try:
            st.session_state["_shared_id"] = key = _shared_texts().put(prompt, session_key(), client_address())
        except (appstate.Full, StoreDown) as e:
            st.session_state["_shared_id"] = None
            st.session_state["_shared_full"] = str(e)
            if "p" in st.query_params:
                del st.query_params["p"]
            return long
        st.session_state["_shared_full"] = None
        if st.query_params.get("p") != key:  # written only when it changes: each write is a message to the browser
            st.query_params["p"] = key
    elif "p" in st.query_params:
        del st.query_params["p"]
    return long


def freeze_runs() -> str:
    """A frozen copy of this browser's finished runs (a link's ?view= id); appstate.Full when there is no room."""
    return _run_store().freeze(st.session_state, lambda: secrets.token_hex(6), client_address())


def _freeze_view() -> None:
    try:
        st.session_state["_frozen"] = freeze_runs()
        st.session_state["_frozen_full"] = None
    except (appstate.Full, StoreDown) as e:
        st.session_state["_frozen"] = None
        st.session_state["_frozen_full"] = str(e)


def share_note(sb, long: bool) -> None:
    with sb.popover("Share this view", icon=":material/link:", width="stretch"):
        st.markdown(
            "The address bar holds this view: model, prompt, chat mode and this page's settings. Copy it to open "
            "the same view in another browser; a refresh keeps it. It never carries who you are: whoever opens it "
            "starts with their own runs, and nothing they do reaches yours."
        )
        st.button("Add a copy of my results to the link", key="share_freeze", on_click=_freeze_view, icon=":material/content_copy:")
        vid = st.session_state.get("_frozen")
        if vid:
            from urllib.parse import urlencode

            query = {k: st.query_params.get(k) for k in st.query_params if k not in ("view", "s")} | {"view": vid}
            st.code(f"{st.context.url or ''}?{urlencode(query)}", language=None, wrap_lines=True)
            store = _run_store()
            st.caption(
                "This link carries a frozen copy of your finished runs as they are now: whoever opens it gets their own copy "
                "of that copy. Your own address is unchanged; runs you make later are not in the copy. The copy stays on this "
                f"server for at least {store.KEEP_VIEW_S / appstate.DAY:.0f} days, whatever other visitors do (a restart "
                f"keeps it too); this browser keeps its {store.views_per_browser} most recent copies."
            )
        elif st.session_state.get("_frozen_full"):
            st.warning(f"No copy was made: {st.session_state['_frozen_full']}. Share the view without results, or try again later.")
        if long and st.session_state.get("_shared_id"):
            n = len(st.session_state.get("prompt") or "")
            st.markdown(
                f"This prompt ({n:,} characters) is too long for a link, so it is kept on this server and the link "
                f"carries its id (`p={st.session_state['_shared_id']}`) for at least {appstate.SharedTexts.KEEP_S / appstate.DAY:.0f} "
                "days (a restart keeps it too). For another server, share the prompt itself:"
            )
            st.download_button("Download the prompt", st.session_state.get("prompt") or "", "prompt.txt", "text/plain", key="share_dl", on_click="ignore")
        elif long:
            st.warning(
                f"This prompt is too long for a link and this server could not keep it ({st.session_state.get('_shared_full')}): "
                "the link carries the view without the prompt. Share the prompt itself:"
            )
            st.download_button("Download the prompt", st.session_state.get("prompt") or "", "prompt.txt", "text/plain", key="share_dl2", on_click="ignore")


@st.cache_resource(show_spinner=False)
def _run_store() -> appstate.RunStore:
    return appstate.RunStore(store=shared())


def _browser_id() -> str | None:
    return _cookie(BROWSER_COOKIE, BROWSER_ID)


SERVER_COOKIE = "llm_explorer_server"  # which server process this browser last saw (to say when it restarted)


@st.cache_resource(show_spinner=False)
def _server_start() -> tuple[str, float]:
    """This server process's id (16 hex digits) and start time."""
    import time

    return secrets.token_hex(8), time.time()


def _cookie(name: str, pattern: re.Pattern) -> str | None:
    try:
        v = st.context.cookies.get(name)
    except Exception:  # noqa: BLE001 - no client context (AppTest)
        return None
    return v if isinstance(v, str) and pattern.fullmatch(v) else None


def keep_runs() -> None:
    """A page's runs belong to this browser and survive a refresh: they are kept under the browser's id, a cookie
    set on its first visit (the address never carries it). A link's frozen view (?view=) is copied into them once.
    A browser that last saw another server process is told, once, that the server restarted and what was lost."""
    cookie = _browser_id()
    first_run = "_sid" not in st.session_state
    try:
        sid = _run_store().attach(st.session_state, cookie, lambda: secrets.token_hex(8), client_address())
    except StoreDown as e:  # the session has its id; its runs last as long as the tab until the store is back
        sid = st.session_state["_sid"]
        st.sidebar.warning(f"Your saved runs cannot be read now: {e}. What you run lasts as long as this tab until it is back.")
    server, started = _server_start()
    seen = _cookie(SERVER_COOKIE, BROWSER_ID)
    if first_run and cookie and seen and seen != server and not st.session_state.get("_restart_said"):
        import time

        st.session_state["_restart_said"] = True
        st.warning(
            f"This server restarted at {time.strftime('%H:%M', time.localtime(started))} since your last visit (or another of its "
            "processes serves you now). Your finished runs, shared links and live classes are kept in its store; an answer that was "
            "being generated then was lost: press the page's button again to run it.",
            icon=":material/restart_alt:",
        )
    if cookie != sid or seen != server:  # a first visit (or cookies refused), or the first visit to this server process
        st.sidebar.html(
            f"<script>document.cookie='{BROWSER_COOKIE}={sid}; path=/; max-age=2592000; SameSite=Lax';"
            f"document.cookie='{SERVER_COOKIE}={server}; path=/; max-age=2592000; SameSite=Lax'</script>",
            unsafe_allow_javascript=True,  # both are 16 hex digits of our own making, never text from a visitor
            width="content",
        )
    if "s" in st.query_params:  # older links carried a session id: it is never honoured
        del st.query_params["s"]
    vid = link_id("view")
    if vid and st.session_state.get("_thawed") != vid:
        try:
            found = _run_store().thaw(st.session_state, vid)
        except StoreDown as e:  # the link's copy stays in the address: tried again at the next run
            st.sidebar.warning(f"This link's copy of someone's results cannot be read now: {e}.")
            return
        st.session_state["_thawed"] = vid
        if not found:
            st.sidebar.info("This link's copy of someone's results is not on this server any more: the view opens without them.")
        del st.query_params["view"]  # a refresh keeps one's own runs, not the link's copy again


def browser_key() -> str:
    """This browser's id for a demo server's limits from a run's first line on: session_key() once the sidebar has
    attached the session (keep_runs), before that the cookie, and for a browser with neither this tab's own id (a
    visitor who sheds its cookie for every try still meets its address's limit)."""
    sid = st.session_state.get("_sid") or _browser_id()
    if sid:
        return sid
    return st.session_state.setdefault("_tab_id", secrets.token_hex(8))


def session_key() -> str:
    """This browser's id (its cookie; a new one for a browser that has none yet): what its runs and its rate limit
    are kept under. Never in the address, so a link hands it to nobody."""
    return st.session_state.get("_sid") or "?"


def save_runs() -> None:
    """The end of every run (app.py): this browser's finished runs to the store when they changed, so a refresh, another
    process or a restart has them. While the store is away they are tried again at the next run."""
    try:
        _run_store().save(st.session_state, client_address())
    except StoreDown:
        pass
