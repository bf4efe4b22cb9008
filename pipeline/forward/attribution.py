"""Why this token: the next-token logit taken apart, and the model changed to test what the parts claim.

    a = attribute(lm, prompt_ids, target)            # direct logit attribution at the last position
    a.embedding, a.heads [L, H], a.ffn [L], a.bias [L]   # each component's share of the logit
    a.total == a.logit                               # exact: the shares sum to the model's own logit
    a = attribute(lm, prompt_ids, " Paris", versus=" London")   # the difference of two candidates
    d = ablate(lm, prompt_ids, heads=[(5, 3)], ffn=[7], mode="zero")   # the next-token distribution without them

Direct logit attribution: the residual stream at the last position is the embedding plus what every layer's
attention and feed-forward block add. The final norm divides that sum by its root mean square and scales it; with
the root mean square frozen at this run's value the logit of a token is a linear function of the stream, so each
component's share is that component dotted with (the token's output row x the norm's scale / rms). Attention's
output is the sum over heads of each head's slice of o_proj applied to that head's output, so heads split exactly
too. Gemma-3's sandwich norms (a norm on attention's and on the feed-forward network's output before they join the
stream) are frozen the same way, at this run's root mean square of that output. The shares then sum to the
model's own logit (before a final soft-cap, which is reported beside it), checked against the logits of the same
forward pass. GQA needs nothing special: o_proj's input is one slice per query head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.model.arch import frozen_norm
from pipeline.model.loaded import LoadedModel


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

    def components(self) -> list[dict]:
        """Every component with its share, largest |share| first: {"name", "kind": "embed"|"head"|"mlp"|"bias",
        "layer", "head", "contribution"} (the CLI's and a notebook's form)."""
        out = [{"name": "embedding", "kind": "embed", "layer": None, "head": None, "contribution": float(self.embedding)}]
        out += [{"name": f"L{i} H{h}", "kind": "head", "layer": i, "head": h, "contribution": float(v)} for (i, h), v in np.ndenumerate(self.heads)]
        out += [{"name": f"L{i} FFN", "kind": "mlp", "layer": i, "head": None, "contribution": float(v)} for i, v in enumerate(self.ffn)]
        out += [{"name": f"L{i} bias", "kind": "bias", "layer": i, "head": None, "contribution": float(v)} for i, v in enumerate(self.bias) if v]
        if self.final_bias:
            out.append({"name": "final norm bias", "kind": "bias", "layer": None, "head": None, "contribution": float(self.final_bias)})
        return sorted(out, key=lambda c: -abs(c["contribution"]))

    def largest(self, n: int = 10) -> list[tuple[str, float]]:
        """The n components with the largest |share|, largest first: ("L5 H3", x), ("L7 FFN", x), ("embedding", x)."""
        items = [("embedding", self.embedding)]
        items += [(f"L{i} H{h}", float(v)) for (i, h), v in np.ndenumerate(self.heads)]
        items += [(f"L{i} FFN", float(v)) for i, v in enumerate(self.ffn)]
        items += [(f"L{i} bias", float(v)) for i, v in enumerate(self.bias) if v]
        if self.final_bias:
            items.append(("final norm bias", float(self.final_bias)))
        return sorted(items, key=lambda kv: -abs(kv[1]))[:n]


def _frozen(mod, x: torch.Tensor, what: str):
    fn = frozen_norm(mod, x)
    if fn is None:
        raise ValueError(f"{type(mod).__name__}: no known formula for the {what} of this architecture")
    return fn


def _last_position_parts(lm: LoadedModel, prompt_ids: list[int]):
    """One forward pass that keeps, at the last position: the stream entering layer 0, each layer's o_proj input
    (the heads' outputs side by side) and output, its feed-forward output, the stream entering the final norm, and
    the logits."""
    arch, keep, hooks = lm.arch, {"z": {}, "attn": {}, "ffn": {}}, []
    layers = arch.layers

    def pre(store, i):
        def hook(_mod, args):
            store[i] = args[0][0, -1].detach().float().clone()

        return hook

    def post(store, i):
        def hook(_mod, _args, out):
            store[i] = (out[0] if isinstance(out, tuple) else out)[0, -1].detach().float().clone()

        return hook

    try:

        def first(_mod, args, kwargs):  # the stream entering layer 0: the embeddings (Gemma's scale included)
            x = args[0] if args else kwargs["hidden_states"]
            keep["emb"] = x[0, -1].detach().float().clone()

        hooks.append(layers[0].register_forward_pre_hook(first, with_kwargs=True))
        for i in range(len(layers)):
            hooks.append(arch.attn_out(i).register_forward_pre_hook(pre(keep["z"], i)))
            hooks.append(arch.attn_out(i).register_forward_hook(post(keep["attn"], i)))
            hooks.append(arch.ffn(i).register_forward_hook(post(keep["ffn"], i)))
        hooks.append(arch.final_norm_module().register_forward_pre_hook(lambda _m, args: keep.__setitem__("final", args[0][0, -1].detach().float().clone())))
        with lm.lock, torch.inference_mode():
            out = lm.model(input_ids=torch.tensor([prompt_ids], device=lm.device), use_cache=False, logits_to_keep=1)
        keep["logits"] = out.logits[0, -1].detach().float().cpu()
    finally:
        for h in hooks:
            h.remove()
    return keep


def attribute(lm: LoadedModel, prompt_ids: list[int], target: int | None = None, versus: int | None = None) -> Attribution:
    """Direct logit attribution of `target`'s logit (minus `versus`'s) at the last position of `prompt_ids`;
    target None: the most likely next token (read from the same forward pass)."""
    arch, f = lm.arch, lm.facts
    keep = _last_position_parts(lm, prompt_ids)
    if target is None:
        target = int(keep["logits"].argmax())
    final = _frozen(arch.final_norm_module(), keep["final"], "final norm")
    W_U = lm.model.get_output_embeddings().weight.detach().float().cpu()
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
            pa, pf = _frozen(post_attn, keep["attn"][i], "post-attention norm"), _frozen(post_ffn, keep["ffn"][i], "post-feed-forward norm")
            ua, uf = pa.read(u), pf.read(u)
            ca, cf = (float(u @ pa.b) if pa.b is not None else 0.0), (float(u @ pf.b) if pf.b is not None else 0.0)
        W_o = arch.attn_out_weight(i).detach().float().cpu()  # [d, H * D]
        z = keep["z"][i].cpu().view(H, D)
        per_head = torch.einsum("dhk,hk->hd", W_o.view(-1, H, D), z)  # [H, d]: each head's slice of the projection
        heads[i] = (per_head @ ua).numpy()
        b_o, b_f = arch.attn_out(i).bias, getattr(arch.ffn_out(i), "bias", None)
        bias[i] += ca + cf
        if b_o is not None:
            bias[i] += float(b_o.detach().float().cpu() @ ua)
        mlp_out = keep["ffn"][i].cpu()
        if b_f is not None:  # the bias is shown on its own; the feed-forward share is the rest
            mlp_out = mlp_out - b_f.detach().float().cpu()
            bias[i] += float(b_f.detach().float().cpu() @ uf)
        ffn[i] = float(mlp_out @ uf)
    logits = keep["logits"]
    logit = float(logits[target] - (logits[versus] if versus is not None else 0))
    if arch.softcap:  # the shares add up to the logit before the soft-cap: undo it on the model's value
        raw = lambda x: float(arch.softcap * np.arctanh(np.clip(float(x) / arch.softcap, -1 + 1e-7, 1 - 1e-7)))  # noqa: E731
        logit = raw(logits[target]) - (raw(logits[versus]) if versus is not None else 0.0)
    return Attribution(target, versus, logit, float(keep["emb"].cpu() @ u), heads, ffn, bias, final.denominator, head_bias)


@dataclass
class Ablated:
    """The next-token distribution before and after switching components off."""

    before: torch.Tensor  # [vocab] probabilities
    after: torch.Tensor
    logits_after: torch.Tensor  # [vocab]: the logits with the components switched off
    kl: float  # KL(before || after), nats
    token: int  # the original most likely token
    new_rank: int  # its rank after (0 = still first)


def ablate(lm: LoadedModel, prompt_ids: list[int], heads=(), ffn=(), mode: str = "zero", before: np.ndarray | torch.Tensor | None = None) -> Ablated:
    """Switch off attention heads [(layer, head)] and feed-forward blocks [layer] by `mode`: "zero" (their output
    set to 0) or "mean" (replaced by its mean over the prompt's positions), at every position; the next-token
    distribution before and after. `before`: the untouched model's last-position logits when the caller has them
    (the page's trace), saving one forward; else they are computed here."""
    if mode not in ("zero", "mean"):
        raise ValueError("mode is 'zero' or 'mean'")
    arch, f = lm.arch, lm.facts
    H, D = f.n_heads, f.head_dim
    by_layer: dict[int, list[int]] = {}
    for i, h in heads:
        if not (0 <= i < f.n_layers and 0 <= h < H):
            raise ValueError(f"no head {h} in layer {i} (this model has {f.n_layers} layers of {H} heads)")
        by_layer.setdefault(i, []).append(h)
    for i in ffn:
        if not 0 <= i < f.n_layers:
            raise ValueError(f"no layer {i} (this model has {f.n_layers})")
    if sum(len(set(hs)) for hs in by_layer.values()) == f.n_layers * H:
        raise ValueError(
            f"That switches off every one of the {f.n_layers * H} heads: the model then reads no other token at all, so nothing is "
            "left to compare. Keep at least one head."
        )
    ids = torch.tensor([prompt_ids], device=lm.device)

    def off_heads(hs):
        def hook(_mod, args):
            x = args[0].clone()
            z = x.view(*x.shape[:-1], H, D)
            for h in hs:
                z[..., h, :] = 0 if mode == "zero" else z[..., h, :].mean(dim=-2, keepdim=True)
            return (x,) + tuple(args[1:])

        return hook

    def off_ffn(_mod, _args, out):
        return torch.zeros_like(out) if mode == "zero" else out.mean(dim=-2, keepdim=True).expand_as(out).clone()

    with lm.lock, torch.inference_mode():
        if before is None:
            logits = lm.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float().cpu()
        else:
            logits = torch.as_tensor(before).float().cpu()
        before = torch.softmax(logits, -1)
        if not by_layer and not ffn:  # nothing switched off: the same forward, not a second one
            return Ablated(before, before, logits, 0.0, int(before.argmax()), 0)
        hooks = [arch.attn_out(i).register_forward_pre_hook(off_heads(hs)) for i, hs in by_layer.items()]
        hooks += [arch.ffn(i).register_forward_hook(off_ffn) for i in set(ffn)]
        try:
            logits = lm.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float().cpu()
            after = torch.softmax(logits, -1)
        finally:
            for h in hooks:
                h.remove()
    token = int(before.argmax())
    kl = float((before * (before.clamp_min(1e-30).log() - after.clamp_min(1e-30).log())).sum())
    return Ablated(before, after, logits, kl, token, int((after > after[token]).sum()))


def parse_components(text: str) -> tuple[list[tuple[int, int]], list[int]]:
    """ "L5H3,L7FFN" or "5.3,7.mlp" -> ([(5, 3)], [7]): heads as (layer, head), feed-forward blocks as layers."""
    import re

    heads, ffn = [], []
    for part in text.replace(" ", "").split(","):
        if m := re.fullmatch(r"L?(\d+)[.H](\d+)", part, re.I):
            heads.append((int(m[1]), int(m[2])))
        elif m := re.fullmatch(r"L?(\d+)\.?(FFN|MLP)", part, re.I):
            ffn.append(int(m[1]))
        elif part:
            raise ValueError(f"{part!r}: name a head as 5.3 (or L5H3) and a feed-forward block as 7.mlp (or L7FFN)")
    return heads, ffn


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
    over: str = "position"  # what the grid's columns are: "position" or "head"


def _grab(lm: LoadedModel, ids: torch.Tensor, where: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One forward keeping, per layer [L] x [1, T, ...]: the residual stream after the layer (where="layer") or the
    heads' outputs side by side, o_proj's input (where="heads"); and the last position's logits."""
    keep = [None] * lm.facts.n_layers

    def grab(i):
        def hook(_mod, args, out=None):
            x = args[0] if where == "heads" else (out[0] if isinstance(out, tuple) else out)
            keep[i] = x.detach().clone()

        return hook

    if where == "heads":
        hooks = [lm.arch.attn_out(i).register_forward_pre_hook(grab(i)) for i in range(len(lm.arch.layers))]
    else:
        hooks = [layer.register_forward_hook(grab(i)) for i, layer in enumerate(lm.arch.layers)]
    try:
        logits = lm.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1].float()
    finally:
        for h in hooks:
            h.remove()
    return keep, logits


def _replay(out: torch.Tensor):
    """A decoder layer's forward that returns `out` (what it computed in an earlier run) without computing."""

    def forward(*_args, **_kwargs):
        return out

    return forward


def patch(lm: LoadedModel, clean_ids: list[int], corrupt_ids: list[int], progress=None, over: str = "position") -> Patching:
    """The grid of causal tracing, per layer ONE batched forward of the corrupted prompt. over="position": the layer x
    position grid, row p with position p's residual stream after that layer replaced by the clean run's.
    over="head": the layer x head grid, row h with head h's output (its slice of o_proj's input) replaced by the
    clean run's at every position."""
    if len(clean_ids) != len(corrupt_ids):
        raise ValueError(
            f"The two prompts are {len(clean_ids)} and {len(corrupt_ids)} tokens long: patching restores one position at a "
            "time, so they must have the same number of tokens. Change a word for one that is as many tokens (see page 1)."
        )
    if over not in ("position", "head"):
        raise ValueError(f"over={over!r}: patch a 'position' or a 'head'")
    T, L, H, D = len(clean_ids), lm.facts.n_layers, lm.facts.n_heads, lm.facts.head_dim
    dev = lm.device
    n = T if over == "position" else H
    with lm.lock, torch.inference_mode():
        clean_states, clean_logits = _grab(lm, torch.tensor([clean_ids], device=dev), "layer" if over == "position" else "heads")
        corrupt_states, corrupt_logits = _grab(lm, torch.tensor([corrupt_ids], device=dev), "layer")
        a = int(clean_logits.argmax())
        b = int(corrupt_logits.argmax())
        if b == a:  # the corruption did not change the answer: compare with the clean run's runner-up
            b = int(clean_logits.topk(2).indices[1])
        diff = lambda lg: float(lg[..., a] - lg[..., b]) if lg.dim() == 1 else (lg[:, a] - lg[:, b])  # noqa: E731
        hi, lo = diff(clean_logits), diff(corrupt_logits)
        grid = np.zeros((L, n))
        batch = torch.tensor([corrupt_ids] * n, device=dev)
        rows = torch.arange(n, device=dev)
        for i, layer in enumerate(lm.arch.layers):

            def restore(_mod, _args, out, i=i):
                h = out[0] if isinstance(out, tuple) else out
                h = h.clone()
                h[rows, rows] = clean_states[i][0, rows]  # row p: position p restored
                return (h, *out[1:]) if isinstance(out, tuple) else h

            def restore_head(_mod, args, i=i):
                z = args[0].clone().view(n, T, H, D)
                z[rows, :, rows] = clean_states[i][0].view(T, H, D).transpose(0, 1)  # row h: head h restored everywhere
                return (z.view(n, T, H * D), *args[1:])

            # nothing before the patch changes: the layers before it (and, restoring a position, the patched layer
            # itself) give back the corrupted run's output instead of computing it again (half the work of the grid)
            replayed = lm.arch.layers[: i + 1 if over == "position" else i]
            for k, earlier in enumerate(replayed):
                earlier.forward = _replay(corrupt_states[k].expand(n, -1, -1))
            hook = layer.register_forward_hook(restore) if over == "position" else lm.arch.attn_out(i).register_forward_pre_hook(restore_head)
            try:
                logits = lm.model(input_ids=batch, use_cache=False, logits_to_keep=1).logits[:, -1].float()
            finally:
                hook.remove()
                for earlier in replayed:
                    del earlier.forward  # the class's own forward again
            grid[i] = ((diff(logits) - lo) / (hi - lo if hi != lo else 1.0)).cpu().numpy()
            if progress:
                progress((i + 1) / L, f"layer {i + 1} of {L}")
    return Patching(a, b, hi, lo, grid, T, over)


@dataclass
class Flow:
    """Where the answer's information came from (the LLM Transparency Tool's contribution graph): for every layer and
    position, the share of what enters the next layer there that came from each earlier token through attention
    (attention weight x the norm of that token's value vector passed through its head's slice of o_proj, summed over
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


def flow(lm: LoadedModel, prompt_ids: list[int]) -> Flow:
    """One forward pass with every layer's attention weights and value vectors kept (the explorer's capturing
    attention: transformers' own eager attention), then the contribution graph's shares. GQA: query head h reads
    the value vectors of its key-value head h // G."""
    from pipeline.model.capture import Capture, capturing

    T, f = len(prompt_ids), lm.facts
    if T > FLOW_MAX_TOKENS:
        raise ValueError(
            f"The prompt is {T:,} tokens; the contribution graph keeps every layer's attention map, so it is drawn for at most {FLOW_MAX_TOKENS} tokens."
        )
    L, H, KV, D = f.n_layers, f.n_heads, f.n_kv_heads, f.head_dim
    layers = set(range(L))
    cap = Capture(full_layers=layers, block=1, qkv_layers=layers)
    streams, hooks = [None] * L, []

    def entering(i):
        def hook(_mod, args, kwargs):
            streams[i] = (args[0] if args else kwargs["hidden_states"])[0].detach().float()

        return hook

    hooks = [layer.register_forward_pre_hook(entering(i), with_kwargs=True) for i, layer in enumerate(lm.arch.layers)]
    try:
        with lm.lock, torch.inference_mode(), capturing(cap):
            lm.model(input_ids=torch.tensor([prompt_ids], device=lm.device), use_cache=False, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    edges, residual, last = np.zeros((L, T, T)), np.zeros((L, T)), np.zeros((L, H, T))
    with torch.inference_mode():
        for i in range(L):
            A = cap.full[i].float()  # [H, T, T]
            v = cap.qkv[i]["v"][torch.arange(H) // (H // KV)]  # [H, T, D]: each query head's value vectors
            W_o = lm.arch.attn_out_weight(i).detach().float().cpu().view(-1, H, D)  # [d, H, D]
            norms = torch.einsum("dhk,htk->htd", W_o, v).norm(dim=-1)  # [H, T]: |W_O^h v_j|
            per_head = A * norms[:, None, :]  # [H, T(query), T(key)]
            w = per_head.sum(0)
            r = streams[i].cpu().norm(dim=-1)  # [T]: the position's own stream entering the layer
            total = r + w.sum(-1)
            edges[i], residual[i] = (w / total[:, None]).numpy(), (r / total).numpy()
            last[i] = per_head[:, -1, :].numpy()
    return Flow(T, edges, residual, last)
