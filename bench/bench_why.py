"""Why this token, fast enough to explore: on a 64-token prompt, the trace the page starts from, then attribution
and the contribution graph (both read from the trace's activations: no forward pass) and an intervention (the 5
largest heads switched off: one forward, the trace's logits are the "before"), each against a
plain forward of the same prompt; and the patching grids (16 tokens x every layer, by position and by head).
Interleaved repeats in one process; medians with min and max.

    .venv/bin/python bench/bench_why.py [--reps 5] [--model smollm2-135m-instruct]
"""

import argparse
import statistics
import time

from common import write


def stats(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4), "n": len(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args()
    import torch

    import pipeline
    from pipeline.forward.attribution import Kind, ablate, attribute, flow, patch

    lm = pipeline.load_model(args.model)
    base = "The Eiffel Tower is in Paris, the Colosseum is in Rome, and Big Ben is in London. " * 4
    ids = pipeline.tokenize(lm.tokenizer, base).input_ids[:63] + pipeline.tokenize(lm.tokenizer, " The capital of France is").input_ids[-1:]
    prompt = lm.tokenizer.decode(ids, skip_special_tokens=True)
    ids = pipeline.tokenize(lm.tokenizer, prompt).input_ids  # the prompt as the page tokenizes it
    clean = pipeline.trace(lm, "Everyone in the world knows that the Eiffel Tower is in the beautiful city of")  # 16 tokens
    corrupt = pipeline.trace(lm, "Everyone in the world knows that the Colosseum is in the beautiful city of")

    def plain():
        with lm.lock, torch.inference_mode():
            lm.model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=1)  # the last position's logits, as every step below

    tr = pipeline.trace(lm, prompt)
    a = attribute(lm, tr)
    heads = [c for c, _ in a.largest(None) if c.kind is Kind.HEAD][:5]
    # each step on this thread, as a notebook or the CLI runs it (the page runs them on the model's own thread, lm.run,
    # where a step right after other torch work on another thread can wait for that work's OpenMP team to stop spinning)
    steps = {
        "plain_forward": plain,
        "trace": lambda: pipeline.trace(lm, prompt),
        "attribution": lambda: attribute(lm, tr),  # read from the trace: no forward pass
        "contribution_graph": lambda: flow(lm, tr).graph(0.05),  # read from the trace too
        "intervention_5_heads": lambda: ablate(lm, tr, heads),  # the trace's logits are the "before": one forward
    }
    for fn in steps.values():  # warm-up, outside the measured set
        fn()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.reps):
        for name, fn in steps.items():  # interleaved: each repeat runs every step once
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    grids = {}
    same = clean.T == corrupt.T
    for over in ("position", "head"):
        if not same:
            break
        ts = []
        for _ in range(max(1, args.reps // 2)):
            t = time.perf_counter()
            p = patch(lm, clean, corrupt, over=over)
            ts.append(time.perf_counter() - t)
        grids[over] = {"grid": list(p.grid.shape), "seconds": stats(ts)}
    med = {k: statistics.median(v) for k, v in times.items()}
    write(
        f"why_{args.model.split('-')[0]}",
        {
            "model": lm.label,
            "device": str(lm.device),
            "prompt_tokens": len(ids),
            "seconds": {k: stats(v) for k, v in times.items()},
            "attribution_plus_graph_s": round(med["attribution"] + med["contribution_graph"], 4),
            "goal_attribution_plus_graph_s": 1.0,
            "intervention_vs_trace": round(med["intervention_5_heads"] / med["trace"], 3),
            "patching": {"tokens": clean.T, "layers": lm.facts.n_layers, **grids} if same else f"clean {clean.T} vs corrupt {corrupt.T} tokens",
            "goal_patching_s": 10.0,
        },
    )


if __name__ == "__main__":
    main()
