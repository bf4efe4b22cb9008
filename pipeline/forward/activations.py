"""One name per activation: the names a trace records, the cache that holds them, and the hooks placed by them.

A name reads like TransformerLens' (`blocks.5.attn.hook_pattern`), with a view after a bar when the cache keeps
less than the whole tensor. The sites, in the order a prompt meets them (T tokens, d model width, H query heads,
Hkv key/value heads, D head dim, L layers):

    hook_embed                    [T, d]      the token embedding's output (Gemma's sqrt(d) scale included)
    blocks.l.hook_resid_pre       [T, d]      the residual stream entering layer l; l = L: entering the final norm
    blocks.l.hook_resid_post      [T, d]      leaving layer l (the same tensor as blocks.(l+1).hook_resid_pre)
    blocks.l.ln1.hook_normalized  [T, d]      the input to attention after the layer's norm (the stream itself
                                              in post-norm layers, OLMo-2)
    blocks.l.attn.hook_q/k/v      [H|Hkv, T, D]  queries, keys, values after RoPE
    blocks.l.attn.hook_pattern    [H, T, T]   attention weights (float16)
    blocks.l.attn.hook_z          [T, H*D]    the heads' outputs side by side: the output projection's input
    blocks.l.attn.hook_proj       [T, d]      the output projection's output (before a post-norm, Gemma/OLMo-2)
    blocks.l.hook_attn_out        [T, d]      what attention adds to the stream (after any post-norm)
    blocks.l.mlp.hook_proj        [T, d]      the feed-forward block's output (before a post-norm)
    blocks.l.hook_mlp_out         [T, d]      what the feed-forward block adds to the stream

Views, after a bar: `|norm` the length over d at each position ([T]), `|last` the last position only (`attn.
hook_pattern|last`: the last query row, [H, T]), `|pooled` a pattern pooled into blocks of the trace's
`attn_block` positions ([H, T', T'], rows still sum to 1). `blocks.*.X` is every layer stacked: [L, ...] (L+1 rows
for hook_resid_pre). `Name.parse` and `str(Name)` are the only reader and writer of the grammar.

    acts = tr.acts
    acts["blocks.*.hook_resid_pre"]          # [L+1, T, d]
    acts["blocks.3.attn.hook_pattern|last"]  # [H, T]
    "blocks.3.attn.hook_q" in acts           # kept for this layer?
    with hooking(lm, {"blocks.3.attn.hook_z": fn}): lm.model(...)   # fn(x) -> None, or a tensor replacing x

A component of the logit (attribution's shares, ablation's switches) is one small type too: `Component`, written
"L5 H3" / "L7 FFN" / "L7 bias" / "embedding" / "final norm bias", read back by `Component.parse` (which also takes
the command line's "5.3" and "7.mlp").
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import torch


class Site(StrEnum):
    EMBED = "hook_embed"
    RESID_PRE = "hook_resid_pre"
    RESID_POST = "hook_resid_post"
    NORMALIZED = "ln1.hook_normalized"
    Q = "attn.hook_q"
    K = "attn.hook_k"
    V = "attn.hook_v"
    PATTERN = "attn.hook_pattern"
    Z = "attn.hook_z"
    ATTN_PROJ = "attn.hook_proj"
    ATTN_OUT = "hook_attn_out"
    MLP_PROJ = "mlp.hook_proj"
    MLP_OUT = "hook_mlp_out"


class View(StrEnum):
    ALL = ""  # the whole tensor
    NORM = "norm"  # |x| over the model width, per position
    LAST = "last"  # the last position (a pattern's last query row)
    POOLED = "pooled"  # a pattern pooled into blocks of positions


_NAME = re.compile(r"(?:blocks\.(\d+|\*)\.)?([a-z_.0-9]+?)(?:\|(\w+))?")


@dataclass(frozen=True)
class Name:
    """One activation's name: a site, a layer (None: not per layer; -1: every layer stacked) and a view."""

    site: Site
    layer: int | None = None
    view: View = View.ALL

    EVERY = -1

    def __str__(self) -> str:
        where = "" if self.layer is None else f"blocks.{'*' if self.layer == Name.EVERY else self.layer}."
        return where + self.site.value + (f"|{self.view.value}" if self.view is not View.ALL else "")

    @classmethod
    def parse(cls, text: str | Name) -> Name:
        if isinstance(text, Name):
            return text
        m = _NAME.fullmatch(str(text))
        try:
            site, view = Site(m[2]), View(m[3] or "")
        except (TypeError, ValueError):
            raise KeyError(f"{text!r} names no activation (see pipeline/forward/activations.py for the names)") from None
        layer = None if m[1] is None else (Name.EVERY if m[1] == "*" else int(m[1]))
        if (site is Site.EMBED) != (layer is None):
            raise KeyError(f"{text!r}: " + ("hook_embed has no layer" if site is Site.EMBED else f"name a layer: blocks.<layer>.{site.value}"))
        return cls(site, layer, view)

    def every(self) -> Name:
        return Name(self.site, Name.EVERY, self.view)


@dataclass(eq=False)
class Activations:
    """The activations one trace kept, by name. Each (site, view) is held once: stacked over every layer ([L, ...]),
    or for some layers only (a dict, when keeping every layer would not fit: full patterns, Q/K/V)."""

    n_layers: int
    attn_block: int = 1  # the pooled pattern's block of positions (1: the pattern at full resolution)
    _held: dict[tuple[Site, View], np.ndarray | dict[int, np.ndarray]] = field(default_factory=dict)
    _making: threading.RLock = field(default_factory=threading.RLock)

    def put(self, name: str | Name, value) -> None:
        """Keep `value` under `name`: a per-layer name with `blocks.*` takes a stack or a {layer: array} dict. A
        value (or a layer's, in the dict) may be `Later(fn)`: computed by fn() the first time it is read, then kept
        (the attention maps, from the kept queries and keys: computed when a page asks for them)."""
        n = Name.parse(name)
        self._held[(n.site, n.view)] = value

    def _made(self, key, layer=None):
        """The value held under key (and layer), computed now if it was held as Later (once, whoever asks)."""
        with self._making:
            held = self._held[key]
            v = held[layer] if layer is not None else held
            if isinstance(v, Later):
                v = v.fn()
                if layer is not None:
                    held[layer] = v
                else:
                    self._held[key] = v
            return v

    def _get(self, n: Name):
        if n.site is Site.RESID_POST:  # leaving layer l = entering layer l + 1: one tensor, held once
            if n.layer == Name.EVERY:
                return self._get(Name(Site.RESID_PRE, Name.EVERY, n.view))[1:]
            return self._get(Name(Site.RESID_PRE, n.layer + 1, n.view))
        key = self._key(n)
        held = self._held[key]
        if n.layer is None or n.layer == Name.EVERY:
            if isinstance(held, dict):
                raise KeyError(f"{n} is kept for layers {sorted(held)} only, not stacked")
            return self._made(key)
        if isinstance(held, dict):
            return self._made(key, n.layer) if n.layer in held else held[n.layer]
        if isinstance(held, Later):
            if not 0 <= n.layer < self.n_layers:
                raise KeyError(f"{n}: this model has {self.n_layers} layers")
            if held.layer is not None:  # one layer of a stack, computed alone (the whole stack is not needed)
                return held.layer(n.layer)
            held = self._made(key)
        if not -len(held) <= n.layer < len(held):
            raise KeyError(f"{n}: this model has {self.n_layers} layers")
        return held[n.layer]

    def _key(self, n: Name) -> tuple[Site, View]:
        if n.site is Site.PATTERN and n.view is View.ALL and self.attn_block == 1 and (Site.PATTERN, View.ALL) not in self._held:
            return Site.PATTERN, View.POOLED  # pooled with a block of 1 is the full pattern, every layer: held once
        return n.site, n.view

    def __getitem__(self, name: str | Name) -> np.ndarray:
        try:
            return self._get(Name.parse(name))
        except (KeyError, IndexError):
            raise KeyError(f"this trace did not keep {name}") from None

    def get(self, name: str | Name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: str | Name) -> bool:
        return self.get(name) is not None

    def ready(self, name: str | Name) -> bool:
        """Whether `name` is held as it is (False: it is computed when first read, see Later)."""
        n = Name.parse(name)
        held = self._held.get(self._key(n))
        if isinstance(held, dict) and n.layer not in (None, Name.EVERY):
            held = held.get(n.layer)
        return held is not None and not isinstance(held, Later)

    def layers(self, name: str | Name) -> list[int]:
        """The layers whose `name` (any layer, e.g. "blocks.*.attn.hook_q") this trace kept."""
        n = Name.parse(name)
        held = self._held.get(self._key(n))
        if held is None:
            return []
        if isinstance(held, Later):
            return list(range(self.n_layers))
        return sorted(held) if isinstance(held, dict) else list(range(len(held)))

    def names(self) -> list[str]:
        """Every name held, as written (stacked ones with blocks.*)."""
        out = []
        for (site, view), held in self._held.items():
            layer = None if site is Site.EMBED else Name.EVERY
            if isinstance(held, dict):
                out += [str(Name(site, i, view)) for i in sorted(held)]
            else:
                out.append(str(Name(site, layer, view)))
        return out

    @property
    def nbytes(self) -> int:
        """Bytes held (what is computed later counts from when it is, plus what it is computed from: `Later.nbytes`)."""
        vals = [x for h in self._held.values() for x in (h.values() if isinstance(h, dict) else [h])]
        sources = {id(x.source): x.source_bytes for x in vals if isinstance(x, Later) and x.source is not None}
        return sum(x.nbytes for x in vals if not isinstance(x, Later)) + sum(sources.values())


@dataclass(eq=False)
class Later:
    """A value computed when first read (Activations.put): `fn()` makes it; `layer(i)`, if given, makes one layer of a
    stack alone. `source` (what it is computed from, shared by several) is counted once in the trace's bytes."""

    fn: Callable
    layer: Callable | None = None
    source: object = None
    source_bytes: int = 0


# --- hooks placed by name -------------------------------------------------------------------------------------


def _first(x):
    return x[0] if isinstance(x, tuple) else x


def _point(arch, n: Name):
    """(module, "pre" | "post") where the activation `n` is the module's input (pre) or output (post)."""
    i, s = n.layer, n.site
    if s is Site.EMBED:
        return arch.embed(), "post"
    if s is Site.RESID_PRE:
        return (arch.layers[i], "pre") if i < len(arch.layers) else (arch.final_norm_module(), "pre")
    if s is Site.RESID_POST:
        return arch.layers[i], "post"
    if s is Site.NORMALIZED:
        norm = arch.in_norm(i)
        return (norm, "post") if norm is not None else (arch.attn(i), "pre")
    if s is Site.Z:
        return arch.attn_out(i), "pre"
    if s is Site.ATTN_PROJ:
        return arch.attn_out(i), "post"
    if s is Site.MLP_PROJ:
        return arch.ffn(i), "post"
    if s in (Site.ATTN_OUT, Site.MLP_OUT):
        post = arch.post_norms(i)[0 if s is Site.ATTN_OUT else 1]
        return (post, "post") if post is not None else (arch.attn_out(i) if s is Site.ATTN_OUT else arch.ffn(i), "post")
    raise KeyError(f"{n}: read it from a trace (the capturing attention records it), it has no hook")


def _hook(mod: torch.nn.Module, where: str, fn: Callable[[torch.Tensor], torch.Tensor | None]):
    """Register fn on the module's input (the first argument, or hidden_states) or output; fn returns None to
    read, or a tensor to replace what it was given."""
    if where == "pre":

        def pre(_m, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            y = fn(x)
            if y is None:
                return None
            return ((y, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": y})

        return mod.register_forward_pre_hook(pre, with_kwargs=True)

    def post(_m, _args, out):
        y = fn(_first(out))
        if y is None:
            return None
        return (y, *out[1:]) if isinstance(out, tuple) else y

    return mod.register_forward_hook(post)


@contextmanager
def hooking(lm, hooks: dict[str | Name, Callable[[torch.Tensor], torch.Tensor | None]]) -> Iterator[None]:
    """Hooks by activation name for the forward passes inside the block: each fn sees the activation ([B, T, ...]
    as the model computes it) and returns None to read it or a tensor to replace it. The hooks live on shared
    modules: the caller holds lm.lock. They are removed whatever happens."""
    handles = []
    try:
        for name, fn in hooks.items():
            n = Name.parse(name)
            if n.layer == Name.EVERY or n.view is not View.ALL:
                raise KeyError(f"hook one layer's whole activation, not {n}")
            handles.append(_hook(*_point(lm.arch, n), fn))
        yield
    finally:
        for h in handles:
            h.remove()


# --- the components of a logit -------------------------------------------------------------------------------


class Kind(StrEnum):
    EMBEDDING = "embed"
    HEAD = "head"
    FFN = "mlp"
    BIAS = "bias"


@dataclass(frozen=True, order=True)
class Component:
    """One part whose output joins the last position's stream: the embedding, a head, a feed-forward block, a
    layer's biases, or the final norm's bias. Written and read in one place."""

    kind: Kind
    layer: int | None = None
    head: int | None = None

    def __str__(self) -> str:
        if self.kind is Kind.HEAD:
            return f"L{self.layer} H{self.head}"
        if self.kind is Kind.FFN:
            return f"L{self.layer} FFN"
        if self.kind is Kind.BIAS:
            return f"L{self.layer} bias" if self.layer is not None else "final norm bias"
        return "embedding"

    @property
    def activation(self) -> Name | None:
        """Where it is switched off: a head's slice of attn.hook_z, a block's mlp.hook_proj."""
        return {Kind.HEAD: Name(Site.Z, self.layer), Kind.FFN: Name(Site.MLP_PROJ, self.layer)}.get(self.kind)

    @classmethod
    def parse(cls, text: str) -> Component:
        """ "L5 H3", "L5H3", "5.3" -> a head; "L7 FFN", "7.mlp" -> a feed-forward block; also "L7 bias",
        "embedding", "final norm bias" (what str() writes)."""
        t = text.strip()
        if m := re.fullmatch(r"L?(\d+)\s*[.H]\s*(\d+)", t, re.I):
            return cls(Kind.HEAD, int(m[1]), int(m[2]))
        if m := re.fullmatch(r"L?(\d+)\s*\.?\s*(FFN|MLP)", t, re.I):
            return cls(Kind.FFN, int(m[1]))
        if m := re.fullmatch(r"L(\d+) bias", t):
            return cls(Kind.BIAS, int(m[1]))
        if t in ("embedding", "final norm bias"):
            return cls(Kind.EMBEDDING) if t == "embedding" else cls(Kind.BIAS)
        raise ValueError(f"{t!r}: name a head as 5.3 (or L5H3) and a feed-forward block as 7.mlp (or L7FFN)")


def parse_components(text: str) -> list[Component]:
    """ "L5H3,L7FFN" or "5.3,7.mlp" -> [head L5 H3, feed-forward L7] (the command line's --ablate)."""
    return [Component.parse(p) for p in text.split(",") if p.strip()]
