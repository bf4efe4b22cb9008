"""A generation nobody records runs at the speed it ran before the decode-step recording (issue 57) landed: our
decode loop (pipeline.generate, greedy, the chat "Why is the sky blue?") timed in this checkout and in a git worktree
of the commit before the recording (BASE), each in its own process, the two sides alternated pair by pair; the
median tokens/s ratio (goal ~1.0) with its min-max over the pairs. Also, for scale, what recording costs
(pipeline.generation.steps, every layer's newest query kept) beside a generation of the same length, in this checkout.

    .venv/bin/python bench/bench_steps_off.py [--tokens 48] [--pairs 5] [--base efecc98]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import ROOT, write

BASE = "efecc98"  # the last commit before pipeline.generation.steps (65c10a0)

PROBE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])  # this tree's pipeline first (the editable install points at the main checkout)
import pipeline
from pipeline.generation import generate
n, reps, record = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
assert pipeline.__file__.startswith(sys.argv[1]), pipeline.__file__
lm = pipeline.load_model()
prompt = "Why is the sky blue?"
list(generate(lm, prompt, n, chat=True))  # warm-up, outside the measured set
out = {"generate": [], "steps": []}
for _ in range(reps):
    t = time.perf_counter(); ev = list(generate(lm, prompt, n, chat=True)); dt = time.perf_counter() - t
    out["generate"].append(len(ev) / dt)
if record:  # after every measured generation: nothing recorded runs before or between them
    from pipeline.generation import steps
    for _ in range(reps):
        t = time.perf_counter(); s = steps(lm, prompt, new=n, chat=True); dt = time.perf_counter() - t
        out["steps"].append(len(s.steps) / dt)
print("RESULT " + json.dumps(out))
"""


def run(tree: str, n: int, reps: int, record: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    p = subprocess.run(
        [sys.executable, "-c", PROBE, tree, str(n), str(reps), "1" if record else "0"], cwd=tree, env=env, capture_output=True, text=True, timeout=900
    )
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{tree}: {p.stderr[-2000:]}")
    return json.loads(line[7:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="generations timed in each process")
    ap.add_argument("--base", default=BASE)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", base, a.base], check=True, capture_output=True)
        try:
            now_tps, base_tps, rec_tps, ratios = [], [], [], []
            for i in range(a.pairs):
                sides = [("now", str(ROOT)), ("base", base)]
                if i % 2:
                    sides.reverse()  # alternate which side runs first
                got = {name: run(tree, a.tokens, a.reps, record=name == "now") for name, tree in sides}
                now, was = statistics.median(got["now"]["generate"]), statistics.median(got["base"]["generate"])
                now_tps.append(now)
                base_tps.append(was)
                rec_tps += got["now"]["steps"]
                ratios.append(now / was)
                print(f"pair {i}: now {now:.1f} tok/s, base {was:.1f} tok/s, ratio {now / was:.3f}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", base], capture_output=True)
    gen = statistics.median(now_tps)
    write(
        "steps_off",
        {
            "what": "our decode loop's tokens/s with the recording off, this checkout vs the commit before it landed",
            "tokens": a.tokens,
            "pairs": a.pairs,
            "base": a.base,
            "now_tokens_per_s": round(gen, 2),
            "base_tokens_per_s": round(statistics.median(base_tps), 2),
            "ratio_now_over_base": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
            "recording_on_steps_per_s": round(statistics.median(rec_tps), 2),
            "recording_cost_x": round(gen / statistics.median(rec_tps), 2),
        },
    )


if __name__ == "__main__":
    main()
