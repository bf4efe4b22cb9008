"""Speculative decoding, drawn step by step: accepted proposals, rejected ones, the target's own token."""
from __future__ import annotations

import html

from .tokens import visible

ACCEPT, REJECT, TARGET = "#b7e4c7", "#f4b6b6", "#bcd7f5"


def _chip(text, bg, strike=False, title=""):
    deco = "text-decoration:line-through;" if strike else ""
    return (f'<span title="{html.escape(title)}" style="background:{bg};{deco}border-radius:3px;padding:0 3px;'
            f'margin:1px;display:inline-block;font-family:ui-monospace,monospace;font-size:13px">'
            f'{html.escape(visible(text))}</span>')


def steps_html(steps, decode, max_steps: int = 200) -> str:
    """One line per target call: green = proposal accepted, red struck = rejected (and the rest of the
    proposal after it), blue = the target's own token (correction or bonus)."""
    rows = ['<div style="line-height:2">']
    for n, s in enumerate(steps[:max_steps]):
        parts = [f'<span style="color:#666;font-size:12px;display:inline-block;width:5.5em">call {n + 1}</span>']
        for i, t in enumerate(s.proposed):
            if i < s.accepted:
                parts.append(_chip(decode(t), ACCEPT, title=f"proposed and accepted (id {t})"))
            else:
                parts.append(_chip(decode(t), REJECT, strike=True, title=f"proposed, rejected (id {t})"))
        if s.correction >= 0:
            parts.append(_chip(decode(s.correction), TARGET, title=f"the target's own token (id {s.correction})"))
        parts.append(f'<span style="color:#666;font-size:12px"> +{s.accepted + (s.correction >= 0)} tokens</span>')
        rows.append("<div>" + "".join(parts) + "</div>")
    if len(steps) > max_steps:
        rows.append(f"<div><i>… {len(steps) - max_steps} more calls</i></div>")
    rows.append("</div>")
    return "".join(rows)


def legend_html() -> str:
    return (_chip("accepted", ACCEPT) + " " + _chip("rejected", REJECT, strike=True) + " "
            + _chip("target's own token", TARGET))
