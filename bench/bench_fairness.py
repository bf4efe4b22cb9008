"""A visitor's trace while another visitor's heavy experiment runs (page 11's kernel sweep): how long the trace
waits for the model. Before: the sweep held the model lock for its whole run (49.7 s measured in the issue) and
a plain threading.Lock let the sweep's loop win the lock again and again. Now the sweep takes the lock per
measurement and the lock goes to the longest waiter (pipeline.model.FairLock).

Interleaved: each repeat times the trace on an idle model, then during a sweep; medians and ranges.

    .venv/bin/python bench/bench_fairness.py [--reps 3]
"""

import argparse
import statistics
import threading
import time

from common import write


def main():
    import pipeline
    from pipeline.lab.attention_kernels import available_kernels, kernel_sweep

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    lm = pipeline.load_model()
    kernels = available_kernels(lm)
    lengths = [128, 512, 1024]
    idle, busy, sweep_s = [], [], []
    for r in range(a.reps):
        prompt = f"Repeat {r}: why does the moon look bigger near the horizon?"
        t = time.perf_counter()
        pipeline.trace(lm, prompt)
        idle.append(time.perf_counter() - t)
        done = threading.Event()

        def sweep():
            t0 = time.perf_counter()
            kernel_sweep(lm, lengths, kernels)
            sweep_s.append(time.perf_counter() - t0)
            done.set()

        th = threading.Thread(target=sweep)
        th.start()
        time.sleep(2.0)  # the sweep is under way
        t = time.perf_counter()
        pipeline.trace(lm, prompt + " (during the sweep)")
        busy.append(time.perf_counter() - t)
        th.join()

    def summary(xs):
        return {"median_s": round(statistics.median(xs), 2), "min_s": round(min(xs), 2), "max_s": round(max(xs), 2)}

    write(
        "fairness",
        {
            "what": "a short prompt's trace on an idle model vs while page 11's kernel sweep runs (lengths 128, 512, 1024; every kernel)",
            "kernels": kernels,
            "trace_idle": summary(idle),
            "trace_during_sweep": summary(busy),
            "sweep": summary(sweep_s),
            "ratio_median": round(statistics.median(b / i for b, i in zip(busy, idle)), 1),
        },
    )


if __name__ == "__main__":
    main()
