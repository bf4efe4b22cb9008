"""A student's tab without a browser: a client of Streamlit's own websocket protocol that opens the join link
(?follow=CODE) and records, like bench_live_class's page script, when it shows which page and prompt.

It sends what the browser sends to start a session (a rerun BackMsg with the address's query string) and reads the
ForwardMsgs: `navigation` and `new_session` say which page runs, `page_info_changed` carries the address's query
string (the bound prompt is in it unless it is the default), `script_finished` says the page has been drawn to its end
(a change is recorded then: what the student sees is the whole page, not its first line). It runs no timers of its own: the follower's heartbeat
fragment runs when the presenter's run wakes it (views.live_wake), so what this measures is the server delivering a
change to each student, as if each had a machine of their own; the browsers' drawing is left out (bench_live_class's
browser followers measure that, 31 Chromium pages on 2 cores)."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import parse_qs


async def follow(url: str, code: str, seen: list, stop: asyncio.Event, errors: list, timers: bool = False) -> None:
    """Follow class `code` on the server at `url` until `stop`; append (path|prompt, ms) to `seen` on each change.
    `timers`: run the fragments' auto-reruns as a browser does (an `auto_rerun` message's interval: a rerun of that
    fragment every interval, until the next full run), for the public heartbeat path (LLM_EXPLORER_LIVE_WAKE=0)."""
    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    from views.sidebar import DEFAULTS  # the prompt is absent from the address at its default

    ws_url = url.replace("http://", "ws://") + "/_stcore/stream"
    pages, page, query, last = {}, "", f"follow={code}", ""
    page_hash, due = "", {}  # the running page's hash; fragment id -> [interval s, next rerun at]
    import secrets

    # each student its own browser: its own id cookie (its runs and its limits), as a Chromium page would have
    cookie = f"llm_explorer_browser={secrets.token_hex(8)}"
    async with websockets.connect(ws_url, subprotocols=["streamlit"], max_size=None, open_timeout=300, additional_headers={"Cookie": cookie}) as ws:
        msg = BackMsg()
        msg.rerun_script.query_string = query
        await ws.send(msg.SerializeToString())
        while not stop.is_set():
            now_s = time.monotonic()
            for fid, t in list(due.items()):
                if timers and now_s >= t[1] and page_hash:
                    t[1] = now_s + t[0]
                    rerun = BackMsg()
                    rerun.rerun_script.query_string, rerun.rerun_script.page_script_hash = query, page_hash
                    rerun.rerun_script.fragment_id, rerun.rerun_script.is_auto_rerun = fid, True
                    await ws.send(rerun.SerializeToString())
            try:
                data = await asyncio.wait_for(ws.recv(), timeout=0.1 if timers else 0.5)
            except TimeoutError:
                continue
            fwd = ForwardMsg()
            fwd.ParseFromString(data)
            kind = fwd.WhichOneof("type")
            if kind == "navigation":
                pages.update({p.page_script_hash: p.url_pathname for p in fwd.navigation.app_pages})
                page = pages.get(fwd.navigation.page_script_hash, page)
            elif kind == "new_session":  # the page by its hash (the navigation message names the pages)
                if fwd.new_session.page_script_hash and fwd.new_session.page_script_hash != page_hash:
                    due.clear()  # another page: its fragments register their own timers
                page_hash = fwd.new_session.page_script_hash or page_hash
                page = pages.get(fwd.new_session.page_script_hash, page)
            elif kind == "auto_rerun":
                due[fwd.auto_rerun.fragment_id] = [fwd.auto_rerun.interval, time.monotonic() + fwd.auto_rerun.interval]
            elif kind == "stop_auto_rerun":
                for fid in fwd.stop_auto_rerun.fragment_ids:
                    due.pop(fid, None)
            elif kind == "page_info_changed":
                query = fwd.page_info_changed.query_string
            elif kind == "delta" and fwd.delta.WhichOneof("type") == "new_element" and fwd.delta.new_element.WhichOneof("type") == "exception":
                errors.append(fwd.delta.new_element.exception.message[:200])
            if kind != "script_finished" or fwd.script_finished != ForwardMsg.FINISHED_SUCCESSFULLY:
                continue  # a student sees the move when the page's run has drawn it to its end
            prompt = parse_qs(query).get("prompt", [DEFAULTS["prompt"]])[-1]
            now = f"/{page}|{prompt}"
            if now != last:
                last = now
                seen.append([now, time.time() * 1000])
