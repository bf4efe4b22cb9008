"""The live class's join link as a student opens it: the address and its QR code (plain text in, text out; no
Streamlit, no model)."""

from __future__ import annotations

import io


def join_url(page_url: str, slugs: list[str], code: str) -> str:
    """This server's front page with ?follow=CODE, from the address of the page the presenter is on (its page slug
    and query taken off; the longest slug first, so /why is not taken for /attention-kernels)."""
    root = (page_url or "").split("?")[0].rstrip("/")
    for slug in sorted({s for s in slugs if s}, key=len, reverse=True):
        if root.endswith("/" + slug):
            root = root[: -len(slug) - 1]
            break
    return f"{root or 'http://localhost:8501'}/?follow={code}"


def qr_svg(text: str) -> str:
    """`text` as a QR code, an SVG drawn here (segno), black on white with its quiet zone."""
    import segno

    out = io.BytesIO()
    segno.make(text, error="m").save(out, kind="svg", scale=6, border=4, xmldecl=False, svgns=True, title="QR code of the join link")
    return out.getvalue().decode()
