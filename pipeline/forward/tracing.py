"""One instrumented forward pass: every stage from token ids to next-token logits.

`trace(lm, prompt)` tokenizes, runs ONE forward pass with forward hooks on the embedding, each decoder
layer and its pre-feed-forward norm, plus the capture attention (see capture.py), and returns a
`Trace`. Shapes (T tokens, L layers, H query heads, Hkv key/value heads, D head dim, d model width):

    embeddings      [T, d]             float32  output of the embedding lookup (Gemma's sqrt(d) scale included)
    hidden_states   [L+1, T, d]        float32  residual stream entering layer 0 ... leaving layer L-1
    resid_norm      [L+1, T]           float32  |residual stream| entering each layer and after the last
    attn_norm       [L, T]             float32  |what attention adds to the residual|, per layer and position
    ffn_norm        [L, T]             float32  |what the feed-forward network adds|
    normed_norm     [L, T]             float32  |the input to attention after the layer's norm|
    attn_last_row   [L, H, T]          float32  every head's attention from the last position (full resolution)
    attentions      [L, H, T', T']     float16  T' = ceil(T / attn_block); full resolution when attn_block == 1
    attn_full       {layer: [H, T, T]} float16  full-resolution maps for the layers kept in full
    qkv             {layer: {q: [H, T, D], k: [Hkv, T, D], v: [Hkv, T, D]}}  after RoPE
    lens_last_top   [L+1] x top-5 (id, p)       logit lens at the last position; lens_grid() for every position
    next_logits     [vocab]            float32  logits for the token after the last position

Callers sharing one model are serialised by `lm.lock`; captures live in a per-call object, so two
browser tabs tracing at once never see each other's numbers.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.common.timing import ACTIVITY, Busy, Samples, interleaved, syncer
from pipeline.forward.tokens import Segment, Token, Tokenized, tokenize
from pipeline.model.capture import Capture, capturing
from pipeline.model.loaded import LoadedModel, ModelFacts, threads_for

ATTN_FULL_BUDGET = 256 << 20  # bytes of full-resolution float16 attention maps kept per trace
ATTN_OVERVIEW_MAX = 256  # the all-layers overview is pooled to at most this many positions
QKV_ALL_LAYERS_MAX_T = 256  # capture Q/K/V for every layer up to this prompt length
LENS_GRID_MAX = 64  # lens_grid(): at most this many (last) positions
DEFAULT_MAX_TOKENS = 4096


class TraceError(ValueError):
    """The prompt cannot be traced; the message is meant for the user."""


@dataclass(eq=False)  # compared and hashed by identity: memos keyed by a trace die with it
class Trace:
    model_label: str
    facts: ModelFacts
    prompt: str
    chat: bool
    text: str
    tokens: tuple[Token, ...]
    segments: tuple[Segment, ...]
    input_ids: list[int]
    embeddings: np.ndarray
    hidden_states: np.ndarray
    attentions: np.ndarray
    attn_block: int
    attn_full: dict[int, np.ndarray]
    attn_last_row: np.ndarray
    resid_norm: np.ndarray  # [L+1, T]  |residual stream|
    attn_norm: np.ndarray  # [L, T]    |what attention adds|
    ffn_norm: np.ndarray  # [L, T]    |what the feed-forward network adds|
    normed_norm: np.ndarray  # [L, T]    |input to attention after the layer's norm|
    lens_last_top: list[list[tuple[int, float]]]  # [L+1] x top-5 (id, prob) at the last position; lens_grid() for all
    next_logits: np.ndarray
    qkv: dict[int, dict[str, np.ndarray]]
    timings: dict[str, float]
    device: str
    exact_tokens: bool = True
    busy: Busy = Busy()  # what else this server ran during the forward pass (its times are inflated if anything)
    forward_cpu_s: float | None = None  # processor time of the forward when one thread ran it (CPU), else None

    @property
    def forward_s(self) -> float:
        """The model's own time for the forward pass: the processor time of the one thread that ran it when that is
        known (small prompts on a CPU, see models.threads_for), else the wall clock."""
        return self.forward_cpu_s if self.forward_cpu_s is not None else self.timings["forward total"]

    @property
    def shared_s(self) -> float:
        """Wall-clock time of the forward pass during which the processor ran something else (another program,
        another visitor, the browser drawing the page): 0 when unknown."""
        return max(0.0, self.timings["forward total"] - self.forward_cpu_s) if self.forward_cpu_s is not None else 0.0

    last_prompt_index: int | None = None  # position of the prompt's last token (before any chat-template suffix)

    @property
    def T(self) -> int:
        return len(self.input_ids)

    @property
    def nbytes(self) -> int:
        """Memory held by the trace's arrays."""
        arrays = [
            self.embeddings,
            self.hidden_states,
            self.attentions,
            self.attn_last_row,
            self.next_logits,
            self.resid_norm,
            self.attn_norm,
            self.ffn_norm,
            self.normed_norm,
            *self.attn_full.values(),
            *(v for d in self.qkv.values() for v in d.values()),
        ]
        return sum(a.nbytes for a in arrays)

    def attention(self, layer: int) -> np.ndarray | None:
        """[H, T, T] full-resolution attention for `layer`, or None when only the pooled overview was kept."""
        if self.attn_block == 1:
            return self.attentions[layer]
        return self.attn_full.get(layer)


def display_maps(tr: Trace, layer: int, max_n: int = 128) -> tuple[np.ndarray, int]:
    """One layer's attention for drawing: ([H, n, n] float32, block) with n <= max_n. Full resolution when the
    prompt is short enough, otherwise the stored overview pooled further (rows still sum to 1)."""
    from pipeline.model.capture import pool_attention

    full = tr.attention(layer)
    if full is not None and tr.T <= max_n:
        return full.astype(np.float32), 1
    src, block = tr.attentions[layer], tr.attn_block
    extra = max(1, -(-src.shape[-1] // max_n))
    if extra > 1:
        src = pool_attention(torch.from_numpy(src.astype(np.float32)), extra).numpy()
    return src.astype(np.float32), block * extra


def _as_np(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()


def check_prompt(prompt: str, n_tokens: int | None = None, max_positions: int | None = None, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
    if prompt is None or not str(prompt).strip():
        raise TraceError("The prompt is empty. Type some text (or pick a preset) to see the pipeline run.")
    if n_tokens is not None:
        if max_positions and n_tokens > max_positions:
            raise TraceError(f"The prompt is {n_tokens:,} tokens, longer than this model's context window of {max_positions:,} tokens. Shorten it.")
        if n_tokens > max_tokens:
            raise TraceError(
                f"The prompt is {n_tokens:,} tokens; this explorer traces at most {max_tokens:,} tokens at once (every attention map is kept). Shorten it."
            )


def over_cap(n_tokens: int, limit: int, whose: str = "The prompt") -> str:
    """What a visitor reads when a prompt is longer than a demo server's cap on the prompts it runs (demo.Caps)."""
    return f"{whose} is {n_tokens:,} tokens; this demo server runs prompts of at most {limit:,} tokens. Shorten it."


def logit_lens(lm: LoadedModel, hidden: torch.Tensor, top: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the final norm and LM head to hidden states [..., d]: (top ids, top probs) [..., top]."""
    head = lm.model.get_output_embeddings()
    with torch.inference_mode():
        logits = lm.arch.apply_softcap(head(lm.arch.final_norm_module()(hidden.to(lm.device, lm.dtype))).float())
        v, i = logits.topk(top, dim=-1)
        p = torch.exp(v - torch.logsumexp(logits, dim=-1, keepdim=True))
    return i.cpu(), p.cpu()


_LENS: weakref.WeakKeyDictionary[Trace, dict] = weakref.WeakKeyDictionary()  # lens_grid memo, dies with its trace


def lens_grid(lm: LoadedModel, tr: Trace, n_positions: int = LENS_GRID_MAX) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Logit lens for the last `n_positions` positions at every layer, read from the trace's stored hidden
    states (no new forward pass). Costs (L+1) x positions LM-head rows, so it is computed on request.
    Returns (positions, top ids [L+1, P], top probs [L+1, P])."""
    T = tr.T
    P = min(T, n_positions)
    memo = _LENS.setdefault(tr, {})
    if P not in memo:
        hs = torch.from_numpy(tr.hidden_states[:, T - P :, :])
        with lm.lock:
            ids, probs = logit_lens(lm, hs)
        memo[P] = (list(range(T - P, T)), ids[..., 0].numpy(), probs[..., 0].numpy())
    return memo[P]


def capture_plan(f: ModelFacts, T: int, attn_layers: list[int] | None = None, qkv_layers: list[int] | None = None) -> Capture:
    """What one trace of T tokens keeps: every layer's attention at full resolution and its Q/K/V when that fits
    the memory budget, otherwise the pooled overview plus a few full layers (the asked-for ones first)."""
    L, H = f.n_layers, f.n_heads
    block = max(1, -(-T // ATTN_OVERVIEW_MAX))
    per_layer = H * T * T * 2
    if block == 1 and per_layer * L <= ATTN_FULL_BUDGET:
        full = set(range(L))
    else:
        wanted = list(dict.fromkeys([*(attn_layers or []), 0, L // 2, L - 1]))  # asked-for layers first
        full = set(wanted[: max(1, ATTN_FULL_BUDGET // per_layer)])
    qkv = set(range(L)) if T <= QKV_ALL_LAYERS_MAX_T else set(qkv_layers or []) | full
    return Capture(full_layers=full, block=block, qkv_layers=qkv)


@dataclass
class _Acts:
    """What the hooks record during one forward pass (per call: two tabs tracing at once never mix)."""

    h: list  # [L+1] residual stream [T, d] entering each layer, and leaving the last (on device)
    mid: list  # [L]   residual after attention (freed once the layer finishes)
    attn: list  # [L]   |what attention adds| [T]
    ffn: list  # [L]   |what the feed-forward network adds| [T]
    normed: list  # [L]   |input to attention after the layer's norm| [T]
    marks: dict  # name -> perf_counter, device-synchronised
    emb: torch.Tensor | None = None  # [T, d] embedding output

    @classmethod
    def empty(cls, L: int) -> _Acts:
        return cls([None] * (L + 1), [None] * L, [None] * L, [None] * L, [None] * L, {})


@contextmanager
def _hooks(lm: LoadedModel, acts: _Acts, progress=None):
    """Forward hooks on the embedding, each layer, its norms and the final norm, recording into `acts`. The
    hooks live on shared modules, so the caller holds lm.lock; they are removed whatever happens."""
    arch, sync = lm.arch, syncer(lm.device)
    L = len(arch.layers)

    def mark(name):
        def hook(*_):
            sync()
            acts.marks[name] = time.perf_counter()

        return hook

    def on_embed(m, i, o):  # hooks must return None, or they replace the module's output
        acts.emb = o[0].detach()
        mark("embed1")()

    def pre(m, args, kwargs, i):
        if i == 0:
            acts.h[0] = (args[0] if args else kwargs["hidden_states"])[0].detach()
        mark(f"L{i}.0")()

    def post(m, args, kwargs, out, i):
        o = out[0] if isinstance(out, tuple) else out
        acts.h[i + 1] = o[0].detach()
        acts.ffn[i] = (acts.h[i + 1].float() - acts.mid[i].float()).norm(dim=-1)
        acts.mid[i] = None
        mark(f"L{i}.1")()
        if progress:
            progress((i + 1) / L, f"layer {i + 1} of {L}")

    def on_normed(m, a, o, i):
        acts.normed[i] = o[0].detach().float().norm(dim=-1)

    def on_attn_input(m, a, k, i):  # post-norm layers (OLMo-2): attention reads the stream itself
        acts.normed[i] = (a[0] if a else k["hidden_states"])[0].detach().float().norm(dim=-1)

    def on_mid(m, a, i):  # residual after attention = input + what attention adds
        acts.mid[i] = a[0][0].detach()
        acts.attn[i] = (acts.mid[i].float() - acts.h[i].float()).norm(dim=-1)

    emb, final = arch.embed(), arch.final_norm_module()
    handles = [emb.register_forward_pre_hook(mark("embed0")), emb.register_forward_hook(on_embed)]
    try:
        for i, layer in enumerate(arch.layers):
            norm = arch.in_norm(i)
            handles += [
                layer.register_forward_pre_hook(lambda m, a, k, i=i: pre(m, a, k, i), with_kwargs=True),
                layer.register_forward_hook(lambda m, a, k, o, i=i: post(m, a, k, o, i), with_kwargs=True),
                norm.register_forward_hook(lambda m, a, o, i=i: on_normed(m, a, o, i))
                if norm is not None
                else arch.attn(i).register_forward_pre_hook(lambda m, a, k, i=i: on_attn_input(m, a, k, i), with_kwargs=True),
                arch.ffn_input(i).register_forward_pre_hook(lambda m, a, i=i: on_mid(m, a, i)),
            ]
        handles += [final.register_forward_pre_hook(mark("norm0")), final.register_forward_hook(mark("norm1"))]
        yield
    finally:
        for h in handles:
            h.remove()


def _stage_timings(marks: dict, L: int, t_fwd: float, t_end: float) -> dict[str, float]:
    out = {"embeddings": marks["embed1"] - marks["embed0"], "positions (RoPE tables)": max(0.0, marks["L0.0"] - marks["embed1"])}
    for i in range(L):
        out[f"layer {i}"] = marks[f"L{i}.1"] - marks[f"L{i}.0"]
    out["final norm"] = marks["norm1"] - marks["norm0"]
    out["LM head (logits)"] = t_end - marks["norm1"]
    out["forward total"] = t_end - t_fwd
    return out


def trace(
    lm: LoadedModel,
    prompt: str,
    chat: bool = False,
    *,
    qkv_layers: list[int] | None = None,
    attn_layers: list[int] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    tokenized: Tokenized | None = None,
    progress=None,
) -> Trace:
    """Tokenize and run one hooked forward pass. Raises TraceError for prompts it cannot trace.

    attn_layers / qkv_layers: layers to keep at full resolution / with Q, K, V when the prompt is too long to
    keep every layer (they are added to the first, middle and last layers, memory permitting).
    progress(fraction, message) is called as each layer finishes."""
    check_prompt(prompt)
    t0 = time.perf_counter()
    tk = tokenized or tokenize(lm.tokenizer, prompt, chat=chat)
    t_tok = time.perf_counter() - t0
    f = lm.facts
    T = len(tk.tokens)
    if T == 0:
        raise TraceError("The prompt produced no tokens.")
    check_prompt(prompt, T, f.max_positions, max_tokens)
    L = f.n_layers
    cap = capture_plan(f, T, attn_layers, qkv_layers)
    acts = _Acts.empty(L)
    sync = syncer(lm.device)
    ids = torch.tensor([tk.input_ids], device=lm.device)
    with lm.lock:
        with _hooks(lm, acts, progress), torch.inference_mode(), capturing(cap), threads_for(lm.device, T), ACTIVITY.doing("trace") as job:
            sync()
            threads = torch.get_num_threads()
            t_fwd, c_fwd = time.perf_counter(), time.thread_time()
            out = lm.model(input_ids=ids, logits_to_keep=1, use_cache=False)
            sync()
            t_end, c_end = time.perf_counter(), time.thread_time()
        logits = out.logits[0, -1].float().cpu()
        # logit lens at the last position: final norm + LM head applied after every layer
        t_l = time.perf_counter()
        hs = torch.stack(acts.h)  # [L+1, T, d] (on device)
        top5_i, top5_p = logit_lens(lm, hs[:-1, -1, :], top=5)  # after the last layer: the real logits, below
        final = torch.softmax(logits, -1).topk(5)
        top5_i = torch.cat([top5_i, final.indices[None]])
        top5_p = torch.cat([top5_p, final.values[None]])
        t_lens = time.perf_counter() - t_l
    timings = {"tokenize": t_tok, **_stage_timings(acts.marks, L, t_fwd, t_end), "logit lens": t_lens}
    tr = _assemble(lm, prompt, tk, cap, acts, hs, logits, top5_i, top5_p, timings)
    tr.busy = job.busy
    if lm.device.type == "cpu" and threads == 1:  # one thread did all the work: its processor time is the model's own
        tr.forward_cpu_s = c_end - c_fwd
    timings["total"] = time.perf_counter() - t0
    return tr


def _assemble(
    lm: LoadedModel,
    prompt: str,
    tk: Tokenized,
    cap: Capture,
    acts: _Acts,
    hs: torch.Tensor,
    logits: torch.Tensor,
    top5_i: torch.Tensor,
    top5_p: torch.Tensor,
    timings: dict,
) -> Trace:
    """The hooks' records as host arrays in one Trace."""
    L = lm.facts.n_layers
    hs_f = hs.float()
    return Trace(
        last_prompt_index=max((i for i, t in enumerate(tk.tokens) if any(t is p for p in tk.prompt_tokens)), default=None),
        model_label=lm.label,
        facts=lm.facts,
        prompt=prompt,
        chat=tk.chat,
        text=tk.text,
        tokens=tk.tokens,
        segments=tk.segments,
        input_ids=tk.input_ids,
        embeddings=_as_np(acts.emb),
        hidden_states=_as_np(hs_f),
        attentions=torch.stack([cap.pooled[i] for i in range(L)]).numpy(),
        attn_block=cap.block,
        attn_full={i: cap.full[i].numpy() for i in sorted(cap.full)},
        attn_last_row=torch.stack([cap.last_row[i] for i in range(L)]).numpy(),
        resid_norm=_as_np(hs_f.norm(dim=-1)),
        attn_norm=_as_np(torch.stack(acts.attn)),
        ffn_norm=_as_np(torch.stack(acts.ffn)),
        normed_norm=_as_np(torch.stack(acts.normed)),
        lens_last_top=[[(int(a), float(b)) for a, b in zip(ri, rp)] for ri, rp in zip(top5_i, top5_p)],
        next_logits=logits.numpy(),
        qkv={i: {k: v.numpy() for k, v in d.items()} for i, d in sorted(cap.qkv.items())},
        timings=timings,
        device=lm.device_label,
        exact_tokens=tk.exact,
    )


def warm_up(lm: LoadedModel, progress=None) -> None:
    """Two traced passes on the model's own thread, the pages' way (eager attention, hooks, a chat prompt), so that
    one-time allocations, kernel choices and the thread's OpenMP team are made before a visitor's first numbers,
    not in them (the app's loader calls it; bench/bench_first_visit.py measures the effect)."""

    def passes(progress=None):
        for prompt, chat in (("The capital of France is", False), ("Why is the sky blue?", True)):
            trace(lm, prompt, chat=chat)

    lm.run(passes, progress=progress)


def forward_repeats(lm, input_ids: list[int], repeats: int = 5, progress=None) -> tuple[Samples, Busy]:
    """The plain forward pass over these ids (no hooks capturing, the LM head on the last position only) timed
    `repeats` times after one warm-up, device-synchronised: the overview's "time it again". Measured as the trace
    measures its forward (tracing.trace): the same threads (pipeline.model.threads_for), and on a CPU forward run
    by one thread its processor time, else the wall clock. (Timed on two threads and the wall clock, 5 repeats
    once read a median of 1,648 ms beside the trace's 170 ms: an OpenMP team waiting at every barrier for a
    thread the browser had.) Returns the times and what else ran meanwhile."""
    ids = torch.tensor([input_ids], device=lm.device)
    s = syncer(lm.device)

    def once() -> float:
        with lm.lock, torch.inference_mode(), threads_for(lm.device, len(input_ids)):
            cpu_clock = lm.device.type == "cpu" and torch.get_num_threads() == 1
            clock = time.thread_time if cpu_clock else time.perf_counter
            s()
            t = clock()
            lm.model(input_ids=ids, logits_to_keep=1, use_cache=False)
            s()
            return clock() - t

    once()
    with ACTIVITY.doing("experiment") as job:
        got = interleaved({"forward": once}, repeats, progress)["forward"]
    return got, job.busy
