"""The seed's common misconceptions, each tested on the loaded model (views/stages/misconceptions.py).

    forced = force_token(lm, "The capital of France is", n=12, at=2)   # "it writes the whole answer first"
    words = word_pieces(lm.tokenizer)                                    # "it reads words"
    temps = temperature_sweep(trace.next_logits)                         # "temperature makes it smarter"
    cost = context_cost(lm, [32, 128, 512])                              # "a longer context is free"
    mem = no_memory(lm, "Why is the sky blue?", "Dog bites man.")        # "it remembers earlier chats"

Each result carries the checks that make its point (pipeline.lab.checks.Check), with the measured numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.forward.sampling import Sampling, entropy_bits, filter_probs
from pipeline.forward.tokens import text_of
from pipeline.lab.checks import Check
from pipeline.model.loaded import LoadedModel


# ---------------------------------------------------------------- 1. "it writes the whole answer, then streams it"
@dataclass(eq=False)
class ForcedToken:
    prompt_ids: list[int]
    original: list[int]  # greedy tokens
    at: int  # the step whose token was replaced
    forced: int  # the token put there instead (the runner-up at that step)
    after: list[int]  # greedy tokens after the forced one
    step_ms: list[float]  # the original run's time per step (ms): one forward pass each
    checks: list[Check] = field(default_factory=list)


def force_token(lm: LoadedModel, prompt: str, n: int = 12, at: int = 2, chat: bool = False) -> ForcedToken:
    """Generate n greedy tokens; then put the runner-up token at step `at` and let the model go on greedily.
    If the answer were written ahead of time, the rest would not change; it does, from the very next token."""
    from pipeline.generation.decode import CacheMode
    from pipeline.generation.loop import generate, prepare

    req = prepare(lm, prompt, n, chat)
    events = list(generate(lm, prompt, n, chat=chat, request=req, cache=CacheMode.DYNAMIC, stop_ids=set()))
    original = [e.token_id for e in events]
    at = max(0, min(at, len(original) - 2))
    runner_up = next(t for t, _, _ in events[at].top_raw if t != original[at])  # before the filters: greedy keeps one
    head = req.prompt_ids + original[:at] + [runner_up]
    rest = n - at - 1
    req2 = type(req)(head, rest, [])
    after = [e.token_id for e in generate(lm, "", rest, request=req2, cache=CacheMode.DYNAMIC, stop_ids=set())]
    same_tail = after == original[at + 1 :]
    step_ms = [e.step_s * 1000 for e in events]
    return ForcedToken(
        req.prompt_ids,
        original,
        at,
        runner_up,
        after,
        step_ms,
        [
            Check(
                "changing one token changes what follows: the rest was not written in advance",
                not same_tail,
                f"token {at} replaced by the runner-up; {sum(a != b for a, b in zip(after, original[at + 1 :]))} of the next {len(after)} tokens differ",
            ),
            Check(
                "one forward pass per token: each token has its own step time",
                len(step_ms) == len(original) and all(t > 0 for t in step_ms),
                f"{len(step_ms)} steps, {min(step_ms):.0f}-{max(step_ms):.0f} ms each (the first includes reading the prompt)",
            ),
        ],
    )


# --------------------------------------------------------------------------------------- 2. "it reads words"
WORD_FORMS = ["Apple", " Apple", "apple", " apple", " APPLE", " apples", " strawberry", " strawbery", " unbelievable", " Paris"]


@dataclass
class WordPieces:
    rows: list[dict]  # form, pieces, ids
    checks: list[Check]


def word_pieces(tokenizer, forms: list[str] | None = None) -> WordPieces:
    """The same word in different forms, tokenised: capitals, a leading space, a plural and a misspelling give
    different ids and often several pieces. The model sees ids, not words."""
    forms = forms or WORD_FORMS
    rows = []
    for w in forms:
        ids = tokenizer(w, add_special_tokens=False)["input_ids"]
        rows.append({"text": w, "pieces": [text_of(tokenizer, [i]) for i in ids], "ids": ids})
    apple = {r["text"]: tuple(r["ids"]) for r in rows if r["text"].strip().lower() == "apple"}
    multi = [r["text"] for r in rows if len(r["ids"]) > 1]
    back = all(tokenizer.decode(r["ids"]) == r["text"] for r in rows)
    return WordPieces(
        rows,
        [
            Check(
                "one word, several id sequences: 'Apple', ' Apple', 'apple' and ' apple' are different tokens",
                len(set(apple.values())) == len(apple) > 1,
                f"{len(apple)} forms, {len(set(apple.values()))} different id sequences",
            ),
            Check(
                "some words are several pieces (a misspelling most of all)", bool(multi), f"split into pieces: {', '.join(repr(m) for m in multi) or 'none'}"
            ),
            Check("the pieces decode back to exactly the text", back, f"{len(rows)} forms round-tripped through the tokenizer"),
        ],
    )


# ------------------------------------------------------------------------ 3. "temperature makes it smarter"
TEMPERATURES = [0.2, 0.5, 0.7, 1.0, 1.5, 2.0]


@dataclass
class TemperatureRow:
    temperature: float
    top_id: int  # the most likely token at this temperature
    top_p: float  # its probability
    entropy_bits: float
    n_for_90: int  # candidates needed to cover 90% of the probability


@dataclass
class TemperatureSweep:
    rows: list[TemperatureRow]
    checks: list[Check]


def temperature_sweep(logits: torch.Tensor, temperatures: list[float] | None = None) -> TemperatureSweep:
    """One next-token distribution at several temperatures: the ranking (and so the best answer) never changes;
    only how much probability the unlikely candidates get."""
    logits = torch.as_tensor(logits).float()
    rows = []
    for t in temperatures or TEMPERATURES:
        p = filter_probs(logits, Sampling(temperature=t)).reshape(-1)
        s, _ = p.sort(descending=True)
        rows.append(TemperatureRow(t, int(p.argmax()), float(p.max()), entropy_bits(p), int((s.cumsum(0) < 0.9).sum()) + 1))
    order = logits.reshape(-1).argsort(descending=True)[:20]
    same_rank = all(
        torch.equal(filter_probs(logits, Sampling(temperature=t)).reshape(-1)[order].argsort(descending=True), torch.arange(len(order)))
        for t in temperatures or TEMPERATURES
    )
    return TemperatureSweep(
        rows,
        [
            Check(
                "the same most likely token at every temperature (no new knowledge)",
                len({r.top_id for r in rows}) == 1,
                f"{len(rows)} temperatures, {len({r.top_id for r in rows})} distinct top token(s)",
            ),
            Check("the top 20 candidates keep their order at every temperature", same_rank, "softmax(logits / T) is monotonic in the logits for any T > 0"),
            Check(
                "higher temperature spreads probability: entropy rises",
                all(a.entropy_bits <= b.entropy_bits + 1e-6 for a, b in zip(rows, rows[1:])),
                " → ".join(f"{r.entropy_bits:.2f}" for r in rows) + " bits",
            ),
        ],
    )


# ---------------------------------------------------------------------------- 4. "a longer context is free"
@dataclass
class ContextCost:
    rows: list[dict]  # tokens, prefill ms, decode step ms, KV MiB
    checks: list[Check]


def context_cost(lm: LoadedModel, lengths: list[int]) -> ContextCost:
    """Prefill time and KV cache bytes measured against the context length."""
    from pipeline.generation.loop import kv_bytes_formula
    from pipeline.generation.sweeps import prefill_decode_sweep

    sweep = prefill_decode_sweep(lm, lengths, decode_steps=4, repeats=3)
    rows = [
        {"tokens": r.tokens, "prefill ms": r.prefill_s * 1000, "decode step ms": r.decode_step_s * 1000, "KV cache MiB": kv_bytes_formula(lm, r.tokens) / 2**20}
        for r in sweep
    ]
    a, b = rows[0], rows[-1]
    return ContextCost(
        rows,
        [
            Check(
                "the KV cache grows with every token of context",
                b["KV cache MiB"] > a["KV cache MiB"],
                f"{a['tokens']:,} → {b['tokens']:,} tokens: {a['KV cache MiB']:.2f} → {b['KV cache MiB']:.2f} MiB per user",
            ),
            Check(
                "reading a longer prompt takes longer (prefill)",
                b["prefill ms"] > a["prefill ms"],
                f"{a['prefill ms']:.0f} → {b['prefill ms']:.0f} ms (medians of 3, this machine, this run)",
            ),
        ],
    )


# ---------------------------------------------------------------------- 5. "it remembers earlier chats"
@dataclass
class NoMemory:
    max_diff: float  # max |logits of the prompt, first time − the same prompt after another one|
    other_prompt: str
    checks: list[Check]


def no_memory(lm: LoadedModel, prompt: str, other: str) -> NoMemory:
    """The same prompt, run before and after a different one: the same logits. Nothing is learned or kept between
    requests; a chat's "memory" is the earlier turns sent again in the prompt (and its KV cache, per request)."""
    tok = lm.tokenizer

    def logits(text):
        ids = torch.tensor([tok(text)["input_ids"]], device=lm.device)
        with lm.lock, torch.inference_mode():
            return lm.model(ids, use_cache=False).logits[0, -1].float().cpu()

    first = logits(prompt)
    logits(other)
    again = logits(prompt)
    diff = float((first - again).abs().max())
    return NoMemory(
        diff,
        other,
        [
            Check(
                "the same prompt gives the same logits before and after another conversation",
                diff == 0.0,
                f"max |difference| over {first.numel():,} logits: {diff:.1e} (bit-identical: the weights did not change)",
            )
        ],
    )


# ------------------------------------------------- 5b. the same numbers whatever shares the server (the shared engine)
@dataclass
class SameInEngine:
    rows: list[dict]  # one per run: what shared its passes, the logits compared, how many differ
    exact_kernels: bool  # pipeline/decode_step/cpu/cpu_decode.c built: every pass sums in a fixed order, row by row
    checks: list[Check]


def _answer(engine, prompt_ids: list[int], n: int, name: str, then=None) -> list:
    """Greedy, `n` tokens, no stop token, every step's logits kept; `then(first_event)` runs after the first token."""
    evs = []
    for ev in engine.submit(prompt_ids, n, stop_ids=frozenset(), name=name, keep_logits=True):
        evs.append(ev)
        if len(evs) == 1 and then is not None:
            then()
    return evs


def _runs_in(engine, prompt_ids: list[int], n: int, others: list[list[int]]) -> list[tuple[str, list]]:
    """The prompt answered in `engine` twice: beside the other visitors' requests (sent once its first token is out),
    then again with its prompt's blocks from the prefix cache. [(label, its events)]."""
    sent = []

    def visitors():
        sent.extend(engine.submit(p, 12, stop_ids=frozenset(), name="misconceptions: another visitor") for p in others)

    try:
        runs = [
            ("in the shared engine, beside 3 other visitors' requests", _answer(engine, prompt_ids, n, "misconceptions: shared", visitors)),
            ("again, its prompt's blocks from the prefix cache", _answer(engine, prompt_ids, n, "misconceptions: again")),
        ]
        if not runs[1][1][0].cached_tokens:  # shorter than one KV block (or the cache is off): say what it was
            runs[1] = ("again (nothing from the prefix cache: it keeps whole blocks of a prompt, and this one is short)", runs[1][1])
    finally:
        for o in sent:
            o.cancel()
    return runs


def _compared(label: str, ref: list, evs: list) -> tuple[dict, Check]:
    """One run's events against the reference's, logits bit for bit: its row of the table and its check."""
    pairs = list(zip(ref, evs))
    differ = sum(int((a.logits != b.logits).sum()) for a, b in pairs)
    gap = max(float((a.logits - b.logits).abs().max()) for a, b in pairs)
    row = {
        "run": label,
        "most requests in one pass": max(e.batch for e in evs),
        "prompt tokens from the prefix cache": evs[0].cached_tokens,
        "logits compared": sum(a.logits.numel() for a, _ in pairs),
        "differing values": differ,
        "largest difference": gap,
        "same tokens": [e.token_id for e in evs] == [e.token_id for e in ref],
    }
    check = Check(
        f"every step's logits {label}, bit for bit as alone",
        differ == 0,
        f"{differ:,} of {row['logits compared']:,} values differ over {len(pairs)} steps (largest difference {gap:.1e}); "
        f"up to {row['most requests in one pass']} requests shared a pass",
        float(differ),
    )
    return row, check


def same_in_engine(lm: LoadedModel, engine, prompt_ids: list[int], n: int = 8) -> SameInEngine:
    """The same prompt's logits at every one of `n` steps, compared bit for bit: served alone (a private engine
    nobody else uses, no prefix cache), then in `engine` (the server's shared one) while other visitors generate
    (three this experiment sends once its first token is out: two long prompts prefilled in chunks beside its
    decode rows, a short question that parks them for a layer or so, and whoever else is on the server), then again
    with its prompt's blocks from the prefix cache."""
    from pipeline.decode_step.choice import CHOICE
    from pipeline.engine import Engine
    from pipeline.generation.sweeps import long_prompt

    tok = lm.tokenizer
    alone = Engine(lm, kv_pool_bytes=max(8 << 20, 2 * sum(lm.kv_layer_bytes(len(prompt_ids) + n + 16))), prefix_cache=False, background=False)
    h = alone.submit(prompt_ids, n, stop_ids=frozenset(), name="misconceptions: alone", keep_logits=True)
    while alone.iterate() is not None:
        pass
    ref = list(h)
    others = [tok(long_prompt(lm, k))["input_ids"] for k in (180, 300)] + [tok("Dog bites man. Remember this sentence.")["input_ids"]]
    rows, checks = [], []
    for label, evs in _runs_in(engine, prompt_ids, n, others):
        row, check = _compared(label, ref, evs)
        rows.append(row)
        checks.append(check)
    exact = CHOICE.exact()  # the kernel choice says whether every pass sums in a fixed order, and why not
    if not exact.c:
        checks.append(Check("the C kernels are built here", False, exact.reason))
    return SameInEngine(rows, exact.c, checks)
