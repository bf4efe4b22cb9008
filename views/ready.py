"""Figures and pictures made ready for the page once per server, not once per visitor: a live class's 30 followers
draw the same page from the same trace within a second of each other. A figure from a pipeline.common.memo.shared
builder gets its page copy (fonts floored, presentation mode's numbers and height) and text alternative once per mode;
an RGB picture its PNG once per pixels. views.render draws them; nothing here changes what it was given."""

from __future__ import annotations

import weakref

import numpy as np

from components import export
from components.figures import copy_figure, frozen
from pipeline.common import LRU, MAX_BYTES, MAX_ENTRIES, digest

PRESENT_MAIN_HEIGHT = 430  # px: in presentation mode the main figure fits a 1280x720 projector's first screen


_FIGURES = LRU(MAX_ENTRIES, MAX_BYTES)  # a shared builder's figure made ready for the page, per mode: one copy per server


def figure(fig, title: str, present: bool, main: bool):
    """The figure as the page draws it (a copy: fonts floored, presentation mode's numbers on it and its main
    figure's height) and its text alternative. A figure from a pipeline.common.memo.shared builder is made ready once
    per server and mode (a live class's followers draw the same figures): a page never changes what it drew."""
    key = getattr(fig, "_shared_key", None)
    key = key and f"{key}|{present}|{main}|{title}"
    hit = key and _FIGURES.peek(key)
    if hit:
        return hit
    fig = export.labelled(fig) if present else copy_figure(fig)
    export.floor_fonts(fig, export.PRESENT_FONT if present else export.MIN_FONT)
    if present and main:
        fig.update_layout(height=min(int(fig.layout.height or 450), PRESENT_MAIN_HEIGHT))
    out = (frozen(fig) if key else fig), export.alt_text(fig, title)
    if key:
        _FIGURES.put(key, out)
    return out


_PNGS = LRU(64, MAX_BYTES)
MAX_IMAGE_WIDTH = 2 * 730  # px: streamlit.elements.lib.image_utils.MAXIMUM_CONTENT_WIDTH, the widest it sends


_SAME: dict = {}  # id(array) -> (a weak reference to it, its key): a shared builder's picture, hashed once


def png(img):
    """An RGB array as PNG bytes, encoded once per server for equal pixels (Streamlit passes PNG bytes no wider than
    it sends on as they are, where it would encode, shrink and encode again an array on every run). The very array
    a shared builder returned again (pipeline.common.memo.shared) is not hashed again (2.7 ms a follower's run)."""
    same = _SAME.get(id(img))
    known = same is not None and same[0]() is img
    key = same[1] if known else digest(img)
    if key and not known:
        for k in [k for k, (ref, _) in list(_SAME.items()) if ref() is None]:
            _SAME.pop(k, None)
        try:
            _SAME[id(img)] = (weakref.ref(img), key)
        except TypeError:  # not an array: hashed each time
            pass
    hit = key and _PNGS.peek(key[0])
    if hit:
        return hit
    import io

    from PIL import Image

    pic = Image.fromarray(np.ascontiguousarray(img))
    if pic.width > MAX_IMAGE_WIDTH:  # Streamlit would shrink it so, again on every run
        pic = pic.resize((MAX_IMAGE_WIDTH, int(pic.height * MAX_IMAGE_WIDTH / pic.width)), resample=Image.BILINEAR)
    buf = io.BytesIO()
    pic.save(buf, format="PNG")
    if key:
        _PNGS.put(key[0], buf.getvalue(), len(buf.getvalue()))
    return buf.getvalue()
