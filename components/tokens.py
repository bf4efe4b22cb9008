"""Token chips: coloured, grapheme-safe segments with ids on hover and visible whitespace."""

from __future__ import annotations

import html
import unicodedata

from pipeline import display_text

# light tints of the Okabe-Ito colour-blind-safe palette
PALETTE = ["#cfe6f7", "#fde3b5", "#c8eadf", "#f9d3e6", "#e2dcf3", "#fff3b0", "#d9e8c4", "#f5d5c8"]
SPECIAL = "#3a3a3a"

GLYPHS = {
    " ": "·",
    "\n": "↵\n",
    "\t": "→",
    "\r": "⟨CR⟩",
    "\x00": "⟨NUL⟩",
    "\x07": "⟨BEL⟩",
    "\x1b": "⟨ESC⟩",
    "\x7f": "⟨DEL⟩",
    "\ufeff": "⟨BOM⟩",
    "\u200b": "⟨ZWSP⟩",
    "\u200d": "⟨ZWJ⟩",
    "\u00a0": "⟨NBSP⟩",
}


MARKDOWN_SPECIAL = frozenset("\\`*_{}[]()#+-.!|~<>$:&=\"'")


def plot_text(text: str) -> str:
    """Text for a Plotly label or hover: Plotly reads a subset of HTML (<b>, <a href>, <br>...) in text, so & and
    < become entities and a typed or generated "<b>" is drawn as those three characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def lit(text: str) -> str:
    """Text for a Markdown string (a caption, a pill) that must show exactly as written: every character Markdown,
    Streamlit's directives (:red[...], :material/...:) or LaTeX ($) could read is backslash-escaped, and
    newlines are drawn as ↵ (a Markdown line cannot hold one). Whole texts (prompts, answers) go in a code
    block instead (views.widgets.verbatim)."""
    text = text.replace("↵\n", "↵")  # already drawn by visible(): one arrow per newline
    return "".join("\\" + ch if ch in MARKDOWN_SPECIAL else ("↵" if ch == "\n" else ch) for ch in text)


def visible(text: str) -> str:
    """Whitespace, control and invisible format characters made visible: space ·, newline ↵, tab →,
    others as ⟨NAME⟩ or ⟨U+XXXX⟩ (zero-width, bidi overrides, BOM...). Joiners inside an emoji are kept."""
    out = []
    for i, ch in enumerate(text):
        cat = unicodedata.category(ch)
        if ch == "\u200d" and 0 < i < len(text) - 1 and not text[i - 1].isspace():
            out.append(ch)  # zero-width joiner inside an emoji sequence
        elif ch in GLYPHS:
            out.append(GLYPHS[ch])
        elif cat in ("Cc", "Cf", "Zl", "Zp") or (cat == "Zs" and ch != " "):
            out.append(f"⟨U+{ord(ch):04X}⟩")
        else:
            out.append(ch)
    return "".join(out)


def chips_html(tokens, segments, max_segments: int = 3000) -> str:
    """HTML of the prompt as token chips. `tokens`/`segments` are pipeline.forward.tokens.Token/Segment lists.

    A segment (one or more tokens forming whole characters) is one chip; its ids are shown under it
    and every token's id, piece and bytes are in the hover title."""
    parts = ['<div class="tokchips" style="line-height:2.6;font-family:ui-monospace,Menlo,monospace;font-size:15px;white-space:pre-wrap;word-break:break-all">']
    for si, seg in enumerate(segments[:max_segments]):
        toks = [tokens[i] for i in seg.token_indices]
        special = all(t.special for t in toks)
        label = toks[0].piece if special else (seg.text or toks[0].text)
        title = "\n".join(f"#{i} id {t.id} · piece {t.piece!r} · bytes {t.bytes.hex(' ') or '—'}" for i, t in zip(seg.token_indices, toks))
        bg = SPECIAL if special else PALETTE[si % len(PALETTE)]
        fg = "#ffffff" if special else "#111"
        ids = " ".join(str(t.id) for t in toks)
        parts.append(
            f'<span title="{html.escape(title)}" style="display:inline-block;background:{bg};color:{fg};'
            f'border-radius:4px;padding:0 3px;margin:1px;text-align:center;vertical-align:top">'
            f"{html.escape(visible(label))}"
            f'<span style="display:block;font-size:13px;line-height:1.2;color:{"#ddd" if special else "#555"}">'
            f"{html.escape(ids)}</span></span>"
        )
    if len(segments) > max_segments:
        parts.append(f"<div><i>… {len(segments) - max_segments:,} more segments not drawn</i></div>")
    parts.append("</div>")
    return "".join(parts)


def token_rows(tokens) -> list[dict]:
    """Table rows for a dataframe: index, id, piece, text, char span, bytes, special."""
    return [
        {"#": i, "id": t.id, "piece": t.piece, "text": visible(t.text), "chars": f"{t.start}–{t.end}", "bytes": t.bytes.hex(" "), "special": t.special}
        for i, t in enumerate(tokens)
    ]


def template_html(tokens) -> str:
    """The exact text the model reads, special tokens set apart as dark chips (so a '<|im_end|>' the user
    typed, which is plain text, looks different from the real special token). The bytes between two special
    tokens are decoded as one sequence (pipeline.forward.tokens.display_text): a character split over byte pieces
    shows whole, a lone byte as <0xE6>."""
    out = ['<pre style="white-space:pre-wrap;font-size:13px;line-height:1.9;background:#f6f6f6;padding:8px;border-radius:6px">']
    run = bytearray()
    for t in tokens:
        if t.special:
            out.append(html.escape(display_text(bytes(run))))
            run.clear()
            out.append(
                f'<span style="background:{SPECIAL};color:#fff;border-radius:3px;padding:0 3px" title="special token, id {t.id}">{html.escape(t.piece)}</span>'
            )
        else:
            run.extend(t.bytes)
    out.append(html.escape(display_text(bytes(run))))
    out.append("</pre>")
    return "".join(out)


def marked_html(before: str, marked: str, after: str, title: str) -> str:
    """A text with one token set apart by a box drawn around it (never by characters inside the text, which a
    reader would take for the model's): before + [marked] + after, verbatim, `title` on hover."""
    box = f'<span style="outline:2px solid #D55E00;outline-offset:1px;border-radius:2px" title="{html.escape(title)}">{html.escape(marked)}</span>'
    return (
        '<pre style="white-space:pre-wrap;font-size:15px;line-height:1.9;background:#f6f6f6;padding:8px;border-radius:6px;margin:0">'
        f"{html.escape(before)}{box}{html.escape(after)}</pre>"
    )
