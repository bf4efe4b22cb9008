"""Command line: `python -m pipeline tokens|next|trace|generate|explain|steps "prompt" [--json]`, `patch CLEAN CORRUPT`.

`steps` walks the decode loop: every step's newest query over every cached key (`--new N --layer L [--chat]`).

`explain` takes the next token's logit apart (direct logit attribution: the embedding, every head, every
feed-forward block; their sum is the logit) and, with --ablate, switches components off and shows the distribution
before and after.

`generate` goes through the model's serving engine (pipeline.engine), as the app's pages do; several prompts
(repeat the argument) are served together, continuously batched."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from pipeline.forward.tokens import text_of

PRECISIONS = ("fp32", "int8")  # pipeline.model.quantised.PRECISIONS (not imported here: the CLI's help loads no torch)


def _load(args):
    """The model named by --model (a built-in key, a folder, or a Hugging Face id in the local cache) in --precision
    (int8: weight-only int8, a model of its own); for a folder or an id its size and the free memory are said on
    stderr before it loads."""
    from pipeline.model.loaded import load_model

    return load_model(args.model, told=lambda sentence: sys.stderr.write(sentence + "\n"), precision=getattr(args, "precision", "fp32"))


def cmd_tokens(args, out):
    from pipeline.forward.tokens import tokenize

    lm = _load(args)
    tk = tokenize(lm.tokenizer, args.prompt, chat=args.chat)
    rows = [{"i": i, "id": t.id, "piece": t.piece, "text": t.text, "start": t.start, "end": t.end, "special": t.special} for i, t in enumerate(tk.tokens)]
    if args.json:
        json.dump(
            {
                "model": lm.label,
                "chat": tk.chat,
                "text": tk.text,
                "n_tokens": len(rows),
                "n_words": len(args.prompt.split()),
                "n_chars": len(args.prompt),
                "tokens": rows,
            },
            out,
            ensure_ascii=False,
            indent=1,
        )
        out.write("\n")
    else:
        out.write(f"{lm.label}: {len(rows)} tokens, {len(args.prompt.split())} words, {len(args.prompt)} chars\n")
        for r in rows:
            out.write(f"{r['i']:>4} {r['id']:>7}  {r['text']!r}{'  (special)' if r['special'] else ''}\n")


def cmd_next(args, out):
    from pipeline.forward.sampling import Sampling, entropy_bits, filter_probs
    from pipeline.forward.tracing import trace

    lm = _load(args)
    tr = trace(lm, args.prompt, chat=args.chat)
    logits = tr.next_logits
    if args.ablate:  # those heads' outputs (their slice of the output projection's input) or feed-forward blocks set to zero
        from pipeline.forward.attribution import ablate, parse_components

        logits = ablate(lm, tr, parse_components(args.ablate)).logits_after
    p = filter_probs(logits, Sampling(args.temperature, args.top_k, args.top_p, args.min_p)).numpy()
    order = np.argsort(-p)[: args.n]
    cands = [{"id": int(i), "text": text_of(lm.tokenizer, [int(i)]), "p": float(p[i])} for i in order if p[i] > 0]
    res = {
        "model": lm.label,
        "prompt": args.prompt,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "candidates_kept": int((p > 0).sum()),
        "entropy_bits": entropy_bits(p),
        "ablated": args.ablate,
        "top": cands,
    }
    if args.json:
        json.dump(res, out, ensure_ascii=False, indent=1)
        out.write("\n")
    else:
        out.write(
            f"{lm.label} | T={args.temperature} top-k={args.top_k} top-p={args.top_p} min-p={args.min_p} | "
            f"{res['candidates_kept']} candidates kept, entropy {res['entropy_bits']:.2f} bits\n"
        )
        for c in cands:
            out.write(f"{c['p']:8.4f}  {c['text']!r}  (id {c['id']})\n")


def cmd_trace(args, out):
    from pipeline.forward.tracing import trace

    lm = _load(args)
    tr = trace(lm, args.prompt, chat=args.chat)
    f = tr.facts
    nxt = int(tr.next_logits.argmax())
    res = {
        "model": lm.label,
        "device": tr.device,
        "n_tokens": tr.T,
        "config": {
            "layers": f.n_layers,
            "heads": f.n_heads,
            "kv_heads": f.n_kv_heads,
            "head_dim": f.head_dim,
            "d_model": f.d_model,
            "vocab": f.vocab,
            "positional": f.positional,
            "norm": f.norm,
        },
        "tokens": [t.text for t in tr.tokens],
        "shapes": {"activations": {n: list(tr.acts[n].shape) for n in tr.acts.names() if "*" in n or "." not in n}, "next_logits": list(tr.next_logits.shape)},
        "residual_norm_last_token": [round(float(x), 3) for x in tr.acts["blocks.*.hook_resid_pre|norm"][:, -1]],
        "logit_lens_last_token": [{"layer": i, "top": text_of(lm.tokenizer, [top[0][0]]), "p": round(top[0][1], 4)} for i, top in enumerate(tr.lens_last_top)],
        "next_token": {"id": nxt, "text": text_of(lm.tokenizer, [nxt])},
        "timings_ms": {k: round(v * 1000, 2) for k, v in tr.timings.items()},
    }
    if args.json:
        json.dump(res, out, ensure_ascii=False, indent=1)
        out.write("\n")
    else:
        out.write(f"{lm.label} on {tr.device}: {tr.T} tokens -> next token {res['next_token']['text']!r}\n")
        for k, v in res["timings_ms"].items():
            if not k.startswith("layer "):
                out.write(f"  {k:<28} {v:9.2f} ms\n")


def cmd_generate(args, out):
    from pipeline.engine import engine_for
    from pipeline.forward.sampling import Sampling
    from pipeline.generation.loop import prepare
    from pipeline.serving import Waiting, stream

    lm = _load(args)
    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed)
    # every request submitted before any is read: the engine batches them
    streams = [stream(lm, prepare(lm, p, args.max_new_tokens, args.chat), sampling) for p in args.prompts]
    res = []
    for p, s in zip(args.prompts, streams):
        ev = [e for e in s if not isinstance(e, Waiting)]
        res.append(
            {
                "prompt": p,
                "tokens": [e.token_id for e in ev],
                "text": text_of(lm.tokenizer, [e.token_id for e in ev], specials=False),
                "finished": ev[-1].finished if ev else None,
                "ttft_ms": round(ev[0].t_s * 1000, 1) if ev else None,
                "max_batch": max((e.batch for e in ev), default=0),
            }
        )
    if args.json:
        json.dump({"model": lm.label, "precision": lm.precision, "engine": engine_for(lm).name, "results": res}, out, ensure_ascii=False, indent=1)
        out.write("\n")
    else:
        for r in res:
            out.write(f"{r['prompt']!r} -> {r['text']!r} ({len(r['tokens'])} tokens, {r['finished']})\n")


def _token(lm, text: str) -> int:
    """A token given as an id ("7042") or as text (" Paris": one token) -> its id; an error that says why not."""
    vocab = lm.facts.vocab
    if text.strip().isdigit():
        i = int(text)
        if not 0 <= i < vocab:
            raise ValueError(f"token id {i} is outside this model's vocabulary of {vocab:,}")
        return i
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"{text!r} is {len(ids)} tokens for this model ({[text_of(lm.tokenizer, [i]) for i in ids]}): name one token")
    return ids[0]


def cmd_explain(args, out):
    from pipeline.forward.attribution import ablate, attribute, parse_components
    from pipeline.forward.tracing import check_prompt, trace

    check_prompt(args.prompt)
    parts = parse_components(args.ablate) if args.ablate else None
    lm = _load(args)
    tr = trace(lm, args.prompt, chat=args.chat)
    versus = _token(lm, args.versus) if args.versus else None
    a = attribute(lm, tr, _token(lm, args.token) if args.token else None, versus)
    target = a.target
    res = {
        "model": lm.label,
        "prompt": args.prompt,
        "token": {"id": target, "text": text_of(lm.tokenizer, [target])},
        "versus": {"id": versus, "text": text_of(lm.tokenizer, [versus])} if versus is not None else None,
        "logit": a.logit,
        "sum": a.total,
        "components": a.components(),
    }
    if parts is not None:
        d = ablate(lm, tr, parts, args.mode)
        res["ablation"] = {
            "mode": args.mode,
            "switched_off": args.ablate,
            "token": text_of(lm.tokenizer, [d.token]),
            "p_before": float(d.before[d.token]),
            "p_after": float(d.after[d.token]),
            "rank_after": d.new_rank,
            "kl_nats": d.kl,
        }
    if args.json:
        json.dump(res, out, ensure_ascii=False, indent=1)
        out.write("\n")
        return
    vs = f" - logit({res['versus']['text']!r})" if versus is not None else ""
    out.write(f"{lm.label}: logit({res['token']['text']!r}){vs} = {a.logit:.4f}; the shares sum to {a.total:.4f}\n")
    for c in res["components"][: args.n]:
        out.write(f"  {c['name']:<12} {c['contribution']:+.4f}\n")
    if parts is not None:
        ab = res["ablation"]
        out.write(
            f"without {args.ablate} ({args.mode}): {ab['token']!r} p {ab['p_before']:.3f} -> {ab['p_after']:.3f}, rank {ab['rank_after']}, "
            f"KL {ab['kl_nats']:.3f} nats\n"
        )


def cmd_patch(args, out):
    from pipeline.forward.attribution import patch
    from pipeline.forward.tracing import check_prompt, trace

    check_prompt(args.clean)
    check_prompt(args.corrupt)
    lm = _load(args)
    clean_tr, corrupt_tr = trace(lm, args.clean, chat=args.chat), trace(lm, args.corrupt, chat=args.chat)
    clean, corrupt = clean_tr.input_ids, corrupt_tr.input_ids
    p = patch(lm, clean_tr, corrupt_tr, over=args.over)
    res = {
        "model": lm.label,
        "clean": args.clean,
        "corrupt": args.corrupt,
        "tokens": [text_of(lm.tokenizer, [t]) for t in clean],
        "corrupt_tokens": [text_of(lm.tokenizer, [t]) for t in corrupt],
        "clean_answer": text_of(lm.tokenizer, [p.clean_token]),
        "corrupt_answer": text_of(lm.tokenizer, [p.corrupt_token]),
        "clean_diff": p.clean_diff,
        "corrupt_diff": p.corrupt_diff,
        "over": p.over,
        "grid": [[round(float(v), 6) for v in row] for row in p.grid],  # [layer][position or head]: 1 = the clean difference back
    }
    if args.json:
        json.dump(res, out, ensure_ascii=False, indent=1)
        out.write("\n")
        return
    out.write(f"{lm.label}: logit({res['clean_answer']!r}) - logit({res['corrupt_answer']!r}): clean {p.clean_diff:.3f}, corrupted {p.corrupt_diff:.3f}\n")
    out.write(f"share of it restored, layer by {p.over} (rows: layers)\n")
    cols = res["tokens"] if p.over == "position" else [f"H{h}" for h in range(p.grid.shape[1])]
    out.write("      " + " ".join(f"{t[:6]:>6}" for t in cols) + "\n")
    for i, row in enumerate(p.grid):
        out.write(f"L{i:<4} " + " ".join(f"{v:6.2f}" for v in row) + "\n")


def _add_readouts(sub) -> None:
    """tokens, next, trace: a prompt's tokens, its next-token candidates, its whole trace."""
    for name, fn in [("tokens", cmd_tokens), ("next", cmd_next), ("trace", cmd_trace)]:
        p = sub.add_parser(name)
        p.add_argument("prompt")
        p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
        p.add_argument("--json", action="store_true")
        p.set_defaults(fn=fn)
        if name == "next":
            p.add_argument("--temperature", type=float, default=1.0)
            p.add_argument("--top-k", type=int, default=0)
            p.add_argument("--top-p", type=float, default=1.0)
            p.add_argument("--min-p", type=float, default=0.0)
            p.add_argument("-n", type=int, default=10, help="how many candidates to print")
            p.add_argument("--ablate", default=None, help="switch heads or feed-forward blocks off (zeroed) first: 5.3,7.mlp")


def _add_why(sub) -> None:
    """explain and patch: why this token (attribution, ablation) and activation patching."""
    p = sub.add_parser("explain", help="why this token: direct logit attribution, and ablation with --ablate")
    p.add_argument("prompt")
    p.add_argument("--chat", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--token", default=None, help="the candidate to explain: an id, or its text (default: the most likely next token)")
    p.add_argument("--versus", default=None, help="explain logit(target) - logit(this candidate)")
    p.add_argument("-n", type=int, default=10, help="how many of the largest shares to print")
    p.add_argument("--ablate", default=None, help="components to switch off: 5.3,7.mlp (or L5H3,L7FFN)")
    p.add_argument("--mode", choices=("zero", "mean"), default="zero")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("patch", help="activation patching: restore the clean run's residual stream at each (layer, position)")
    p.add_argument("clean")
    p.add_argument("corrupt")
    p.add_argument("--chat", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--over", choices=("position", "head"), default="position", help="restore one position's stream, or one head's output everywhere")
    p.set_defaults(fn=cmd_patch)


def cmd_steps(args, out):
    from pipeline.generation.steps import steps

    lm = _load(args)
    L = lm.facts.n_layers
    layer = args.layer if args.layer is not None else L - 1
    if not -L <= layer < L:
        raise ValueError(f"--layer {args.layer}: this model has layers 0-{L - 1}")
    got = steps(lm, args.prompt, new=args.new, chat=args.chat, temperature=args.temperature, seed=args.seed)
    rows = [
        {
            "step": i,
            "token_id": s.token_id,
            "token": s.token,
            "p": round(s.p, 6),
            "cache_len": s.cache_len,
            "kv_bytes": s.kv_bytes,
            "seconds": round(s.seconds, 6),
            "attention": [[round(float(w), 6) for w in head] for head in s.attention[layer]],
        }
        for i, s in enumerate(got.steps)
    ]
    if args.json:
        json.dump({"model": lm.label, "layer": layer % L, "prompt_ids": got.prompt_ids, "steps": rows}, out, ensure_ascii=False)
        out.write("\n")
        return
    out.write(f"{lm.label}, layer {layer % L}: step, token, p, keys attended, KV cache, time, each head's top key\n")
    for r, s in zip(rows, got.steps):
        tops = " ".join(f"h{h}:{int(np.argmax(w))}" for h, w in enumerate(s.attention[layer]))
        out.write(
            f"{r['step']:>4} {r['token']!r:>12} p={r['p']:.3f} keys={r['cache_len']:>5} kv={r['kv_bytes'] / 1024:,.0f} KiB {r['seconds'] * 1000:7.1f} ms  {tops}\n"
        )


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate through the serving engine (several prompts: batched)")
    p.add_argument("prompts", nargs="+")
    p.add_argument("--chat", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=PRECISIONS, default=argparse.SUPPRESS, help="as the option before the command")
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser("steps", help="every decode step's newest query over the KV cache: one row per head (step 0: the prompt's last query)")
    p.add_argument("prompt")
    p.add_argument("--new", type=int, default=8, help="decode steps (tokens generated)")
    p.add_argument("--layer", type=int, default=None, help="the layer whose rows are printed (default: the last)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default); above 0: sampled with --seed")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_steps)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__)
    ap.add_argument("--model", default=None, help="smollm2-135m-instruct (default), gemma3-270m, or a local folder")
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32", help="int8: the model's projections in int8 weight-only, on a CPU")
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_readouts(sub)
    _add_why(sub)
    _add_generate(sub)
    return ap


def _not_utf8(args) -> str | None:
    """What is wrong with a prompt argument that is not UTF-8 text (argv bytes that are not UTF-8 arrive as lone
    surrogates), or None."""
    for text in [getattr(args, "prompt", ""), getattr(args, "clean", ""), getattr(args, "corrupt", "")] + list(getattr(args, "prompts", None) or []):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"the prompt is not valid UTF-8 text (at character {e.start}); pass text, or fix the terminal's encoding"
    return None


def main(argv=None, out=None) -> int:
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    bad = _not_utf8(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    from pipeline.forward.tracing import TraceError
    from pipeline.model.registry import ModelLoadError

    try:
        args.fn(args, out)
    except (ModelLoadError, TraceError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
