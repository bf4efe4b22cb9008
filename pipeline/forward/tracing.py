"""One instrumented forward pass: every stage from token ids to next-token logits.

`trace(lm, prompt)` tokenizes, runs ONE forward pass with hooks placed by activation name (activations.py) plus the
capturing attention (capture.py), and returns a `Trace`: the tokens, the next-token logits, the logit lens at the
last position, the stage timings, and `tr.acts`, the activations it kept, each under its one name:

    hook_embed                            [T, d]             float32
    blocks.*.hook_resid_pre               [L+1, T, d]        float32  the stream entering each layer and the final norm
    blocks.*.hook_resid_pre|norm          [L+1, T]           float32  its length at each position
    blocks.*.ln1.hook_normalized|norm     [L, T]             float32  |the input to attention after the layer's norm|
    blocks.*.hook_attn_out|norm           [L, T]             float32  |what attention adds to the stream|
    blocks.*.hook_mlp_out|norm            [L, T]             float32  |what the feed-forward block adds|
    blocks.*.attn.hook_pattern|pooled     [L, H, T', T']     float16  T' = ceil(T / acts.attn_block); computed when read
    blocks.l.attn.hook_pattern            [H, T, T]          float16  full resolution (every layer when attn_block == 1);
                                                                      computed when read (capture.MapSource)
    blocks.*.attn.hook_pattern|last       [L, H, T]          float32  every head's attention from the last position
    blocks.l.attn.hook_q / _k / _v        [H|Hkv, T, D]      float32  after RoPE, every layer (float16 over LONG_T tokens)

The forward runs SDPA (the model's fast attention); the maps are transformers' eager attention's numbers, computed
from the kept queries and keys when a page asks (bench/bench_long_trace.py: the trace <= 1.15x the forward up to 8k).
    blocks.*.attn.hook_z|last             [L, H*D]           float32  the heads' outputs at the last position
    blocks.*.attn.hook_proj|last          [L, d]             float32  the output projection's output there
    blocks.*.mlp.hook_proj|last           [L, d]             float32  the feed-forward block's output there
    (T tokens, L layers, H query heads, Hkv key/value heads, D head dim, d model width)

Attribution reads the last three (and the stream) instead of running the model again. Callers sharing one model are
serialised by `lm.lock`; captures live in a per-call object, so two browser tabs tracing at once never see each
other's numbers.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.common.timing import ACTIVITY, Busy, Samples, interleaved, syncer
from pipeline.forward.activations import Activations, Name, Site, View, hooking
from pipeline.forward.kept import MemoryTooSmall, Plan, capture_plan, check_memory, lazy_maps, trace_bytes
from pipeline.forward.tokens import Segment, Token, Tokenized, tokenize
from pipeline.model.capture import capturing
from pipeline.model.loaded import LoadedModel, ModelFacts, threads_for

LENS_GRID_MAX = 64  # lens_grid(): at most this many (last) positions
DEFAULT_MAX_TOKENS = None  # no limit of the explorer's own: the model's context (and the memory the estimate needs)


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
    acts: Activations  # every activation kept, by name (see the module's docstring)
    lens_at_last: object  # makes lens_last_top when first read (the LM head on every layer's last row: 15% of a short trace)
    next_logits: np.ndarray  # [vocab] float32: the logits for the token after the last position
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
    _lens: list | None = None

    @property
    def lens_last_top(self) -> list[list[tuple[int, float]]]:
        """[L+1] x top-5 (id, prob) at the last position: the final norm and LM head after every layer (the last row:
        the model's own next-token distribution); computed the first time it is read, its time then in timings
        ("logit lens"). lens_grid() for every position."""
        if self._lens is None:
            t = time.perf_counter()
            self._lens = self.lens_at_last()
            self.timings["logit lens"] = time.perf_counter() - t
        return self._lens

    @property
    def T(self) -> int:
        return len(self.input_ids)

    @property
    def nbytes(self) -> int:
        """Memory held by the trace's arrays."""
        return self.acts.nbytes + self.next_logits.nbytes

    def attention(self, layer: int) -> np.ndarray | None:
        """[H, T, T] full-resolution attention for `layer`, or None when only the pooled overview was kept."""
        return self.acts.get(Name(Site.PATTERN, layer))


def _as_np(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()


def check_prompt(prompt: str, n_tokens: int | None = None, max_positions: int | None = None, max_tokens: int | None = DEFAULT_MAX_TOKENS) -> None:
    if prompt is None or not str(prompt).strip():
        raise TraceError("The prompt is empty. Type some text (or pick a preset) to see the pipeline run.")
    if n_tokens is not None:
        if max_positions and n_tokens > max_positions:
            raise TraceError(f"The prompt is {n_tokens:,} tokens, longer than this model's context window of {max_positions:,} tokens. Shorten it.")
        if max_tokens is not None and n_tokens > max_tokens:
            raise TraceError(f"The prompt is {n_tokens:,} tokens; this explorer traces at most {max_tokens:,} tokens at once. Shorten it.")


def over_cap(n_tokens: int, limit: int, whose: str = "The prompt") -> str:
    """What a visitor reads when a prompt is longer than a demo server's cap on the prompts it runs (demo.Caps)."""
    return f"{whose} is {n_tokens:,} tokens; this demo server runs prompts of at most {limit:,} tokens. Shorten it."


def logit_lens(lm: LoadedModel, hidden: torch.Tensor, top: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the final norm and LM head to hidden states [..., d]: (top ids, top probs) [..., top]."""
    head = lm.arch.unembedding()
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
        hs = torch.from_numpy(tr.acts["blocks.*.hook_resid_pre"][:, T - P :, :])
        with lm.lock:
            ids, probs = logit_lens(lm, hs)
        memo[P] = (list(range(T - P, T)), ids[..., 0].numpy(), probs[..., 0].numpy())
    return memo[P]


@dataclass
class _Recorded:
    """What the hooks record during one forward pass (per call: two tabs tracing at once never mix)."""

    h: list  # [L+1] residual stream [T, d] entering each layer, and leaving the last (on device)
    norms: dict  # Site -> [L] x |activation| [T]
    last: dict  # Site -> [L] x the activation at the last position
    marks: dict  # name -> perf_counter, device-synchronised
    emb: torch.Tensor | None = None  # [T, d] embedding output

    @classmethod
    def empty(cls, L: int) -> _Recorded:
        sites_n, sites_l = (Site.NORMALIZED, Site.ATTN_OUT, Site.MLP_OUT), (Site.Z, Site.ATTN_PROJ, Site.MLP_PROJ)
        return cls([None] * (L + 1), {s: [None] * L for s in sites_n}, {s: [None] * L for s in sites_l}, {})


def _recorders(lm: LoadedModel, rec: _Recorded, progress=None) -> dict[Name, object]:
    """One read-only hook per activation the trace keeps (hooked by name), the stage marks riding on them."""
    sync = syncer(lm.device)
    L = len(lm.arch.layers)

    def mark(name):
        sync()
        rec.marks[name] = time.perf_counter()

    def on_embed(x):
        rec.emb = x[0].detach()
        mark("embed1")

    def entering(i):
        def hook(x):
            if i < L:
                rec.h[i] = x[0].detach()
            mark(f"L{i}.0" if i < L else "norm0")

        return hook

    def leaving(i):
        def hook(x):
            rec.h[i + 1] = x[0].detach()
            mark(f"L{i}.1")
            if progress:
                progress((i + 1) / L, f"layer {i + 1} of {L}")

        return hook

    def norm_of(site, i):
        def hook(x):
            rec.norms[site][i] = x[0].detach().float().norm(dim=-1)

        return hook

    def last_of(site, i):
        def hook(x):
            rec.last[site][i] = x[0, -1].detach().float().clone()

        return hook

    hooks = {Name(Site.EMBED): on_embed, Name(Site.RESID_PRE, L): entering(L)}
    for i in range(L):
        hooks[Name(Site.RESID_PRE, i)] = entering(i)
        hooks[Name(Site.RESID_POST, i)] = leaving(i)
        hooks |= {Name(site, i): norm_of(site, i) for site in rec.norms}
        hooks |= {Name(site, i): last_of(site, i) for site in rec.last}
    return hooks


@contextmanager
def _hooks(lm: LoadedModel, rec: _Recorded, progress=None):
    """The recorders, and the two stage marks no activation carries (the embedding's start, the final norm's end).
    The hooks live on shared modules, so the caller holds lm.lock; they are removed whatever happens."""
    sync = syncer(lm.device)

    def mark(name):
        def hook(*_):
            sync()
            rec.marks[name] = time.perf_counter()

        return hook

    emb, final = lm.arch.embed(), lm.arch.final_norm_module()
    handles = [emb.register_forward_pre_hook(mark("embed0")), final.register_forward_hook(mark("norm1"))]
    try:
        with hooking(lm, _recorders(lm, rec, progress)):
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
    try:
        check_memory(f, T)
    except MemoryTooSmall as e:
        raise TraceError(str(e)) from None
    if progress:  # said first, before the forward: what this trace will hold
        progress(0.0, f"{T:,} tokens; the trace will keep about {trace_bytes(f, T) / 2**20:,.0f} MB")
    L = f.n_layers
    plan = capture_plan(f, T, attn_layers, qkv_layers)
    cap = plan.capture
    rec = _Recorded.empty(L)
    sync = syncer(lm.device)
    ids = torch.tensor([tk.input_ids], device=lm.device)
    with lm.lock:
        with _hooks(lm, rec, progress), torch.inference_mode(), capturing(cap), threads_for(lm.device, T), ACTIVITY.doing("trace") as job:
            sync()
            threads = torch.get_num_threads()
            t_fwd, c_fwd = time.perf_counter(), time.thread_time()
            out = lm.model(input_ids=ids, logits_to_keep=1, use_cache=False)
            sync()
            t_end, c_end = time.perf_counter(), time.thread_time()
        logits = out.logits[0, -1].float().cpu()
        hs = torch.stack(rec.h)  # [L+1, T, d] (on device)
    timings = {"tokenize": t_tok, **_stage_timings(rec.marks, L, t_fwd, t_end)}
    tr = _assemble(lm, prompt, tk, plan, rec, hs, logits, _lens_at_last(lm, hs[:-1, -1, :].clone(), logits), timings)
    tr.busy = job.busy
    if lm.device.type == "cpu" and threads == 1:  # one thread did all the work: its processor time is the model's own
        tr.forward_cpu_s = c_end - c_fwd
    timings["total"] = time.perf_counter() - t0
    return tr


def _lens_at_last(lm: LoadedModel, last_rows: torch.Tensor, logits: torch.Tensor):
    """lens_last_top's maker: the logit lens at the last position (final norm + LM head after every layer, the real
    logits after the last), with the model held weakly (a kept trace never keeps an unloaded model)."""
    ref = weakref.ref(lm)

    def make():
        model = ref()
        if model is None:
            raise TraceError("the model this trace came from was unloaded: trace the prompt again for the logit lens")
        with model.lock:
            top5_i, top5_p = logit_lens(model, last_rows, top=5)
        final = torch.softmax(logits, -1).topk(5)
        top5_i, top5_p = torch.cat([top5_i, final.indices[None]]), torch.cat([top5_p, final.values[None]])
        return [[(int(a), float(b)) for a, b in zip(ri, rp)] for ri, rp in zip(top5_i, top5_p)]

    return make


def _last_prompt_index(tk: Tokenized) -> int | None:
    """The position of the prompt's last token (before any chat-template suffix). Once over the tokens: asking each
    token whether it is among the prompt's (a list made anew each time) took 2 s at 8k tokens, a tenth of the forward."""
    mine = {id(t) for t in tk.prompt_tokens}
    return max((i for i, t in enumerate(tk.tokens) if id(t) in mine), default=None)


def _assemble(
    lm: LoadedModel, prompt: str, tk: Tokenized, plan: Plan, rec: _Recorded, hs: torch.Tensor, logits: torch.Tensor, lens_at_last, timings: dict
) -> Trace:
    """The hooks' records as host arrays in one Trace, each activation under its name."""
    L = lm.facts.n_layers
    cap = plan.capture
    hs_f = hs.float()
    acts = Activations(L, attn_block=plan.block)
    acts.put(Name(Site.EMBED), _as_np(rec.emb))
    acts.put("blocks.*.hook_resid_pre", _as_np(hs_f))
    acts.put("blocks.*.hook_resid_pre|norm", _as_np(hs_f.norm(dim=-1)))
    for site, norms in rec.norms.items():
        acts.put(Name(site, Name.EVERY, View.NORM), _as_np(torch.stack(norms)))
    for site, last in rec.last.items():
        acts.put(Name(site, Name.EVERY, View.LAST), _as_np(torch.stack(last)))
    lazy_maps(acts, cap, plan)
    acts.put("blocks.*.attn.hook_pattern|last", torch.stack([cap.last_row[i] for i in range(L)]).numpy())
    acts.put(Name(Site.Q, Name.EVERY), {i: cap.sources[i].q.numpy() for i in range(L)})
    acts.put(Name(Site.K, Name.EVERY), {i: cap.sources[i].k.numpy() for i in range(L)})
    acts.put(Name(Site.V, Name.EVERY), {i: cap.v[i].numpy() for i in range(L)})
    return Trace(
        last_prompt_index=_last_prompt_index(tk),
        model_label=lm.label,
        facts=lm.facts,
        prompt=prompt,
        chat=tk.chat,
        text=tk.text,
        tokens=tk.tokens,
        segments=tk.segments,
        input_ids=tk.input_ids,
        acts=acts,
        lens_at_last=lens_at_last,
        next_logits=logits.numpy(),
        timings=timings,
        device=lm.device_label,
        exact_tokens=tk.exact,
    )


def warm_up(lm: LoadedModel, progress=None) -> None:
    """Two traced passes on the model's own thread, the pages' way (hooks, the kept activations, a chat prompt), so that
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
