"""Speculative decoding, drawn step by step: accepted proposals, rejected ones, the target's own token."""

from __future__ import annotations

import html

from .tokens import visible

ACCEPT, REJECT, TARGET = "#b7e4c7", "#f4b6b6", "#bcd7f5"


def _chip(text, bg, strike=False, title="", token=True):
    """A coloured chip; token=True shows whitespace visibly (a token's text), False shows plain words."""
    deco = "text-decoration:line-through;" if strike else ""
    font = "font-family:ui-monospace,monospace;" if token else ""
    return (
        f'<span title="{html.escape(title)}" style="background:{bg};{deco}border-radius:3px;padding:0 3px;'
        f'margin:1px;display:inline-block;{font}font-size:13px">'
        f"{html.escape(visible(text) if token else text)}</span>"
    )


def steps_html(steps, decode, max_steps: int = 200, first_token: int | None = None) -> str:
    """One line per target call: green = proposal accepted, red struck = rejected (and the rest of the
    proposal after it), blue = the target's own token (correction or bonus). `first_token`: the token of
    the prefill pass, drawn first."""
    rows = ['<div style="line-height:2">']
    if first_token is not None:
        rows.append(
            '<div><span style="color:#666;font-size:12px;display:inline-block;width:5.5em">prefill</span>'
            + _chip(decode(first_token), TARGET, title=f"the prompt's pass: first token (id {first_token})")
            + '<span style="color:#666;font-size:12px"> (1 new token)</span></div>'
        )
    for n, s in enumerate(steps[:max_steps]):
        parts = [f'<span style="color:#666;font-size:12px;display:inline-block;width:5.5em">call {n + 1}</span>']
        for i, t in enumerate(s.proposed):
            if i < s.accepted:
                parts.append(_chip(decode(t), ACCEPT, title=f"proposed and accepted (id {t})"))
            else:
                parts.append(_chip(decode(t), REJECT, strike=True, title=f"proposed, rejected (id {t})"))
        if s.correction >= 0:
            parts.append(_chip(decode(s.correction), TARGET, title=f"the target's own token (id {s.correction})"))
        k = s.accepted + (s.correction >= 0)
        parts.append(f'<span style="color:#666;font-size:12px"> ({k} new token{"s" if k != 1 else ""})</span>')
        rows.append("<div>" + "".join(parts) + "</div>")
    if len(steps) > max_steps:
        rows.append(f"<div><i>… {len(steps) - max_steps} more calls</i></div>")
    rows.append("</div>")
    return "".join(rows)


def legend_html() -> str:
    return (
        _chip("accepted proposal", ACCEPT, token=False)
        + " "
        + _chip("rejected proposal", REJECT, strike=True, token=False)
        + " "
        + _chip("the target's own token", TARGET, token=False)
    )
