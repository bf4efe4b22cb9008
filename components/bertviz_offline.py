"""Offline (no-CDN) rendering of bertviz head_view / model_view.

bertviz's ``html_action="return"`` output loads require.js from cdnjs, and its
JS calls ``require.config({paths: {d3: <cdn>, jquery: <cdn>}})`` followed by
``requirejs(['jquery', 'd3'], function ($, d3) {...})``.  Here we:

* drop the require.js <script src=...> tag,
* inline vendored d3 v5.7.0 and jQuery 3.7.1 (``vendor/`` next to this file)
  *before* any AMD shim exists, so their UMD wrappers take the "plain global"
  branch and set ``window.d3`` / ``window.jQuery``,
* then install a tiny synchronous ``require``/``requirejs``/``define`` shim that
  maps the module names 'd3' and 'jquery' to those globals; ``require.config``
  is a no-op, so the CDN paths in bertviz's JS are ignored,
* re-serialize bertviz's embedded params JSON compactly with the attention
  weights rounded to ``decimals`` places.

Tested with bertviz 1.4.1.
"""

from __future__ import annotations

import html as _html
import json
import os
import re

import numpy as np

from pipeline.common import shared

_VENDOR_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor")
_VENDOR_FILES = ("d3.min.js", "jquery.min.js")
_vendor_cache: dict[str, str] = {}

_REQUIRE_TAG_RE = re.compile(r'<script src="[^"]*require(?:\.min)?\.js"></script>')
_REQUIRE_CONFIG_RE = re.compile(r"require\.config\(\{.*?\}\);", re.S)
_PARAMS_MARK = "const params = "

# Synchronous AMD-ish shim. Must be emitted AFTER d3/jquery are inlined: if a
# `define` with `.amd` existed when they load, their UMD headers would call
# define(...) instead of creating the globals.
_SHIM_JS = """
(function (w) {
  var mods = {};
  function get(name) {
    if (name in mods) return mods[name];
    if (name === 'd3') return w.d3;
    if (name === 'jquery' || name === 'jQuery') return w.jQuery;
    throw new Error('bertviz_offline shim: unknown module ' + name);
  }
  function req(deps, cb) {
    if (typeof deps === 'string') return get(deps);
    var args = (deps || []).map(get);
    if (cb) cb.apply(w, args);
  }
  req.config = function () {};
  function def(name, deps, factory) {
    if (typeof name !== 'string') { factory = deps; deps = name; name = null; }
    if (!Array.isArray(deps)) { factory = deps; deps = []; }
    var v = typeof factory === 'function' ? factory.apply(w, deps.map(get)) : factory;
    if (name) mods[name] = v;
  }
  def.amd = {};
  w.require = w.requirejs = req;
  w.define = def;
})(window);
"""


def _vendor(name: str) -> str:
    if name not in _vendor_cache:
        with open(os.path.join(_VENDOR_DIR, name), encoding="utf-8") as f:
            src = f.read()
        if re.search(r"</script", src, re.I):  # would terminate the inline <script>
            raise ValueError(f"{name} contains '</script'; cannot inline as-is")
        _vendor_cache[name] = src
    return _vendor_cache[name]


def select_layers(n_layers: int, max_layers: int | None = None) -> list[int]:
    """Evenly spread layer indices (always includes first and last)."""
    if max_layers is None or max_layers >= n_layers:
        return list(range(n_layers))
    if max_layers < 1:
        raise ValueError("max_layers must be >= 1")
    if max_layers == 1:
        return [n_layers - 1]
    idx = np.linspace(0, n_layers - 1, max_layers).round().astype(int)
    return sorted(set(int(i) for i in idx))


def _compact_json(obj) -> str:
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    # 0.0 -> 0, 1.0 -> 1 (only bare numbers inside arrays)
    s = re.sub(r"(?<=[\[,])(\d+)\.0(?=[,\]])", r"\1", s)
    # keep token text from closing the <script> element
    return s.replace("</", "<\\/")


@shared  # a live class's followers draw the same page: its HTML (a MB) made once per server
def offline_html(kind, attention, tokens, max_layers=None, decimals=3, display_mode="dark", title=None) -> str:
    """Return a standalone HTML document rendering bertviz's head/model view offline.

    kind: "head" or "model".
    attention: array-like [n_layers, n_heads, T, T].
    tokens: list of T display strings.
    max_layers: keep at most this many evenly spread layers (see select_layers);
        the chosen (original, 0-based) indices are shown in the page header, in an
        HTML comment, and in bertviz's own layer labels.
    decimals: rounding of attention weights embedded in the page.
    display_mode: model view only, "dark" (bertviz default) or "light".
    """
    att, tokens = _checked(kind, attention, tokens)
    n_layers, n_heads, T, _ = att.shape
    layers = select_layers(n_layers, max_layers)
    raw = _offline_body(_bertviz_html(kind, att, tokens, layers, decimals, display_mode))
    return _document(kind, raw, layers, n_layers, n_heads, T, decimals, display_mode, title)


def _checked(kind, attention, tokens) -> tuple[np.ndarray, list[str]]:
    if kind not in ("head", "model"):
        raise ValueError("kind must be 'head' or 'model'")
    att = np.asarray(attention)
    if att.ndim != 4 or att.shape[2] != att.shape[3]:
        raise ValueError(f"attention must be [layers, heads, T, T], got {att.shape}")
    tokens = [str(t) for t in tokens]
    if len(tokens) != att.shape[2]:
        raise ValueError(f"{len(tokens)} tokens but attention has T={att.shape[2]}")
    return att, tokens


def _bertviz_html(kind, att: np.ndarray, tokens: list[str], layers: list[int], decimals: int, display_mode: str) -> str:
    """bertviz's own HTML for the selected layers. float64 so that tolist() yields short reprs (0.123, not
    0.12300000339...). Only the selected layers are converted; bertviz only indexes attention[i] for i in
    include_layers (and attention[0] for the head count), so the other slots reuse the first selected tensor."""
    import torch
    from bertviz import head_view, model_view

    sel = {i: torch.from_numpy(np.round(att[i].astype(np.float64), decimals)[None]) for i in layers}
    att_list = [sel.get(i, sel[layers[0]]) for i in range(att.shape[0])]
    if kind == "head":
        return head_view(att_list, tokens, include_layers=layers, html_action="return").data
    return model_view(att_list, tokens, include_layers=layers, display_mode=display_mode, html_action="return").data


def _offline_body(raw: str) -> str:
    """bertviz's HTML without its CDN loader, its parameters serialised once and compactly."""
    raw, n = _REQUIRE_TAG_RE.subn("", raw)  # 1) drop the require.js CDN tag
    if n != 1:
        raise RuntimeError("bertviz_offline: require.js <script> tag not found (bertviz changed?)")
    raw = _REQUIRE_CONFIG_RE.sub("", raw, count=1)  # 2) drop require.config({paths: CDN...}) (the shim's is a no-op)
    start = raw.find(_PARAMS_MARK)  # 3) re-serialise params compactly
    if start < 0:
        raise RuntimeError("bertviz_offline: params marker not found (bertviz changed?)")
    start += len(_PARAMS_MARK)
    params, end = json.JSONDecoder().raw_decode(raw, start)
    # bertviz's str.replace also substitutes the marker inside the trailing "// HACK: PYTHON_PARAMS is a template
    # marker..." comment, i.e. the whole JSON is embedded twice (and a "</script>" in a token breaks the page).
    # Drop the rest of that line.
    eol = raw.find("\n", end)
    eol = len(raw) if eol < 0 else eol
    return raw[:start] + _compact_json(params) + ";" + raw[eol:]


def _document(kind, raw, layers, n_layers, n_heads, T, decimals, display_mode, title) -> str:
    """The standalone page: vendored d3 and jQuery, the require shim, a header naming the layers shown."""
    layer_str = ", ".join(map(str, layers))
    header = f"Layers shown: {layer_str} (of {n_layers}); {n_heads} heads; {T} tokens; weights rounded to {decimals} dp"
    dark = kind == "model" and display_mode == "dark"
    body_style = "background:#000;color:#ccc;" if dark else "background:#fff;color:#000;"
    head_title = _html.escape(title or f"bertviz {kind} view")
    vendor = "\n".join(f"<script>/* {n} */\n{_vendor(n)}\n</script>" for n in _VENDOR_FILES)
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{head_title}</title>\n"
        f"<!-- bertviz_offline kind={kind} layers=[{layer_str}] n_layers={n_layers} -->\n"
        f"{vendor}\n<script>{_SHIM_JS}</script>\n"
        f'</head><body style="margin:4px;{body_style}">\n'
        f'<div id="bv-offline-header" data-layers="{layer_str}" '
        f'style="font:12px sans-serif;opacity:.75;margin-bottom:4px">{_html.escape(header)}</div>\n'
        f"{raw}\n</body></html>\n"
    )


__all__ = ["offline_html", "select_layers"]
