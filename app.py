"""LLM inference pipeline explorer: navigation and the shared sidebar (model, prompt, chat, device). The pages
themselves are rows of views/pages.py."""

from pathlib import Path

import streamlit as st

# a favicon of our own: a :material/...: icon is fetched from fonts.gstatic.com, and no page may reach another host
st.set_page_config(page_title="LLM pipeline explorer", page_icon=str(Path(__file__).parent / "components" / "favicon.png"), layout="wide")

from hosting.store import StoreDown  # noqa: E402
from views import guard, header, live, live_presenter, live_wake, loading, pages, session, sidebar, st_private  # noqa: E402  (after set_page_config)


def _page(spec: pages.PageSpec) -> st.Page:
    kw = {"default": True} if spec.slug == "" else {"url_path": spec.slug}
    return st.Page(spec.file, title=spec.title, icon=spec.icon, visibility="hidden" if spec.hidden else "visible", **kw)


def main() -> None:
    NAV = {spec.title: _page(spec) for spec in pages.ALL}
    live_wake.know_pages({spec.slug: st_private.page_hash(NAV[spec.title]) for spec in pages.ALL})  # a class's wake-ups
    # One flat list (the stage numbers carry the order): with section headers Streamlit draws headers and items as
    # children of a <div> inside its <ul>, which screen readers cannot read as a list (axe-core: list, listitem).
    page = st.navigation(list(NAV.values()), expanded=True)
    demo_mode = guard.policy().enabled
    if demo_mode:
        loading.warm()  # the operator's models load at the first visit, in the background
    spec = pages.BY_TITLE.get(page.title, pages.STAGES[0])
    live.follow(spec.slug, lambda slug: NAV[pages.BY_SLUG[slug].title])  # a student in a live class: the presenter's view first
    sidebar.sidebar()
    prev_spec, next_spec = pages.neighbours(spec)
    header.page_header(spec, NAV[prev_spec.title] if prev_spec else None, NAV[next_spec.title] if next_spec else None)
    # a presenter's view to the class (if any) as this run starts: the page, model, prompt and settings are known before
    # the page does its own work (a new prompt's trace: seconds the class need not wait); again after the page, below, for
    # what its widgets changed (a new number, and a wake-up, only if the view did change)
    live_presenter.publish(spec.slug)
    try:
        if demo_mode:  # a visitor never sees a traceback: the server logs it under a request id, the page shows the id
            try:
                page.run()
            except Exception as e:  # noqa: BLE001 - st.stop and st.rerun are BaseExceptions and pass through
                guard.fail(e, "draw this page", level="error")
        else:
            try:
                page.run()
            except StoreDown as e:  # the store (live classes, links, limits) is away: said, and the app keeps serving
                guard.fail(e, "draw all of this page", level="error")
    finally:
        header.finish()  # the lesson handout, if asked for: after the page, so its results are in it
        live_presenter.publish(spec.slug)  # the view with every widget of the page drawn (the same view: nothing sent)
        session.save_runs()  # this browser's finished runs to the store: a refresh, another process or a restart has them
    live.shown()  # a student's page drew the presenter's view to its end (not reached when the run stopped or restarted)


# a live class's followers run their pages a few at a time (views.live_wake.turn): the same work, without 120 threads
# taking the interpreter from each other every 5 ms
with live_wake.turn(live.following()):
    main()
