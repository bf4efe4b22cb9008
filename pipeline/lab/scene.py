"""The seed's scene, run for real: Alice, Bob, Charlie and Diana send requests to one model, three ways.

    users = [User("Alice", 0.0, "Why is the sky blue?", 48), User("Bob", 0.5, "Dog bites man.", 8), ...]
    run = run_scene(lm, users, "continuous")        # or "one after another", "static"

Each policy runs on an engine of its own (so other visitors' requests never enter the picture), driven here
iteration by iteration in real time: a user's request is submitted when its arrival time has passed.
  * "one after another": one request at a time (a batch of one), first come first served;
  * "static": the batch waits until everyone has arrived, runs together, and nobody leaves or joins until
    the longest answer is done (finished rows keep being computed as padding);
  * "continuous": our engine: requests join at the next iteration after they arrive and leave the iteration
    they finish.
Everything on the batching page is drawn from the returned records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from pipeline.common.telemetry import Sampler
from pipeline.engine import Engine, IterationRecord, Policy
from pipeline.forward.sampling import GREEDY
from pipeline.generation.loop import prepare
from pipeline.model.loaded import LoadedModel

# the article's class: Alice, Bob, Charlie and Diana send requests to the same model ((name, arrives after s, prompt,
# max new tokens) per user)
SCENES = {
    "One long answer, three short ones": [
        ("Alice", 0.0, "Why is the sky blue?", 48),
        ("Bob", 0.2, "The capital of France is", 8),
        ("Charlie", 0.4, "Dog bites man.", 8),
        ("Diana", 0.6, "Apple released a new chip.", 8),
    ],
    "Staggered arrivals": [
        ("Alice", 0.0, "Why is the sky blue?", 24),
        ("Bob", 1.0, "The capital of France is", 24),
        ("Charlie", 2.0, "Dog bites man.", 24),
        ("Diana", 3.0, "Apple released a new chip.", 24),
    ],
    "Everyone at once, same length": [
        ("Alice", 0.0, "Why is the sky blue?", 24),
        ("Bob", 0.0, "The capital of France is", 24),
        ("Charlie", 0.0, "Dog bites man.", 24),
        ("Diana", 0.0, "Apple released a new chip.", 24),
    ],
}
SCENE_MAX_NEW_TOKENS = 128  # a user's answer in the scene: long enough to see the batch change, short enough for a CPU


class ScenePolicy(StrEnum):
    """The batching page's three ways to serve the scene: a batch of one, and the engine's two policies (their values
    the engine's own: `engine_policy` is the Policy that serves each)."""

    ONE_BY_ONE = "one after another"
    STATIC = Policy.STATIC.value
    CONTINUOUS = Policy.CONTINUOUS.value

    @property
    def engine_policy(self) -> Policy:
        """The engine's policy that serves it: one after another is continuous batching with a batch of one."""
        return Policy.CONTINUOUS if self is ScenePolicy.ONE_BY_ONE else Policy(self.value)


POLICIES = tuple(ScenePolicy)
# eight visitors' questions (the serving benchmark and the browser load test send these)
VISITOR_PROMPTS = [
    "Why is the sky blue?",
    "The capital of France is",
    "Dog bites man.",
    "Apple released a new chip.",
    "Write a haiku about the sea.",
    "Explain what a KV cache is.",
    "List three prime numbers.",
    "What is the boiling point of water?",
]


@dataclass
class User:
    name: str
    arrival_s: float  # seconds after the scene starts
    prompt: str
    max_new_tokens: int


@dataclass
class UserResult:
    name: str
    request_id: int
    arrival_s: float  # when the request arrived (s after the start)
    admitted_s: float | None  # when it got a slot (s after the start)
    first_token_s: float | None  # when its first token came out
    done_s: float | None  # when its last token came out
    prompt_tokens: int
    token_ids: list[int]

    @property
    def ttft_s(self) -> float | None:
        """Time to first token, from its own arrival (waiting in line included)."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> float | None:
        """Arrival to last token."""
        return None if self.done_s is None else self.done_s - self.arrival_s


@dataclass(eq=False)
class SceneRun:
    policy: str
    users: list[UserResult]
    records: list[IterationRecord]  # every engine iteration, in order (times from the start)
    wall_s: float  # first arrival to last token
    block_size: int
    kv_block_bytes: int  # one block over every layer
    utilisation: float | None  # mean CPU / GPU utilisation over the run (%)
    utilisation_of: str
    timeline: object = field(repr=False, default=None)  # the telemetry Timeline

    @property
    def tokens(self) -> int:
        return sum(len(u.token_ids) for u in self.users)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_latency_s(self) -> float:
        xs = [u.latency_s for u in self.users if u.latency_s is not None]
        return sum(xs) / len(xs) if xs else 0.0

    @property
    def mean_ttft_s(self) -> float:
        xs = [u.ttft_s for u in self.users if u.ttft_s is not None]
        return sum(xs) / len(xs) if xs else 0.0

    @property
    def padded_rows(self) -> int:
        return sum(len(r.padded) for r in self.records)


def engine_for_policy(lm: LoadedModel, policy: ScenePolicy | str, n_users: int, kv_pool_bytes: int | None = None) -> Engine:
    try:
        policy = ScenePolicy(policy)
    except ValueError:
        raise ValueError(f"policy must be one of {[str(p) for p in ScenePolicy]}") from None
    return Engine(
        lm,
        kv_pool_bytes=kv_pool_bytes,
        max_batch=1 if policy == ScenePolicy.ONE_BY_ONE else max(1, n_users),
        max_queue=max(4, n_users),
        policy=policy.engine_policy,
        background=False,
        static_batch_size=n_users,
        # the three policies differ in batching alone: none reuses another user's prompt K/V, and the running
        # users decode in every pass (no prefill first: a newcomer's pass carries them too, as in Orca)
        prefix_cache=False,
        max_decode_stall=0,
        decode_steps=1,  # the Gantt draws a token a pass
    )


def run_scene(
    lm: LoadedModel, users: list[User], policy: str, chat: bool = False, stop_at_eos: bool = False, kv_pool_bytes: int | None = None, progress=None
) -> SceneRun:
    """Run the users' requests under `policy` (greedy). stop_at_eos False: each answer is exactly its
    max_new_tokens long, so the lengths the scene sets are the lengths that run."""
    eng = engine_for_policy(lm, policy, len(users), kv_pool_bytes)
    reqs = [prepare(lm, u.prompt, u.max_new_tokens, chat) for u in users]
    order = sorted(range(len(users)), key=lambda i: users[i].arrival_s)
    handles: dict[int, object] = {}
    total = sum(r.max_new_tokens for r in reqs)
    with Sampler(interval_s=0.1) as sampler:
        t0 = time.perf_counter()
        eng.t_start = t0
        pending = list(order)
        while pending or any(h.request.finish is None for h in handles.values()):
            now = time.perf_counter() - t0
            while pending and users[pending[0]].arrival_s <= now:
                i = pending.pop(0)
                handles[i] = eng.submit(
                    reqs[i].prompt_ids,
                    reqs[i].max_new_tokens,
                    GREEDY,
                    stop_ids=None if stop_at_eos else frozenset(),
                    name=users[i].name,
                    arrived=t0 + users[i].arrival_s,
                )
            rec = eng.iterate()
            if rec is None and pending:
                time.sleep(max(0.0, min(0.05, users[pending[0]].arrival_s - (time.perf_counter() - t0))))
            if progress:
                done = sum(len(h.request.generated) for h in handles.values())
                progress(min(1.0, done / max(1, total)), f"{policy}: {done} of {total} tokens")
        t_end = time.perf_counter()
    tl = sampler.timeline
    util, util_of = tl.mean_utilisation()
    results = []
    for i, u in enumerate(users):
        r = handles[i].request
        list(handles[i])  # drain its events
        rel = lambda t: None if t is None else t - t0
        results.append(
            UserResult(u.name, r.id, u.arrival_s, rel(r.admitted_at), rel(r.first_token_at), rel(r.last_token_at), len(r.prompt_ids), list(r.generated))
        )
    first_arrival = min(u.arrival_s for u in users)
    return SceneRun(policy, results, list(eng.records), (t_end - t0) - first_arrival, eng.kv.block_size, eng.block_bytes, util, util_of, tl)


def run_alone(lm: LoadedModel, user: User, chat: bool = False, stop_at_eos: bool = False) -> list[int]:
    """The reference: the same request generated alone by transformers' own loop (greedy)."""
    from pipeline.generation.decode import CacheMode
    from pipeline.generation.loop import generate

    req = prepare(lm, user.prompt, user.max_new_tokens, chat)
    return [e.token_id for e in generate(lm, user.prompt, chat=chat, request=req, cache=CacheMode.DYNAMIC, stop_ids=None if stop_at_eos else set())]


@dataclass
class LibraryRun:
    """transformers' own continuous batching (`model.generate_batch`) on the same requests, all submitted at once
    (it takes no arrival times): the comparison with a well-kept library."""

    tokens: int
    wall_s: float
    token_ids: dict[str, list[int]]  # per user
    error: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def run_transformers_batch(lm: LoadedModel, users: list[User], chat: bool = False, stop_at_eos: bool = False) -> LibraryRun:
    from transformers import GenerationConfig

    reqs = [prepare(lm, u.prompt, u.max_new_tokens, chat) for u in users]
    eos = lm.tokenizer.eos_token_id if stop_at_eos else -1
    gc = GenerationConfig(max_new_tokens=max(r.max_new_tokens for r in reqs), do_sample=False, eos_token_id=eos, pad_token_id=lm.tokenizer.pad_token_id or 0)
    t = time.perf_counter()
    try:
        with lm.lock:
            with lm.arch.attention_as("sdpa"):  # it refuses the explorer's capturing attention
                out = lm.model.generate_batch(inputs=[r.prompt_ids for r in reqs], generation_config=gc, progress_bar=False)
    except Exception as e:  # noqa: BLE001 - a library limit on this model or machine: say so, keep the page
        return LibraryRun(0, time.perf_counter() - t, {}, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    wall = time.perf_counter() - t
    results = list(out.values())  # in the order of the inputs
    ids = {u.name: list(getattr(o, "generated_tokens", []) or [])[: r.max_new_tokens] for u, r, o in zip(users, reqs, results)}
    return LibraryRun(sum(len(v) for v in ids.values()), wall, ids)
