"""The Streamlit side of the shared state: the sidebar, the model and traces a page reads, and the widgets
several pages share. The state itself (loaders, trace cache, a page's last run) lives in `appstate`, which
knows nothing of Streamlit; this module only holds one instance per process or per session.

Pages stay thin: they read widgets, call pipeline, hand plain data to components.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import streamlit as st

import appstate
import demo
import pipeline
from components import export
from components.tokens import lit
from pipeline.generation import GenerationRecord, prepare
from pipeline.models import ModelLoadError, available_models, canonical_key
from pipeline.timing import ACTIVITY
from pipeline.tracing import TraceError, check_prompt
from views import session

PRESETS = {
    "Why is the sky blue?": ("Why is the sky blue?", True),
    "The capital of France is": ("The capital of France is", False),
    "Apple released a new chip.": ("Apple released a new chip.", False),
    "Apple fell from the tree.": ("Apple fell from the tree.", False),
    "Dog bites man.": ("Dog bites man.", False),
    "Man bites dog.": ("Man bites dog.", False),
    "The cat sat on the mat because it was warm.": ("The cat sat on the mat because it was warm.", False),
    "Emoji, Hindi and code": ("Hi 👋🏽! नमस्ते दुनिया\ndef add(a, b):\n    return a + b", False),
}
# prompts the embedded model answers well when generating (greedy, 48 tokens: no loop, a real answer); the
# completion-style default ("The capital of France is") is made for pages 1-5's single next token
GENERATION_PRESETS = {
    "Why is the sky blue?": ("Why is the sky blue?", True),
    "A haiku": ("Write a haiku about the sea.", True),
    "Python code": ("Write a Python function that adds two numbers.", True),
}
LOCAL = "Local folder…"
DEFAULTS = {"prompt": "The capital of France is", "chat": False, "model_choice": pipeline.EMBEDDED, "local_path": ""}


# ------------------------------------------------------------------------------------- demo mode (demo.py)
def policy() -> demo.Policy:
    """Demo mode's policy: LLM_EXPLORER_DEMO=1 or a [demo] section in .streamlit/secrets.toml (read each run:
    cheap, and a test can switch it per server)."""
    try:
        secrets = st.secrets.to_dict() if st.secrets.load_if_toml_exists() else {}
    except Exception:  # noqa: BLE001 - a malformed secrets file must not take the app down
        secrets = {}
    return demo.load_policy(secrets)


def cap(name: str, page_max: int) -> int:
    """A control's maximum: the page's own, or the demo server's cap when lower."""
    return min(page_max, getattr(policy().caps, name))


def cap_note(name: str, unit: str = "") -> str:
    """ " Demo server: at most N unit." next to a capped control (empty outside demo mode)."""
    p = policy()
    return f" Demo server: at most {getattr(p.caps, name):,}{' ' + unit if unit else ''}." if p.enabled else ""


@st.cache_resource(show_spinner=False)
def _errors() -> demo.ErrorLog:
    return demo.ErrorLog()


@st.cache_resource(show_spinner=False)
def _limiter() -> demo.RateLimiter:
    return demo.RateLimiter(0)


@st.cache_resource(show_spinner=False)
def _heavy_line(at_once: int) -> demo.FairQueue:
    return demo.FairQueue(at_once)


@st.cache_resource(show_spinner=False)
def _sessions() -> demo.Sessions:
    return demo.Sessions()


def server_status() -> dict:
    """What the operator page shows: plain numbers from this process's shared state."""
    import datetime

    p = policy()
    engines = []
    for key in _loaders().keys():
        ldr = _loader(key)
        if ldr.done.is_set() and ldr.result is not None:
            s = pipeline.engine.engine_for(ldr.result).stats()
            engines.append(
                {
                    "model": ldr.result.label,
                    "running": s["running"],
                    "waiting": s["waiting"],
                    "tok/s, last minute": round(s["tokens_per_s_last_minute"], 1),
                    "KV MiB in use": round(s["kv_bytes_in_use"] / 2**20, 1),
                    "iterations": s["iterations"],
                    "cancelled": s.get("ended", {}).get("cancelled", 0),
                }
            )
    errors = [(datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S"), rid, where, msg) for t, rid, where, msg in reversed(_errors().items)]
    return {
        "sessions": _sessions().active(),
        "heavy": _heavy_line(p.caps.heavy_at_once).snapshot(),
        "engines": engines,
        "errors": errors,
        "traces": len(_traces()),
        "trace_bytes": _traces().nbytes,
    }


@st.cache_resource(show_spinner=False)
def _address_limiter() -> demo.RateLimiter:
    return demo.RateLimiter(0)


@st.cache_resource(show_spinner=False)
def _address_slots() -> demo.AddressSlots:
    return demo.AddressSlots()


@st.cache_resource(show_spinner=False)
def password_guard() -> demo.PasswordGuard:
    """The operator page's guard against guessing: one per server process, whatever the session or address."""
    return demo.PasswordGuard()


def session_key() -> str:
    """This browser's id (its cookie; a new one for a browser that has none yet): what its runs and its rate limit
    are kept under. Never in the address, so a link hands it to nobody."""
    return st.session_state.get("_sid") or "?"


def client_address() -> str:
    """The connection's address ("local" for localhost, where Streamlit gives none)."""
    try:
        ip = st.context.ip_address
    except Exception:  # noqa: BLE001 - no client context (a bare script run)
        ip = None
    return ip if isinstance(ip, str) and ip else "local"  # AppTest gives a mock


def fail(e: BaseException, what: str, where=None, level: str = "warning") -> None:
    """An unexpected error, said in the page: type and message on one's own machine; on a demo server only a
    request id (the details, paths and traceback are logged on the server, never shown to a visitor)."""
    w = where or st
    if policy().enabled:
        rid = _errors().record(e, what)
        getattr(w, level)(f"Could not {what}. The server logged the details under request id **{rid}**: quote it to whoever runs this server.")
    else:
        getattr(w, level)(f"Could not {what}: {type(e).__name__}: {e}")


def sweep_lengths(offered: list[int], key: str) -> list[int]:
    """A sweep's prompt lengths: those within a demo server's cap, up to the visitor's "Longest prompt" (bound to
    the link, so a shared link reruns the same sweep)."""
    offered = [n for n in offered if n <= cap("sweep_tokens", 10**9)]
    longest = st.select_slider(
        "Longest prompt", offered, value=offered[-1], key=key, bind="query-params", help="Shorter sweeps finish sooner." + cap_note("sweep_tokens")
    )
    return [n for n in offered if n <= longest]


def prompt_fits(lm, prompt: str, chat: bool) -> bool:
    """A demo server's prompt-token cap, for pages that run a prompt without tracing it; says so when over."""
    limit = cap("prompt_tokens", 10**9)
    if limit >= 10**9:
        return True
    n = len(pipeline.tokenize(lm.tokenizer, prompt, chat=chat).input_ids)
    if n > limit:
        st.warning(f"The prompt is {n:,} tokens; this demo server runs prompts of at most {limit:,} tokens. Shorten it.")
    return n <= limit


def allowed(what: str) -> bool:
    """A demo server's limits on starting a run (always True elsewhere): per browser (requests_per_minute) and per
    client address (address_per_minute, whatever sessions or cookies it sheds); says in the page what was refused
    and when to try again."""
    p = policy()
    if not p.enabled:
        return True
    wait = _limiter().allow(session_key(), p.caps.requests_per_minute)
    if wait:
        st.warning(
            f"Refused: too many runs from this browser. This demo server allows {p.caps.requests_per_minute} a minute per browser "
            f"(model runs, generations, sweeps and tokenizing all count). Try {what} again in {wait:.0f} s."
        )
        return False
    wait = _address_limiter().allow(client_address(), p.caps.address_per_minute)
    if wait:
        st.warning(
            f"Refused: too many runs from your network address ({p.caps.address_per_minute} a minute is the most one address may start "
            f"on this demo server). Try {what} again in {wait:.0f} s."
        )
    return not wait


def address_slot():
    """A context manager holding one of this client address's places for a run queued or running (a demo server's
    address_at_once); raises demo.Busy, with a message for the page, when the address has none left."""
    p = policy()
    return _address_slots().hold(client_address(), p.caps.address_at_once if p.enabled else 0)


@contextmanager
def heavy(what: str, slot: str | None = None):
    """A heavy experiment (a sweep, the kernels, production mode, a speculative comparison): on a demo server it
    waits its turn in a fair line (one per visitor, `heavy_at_once` at a time), saying where it stands; a tab
    closed while waiting leaves the line. Elsewhere it just runs. With `slot`, what else ran on the server while
    it ran is kept beside the page's result (busy_note(slot) says it)."""
    p = policy()
    if not p.enabled:
        with timed(slot):
            yield
        return
    if not allowed(what):
        st.stop()
    note = st.empty()
    line = _heavy_line(p.caps.heavy_at_once)
    try:
        slot_held = address_slot()
        slot_held.__enter__()
    except demo.Busy as e:
        note.warning(str(e))
        st.stop()
    try:
        try:
            ticket = line.turn(
                session_key(), what, on_wait=lambda pos: note.info(f"The server runs one heavy experiment at a time: you are {demo.ordinal(pos)} in line.")
            )
            ticket.__enter__()
        except demo.Busy as e:
            note.warning(str(e))
            st.stop()
        note.empty()
        try:
            with timed(slot):
                yield
        finally:
            ticket.__exit__(None, None, None)
    finally:
        slot_held.__exit__(None, None, None)


@contextmanager
def timed(slot: str | None):
    """A timed experiment: registered as one (so other times measured meanwhile say so), and what else ran while it
    ran kept beside the page's result in `slot` (busy_note(slot) says it)."""
    with ACTIVITY.doing("experiment") as job:
        yield
    if slot:
        remember(slot + "/busy", job.busy)


def metric_of(col, label: str, samples, scale: float = 1000.0, unit: str = "ms", digits: int = 0, help: str | None = None) -> None:
    """A metric for repeated measurements: the median as its value (short enough never to be cut), the range of
    the repeats under it."""
    f = lambda x: f"{x * scale:,.{digits}f}"  # noqa: E731
    col.metric(
        label,
        f"{f(samples.median)} {unit}".strip(),
        f"range {f(samples.lo)}–{f(samples.hi)} {unit}".strip() if len(samples.values) > 1 else None,
        delta_color="off",
        delta_arrow="off",
        help=help,
    )


def claim_or_doubt(verdict, where=None) -> None:
    """A measured trend as the page may state it (pipeline.generation.Verdict): the claim when every repeat holds
    it, else why this machine could not tell."""
    w = where or st
    if verdict.claim:
        w.caption(verdict.claim)
    else:
        w.warning(verdict.doubt, icon=":material/help:")


def busy_note(busy, where=None) -> None:
    """What else this server ran while a time shown was measured (a Busy, or the slot of a heavy experiment's
    result): a warning that the time is inflated, or a one-line caption that nothing else ran."""
    if isinstance(busy, str):
        busy = recall(busy + "/busy")
    if busy is None:
        return
    w = where or st
    if busy:
        w.warning(str(busy), icon=":material/groups:")
    else:
        w.caption(str(busy))


@st.cache_resource(show_spinner=False)
def _loaders() -> appstate.Loaders:
    return appstate.Loaders(max_models=4)


def _loader(key: str) -> appstate.Loader:
    return _loaders().get(key)


def warm() -> None:
    """Start loading every model of the demo allowlist (each once per process; `make demo` has built their
    caches before the server opened, so this is seconds)."""
    for key in policy().models:
        _loader(key)


def _init_state():
    for k, v in DEFAULTS.items():
        st.session_state.setdefault(k, v)


def _prompt_edited():
    """A typed prompt is no longer the preset: the preset box says so."""
    name = st.session_state.get("preset")
    if name in PRESETS and PRESETS[name][0] != st.session_state.get("prompt"):
        st.session_state["preset"] = "—"


def _apply_preset():
    name = st.session_state.get("preset")
    if name in PRESETS:
        st.session_state["prompt"], st.session_state["chat"] = PRESETS[name]


def sidebar():
    _init_state()
    session.keep_runs()
    long = session.shared_prompt()
    sb = st.sidebar
    pol = policy()
    _sessions().seen(session_key())
    if pol.enabled:  # only the operator's allowlist; nothing a visitor types is ever a server path
        known = {m.key: m for m in available_models()}
        choices = [known.get(k) or pipeline.models.ModelChoice(k, Path(k).name, True) for k in pol.models]
        keys = [m.key for m in choices]
        if st.session_state.get("model_choice") not in keys:
            st.session_state["model_choice"] = keys[0]
        helptext = "The models this demo server offers (chosen by its operator). Nothing is ever downloaded."
    else:
        choices = available_models()
        keys = [m.key for m in choices] + [LOCAL]
        helptext = (
            "Embedded SmolLM2-135M-Instruct, Gemma-3 270M after `make models`, or any local Hugging Face folder (safetensors). Nothing is ever downloaded."
        )
    labels = {m.key: m.label + ("" if m.available else " (not installed)") for m in choices}
    sb.selectbox("Model", keys, key="model_choice", bind="query-params", format_func=lambda k: labels.get(k, k), help=helptext)
    if st.session_state["model_choice"] == LOCAL:
        sb.text_input("Folder path", key="local_path", placeholder="/path/to/hf-model-folder")
    sb.selectbox("Preset prompt", ["—"] + list(PRESETS), key="preset", on_change=_apply_preset)
    sb.text_area(
        "Prompt",
        key="prompt",
        height=110,
        max_chars=200_000,
        on_change=_prompt_edited,
        bind=None if long else "query-params",
        help="Any text: it is shown as typed, never read as Markdown or HTML." + cap_note("prompt_tokens", "tokens"),
    )
    sb.toggle(
        "Chat mode (wrap in the chat template)",
        key="chat",
        bind="query-params",
        help="One switch for every page: the prompt wrapped in the model's chat template (instruct models answer "
        "questions in chat mode; a completion such as 'The capital of France is' reads better without it).",
    )
    session.share_note(sb, long)
    info = st.session_state.get("_device_label")
    if info:
        sb.caption(f"**Device:** {info}")
    st.session_state["_run_caption"] = sb.empty()  # one "This run" line, however many traces a page reads


def model_key() -> str:
    choice = st.session_state.get("model_choice") or pipeline.EMBEDDED
    pol = policy()
    if pol.enabled:
        return choice if choice in pol.models else pol.models[0]
    if choice == LOCAL:
        path = st.session_state.get("local_path", "").strip()
        return canonical_key(path) if path else ""
    return choice


def get_model():
    """The loaded model for the sidebar's choice (shared by all tabs), with progress while it loads.
    Stops the page with a clear message when it cannot load."""
    key = model_key()
    if not key:
        st.info("Type the path of a local Hugging Face model folder in the sidebar.")
        st.stop()
    if key not in (pipeline.EMBEDDED, pipeline.GEMMA):
        try:
            pipeline.models.check_folder(key)
        except ModelLoadError as e:
            _load_failed(e, "open this model")
            st.stop()
    lm = _wait_loaded(key, "the model")
    if lm is None:
        st.stop()
    if st.session_state.get("_device_label") != lm.device_label:
        st.session_state["_device_label"] = lm.device_label
        st.sidebar.caption(f"**Device:** {lm.device_label}")
    return lm


@st.cache_resource(show_spinner=False)
def _traces() -> appstate.TraceCache:
    return appstate.TraceCache()


def _trace(model_key: str, prompt: str, chat: bool, qkv_layer: int | None, progress=None):
    """The shared trace for these inputs; a new one counts as a run against the visitor's limits (a cached one
    costs nothing) and is made on the model's own thread (pipeline.models.LoadedModel.run)."""
    lm = _loader(model_key).result
    key = (model_key, prompt, chat, qkv_layer)
    make = lambda: lm.run(_make_trace, lm, prompt, chat, qkv_layer, progress=progress)  # noqa: E731
    if key in _traces():
        return _traces().get(key, make)
    if not allowed("running the model"):
        st.stop()
    try:
        with address_slot():
            return _traces().get(key, make)
    except demo.Busy as e:
        st.warning(str(e))
        st.stop()


def _make_trace(lm, prompt: str, chat: bool, qkv_layer: int | None, progress=None):
    return pipeline.trace(
        lm,
        prompt,
        chat=chat,
        qkv_layers=[qkv_layer] if qkv_layer is not None else None,
        attn_layers=None if qkv_layer is None else [qkv_layer],
        max_tokens=cap("prompt_tokens", pipeline.tracing.DEFAULT_MAX_TOKENS),
        progress=progress,
    )


def get_trace(prompt: str | None = None, chat: bool | None = None, qkv_layer: int | None = None):
    """(lm, trace) for the sidebar's prompt (or the one given); shows a clear message and stops on bad input.
    A progress bar follows the layers while the model runs."""
    lm = get_model()
    own = prompt is None
    prompt = st.session_state.get("prompt", "") if prompt is None else prompt
    chat = bool(st.session_state.get("chat")) if chat is None else chat
    bar = st.empty()
    try:
        check_prompt(prompt)
        tr = _trace(model_key(), prompt, chat, qkv_layer, progress=lambda f, msg: bar.progress(f, text=f"Running the model with hooks: {msg}"))
    except TraceError as e:
        bar.empty()
        st.warning(str(e))
        st.stop()
    bar.empty()
    if chat and not tr.chat and own:
        st.caption("This model has no chat template (a base model), so the prompt is used as plain text.")
    if own:
        nxt, p = pipeline.sampling.top_token(tr.next_logits)
        where = st.session_state.get("_run_caption") or st.sidebar
        where.caption(f"**This run:** {tr.T:,} tokens → most likely next token **{lit(repr(lm.tokenizer.decode([nxt])))}** (p = {p:.2f})")
    return lm, tr


@st.cache_resource(show_spinner=False)
def _tokenized() -> appstate.LRU:
    return appstate.LRU(16)


def get_tokens():
    """(lm, tokenized prompt, message or None): tokenizing works at any length (a demo server tokenizes at most
    its tokenize_chars); the message says when the prompt is too long for the model to run on. Tokenizing a new
    prompt counts against the visitor's limits."""
    lm = get_model()
    prompt, chat = st.session_state.get("prompt", ""), bool(st.session_state.get("chat"))
    try:
        check_prompt(prompt)
    except TraceError as e:
        st.warning(str(e))
        st.stop()
    limit = cap("tokenize_chars", 10**9)
    if len(prompt) > limit:
        st.warning(f"The prompt is {len(prompt):,} characters; this demo server tokenizes at most {limit:,}. Shorten it.")
        st.stop()
    key = (model_key(), prompt, chat)
    if key not in _tokenized() and not allowed("tokenizing"):
        st.stop()
    tk = _tokenized().get(key, lambda: pipeline.tokenize(lm.tokenizer, prompt, chat=chat))
    try:
        check_prompt(prompt, len(tk.tokens), lm.facts.max_positions)
        msg = None
    except TraceError as e:
        msg = str(e)
    return lm, tk, msg


# Widget callbacks: never a function or lambda defined in a page script. Streamlit keeps each widget's
# format_func / on_change in the session's widget metadata, and a page-level function holds the page's whole
# namespace (its trace, its results) through __globals__; a widget whose options change with the prompt gets a
# new entry per prompt, so one session used to keep every trace it ever saw (~210 MB per long prompt). These
# helpers close over plain data only.
def labeller(labels) -> callable:
    """format_func for options 0..n-1 (or the keys of a dict) that shows labels[option]."""
    return (list(labels) if not isinstance(labels, dict) else dict(labels)).__getitem__


def on_choice(select_key: str, table: dict, targets: tuple[str, ...]) -> callable:
    """on_change for a selectbox `select_key` whose choice fills other widgets: table[choice] -> one value per
    target session-state key (a single target takes the value itself)."""

    def fill():
        vals = table[st.session_state[select_key]]
        st.session_state.update({targets[0]: vals} if len(targets) == 1 else dict(zip(targets, vals)))

    return fill


def verbatim(text: str, where=None, cursor: bool = False, max_lines: int = 0):
    """Text a visitor or the model wrote, exactly as written: a code block keeps newlines and indentation and
    never reads Markdown or HTML (a generated "# heading" stays a line of code). The one way whole texts are
    drawn on every page; short pieces inside a sentence go through components.tokens.lit."""
    lines = text.count("\n") + 1
    height = 24 * max_lines + 16 if max_lines and lines > max_lines else "content"
    (where or st).code(text + (" ▌" if cursor else ""), language=None, wrap_lines=True, height=height)


class PageExports:
    """What the page drew in this run, for "Export this page": figures, tables and non-Plotly views."""

    def __init__(self, title: str):
        self.title, self.figures, self.tables, self.html = title, [], {}, {}

    def stem(self) -> str:
        return export.slug(self.title, (st.session_state.get("prompt") or "")[:40])

    def zip(self) -> bytes:
        return export.page_zip(self.stem(), self.figures, self.tables, self.html)


def _exports() -> PageExports:
    return st.session_state.get("_exports") or PageExports("page")


def presenting() -> bool:
    return bool(st.session_state.get("present"))


def figure(fig, name: str = "", where=None, key: str | None = None) -> None:
    """A Plotly figure, ready for slides: its camera button saves a 3x PNG under a meaningful name, SVG and PNG
    buttons under it (drawn on click, every label inside the canvas), and it joins the page's ZIP export. In
    presentation mode the numbers are drawn on the figure (no hover needed)."""
    reg = _exports()
    title = name or (fig.layout.title.text if fig.layout.title and fig.layout.title.text else "figure")
    if presenting():
        fig = export.labelled(fig)
    stem = export.slug(reg.title, title, (st.session_state.get("prompt") or "")[:40])
    w = where or st
    config = {"toImageButtonOptions": {"format": "png", "scale": export.SCALE, "filename": stem}, "displaylogo": False}
    w.plotly_chart(fig, width="stretch", key=key, config=config)
    reg.figures.append((title, fig))
    n = len(reg.figures)
    row = w.container(horizontal=True, gap="small")  # buttons as wide as their labels, in a half-width column too
    row.download_button(
        "SVG", _image_of(fig, "svg"), f"{stem}.svg", "image/svg+xml", key=f"svg_{n}_{key or ''}", icon=":material/download:", type="tertiary", on_click="ignore"
    )
    row.download_button(
        "PNG ×3", _image_of(fig, "png"), f"{stem}.png", "image/png", key=f"png_{n}_{key or ''}", icon=":material/download:", type="tertiary", on_click="ignore"
    )


def _image_of(fig, fmt: str):
    """Deferred: the image is drawn only when its button is clicked (a closure over the figure alone)."""
    return lambda: export.image(fig, fmt)


def table(name: str, df, where=None, **kw) -> None:
    """A table (a DataFrame or a list of row dicts) shown as usual, and saved as CSV in the page's ZIP export."""
    import pandas as pd

    df = df if isinstance(df, pd.DataFrame) else pd.DataFrame(df)
    _exports().tables[name] = df
    (where or st).dataframe(df, **kw)


def html_view(body: str, name: str, where=None) -> None:
    """A non-Plotly view (token chips, speculative call rows), shown and saved as HTML in the page's ZIP export."""
    _exports().html[name] = body
    (where or st).html(body)


def page_header(title: str, takeaway: str, prev_page, next_page) -> None:
    """The run's export registry; presentation mode's layout (no sidebar, larger type), the page's takeaway
    and previous / next stage links; the toggle itself."""
    st.session_state["_exports"] = reg = PageExports(title)
    c = st.columns([6, 2, 2])
    c[1].toggle(
        "Presentation mode",
        key="present",
        bind="query-params",
        help="For a projector or slides: no sidebar, larger type, numbers drawn on the figures. The link keeps it (?present=true).",
    )
    c[2].download_button(
        "Export this page",
        reg.zip,
        f"{reg.stem()}.zip",
        "application/zip",
        key="export_page",
        on_click="ignore",
        icon=":material/folder_zip:",
        help="Every figure of this page as SVG and 3x PNG, the numbers behind them as JSON, its tables as CSV, in one ZIP",
    )
    if presenting():
        st.html(
            "<style>section[data-testid='stSidebar'],[data-testid='stSidebarCollapsedControl'],[data-testid='stExpandSidebarButton']{display:none}"
            ".stMainBlockContainer{max-width:100%;padding-left:3rem;padding-right:3rem}"
            ".stMainBlockContainer p,.stMainBlockContainer li{font-size:1.3rem}</style>"
        )
        st.info(takeaway, icon=":material/lightbulb:")
        n = st.columns([3, 3, 2])
        if prev_page is not None:
            n[0].page_link(prev_page, label=f"← {prev_page.title}")
        if next_page is not None:
            n[1].page_link(next_page, label=f"{next_page.title} →")


PASS, FAIL, SKIP = (":green[:material/check_circle:]", ":red[:material/cancel:]", ":gray[:material/remove_circle: not run]")


def verdict(ok: bool | None) -> str:
    """A pass / fail / not-run mark drawn with Streamlit's bundled icon font (no emoji font needed)."""
    return SKIP if ok is None else (PASS if ok else FAIL)


def _check_results() -> appstate.CheckResults:
    return st.session_state.setdefault("_checks", appstate.CheckResults())


def how_do_we_know(checks_fn, key: str, tr, label="How do we know? Cross-checks on this run", ask: bool = False):
    """An expander that runs `checks_fn()` -> [Check] once per `tr` (a trace, or a run's result object) and shows
    each measured discrepancy. Results live in the session (appstate.CheckResults), never on the shared trace.
    Checks that need extra forward passes on long prompts (or, with `ask`, always) wait for a click."""
    with st.expander(label):
        store = _check_results()
        results = store.get(key, tr)
        if results is None:
            T = getattr(tr, "T", 0)
            if (ask or T > 256) and not st.button("Run the cross-checks", key=f"chk_{key}", help="They re-run the model: seconds"):
                st.caption(
                    "The cross-checks re-run the model, so they wait for a click."
                    if ask
                    else f"{T} tokens: the cross-checks re-run the model, so they wait for a click."
                )
                return
            try:
                results = checks_fn()
            except Exception as e:  # noqa: BLE001 - a failed check is shown, the page keeps serving
                fail(e, "run a check", level="error")
                return
            store.put(key, tr, results)
        show_checks(results)


def evidence(checks, label="How do we know? Cross-checks on this run") -> None:
    """The "How do we know?" box for checks already computed (cheap arithmetic on a run's own numbers, or a
    comparison the page ran anyway)."""
    with st.expander(label):
        show_checks(checks)


def show_checks(checks) -> None:
    """Each check as one line: its verdict, what was compared, the measured discrepancy."""
    for c in checks:
        st.markdown(f"{verdict(c.ok)} **{c.name}** — {c.detail}")


@st.cache_resource(show_spinner="Loading tokenizer…")
def tokenizer_for(key: str):
    return pipeline.models.load_tokenizer(key)


def layer_with_qkv(tr, label: str, key: str, default: int | None = None):
    """A layer picker for views that need the layer's Q/K/V. Short prompts have them for every layer; long
    ones for a few kept layers, and another layer is captured on request (one more forward pass, which keeps
    the default layers too). Returns (trace, layer)."""
    L = tr.facts.n_layers
    if len(tr.qkv) == L:
        return tr, st.slider(label, 0, L - 1, L // 2 if default is None else default, key=key, bind="query-params")
    extra_key = (f"{key}_extra", st.session_state.get("prompt"), model_key())
    extra = st.session_state.get(str(extra_key))
    if extra is not None and extra not in tr.qkv:
        _, tr = get_trace(qkv_layer=extra)
    options = sorted(tr.qkv)
    if len(options) > 1:
        layer = st.select_slider(label, options, value=extra if extra in options else options[len(options) // 2], key=key, bind="query-params")
    else:
        layer = options[0]
        st.markdown(f"{label}: **{layer}**")
    c1, c2 = st.columns([1, 3])
    want = c1.number_input("Capture another layer", 0, L - 1, 1, key=f"{key}_want")
    if c2.button(f"Run the model again keeping layer {want} in full ({tr.T:,} tokens: seconds on CPU)", key=f"{key}_go"):
        st.session_state[str(extra_key)] = int(want)
        st.rerun()
    st.caption(
        f"{tr.T:,} tokens: query/key/value and full-resolution maps are kept for layer"
        f"{'s' if len(options) > 1 else ''} {', '.join(map(str, options))} only, to bound memory."
    )
    return tr, layer


def chat_mode(lm, where=None) -> bool:
    """The prompt's chat mode on a page that runs it: the sidebar's one switch (shown, not repeated, so two
    switches can never disagree). Base models have no chat template: plain text whatever the switch says."""
    has = bool(getattr(lm.tokenizer, "chat_template", None))
    on = bool(st.session_state.get("chat")) and has
    (where or st).caption(
        f"Chat mode: **{'on' if on else 'off'}** (the sidebar's switch)" if has else "Plain text: this model has no chat template (a base model)."
    )
    return on


def _use_preset(name: str) -> None:
    st.session_state["prompt"], st.session_state["chat"] = GENERATION_PRESETS[name]
    st.session_state["preset"] = "—"


def generation_presets(where=None) -> None:
    """One-click prompts that generate well on the embedded model (they set the sidebar's prompt and chat mode)."""
    w = where or st
    cols = w.columns(len(GENERATION_PRESETS) + 1)
    cols[0].caption("Prompts that generate well:")
    for c, name in zip(cols[1:], GENERATION_PRESETS):
        c.button(name, key=f"genpreset_{name}", on_click=_use_preset, args=(name,), type="tertiary", icon=":material/edit_note:")


def generation_prompt() -> str | None:
    """The sidebar's prompt for a generation page; None (with a message in the page) when it is empty."""
    prompt = st.session_state.get("prompt", "") or ""
    if not prompt.strip():
        st.info("The sidebar's prompt is empty: type one (or pick a preset) to generate.")
        return None
    return prompt


def sampling_controls(prefix: str, greedy_default: bool = False) -> dict:
    """Max new tokens / temperature / top-k / top-p / seed in one row, with the app's one set of defaults
    (pipeline.sampling.DEFAULTS, the same as page 5's and the overview's), each bound to the URL."""
    d = pipeline.sampling.DEFAULTS
    c = st.columns(5)
    q = dict(bind="query-params")
    return dict(
        max_new_tokens=c[0].number_input(
            "Max new tokens",
            0,
            cap("new_tokens", 100_000),
            min(48, cap("new_tokens", 48)),
            key=f"{prefix}_n",
            help=f"Capped at {pipeline.generation.MAX_NEW_TOKENS:,}." + cap_note("new_tokens"),
            **q,
        ),
        temperature=c[1].slider("Temperature", 0.0, 2.0, 0.0 if greedy_default else d.temperature, 0.05, key=f"{prefix}_t", help="0 = greedy", **q),
        top_k=c[2].slider("Top-k (0 = off)", 0, 200, d.top_k, key=f"{prefix}_k", **q),
        top_p=c[3].slider("Top-p (1 = off)", 0.0, 1.0, d.top_p, 0.01, key=f"{prefix}_p", **q),
        seed=c[4].number_input("Seed", 0, 2**31 - 1, d.seed, key=f"{prefix}_seed", **q),
    )


def run_generation(
    lm, prompt: str, chat: bool, settings: dict, slot: str, out=None, sampler=None, use_cache: bool = True, cache: str = "engine"
) -> GenerationRecord | None:
    """Stream one generation into `out` (a placeholder), keeping every event in the session's `slot` as it
    arrives, so a Stop (which reruns the page) loses nothing. Returns the record, or None on bad input.
    cache "engine": the request joins the shared engine (every visitor's requests batched together); while it
    waits in line the page says where it stands. Other caches: this request's own loop (pipeline.generate)."""
    try:
        req = prepare(lm, prompt, settings["max_new_tokens"], chat)
    except TraceError as e:
        st.warning(str(e))
        return None
    limit = cap("prompt_tokens", 10**9)
    if len(req.prompt_ids) > limit:
        st.warning(f"The prompt is {len(req.prompt_ids):,} tokens; this demo server generates from prompts of at most {limit:,} tokens. Shorten it.")
        return None
    if not allowed("generating"):
        return None
    try:
        with address_slot():
            return _stream(lm, prompt, chat, settings, slot, req, out, sampler, use_cache, cache)
    except demo.Busy as e:
        st.warning(str(e))
        return None


def _stream(lm, prompt, chat, settings, slot, req, out, sampler, use_cache, cache) -> GenerationRecord | None:
    for note in req.notes:
        st.info(note)
    rec = GenerationRecord(prompt=prompt, chat=chat, model=lm.label, settings=dict(settings), prompt_tokens=len(req.prompt_ids), use_cache=use_cache)
    t_start = time.perf_counter()
    opts = {k: v for k, v in settings.items() if k != "max_new_tokens"}
    engine = use_cache and cache == "engine"
    own = None
    if engine:
        try:
            events = pipeline.engine.engine_for(lm).submit(req.prompt_ids, req.max_new_tokens, pipeline.engine.Sampling(**opts), arrived=t_start).stream()
        except (pipeline.engine.QueueFull, pipeline.engine.TooLarge, ValueError) as e:
            st.warning(str(e))
            return None
    else:  # this request's own loop: registered as one generation (the engine registers its steps itself)
        events = pipeline.generate(lm, prompt, chat=chat, request=req, use_cache=use_cache, cache=cache, **opts)
        own = ACTIVITY.start("generation")
    appstate.remember(st.session_state, slot, model_key(), rec)
    try:
        for ev in events:
            if rec.stopped:  # Stop was pressed: the page has moved on, keep what it showed (the engine
                break  # request is cancelled as the stream closes)
            if isinstance(ev, pipeline.engine.Waiting):
                if out is not None:
                    out.info(f"Server busy: {ev}. Your request starts as soon as a slot is free.")
                continue
            rec.events.append(ev)
            if sampler is not None:
                sampler.mark(
                    "prefill" if ev.phase == "prefill" else "decode", t_start if ev.phase == "prefill" else t_start + ev.t_s - ev.step_s, t_start + ev.t_s
                )
            if out is not None:
                verbatim(rec.text(lm.tokenizer), out, cursor=True)
    except pipeline.engine.EngineError as e:  # a replica that died, an engine error: what was made is kept
        st.warning(str(e))
        rec.stopped = True
    finally:
        # what else ran meanwhile: the engine's steps counted this request in their batch, its own loop did not
        rec.busy = ACTIVITY.end(own) if own is not None else ACTIVITY.during(t_start, time.perf_counter()).less_one("generation")
    rec.done = not rec.stopped
    if out is not None:
        verbatim(rec.text(lm.tokenizer), out)
    return rec


def last_generation(slot: str, lm) -> GenerationRecord | None:
    """This session's last generation in `slot` for the loaded model, if it produced anything."""
    rec = appstate.recall(st.session_state, slot, model_key())
    return rec if rec is not None and rec.model == lm.label and rec.events else None


def stop_generation(slot: str) -> None:
    """The Stop button: the running generation in `slot` stops after its current token, keeping what it made."""
    rec = appstate.recall(st.session_state, slot, model_key())
    if rec is not None and not rec.done:
        rec.stopped = True


def remember(slot: str, value) -> None:
    """Keep a page's last result (a sweep, a comparison) for this session and the loaded model."""
    appstate.remember(st.session_state, slot, model_key(), value)


def recall(slot: str):
    """The page's last result for the loaded model, or None."""
    return appstate.recall(st.session_state, slot, model_key())


def load_other_model(key: str):
    """Load a second model (e.g. a draft) with progress; a clear message and None when it cannot load."""
    pol = policy()
    if pol.enabled and not pol.caps.draft_folders and key not in pol.models:
        st.warning("This demo server loads only the models its operator chose.")
        return None
    try:
        pipeline.models.check_folder(key)
    except ModelLoadError as e:
        st.error(str(e))
        return None
    return _wait_loaded(key, "the draft model")


def _wait_loaded(key: str, what: str):
    """The loaded model for `key`, with a progress bar while it loads; None (and a message) if it failed."""
    ldr = _loader(key)
    if not ldr.done.is_set():
        bar = st.progress(0.0, text=f"Loading {what}…")
        while not ldr.done.wait(0.25):
            bar.progress(min(1.0, ldr.fraction), text=f"{ldr.message} · {time.time() - ldr.t0:.0f} s")
        bar.empty()
    if ldr.error:
        _loaders().forget(key)  # only this one: every other loaded model stays for every session
        _load_failed(ModelLoadError(f"Could not load {what}: {ldr.error}"), f"load {what}")
        return None
    return ldr.result


def _load_failed(e: ModelLoadError, what: str) -> None:
    """A model that cannot be opened or loaded: its own message on one's own machine (it names the folder the
    user typed); on a demo server only a request id."""
    if policy().enabled:
        fail(e, what, level="error")
    else:
        st.error(str(e))


@st.fragment(run_every="2s")
def engine_panel(lm):
    """What the shared engine is serving for this app right now (every visitor's generations), refreshed."""
    s = pipeline.engine.engine_for(lm).stats()
    st.subheader("Live: this server's engine")
    c = st.columns(4)
    c[0].metric("Requests running", s["running"])
    c[1].metric("Waiting in line", s["waiting"])
    c[2].metric("Tokens/s, last minute", f"{s['tokens_per_s_last_minute']:.1f}")
    c[3].metric(
        "KV memory in use", f"{s['kv_bytes_in_use'] / 2**20:,.1f} of {s['kv_bytes_total'] / 2**20:,.0f} MiB", help=f"{s['blocks_used']} of {s['blocks']} blocks"
    )
    hits = s.get("prefix_hit_requests", 0)
    st.caption(
        f"{s['engine']}: every generation on pages 6, 9 and 14 of every visitor goes through it. {s['iterations']:,} iterations so far. "
        f"Prefix cache: {hits:,} {'prompt' if hits == 1 else 'prompts'} started like an earlier one and reused "
        f"{s.get('prefix_hit_tokens', 0):,} tokens of K/V instead of computing them ({s.get('blocks_cached', 0):,} blocks cached)."
    )
