"""'How do we know?': cross-checks of a Trace against independent computations.

Each check returns a `Check` with the measured discrepancy, so pages can show the evidence, not a claim.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.forward.sampling import DEFAULTS, Sampling, filter_probs, prob_of, top_token
from pipeline.forward.tokens import text_of
from pipeline.forward.tracing import Trace
from pipeline.model.loaded import LoadedModel

EAGER_CHECK_MAX_T = 512


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not run (the detail says why)
    detail: str
    value: float | None = None


def check_tokens(tr) -> Check:
    """tr: a Trace or a tokens.Tokenized."""
    joined = b"".join(t.bytes for t in tr.tokens)
    ok = joined == tr.text.encode("utf-8")
    return Check(
        "token bytes reassemble the text",
        ok,
        f"{len(tr.tokens)} tokens, {len(joined)} bytes joined vs {len(tr.text.encode('utf-8'))} in the text"
        + ("" if ok else " (this tokenizer normalises text)"),
    )


_LOGITS: weakref.WeakKeyDictionary[Trace, list[Check]] = weakref.WeakKeyDictionary()


def token_checks(tokenizer, tk) -> list[Check]:
    """The tokens page's evidence: the token bytes reassemble the text and, for a plain prompt, the ids are the
    tokenizer's own encoding of it."""
    out = [check_tokens(tk)]
    if not tk.chat:
        ref = tokenizer(tk.prompt, split_special_tokens=True)["input_ids"]
        out.append(Check("ids = the tokenizer's own encoding", ref == tk.input_ids, f"{len(ref)} ids from tokenizer(prompt) vs {len(tk.input_ids)} shown"))
    return out


def check_logits(lm: LoadedModel, tr: Trace) -> list[Check]:
    """A plain transformers forward (SDPA attention, no hooks, all positions) vs the trace. Run once per trace
    (a forward pass): the result is kept while the trace lives."""
    if tr not in _LOGITS:
        _LOGITS[tr] = _check_logits(lm, tr)
    return list(_LOGITS[tr])


def _check_logits(lm: LoadedModel, tr: Trace) -> list[Check]:
    ids = torch.tensor([tr.input_ids], device=lm.device)
    with lm.lock, torch.inference_mode():
        out = lm.model(input_ids=ids, output_hidden_states=True, use_cache=False)
    ref = out.logits[0, -1].float().cpu().numpy()
    d = float(np.abs(ref - tr.next_logits).max())
    same_top = int(ref.argmax()) == int(tr.next_logits.argmax())
    hs = [h[0].float().cpu().numpy() for h in out.hidden_states]
    dh = max(float(np.abs(a - b).max()) for a, b in zip(hs[:-1], tr.acts["blocks.*.hook_resid_pre"][:-1]))
    tol = lm.arch.tols
    return [
        Check(
            "next-token logits = plain transformers forward",
            d < tol.trace_logits and same_top,
            f"max |difference| {d:.2e} over {ref.size:,} logits; same top token: {same_top} (the trace uses eager attention, the plain forward SDPA)",
            d,
        ),
        Check("hidden states = transformers' output_hidden_states", dh < tol.hidden, f"max |difference| {dh:.2e} over {len(hs) - 1} layers", dh),
    ]


def check_attention(lm: LoadedModel, tr: Trace) -> list[Check]:
    rows = tr.acts["blocks.*.attn.hook_pattern|pooled"].astype(np.float32).sum(-1)
    err = float(np.abs(rows - 1).max())
    out = [Check("every attention row sums to 1", err < 1e-2, f"max |row sum - 1| {err:.1e} over {rows.size:,} rows (float16 storage)", err)]
    if tr.T > EAGER_CHECK_MAX_T:
        out.append(
            Check(
                "attention maps = transformers' eager attentions",
                None,
                f"not run: {tr.T} tokens is over {EAGER_CHECK_MAX_T} (the independent eager run keeps every fp32 map)",
            )
        )
        return out
    ids = torch.tensor([tr.input_ids], device=lm.device)
    with lm.lock, torch.inference_mode():
        with lm.arch.attention_as("eager"):
            ref = lm.model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    d = 0.0
    kept = tr.acts.layers("blocks.*.attn.hook_pattern")
    for layer in kept:
        mine = tr.acts[f"blocks.{layer}.attn.hook_pattern"]
        d = max(d, float(np.abs(ref[layer][0].float().cpu().numpy() - mine.astype(np.float32)).max()))
    out.append(
        Check(
            "attention maps = transformers' eager attentions",
            d < 2e-3 if lm.dtype == torch.float32 else d < 3e-2,
            f"max |difference| {d:.1e} over {len(kept)} layers x {tr.facts.n_heads} heads",
            d,
        )
    )
    return out


def hf_processed_probs(logits, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The reference: transformers' own logits processors, in generate()'s order, then softmax."""
    from transformers import LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = torch.as_tensor(np.asarray(logits), dtype=torch.float32).reshape(1, -1).clone()
    if temperature <= 0:
        return torch.nn.functional.one_hot(scores.argmax(-1), scores.size(-1)).float()[0]
    procs = LogitsProcessorList()
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k and top_k > 0:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    if min_p and min_p > 0:
        procs.append(MinPLogitsWarper(min_p))
    return torch.softmax(procs(torch.zeros(1, 1, dtype=torch.long), scores), dim=-1)[0]


def check_filters(logits, sampling: Sampling) -> Check:
    temperature, top_k, top_p, min_p = sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p
    mine = filter_probs(logits, sampling).reshape(-1)
    ref = hf_processed_probs(logits, temperature, top_k, top_p, min_p)
    d = float((mine - ref).abs().max())
    same = bool(((mine > 0) == (ref > 0)).all())
    n = int((ref > 0).sum())
    return Check(
        f"filters = transformers' logits processors (temperature {temperature:g}, top-k {top_k}, top-p {top_p:g}, min-p {min_p:g})",
        d < 1e-6 and same,
        f"max |difference| {d:.1e}; same surviving set: {same} ({n:,} candidate{'s' if n != 1 else ''})",
        d,
    )


def all_checks(lm: LoadedModel, tr: Trace, sampling: Sampling = DEFAULTS) -> list[Check]:
    """Every check on one trace; the filters with typical settings (every filter active), as the next-token page would."""
    return [check_tokens(tr)] + check_logits(lm, tr) + check_attention(lm, tr) + [check_filters(tr.next_logits, sampling)]


def check_rope(lm: LoadedModel, tr: Trace, demo, token_index: int) -> list[Check]:
    """The embeddings page's RoPE evidence: our rotation reproduces the model's rotated q·k, the score depends on the distance
    only, and the embedding layer's output is the matrix row (times the model's scale)."""
    from pipeline.forward import analysis

    direct = float(demo.q_rot @ demo.k_rot)
    again = float(analysis.rotate(demo.q_raw, demo.q_index, demo.inv_freq) @ analysis.rotate(demo.k_raw, demo.k_index, demo.inv_freq))
    shift = float(np.abs(demo.scores_at_0 - demo.scores_at_100).max())
    tok = tr.tokens[token_index]
    return [
        Check(
            "our RoPE reproduces the model's rotated query·key",
            abs(direct - again) < 1e-3 * max(1, abs(direct)),
            f"model's q·k {direct:.5f} vs un-rotated then re-rotated {again:.5f}",
        ),
        Check("score depends on distance only", bool(shift < 1e-6 * max(1, np.abs(demo.scores_at_0).max())), f"max |shift by 100 − original| {shift:.1e}"),
        Check(
            "embedding output = row of the matrix (× scale)",
            bool(np.allclose(analysis.embed_ids(lm, [tok.id])[0], tr.acts["hook_embed"][token_index], atol=1e-5)),
            f"token {tok.id}: lookup vs the hooked embedding layer output",
        ),
    ]


def check_head_softmax(tr: Trace, hs) -> list[Check]:
    """softmax(Q·Kᵀ × scale) recomputed from one head's captured Q and K equals the captured attention map."""
    from pipeline.forward.analysis import masked_softmax

    mine = tr.attention(hs.layer)
    if mine is None:
        return []
    d = float(np.abs(masked_softmax(hs.masked) - mine[hs.head].astype(np.float64)).max())
    return [
        Check("softmax(Q·Kᵀ × scale) from the captured Q, K = the attention map", d < 5e-3, f"layer {hs.layer} head {hs.head}: max |difference| {d:.1e}", d)
    ]


def check_lens(lm: LoadedModel, tr: Trace) -> Check:
    """The logit lens after the last layer is the model's own next-token distribution."""
    tid, p = tr.lens_last_top[-1][0]
    best, p_final = top_token(tr.next_logits)
    p_lens_tok = prob_of(tr.next_logits, tid)
    dec = lambda ids: text_of(lm.tokenizer, ids)  # noqa: E731
    return Check(
        "logit lens after the last layer = the model's own next-token distribution",
        tid == best and abs(p - p_lens_tok) < 1e-3,
        f"lens: {dec([tid])!r} (id {tid}) with p = {p:.4f}; logits: {dec([best])!r} (id {best}) with p = {p_final:.4f}",
    )


def check_kv_bytes(lm: LoadedModel, events) -> Check:
    """The bytes held by the real cache tensors after every step = the formula at that context length."""
    from pipeline.generation.loop import kv_bytes_formula

    bad = [e for e in events if e.kv_bytes != kv_bytes_formula(lm, e.context_len)]
    return Check(
        "cache tensors' bytes = 2 × layers × KV heads × head dim × bytes per value × tokens",
        not bad,
        f"{len(events)} steps compared"
        + (
            f"; first mismatch at {bad[0].context_len} tokens: {bad[0].kv_bytes:,} vs {kv_bytes_formula(lm, bad[0].context_len):,} B"
            if bad
            else ", every one equal"
        ),
    )


def check_same_tokens(name: str, got: dict[str, list[int]], alone: dict[str, list[int]]) -> Check:
    """Every named request's tokens equal the same request's tokens generated alone."""
    bad = [k for k in alone if got.get(k) != alone[k]]
    n = sum(len(v) for v in alone.values())
    return Check(name, not bad, f"{len(alone)} requests, {n:,} tokens compared" + (f"; different: {', '.join(bad)}" if bad else ", all identical"))


# ------------------------------------------------------------------- the pages after the first token


def check_greedy_vs_transformers(lm: LoadedModel, prompt_ids: list[int], tokens: list[int], stop_ids) -> Check:
    """A greedy run's tokens = transformers' own `model.generate` on the same prompt ids (its loop, its cache,
    its argmax: independent of ours)."""
    from transformers import GenerationConfig

    n = len(tokens)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    gc = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=sorted(stop_ids) or None, pad_token_id=pad)
    with lm.lock, torch.inference_mode():
        out = lm.model.generate(torch.tensor([prompt_ids], device=lm.device), generation_config=gc)
    ref = out[0, len(prompt_ids) :].tolist()
    same = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), None)
    ok = same is None and len(ref) == n
    return Check(
        "greedy tokens = transformers' model.generate on the same prompt ids",
        ok,
        f"{n} tokens compared, all identical"
        if ok
        else (f"first difference at token {same}" if same is not None else f"lengths differ: {n} here, {len(ref)} from model.generate"),
    )


def generation_checks(lm: LoadedModel, rec) -> list[Check]:
    """The generation page's run (a GenerationRecord): greedy against transformers; a sampled run against a second run of our
    own loop with the same seed (pipeline.generate, the request alone, not through the shared engine); the
    headline metrics recomputed from the raw event times."""
    from pipeline.generation.decode import CacheMode
    from pipeline.generation.events import eos_ids
    from pipeline.generation.loop import generate, metrics, prepare

    toks = [e.token_id for e in rec.events]
    req = prepare(lm, rec.prompt, len(toks), rec.chat)
    out = []
    if rec.sampling.greedy:
        out.append(check_greedy_vs_transformers(lm, req.prompt_ids, toks, eos_ids(lm)))
    else:
        again = [e.token_id for e in generate(lm, rec.prompt, len(toks), rec.sampling, chat=rec.chat, request=req, cache=CacheMode.DYNAMIC)]
        out.append(
            Check(
                "sampled tokens reproduce: same seed, our loop run alone (outside the shared engine)",
                again == toks,
                f"{len(toks)} tokens, "
                + (
                    "all identical"
                    if again == toks
                    else f"first difference at {next(i for i, (a, b) in enumerate(zip(toks, again + [-1] * len(toks))) if a != b)}"
                ),
            )
        )
    m, ev = metrics(rec.events), rec.events
    if len(ev) > 1:
        tpot = (ev[-1].t_s - ev[0].t_s) / (len(ev) - 1)
        out.append(
            Check(
                "time per output token = (last token's time − first token's time) ÷ (tokens − 1), from the raw events",
                abs(tpot - m.tpot_s) < 1e-9,
                f"{tpot * 1000:.2f} ms recomputed vs {m.tpot_s * 1000:.2f} ms shown; TTFT = the first event's time, {ev[0].t_s * 1000:.0f} ms",
            )
        )
    return out


def check_matmul_probe(mm) -> Check:
    """The probe's FLOP/s = 2 n³ / its own measured time."""
    want = 2 * mm.n**3 / mm.seconds / 1e12
    return Check(
        f"matmul FLOP/s = 2 × {mm.n}³ ÷ measured time",
        abs(want - mm.tflops) <= 1e-9 * max(1.0, want),
        f"2 × {mm.n}³ = {2 * mm.n**3:.3e} FLOP in {mm.seconds * 1000:.2f} ms = {want * 1000:,.0f} GFLOP/s",
    )


def check_profile(prof) -> Check:
    """The matmul share = matmul operators' time ÷ all operators' time of the same profiled step."""
    share = prof.matmul_us / prof.total_us if prof.total_us else 0.0
    return Check(
        "matmul share = matmul operators' self time ÷ all operators' self time (the median profiled step)",
        abs(share - prof.matmul_share) < 1e-9,
        f"{prof.matmul_us:,.0f} µs of {prof.total_us:,.0f} µs = {share:.1%}",
    )


def roofline_checks(rf) -> list[Check]:
    """The roofline page: every operation's bound recomputed from its FLOPs and bytes and the two measured roofs; the ridge
    and the decode ceiling from their formulas."""
    bad = []
    n = 0
    for ph in rf.phases.values():
        for op in ph.ops:
            n += 1
            want = max(op.flops / rf.peak_flops, op.bytes / rf.bandwidth)
            if abs(want - op.bound_s) > 1e-9 * max(want, 1e-12) or abs(op.intensity - op.flops / max(op.bytes, 1)) > 1e-9 * max(op.intensity, 1):
                bad.append(op.op)
    ceiling = rf.bandwidth / (rf.weight_bytes + rf.kv_bytes)
    return [
        Check(
            "each operation's bound = max(FLOPs ÷ peak, bytes ÷ bandwidth), its intensity = FLOPs ÷ bytes",
            not bad,
            f"{n} operations recomputed" + (f"; different: {', '.join(bad)}" if bad else ", all equal"),
        ),
        Check(
            "ridge = peak ÷ bandwidth; decode ceiling = bandwidth ÷ (weight bytes + KV bytes)",
            abs(ceiling - rf.decode_ceiling_tokens_per_s) <= 1e-9 * ceiling,
            f"ridge {rf.peak_flops / rf.bandwidth:.1f} FLOP/byte; ceiling {ceiling:,.1f} tokens/s",
        ),
    ]


def check_kernels_agree(rows, tol: float) -> Check:
    """The attention-kernels page: every attention kernel's logits against eager attention's on the same prompt."""
    ok_rows = [r for r in rows if r.max_diff_vs_eager is not None]
    worst = max((r.max_diff_vs_eager for r in ok_rows), default=0.0)
    return Check(
        "every kernel gives the same logits as eager attention (softmax(QKᵀ/√d)·V written out)",
        worst < tol if ok_rows else None,
        f"{len(ok_rows)} runs compared; largest |difference| {worst:.1e} (tolerance {tol:g})",
    )


def check_sse(events, lines: list[str], text: str) -> Check:
    """The streaming page: the stream's messages, parsed back, carry exactly the generated text, in order."""
    import json

    got = "".join(json.loads(ln.split("data: ", 1)[1])["text"] for ln in lines if ln.startswith("event: token"))
    return Check(
        "the event stream, parsed back, carries exactly the generated tokens' text",
        got == text and len(lines) == len(events) + 1,
        f"{len(events)} token messages + [DONE]; {len(got)} characters, " + ("identical" if got == text else "different"),
    )


def check_plan_params(lm: LoadedModel, stages) -> Check:
    """The streaming page: the pipeline plan places every weight exactly once (its devices' bytes sum to the model's)."""
    model_mb = sum(p.numel() for p in lm.model.parameters()) * lm.arch.bytes_per_value / 2**20
    planned = sum(s.weights_mb for s in stages)
    return Check(
        "the plan places every weight once: its devices' MiB add up to the model's parameters",
        abs(planned - model_mb) <= 0.01 * model_mb + 0.1,
        f"{planned:,.1f} MiB planned vs {model_mb:,.1f} MiB of parameters (tied embeddings counted once)",
    )


def check_attribution(a) -> Check:
    """The shares of a direct logit attribution sum to the model's own logit (pipeline.forward.attribution)."""
    d = abs(a.total - a.logit)
    return Check(
        "the shares (embedding + every head + every feed-forward block + biases) sum to the model's own logit",
        d < 1e-3 * max(1.0, abs(a.logit)),
        f"sum {a.total:.5f} vs logit {a.logit:.5f}: difference {d:.1e}",
        d,
    )


def check_ablation(lm: LoadedModel, tr, layer: int, head: int) -> Check:
    """Switching a head off through hooks = a plain forward of the model with that head's slice of the attention output projection zeroed."""
    from pipeline.forward.attribution import Component, Kind, ablate

    got = ablate(lm, tr, [Component(Kind.HEAD, layer, head)]).after
    D = lm.facts.head_dim
    W = lm.arch.attn_out_weight(layer)  # [d, H*D] (a view of GPT-2's transposed Conv1D weight: writes reach it)
    from pipeline.model.capture import as_traced

    with lm.lock, torch.no_grad(), as_traced():  # the trace's attention kernel, as ablation runs it
        saved = W.detach().clone()
        try:
            W[:, head * D : (head + 1) * D] = 0
            ref = torch.softmax(lm.model(input_ids=torch.tensor([tr.input_ids], device=lm.device)).logits[0, -1].float(), -1).cpu()
        finally:
            W.copy_(saved)
    d = float((got - ref).abs().max())
    return Check(
        f"switching L{layer} H{head} off = the model with that head's columns of the attention output projection set to zero (a plain forward)",
        d < 1e-5,
        f"largest difference of the next-token probabilities {d:.1e}",
        d,
    )


def check_step(lm: LoadedModel, got, step: int) -> Check:
    """A recorded decode step's rows (pipeline.generation.steps) against the last row of a full forward over the same
    ids with transformers' eager attention, at every layer."""
    s = got.steps[step]
    with lm.lock, torch.inference_mode(), lm.arch.attention_as("eager"):
        att = lm.model(input_ids=torch.tensor([got.ids[: s.cache_len]], device=lm.device), output_attentions=True, use_cache=False).attentions
    d = max(float(np.abs(s.attention[i] - att[i][0, :, -1].float().cpu().numpy()).max()) for i in range(len(att)))
    return Check(
        "each head's row = the last row of a full eager forward over the same ids", d <= 2e-3, f"step {step}, every layer: max |difference| {d:.1e}", d
    )
