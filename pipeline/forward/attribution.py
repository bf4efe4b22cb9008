"""Why this token: the next-token logit taken apart, and the model changed to test what the parts claim.

    tr = trace(lm, "The capital of France is")
    a = attribute(lm, tr)                          # direct logit attribution at the last position, read from the trace
    a.embedding, a.heads [L, H], a.ffn [L], a.bias [L]   # each component's share of the logit
    a.total == a.logit                             # exact: the shares sum to the model's own logit
    a = attribute(lm, tr, paris, versus=london)    # the difference of two candidates
    d = ablate(lm, tr, [Component.parse("L5 H3")], Ablation.ZERO)   # the next-token distribution without them
    p = patch(lm, clean_trace, corrupt_trace, PatchOver.POSITION)  # causal tracing between two prompts

Direct logit attribution: the residual stream at the last position is the embedding plus what every layer's
attention and feed-forward block add. The final norm divides that sum by its root mean square and scales it; with
the root mean square frozen at this run's value the logit of a token is a linear function of the stream, so each
component's share is that component dotted with (the token's output row x the norm's scale / rms). Attention's
output is the sum over heads of each head's slice of the output projection applied to that head's output, so heads
split exactly too. Gemma-3's sandwich norms (a norm on attention's and on the feed-forward network's output before
they join the stream) are frozen the same way, at this run's root mean square of that output. The shares then sum
to the model's own logit (before a final soft-cap, which is reported beside it), checked against the logits of the
same forward pass. GQA needs nothing special: the projection's input is one slice per query head.

Everything attribution reads is in the trace's activation cache (activations.py: the stream, `attn.hook_z|last`,
`attn.hook_proj|last`, `mlp.hook_proj|last`): no second forward pass. Ablation and patching change the model, so
they run it again, hooked by the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch

from pipeline.forward.activations import Component, Kind, Name, Site, hooking, parse_components
from pipeline.forward.tracing import Trace
from pipeline.model.arch import frozen_norm
from pipeline.model.capture import as_traced
from pipeline.model.loaded import LoadedModel

__all__ = ["Ablation", "Attribution", "Component", "Kind", "PatchOver", "ablate", "attribute", "flow", "parse_components", "patch"]


@dataclass
class Attribution:
    """Shares of one target's logit (or of the difference of two targets' logits) at the last position."""

    target: int
    versus: int | None  # the second candidate (the shares are then of logit(target) - logit(versus))
    logit: float  # the model's own value: logit(target), or the difference (before any final soft-cap)
    embedding: float
    heads: np.ndarray  # [L, H]
    ffn: np.ndarray  # [L]
    bias: np.ndarray  # [L]: the blocks' output projections' biases (and their post-norms'), 0 for models without them
    final_rms: float  # the final norm's root mean square (LayerNorm: standard deviation) in this run, frozen in every share
    final_bias: float = 0.0  # the final norm's own bias read by the unembedding (LayerNorm, GPT-2), 0 for an RMSNorm

    @property
    def total(self) -> float:
        return float(self.embedding + self.heads.sum() + self.ffn.sum() + self.bias.sum() + self.final_bias)

    def share(self, c: Component) -> float:
        if c.kind is Kind.HEAD:
            return float(self.heads[c.layer, c.head])
        if c.kind is Kind.FFN:
            return float(self.ffn[c.layer])
        if c.kind is Kind.BIAS:
            return float(self.bias[c.layer]) if c.layer is not None else float(self.final_bias)
        return float(self.embedding)

    def parts(self) -> list[Component]:
        """Every component, the biases only where the model has them."""
        L, H = self.heads.shape
        out = [Component(Kind.EMBEDDING)]
        out += [Component(Kind.HEAD, i, h) for i in range(L) for h in range(H)]
        out += [Component(Kind.FFN, i) for i in range(L)]
        out += [Component(Kind.BIAS, i) for i in range(L) if self.bias[i]]
        return out + ([Component(Kind.BIAS)] if self.final_bias else [])

    def largest(self, n: int | None = 10) -> list[tuple[Component, float]]:
        """The n components with the largest |share|, largest first."""
        return sorted(((c, self.share(c)) for c in self.parts()), key=lambda cv: -abs(cv[1]))[:n]

    def components(self) -> list[dict]:
        """Every component with its share, largest |share| first: {"name", "kind": "embed"|"head"|"mlp"|"bias",
        "layer", "head", "contribution"} (the CLI's and a notebook's form)."""
        return [{"name": str(c), "kind": c.kind.value, "layer": c.layer, "head": c.head, "contribution": v} for c, v in self.largest(None)]


class UnknownNorm(ValueError):
    """A norm whose formula attribution does not know (its class is not in pipeline.model.arch.NORM_KINDS)."""


def _frozen(mod, x: torch.Tensor, what: str):
    fn = frozen_norm(mod, x)
    if fn is None:
        raise UnknownNorm(f"{type(mod).__name__}: no known formula for the {what} of this architecture")
    return fn


def _same_model(lm: LoadedModel, tr: Trace) -> None:
    if tr.model_label != lm.label:
        raise ValueError(f"this trace is of {tr.model_label}, not of {lm.label}")


def attribute(lm: LoadedModel, tr: Trace, target: int | None = None, versus: int | None = None) -> Attribution:
    """Direct logit attribution of `target`'s logit (minus `versus`'s) at the last position of the traced prompt,
    read from the trace's activations; target None: the most likely next token."""
    _same_model(lm, tr)
    arch, f, acts = lm.arch, lm.facts, tr.acts
    t = lambda name: torch.from_numpy(np.ascontiguousarray(acts[name])).float()  # noqa: E731
    stream = t("blocks.*.hook_resid_pre")[:, -1]  # [L+1, d]: entering each layer, and the final norm
    z, attn, mlp = t("blocks.*.attn.hook_z|last"), t("blocks.*.attn.hook_proj|last"), t("blocks.*.mlp.hook_proj|last")
    logits = torch.from_numpy(tr.next_logits).float()
    if target is None:
        target = int(logits.argmax())
    final = _frozen(arch.final_norm_module(), stream[-1], "final norm")
    W_U = arch.unembedding().weight.detach().float().cpu()
    row = W_U[target] - (W_U[versus] if versus is not None else 0)
    u = final.read(row)  # the logit is u . stream + row . (the final norm's bias), the final norm frozen
    head_bias = float(row @ final.b) if final.b is not None else 0.0
    H, D = f.n_heads, f.head_dim
    heads = np.zeros((f.n_layers, H))
    ffn, bias = np.zeros(f.n_layers), np.zeros(f.n_layers)
    for i in range(f.n_layers):
        ua, uf, ca, cf = u, u, 0.0, 0.0  # each block's readout (through its post-norm, if any) and that norm's bias
        post_attn, post_ffn = arch.post_norms(i)
        if post_attn is not None:  # Gemma, OLMo-2: the block's output is normalised before it joins the stream (frozen)
            pa, pf = _frozen(post_attn, attn[i], "post-attention norm"), _frozen(post_ffn, mlp[i], "post-feed-forward norm")
            ua, uf = pa.read(u), pf.read(u)
            ca, cf = (float(u @ pa.b) if pa.b is not None else 0.0), (float(u @ pf.b) if pf.b is not None else 0.0)
        W_o = arch.attn_out_weight(i).detach().float().cpu()  # [d, H * D]
        per_head = torch.einsum("dhk,hk->hd", W_o.view(-1, H, D), z[i].view(H, D))  # [H, d]: each head's slice
        heads[i] = (per_head @ ua).numpy()
        b_o, b_f = arch.attn_out(i).bias, getattr(arch.ffn_out(i), "bias", None)
        bias[i] += ca + cf
        if b_o is not None:
            bias[i] += float(b_o.detach().float().cpu() @ ua)
        mlp_out = mlp[i]
        if b_f is not None:  # the bias is shown on its own; the feed-forward share is the rest
            mlp_out = mlp_out - b_f.detach().float().cpu()
            bias[i] += float(b_f.detach().float().cpu() @ uf)
        ffn[i] = float(mlp_out @ uf)
    logit = float(logits[target] - (logits[versus] if versus is not None else 0))
    if arch.softcap:  # the shares add up to the logit before the soft-cap: undo it on the model's value
        raw = lambda x: float(arch.softcap * np.arctanh(np.clip(float(x) / arch.softcap, -1 + 1e-7, 1 - 1e-7)))  # noqa: E731
        logit = raw(logits[target]) - (raw(logits[versus]) if versus is not None else 0.0)
    return Attribution(target, versus, logit, float(stream[0] @ u), heads, ffn, bias, final.denominator, head_bias)


class Ablation(StrEnum):
    ZERO = "zero"  # the component's output set to 0
    MEAN = "mean"  # replaced by its mean over the prompt's positions


@dataclass
class Ablated:
    """The next-token distribution before and after switching components off."""

    before: torch.Tensor  # [vocab] probabilities
    after: torch.Tensor
    logits_after: torch.Tensor  # [vocab]: the logits with the components switched off
    kl: float  # KL(before || after), nats
    token: int  # the token followed: the one asked about, else the original most likely
    new_rank: int  # its rank after (0 = the most likely)


def _switchable(lm: LoadedModel, off) -> tuple[dict[int, list[int]], list[int]]:
    """The heads by layer and the feed-forward layers among `off`, each checked against the model."""
    f, H = lm.facts, lm.facts.n_heads
    by_layer: dict[int, list[int]] = {}
    ffn: list[int] = []
    for c in off:
        c = Component.parse(c) if isinstance(c, str) else c
        if c.kind is Kind.HEAD:
            if not (0 <= c.layer < f.n_layers and 0 <= c.head < H):
                raise ValueError(f"no head {c.head} in layer {c.layer} (this model has {f.n_layers} layers of {H} heads)")
            by_layer.setdefault(c.layer, []).append(c.head)
        elif c.kind is Kind.FFN:
            if not 0 <= c.layer < f.n_layers:
                raise ValueError(f"no layer {c.layer} (this model has {f.n_layers})")
            ffn.append(c.layer)
        else:
            raise ValueError(f"{c} cannot be switched off: pick heads and feed-forward blocks")
    if sum(len(set(hs)) for hs in by_layer.values()) == f.n_layers * H:
        raise ValueError(
            f"That switches off every one of the {f.n_layers * H} heads: the model then reads no other token at all, so nothing is "
            "left to compare. Keep at least one head."
        )
    return by_layer, ffn


def ablate(lm: LoadedModel, tr: Trace, off=(), mode: Ablation | str = Ablation.ZERO, token: int | None = None) -> Ablated:
    """Switch off the components `off` (heads and feed-forward blocks: Components, or their names "L5 H3", "7.mlp")
    by `mode` at every position of the traced prompt: the next-token distribution before (the trace's) and after, and
    `token`'s rank after (default: the most likely token before)."""
    _same_model(lm, tr)
    try:
        mode = Ablation(mode)
    except ValueError:
        raise ValueError(f"mode is {' or '.join(repr(m.value) for m in Ablation)}, not {mode!r}") from None
    by_layer, ffn = _switchable(lm, off)
    H, D = lm.facts.n_heads, lm.facts.head_dim
    logits = torch.from_numpy(tr.next_logits).float()
    before = torch.softmax(logits, -1)
    token = int(before.argmax()) if token is None else int(token)
    if not by_layer and not ffn:  # nothing switched off: the trace's forward, not a second one
        return Ablated(before, before, logits, 0.0, token, int((before > before[token]).sum()))

    def off_heads(hs):
        def fn(x):
            x = x.clone()
            z = x.view(*x.shape[:-1], H, D)
            for h in hs:
                z[..., h, :] = 0 if mode is Ablation.ZERO else z[..., h, :].mean(dim=-2, keepdim=True)
            return x

        return fn

    def off_ffn(out):
        return torch.zeros_like(out) if mode is Ablation.ZERO else out.mean(dim=-2, keepdim=True).expand_as(out).clone()

    hooks = {Name(Site.Z, i): off_heads(hs) for i, hs in by_layer.items()} | {Name(Site.MLP_PROJ, i): off_ffn for i in set(ffn)}
    ids = torch.tensor([tr.input_ids], device=lm.device)
    with lm.lock, torch.inference_mode(), as_traced(), hooking(lm, hooks):  # the trace's attention: its logits are `before`
        logits = lm.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float().cpu()
    after = torch.softmax(logits, -1)
    kl = float((before * (before.clamp_min(1e-30).log() - after.clamp_min(1e-30).log())).sum())
    return Ablated(before, after, logits, kl, token, int((after > after[token]).sum()))


class PatchOver(StrEnum):
    """What one cell of the patching grid restores from the clean run."""

    POSITION = "position"  # one position's residual stream after a layer: the layer x position grid
    HEAD = "head"  # one head's output at every position: the layer x head grid


@dataclass
class Patching:
    """Causal tracing between two prompts of the same length in tokens: for each (layer, position), or each (layer,
    head), how much of the logit difference comes back when the clean run's residual stream at that position (or
    that head's output at every position) is restored into the corrupted run."""

    clean_token: int  # the clean run's answer
    corrupt_token: int  # the corrupted run's answer (the comparison's other side; if equal, the clean run's runner-up)
    clean_diff: float  # logit(clean_token) - logit(corrupt_token) in the clean run
    corrupt_diff: float  # ... in the corrupted run
    grid: np.ndarray  # [L, T] or [L, H]: (patched diff - corrupt diff) / (clean diff - corrupt diff); 1 = all of it back
    positions: int
    over: PatchOver = PatchOver.POSITION  # what the grid's columns are


def _heads_outputs(lm: LoadedModel, ids: list[int]) -> list[torch.Tensor]:
    """One forward keeping every layer's attn.hook_z ([1, T, H*D]): what head patching restores (the trace keeps it
    at the last position only)."""
    keep = [None] * lm.facts.n_layers

    def grab(i):
        def fn(x):
            keep[i] = x.detach().clone()

        return fn

    with as_traced(), hooking(lm, {Name(Site.Z, i): grab(i) for i in range(lm.facts.n_layers)}):
        lm.model(input_ids=torch.tensor([ids], device=lm.device), use_cache=False, logits_to_keep=1)
    return keep


def _replay(out: torch.Tensor):
    """A decoder layer's forward that returns `out` (what it computed in an earlier run) without computing."""

    def forward(*_args, **_kwargs):
        return out

    return forward


def patch(lm: LoadedModel, clean: Trace, corrupt: Trace, progress=None, over: PatchOver | str = PatchOver.POSITION) -> Patching:
    """The grid of causal tracing, per layer ONE batched forward of the corrupted prompt, the two runs' streams read
    from their traces. POSITION: the layer x position grid, row p with position p's residual stream after that layer
    (blocks.l.hook_resid_post) replaced by the clean run's. HEAD: the layer x head grid, row h with head h's output
    (its slice of blocks.l.attn.hook_z) replaced by the clean run's at every position."""
    _same_model(lm, clean)
    _same_model(lm, corrupt)
    if clean.T != corrupt.T:
        raise ValueError(
            f"The two prompts are {clean.T} and {corrupt.T} tokens long: patching restores one position at a "
            "time, so they must have the same number of tokens. Change a word for one that is as many tokens (see page 1)."
        )
    try:
        over = PatchOver(over)
    except ValueError:
        raise ValueError(f"over={over!r}: patch a {' or a '.join(repr(o.value) for o in PatchOver)}") from None
    T, L, H, D = clean.T, lm.facts.n_layers, lm.facts.n_heads, lm.facts.head_dim
    dev = lm.device
    n = T if over is PatchOver.POSITION else H
    post = lambda tr, i: torch.from_numpy(tr.acts[Name(Site.RESID_POST, i)]).to(dev, lm.dtype)[None]  # noqa: E731
    clean_logits, corrupt_logits = torch.from_numpy(clean.next_logits).float(), torch.from_numpy(corrupt.next_logits).float()
    a = int(clean_logits.argmax())
    b = int(corrupt_logits.argmax())
    if b == a:  # the corruption did not change the answer: compare with the clean run's runner-up
        b = int(clean_logits.topk(2).indices[1])
    diff = lambda lg: float(lg[..., a] - lg[..., b]) if lg.dim() == 1 else (lg[:, a] - lg[:, b])  # noqa: E731
    hi, lo = diff(clean_logits), diff(corrupt_logits)
    grid = np.zeros((L, n))
    batch = torch.tensor([corrupt.input_ids] * n, device=dev)
    rows = torch.arange(n, device=dev)
    with lm.lock, torch.inference_mode():
        clean_z = _heads_outputs(lm, clean.input_ids) if over is PatchOver.HEAD else None
        for i in range(L):

            def restore(h, i=i):
                h = h.clone()
                h[rows, rows] = post(clean, i)[0, rows]  # row p: position p restored
                return h

            def restore_head(z, i=i):
                z = z.clone().view(n, T, H, D)
                z[rows, :, rows] = clean_z[i][0].view(T, H, D).transpose(0, 1)  # row h: head h restored everywhere
                return z.view(n, T, H * D)

            # nothing before the patch changes: the layers before it (and, restoring a position, the patched layer
            # itself) give back the corrupted run's output instead of computing it again (half the work of the grid)
            replayed = lm.arch.layers[: i + 1 if over is PatchOver.POSITION else i]
            for k, earlier in enumerate(replayed):
                earlier.forward = _replay(post(corrupt, k).expand(n, -1, -1))
            hook = {Name(Site.RESID_POST, i): restore} if over is PatchOver.POSITION else {Name(Site.Z, i): restore_head}
            try:
                with as_traced(), hooking(lm, hook):  # the trace's attention: the two traces' logits are the grid's ends
                    logits = lm.model(input_ids=batch, use_cache=False, logits_to_keep=1).logits[:, -1].float()
            finally:
                for earlier in replayed:
                    del earlier.forward  # the class's own forward again
            grid[i] = ((diff(logits.cpu()) - lo) / (hi - lo if hi != lo else 1.0)).numpy()
            if progress:
                progress((i + 1) / L, f"layer {i + 1} of {L}")
    return Patching(a, b, hi, lo, grid, T, over)


@dataclass
class Flow:
    """Where the answer's information came from (the LLM Transparency Tool's contribution graph): for every layer and
    position, the share of what enters the next layer there that came from each earlier token through attention
    (attention weight x the norm of that token's value vector passed through its head's slice of the output projection, summed over
    heads) and from the position's own residual stream. Each row of shares sums to 1."""

    tokens: int
    edges: np.ndarray  # [L, T, T]: edges[l, i, j] = share of position i's stream after layer l read from token j
    residual: np.ndarray  # [L, T]: the share the position's own stream kept
    last: np.ndarray  # [L, H, T]: per head, attention weight x |W_O^h v_j| at the last position (unnormalised)

    def graph(self, threshold: float) -> list[tuple[int, int, int, float]]:
        """The edges (layer, from position, to position, share) with a share >= threshold on some path to the last
        position after the last layer (the prediction), found backwards from it; from == to is the residual stream."""
        L, T = self.residual.shape
        need, out = {T - 1}, []
        for layer in range(L - 1, -1, -1):
            reach = set()
            for i in sorted(need):
                for j in range(i + 1):
                    w = self.residual[layer, i] if j == i else self.edges[layer, i, j]
                    if w >= threshold:
                        out.append((layer, j, i, float(w)))
                        reach.add(j)
            need = reach
            if not need:
                break
        return out


FLOW_MAX_TOKENS = 256  # every layer's full attention map is kept for the graph


def flow(lm: LoadedModel, tr: Trace) -> Flow:
    """The contribution graph's shares, read from the trace: every layer's attention pattern, value vectors and
    entering stream (a trace of at most FLOW_MAX_TOKENS tokens keeps them all). GQA: query head h reads the value
    vectors of its key-value head h // G."""
    _same_model(lm, tr)
    T, f = tr.T, lm.facts
    if T > FLOW_MAX_TOKENS:
        raise ValueError(
            f"The prompt is {T:,} tokens; the contribution graph keeps every layer's attention map, so it is drawn for at most {FLOW_MAX_TOKENS} tokens."
        )
    L, H, KV, D = f.n_layers, f.n_heads, f.n_kv_heads, f.head_dim
    acts = tr.acts
    streams = torch.from_numpy(acts["blocks.*.hook_resid_pre|norm"])  # [L+1, T]: |the stream entering each layer|
    edges, residual, last = np.zeros((L, T, T)), np.zeros((L, T)), np.zeros((L, H, T))
    with torch.inference_mode():
        for i in range(L):
            A = torch.from_numpy(acts[Name(Site.PATTERN, i)]).float()  # [H, T, T]
            v = torch.from_numpy(acts[Name(Site.V, i)])[torch.arange(H) // (H // KV)]  # [H, T, D]: each query head's values
            W_o = lm.arch.attn_out_weight(i).detach().float().cpu().view(-1, H, D)  # [d, H, D]
            norms = torch.einsum("dhk,htk->htd", W_o, v).norm(dim=-1)  # [H, T]: |W_O^h v_j|
            per_head = A * norms[:, None, :]  # [H, T(query), T(key)]
            w = per_head.sum(0)
            r = streams[i]  # [T]: the position's own stream entering the layer
            total = r + w.sum(-1)
            edges[i], residual[i] = (w / total[:, None]).numpy(), (r / total).numpy()
            last[i] = per_head[:, -1, :].numpy()
    return Flow(T, edges, residual, last)
