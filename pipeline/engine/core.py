"""One engine per loaded model serves every visitor: continuous batching with a paged KV memory.

    eng = engine_for(lm)                             # one per model per process, started on first use
    h = eng.submit(prompt_ids, 64, Sampling(temperature=0.7, seed=1))
    for ev in h: ...                                 # the same StepEvents as pipeline.generate
    h.cancel()                                       # Stop / a closed tab: slot and KV freed next iteration
    h.position(), h.eta_s()                          # "2nd in line, about 3 s"

Each iteration (`iterate()`): the scheduler admits waiting requests and hands out prefill chunks; the engine
runs those chunks and a decode token for every running request in ONE batched forward (engine.paged), samples
each row with its own settings and generator, and retires finished requests at once. A short request that
arrives during a pass does not wait for all of it: the decode tokens and long prompts' chunks stop ("park") at
the layer they reached; the newcomer's prompt is prefilled first, alone, and they resume after it (at most 2
passes later: the scheduler's prefill first). A prompt that starts like an earlier one (the chat template's
system turn, the same question again) shares that prompt's KV blocks and prefills only the rest (the
scheduler's prefix cache). Where only greedy decode rows run (at most ONE_CALL_ROWS) and nobody waits, a pass takes up
to config.decode_steps tokens a row in one C call (vLLM's multi-step scheduling; each step's numbers those of a pass
of its own), and a request that arrives meanwhile stops it after the step under way. On a GPU every decode pass is a
CUDA graph replay, one graph per padded batch size, and such a pass makes its tokens in one replay (engine.graphed).
A background thread iterates while there is work and stops when idle; `iterate()` can also be driven by hand
(the batching page runs its scene that way, step by step, on an engine of its own).

policy=Policy.STATIC is the comparison the batching page draws (the scheduler owns both policies): nobody is
admitted until the whole batch has arrived, and rows that finish keep being computed (padding) until the longest
is done. Which engine serves a model (this one in-process, or Ray Serve's) is engine.registry's decision.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import asdict, replace

import torch

from pipeline.common.timing import ACTIVITY
from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu.greedy import greedy_summary
from pipeline.engine import worker
from pipeline.engine.blocks import BlockPool
from pipeline.engine.config import BLOCK_SIZE, EngineConfig  # noqa: F401 - BLOCK_SIZE: the engine's name for it
from pipeline.engine.handle import EngineStats, Handle, IterationRecord
from pipeline.engine.request import Chunk, PassOutput, Policy, Request, State
from pipeline.engine.scheduler import Scheduler
from pipeline.forward.sampling import GREEDY, GreedySummary, Sampling, StepOutput, choose
from pipeline.forward.tokens import token_pieces, token_texts
from pipeline.generation.events import Finish, Phase, Runner, StepEvent, eos_ids
from pipeline.model.loaded import LoadedModel

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, lm: LoadedModel, config: EngineConfig | None = None, **settings):
        """`config` (or its fields as keywords: Engine(lm, max_batch=4, background=False))."""
        from pipeline.decode_step.fused import supported
        from pipeline.engine.graphed import DecodeGraphs
        from pipeline.engine.paged import PagedKV, PagedStep

        cfg = self.config = replace(config or EngineConfig(), **settings).for_device(lm)
        policy = cfg.policy
        self.lm, self.background, self.park = lm, cfg.background, cfg.park
        n_blocks = max(1, cfg.kv_pool_bytes // PagedKV.block_bytes(lm, cfg.block_size))
        ok, self.unsupported = supported(lm)
        graphs = ok and cfg.graphs
        self.kv = PagedKV(lm, n_blocks + graphs, cfg.block_size)  # with graphs, one more: the scratch block (engine.graphed)
        self.step = PagedStep(lm, self.kv) if ok else None
        if graphs:  # captured on CUDA; elsewhere their body runs eagerly (DecodeGraphs.label says which)
            self.step.graphs = DecodeGraphs(self.step, scratch=n_blocks)
        self.name = f"engine ({policy} batching)" + (f", {self.step.graphs.label}" if graphs else "")
        if not ok:  # the kernel choice's answer for an architecture the batched step does not implement
            self.name += ", " + CHOICE.unsupported(self.unsupported).reason
        continuous = policy == Policy.CONTINUOUS
        self.scheduler = Scheduler(
            BlockPool(n_blocks, cfg.block_size),
            max_batch=cfg.max_batch,
            max_queue=cfg.max_queue,
            prefill_chunk=cfg.prefill_chunk,
            request_chunk=cfg.request_chunk,
            prefix_cache=cfg.prefix_cache and ok and continuous,
            max_decode_stall=cfg.max_decode_stall if continuous else 0,
            policy=policy,
            static_batch_size=cfg.static_batch_size,
            decode_steps=cfg.decode_steps if continuous else 1,
        )
        self.records: deque[IterationRecord] = deque(maxlen=cfg.history)
        self.t_start = time.perf_counter()
        self.iterations = 0
        self.tokens_out: deque[tuple[float, int]] = deque(maxlen=8192)  # (time, tokens) per iteration
        self._handles: dict[int, Handle] = {}
        self._gens: dict[int, torch.Generator | None] = {}
        self._fallback: dict = {}  # per-request decode steps when the paged step is unsupported
        self._parked: dict = {}  # request id -> its prompt chunk or decode token (a Seq) stopped at a layer
        self._dec, self._pieces = token_texts(lm.tokenizer), token_pieces(lm.tokenizer)
        self._step_s: dict[int, float] = {}  # rows' bucket (bit length) -> recent seconds per decode pass (for eta_s)
        self._served_tokens: deque[int] = deque(maxlen=32)  # tokens of the last finished answers (for eta_s)
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._iter_lock = threading.Lock()
        worker.started(self)

    # ------------------------------------------------------------------------------------------ visitors
    def submit(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        sampling: Sampling = GREEDY,
        stop_ids=None,
        name: str = "",
        arrived: float | None = None,
        keep_logits: bool = False,
    ) -> Handle:
        """Queue a request; raises scheduler.QueueFull ("server busy") or TooLarge at once, never hangs. With
        `keep_logits` every event carries the step's full logits (StepEvent.logits)."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        limit = self.lm.facts.max_positions
        if limit is not None and len(prompt_ids) + max_new_tokens > limit:
            raise ValueError(f"{len(prompt_ids):,} prompt + {max_new_tokens:,} new tokens exceed this model's context window of {limit:,}.")
        req = Request(list(prompt_ids), int(max_new_tokens), sampling, frozenset(eos_ids(self.lm) if stop_ids is None else stop_ids), name, keep_logits)
        if arrived is not None:
            req.arrived = arrived  # time since the request arrived includes tokenizing it
        h = Handle(self, req)
        self._handles[req.id] = h
        self._gens[req.id] = req.sampling.generator()
        try:
            self.scheduler.submit(req)
        except Exception:
            self._forget(req)
            raise
        if self.background:
            self._ensure_worker()
        return h

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block over every layer."""
        return self.kv.block_bytes_per_layer * self.lm.facts.n_layers

    def eta_s(self, req: Request) -> float | None:
        """Seconds until `req` is likely admitted, from the recent time per admitted request: requests ahead of it
        (its place in line) over the requests served at once, times what a request took lately (the median answer
        of the last 32 finished, in tokens, at the step time measured at this many rows). None before anything
        was measured. (The old estimate, the tokens still to generate over the last 30 s's token rate, said
        "about 3,430 s" to a burst after a quiet spell that was served in 105 s.)"""
        k = self.scheduler.position(req)
        if k == 0:
            return 0.0
        q = self.scheduler.snapshot()
        at_once = max(1, min(self.scheduler.max_batch, q.running + q.waiting))  # rows the scheduler will run together
        step = self._step_time(at_once)
        if step is None:
            return None
        served = sorted(self._served_tokens)
        tokens = served[len(served) // 2] if served else min(req.max_new_tokens, 64)
        return k / at_once * tokens * step

    def _step_time(self, rows: int) -> float | None:
        """The recent time of an iteration with about `rows` rows (an average per power-of-two bucket). A bucket not
        measured yet is scaled from the nearest one by (rows ratio)^0.25: a CPU decode step of 1, 8 and 12 rows took
        28.8, 40.6 and 45.0 ms (pipeline/decode_step/choice.py), a GPU's grows less."""
        if not self._step_s:
            return None
        b = rows.bit_length()
        near = min(self._step_s, key=lambda x: (abs(x - b), -x))
        return self._step_s[near] * (2 ** (b - near)) ** 0.25

    def tokens_per_s(self, window_s: float = 60.0) -> float:
        """Tokens generated per second over the last `window_s` seconds (all requests together)."""
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self.tokens_out) if now - t <= window_s]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1e-3)
        return sum(n for _, n in recent) / span

    def stats(self) -> EngineStats:
        q = self.scheduler.snapshot()
        return EngineStats(
            **asdict(q),
            kv_bytes_in_use=q.blocks_used * self.block_bytes,
            kv_bytes_total=self.kv.nbytes,
            tokens_per_s_last_minute=self.tokens_per_s(60.0),
            iterations=self.iterations,
            engine=self.name,
        )

    def healthy(self) -> bool:
        """False when requests are running but no worker is left to run them (a background engine only)."""
        with self._thread_lock:
            alive = self._thread is not None and self._thread.is_alive()
        return alive or not self.background or not self.scheduler.snapshot().running

    # ------------------------------------------------------------------------------------------ the loop
    def _wake(self):
        self.scheduler.wake()

    def _ensure_worker(self):
        with self._thread_lock:
            if self._thread is None:
                # the thread holds the engine weakly between iterations: an engine whose model was dropped is freed,
                # and its thread ends, however busy it was (a thread holding it strongly kept every model alive)
                self._thread = threading.Thread(target=worker.work, args=(weakref.ref(self),), daemon=True, name=f"engine-{self.lm.label}")
                self._thread.start()

    def iterate(self) -> IterationRecord | None:
        """One iteration: the scheduler's plan, ONE batched forward, a token sampled for each row, and the report
        back to the scheduler (`update`), which moves the requests along and retires those that ended; then their
        visitors get the events. None when idle."""
        with self._iter_lock:
            t0 = time.perf_counter()
            plan = self.scheduler.plan()
            for r in plan.retired:
                self._close(r)
            if plan.empty:
                return None
            rows = [r for r in plan.decode if r.state in (State.DECODE, State.PADDING)]
            batch = len(rows) + len(plan.prefill)
            ended, decoded, padded, first, n = {}, [], [], [], 1
            try:
                with self.lm.lock, torch.inference_mode(), ACTIVITY.doing("generation", batch):  # what a time shown elsewhere shared the server with
                    steps = self._decode_steps(plan, rows)
                    if steps is None:
                        prefilled, first, rows, logits = self._forward(plan.prefill, rows)  # rows: those not parked
                        parts = ([torch.stack([lg for _, lg in first])] if first else []) + ([logits] if rows else [])
                        outs = self._outputs([r for r, _ in first] + rows, parts[0] if len(parts) == 1 else torch.cat(parts)) if parts else []
                t_done = time.perf_counter()
                if steps is not None:  # several tokens a row, each step reported and sent as a pass of its own
                    n = steps.n
                    ended, decoded = self._deliver_steps(plan, rows, steps, t0, t_done, batch)
                else:
                    live = [(r, Phase.PREFILL, out) for (r, _), out in zip(first, outs)] + [(r, Phase.DECODE, out) for r, out in zip(rows, outs[len(first) :])]
                    padded = [r.id for r, _, _ in live if r.state == State.PADDING]  # static batching: finished rows computed as padding
                    live = [x for x in live if x[0].state != State.PADDING]
                    ended = self._deliver(plan, live, prefilled, t0, t_done, batch)
                    decoded = [r.id for r, phase, _ in live if phase == Phase.DECODE]
            except Exception as e:  # noqa: BLE001 - out of memory, a bad state: fail these requests, keep serving
                t_done = time.perf_counter()
                ended = self._fail(plan, e)
            for r in self.scheduler.release_static_batch():
                self._forget(r)
            self.iterations += 1
            self.tokens_out.append((t_done, len(first) + n * len(decoded)))
            if batch and not plan.prefill:  # decode passes only: a prompt's pass is longer and once per request
                b, step = batch.bit_length(), (t_done - t0) / n
                old = self._step_s.get(b)
                self._step_s[b] = step if old is None else 0.7 * old + 0.3 * step
            return self._record(plan, t0, t_done, decoded, ended, padded, n)

    def _deliver_steps(self, plan, rows: list[Request], steps, t0: float, t_done: float, batch: int) -> tuple[dict, list[int]]:
        """A multi-step pass's tokens (a layer_call.Steps), each step reported and sent as a pass of its own, its
        share of the time each. Returns (request id -> why it ended, the rows that decoded)."""
        ended: dict = {}
        n, per = steps.n, (t_done - t0) / steps.n
        for j in range(n):
            summ = GreedySummary(*(torch.from_numpy(a[j]) for a in steps[1:]))
            live = [(r, Phase.DECODE, StepOutput(summary=summ.row(b))) for b, r in enumerate(rows) if ended.get(r.id) is None]
            ended.update(self._deliver(plan, live, {}, t_done - per, t_done, batch))
        return ended, [r.id for r in rows]

    def _fail(self, plan, e: Exception) -> dict:
        """The pass failed: its requests fail with the error's first line (their visitors are told), the engine goes on."""
        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        failed = [r for r in plan.requests().values() if r.state != State.FINISHED]
        self.scheduler.fail(failed)
        for r in failed:
            if r.id in self._handles:
                self._handles[r.id].error = msg
            self._close(r)
        return {r.id: Finish.ERROR for r in failed}

    def _record(self, plan, t0: float, t_done: float, decoded: list[int], ended: dict, padded: list[int], n: int) -> IterationRecord:
        """The iteration's record (the batching page's Gantt), kept in `records`."""
        blocks, waiting = self.scheduler.occupancy()
        done = [c.request.prefilled - c.start for c in plan.prefill]  # 0 for a chunk parked (or failed)
        rec = IterationRecord(
            self.iterations,
            t0 - self.t_start,
            t_done - self.t_start,
            decoded,
            [(c.request.id, max(0, n)) for c, n in zip(plan.prefill, done)],
            waiting,
            blocks,
            [rid for rid, end in ended.items() if end is not None],
            padded,
            n,
        )
        self.records.append(rec)
        return rec

    def _deliver(self, plan, live: list, prefilled: dict, t0: float, t_done: float, batch: int) -> dict:
        """One step's outputs: each live (request, phase, StepOutput) sampled with its own settings, the tokens and
        the prompt tokens now cached (`prefilled`) reported to the scheduler, then each request's event sent.
        Returns the scheduler's answer: request id -> why it ended (None: it goes on)."""
        choices = {}
        for r, phase, out in live:
            c = choose(out, self._dec, r.sampling, self._gens.get(r.id))
            choices[r.id] = (r, phase, r.context_len, len(r.blocks), c, out.logits if r.keep_logits else None)
        ended = self.scheduler.update(plan, PassOutput(prefilled, {rid: ch[4].token_id for rid, ch in choices.items()}, t_done))
        for rid, (r, phase, ctx, held, c, kept) in choices.items():
            self._emit(r, c, phase, ctx, held, t0, t_done, batch, ended[rid], kept)
        return ended

    def _decode_steps(self, plan, rows: list[Request]):
        """The pass's decode tokens in one C call or graph replay, where the scheduler allows several (Plan.steps:
        decode rows only, greedy, nobody waiting; a request arriving meanwhile stops the C call after its current step)
        and the step can (PagedStep.decode_steps says: how many rows), nothing parked. Each step's
        numbers are those of a pass of its own (cpu_decode.c's row_steps runs the same row_layers), so a request's
        tokens and probabilities do not depend on how many steps its passes took (tests/pipeline/test_decode_steps.py).
        A layer_call.Steps, or None: one step, as every other pass."""
        from pipeline.engine.paged import Seq

        if plan.steps < 2 or self.step is None or self._parked:
            return None
        seqs = [Seq([r.generated[-1]], r.context_len - 1, r.blocks) for r in rows]
        left = [r.max_new_tokens - len(r.generated) for r in rows]
        k = max(r.sampling.n_top for r in rows)
        return self.step.decode_steps(seqs, [r.stop_ids for r in rows], left, self.scheduler.news, plan.steps, k)

    def _forward(self, chunks: list[Chunk], rows: list[Request]):
        """ONE forward for this iteration: the prompt chunks and a decode token for every running row. Returns
        ({request id: prompt tokens now in the cache, for each chunk not parked}, [(request whose prompt is now
        complete, its last logits)], the rows that decoded, their logits [n, vocab]). It changes no request: what it
        did goes to the scheduler (`update`). When a short request arrives during the pass (newcomer_waiting), the
        decode rows and the chunks of long prompts that are not their last stop at the layer they reached ("parked",
        engine.paged): the newcomer is prefilled in the next iteration, together with them resuming where they
        stopped."""
        if self.step is None:
            return self._forward_one_by_one(chunks, rows)
        from pipeline.engine.paged import Seq

        def resumed(r, start):  # the Seq parked at `start` last time, or None
            p = self._parked.pop(r.id, None)
            return p if p is not None and p.start == start else None

        seqs = [resumed(r, a) or Seq(r.prompt_ids[a:b], a, r.blocks, parkable=b < len(r.prompt_ids)) for r, a, b in chunks]
        seqs += [resumed(r, r.context_len - 1) or Seq([r.generated[-1]], r.context_len - 1, r.blocks, parkable=True) for r in rows]
        interrupt = self.newcomer_waiting if self.park else None
        logits = self.step.forward(seqs, interrupt=interrupt)
        prefilled, first = {}, []
        for j, (r, _, _) in enumerate(chunks):
            s = seqs[j]
            if s.parked:  # K/V written up to s.layer; the rest in a later iteration
                self._parked[r.id] = s
                continue
            prefilled[r.id] = s.end
            if s.end == len(r.prompt_ids):
                first.append((r, logits[j]))
        done = []
        for j, r in enumerate(rows, len(chunks)):
            if seqs[j].parked:
                self._parked[r.id] = seqs[j]
            else:
                done.append(j)
        kept = logits if len(done) == len(seqs) else logits[done] if done else None  # (indexing copies the logits)
        return prefilled, first, [rows[j - len(chunks)] for j in done], kept

    def newcomer_waiting(self) -> bool:
        """Asked by the forward after every layer: should the parkable rows stop here for a short request that
        just arrived (the scheduler's answer; see Scheduler.newcomer_fits)."""
        return self.scheduler.newcomer_fits()

    def _forward_one_by_one(self, chunks: list[Chunk], rows: list[Request]):
        """Architectures the batched step does not implement: transformers' forward, one request at a time
        (whole prompts, no chunking)."""
        from pipeline.generation.decode import CacheMode, TransformersStep

        prefilled, first = {}, []
        for r, _, b in chunks:
            prefilled[r.id] = b
            if b < len(r.prompt_ids):
                continue
            st = self._fallback[r.id] = TransformersStep(self.lm, CacheMode.DYNAMIC, r.n_tokens)
            first.append((r, st.prefill(r.prompt_ids).logits))
        out = [self._fallback[r.id].step(r.generated[-1], r.context_len - 1).logits for r in rows]
        return prefilled, first, rows, torch.stack(out) if out else None

    @staticmethod
    def _outputs(reqs: list[Request], logits: torch.Tensor) -> list[StepOutput]:
        """What sampling needs of each row, brought to the host in one transfer where possible: greedy rows only a
        GreedySummary computed on the device for all of them at once, sampled rows their whole distribution."""
        greedy = [j for j, r in enumerate(reqs) if r.sampling.greedy]
        out: list[StepOutput | None] = [None] * len(reqs)
        if greedy:
            k = max(reqs[j].sampling.n_top for j in greedy)
            every = len(greedy) == len(reqs)  # (indexing the logits copies them: 0.1-0.2 ms a pass)
            summ = greedy_summary(logits if every else logits[torch.tensor(greedy, device=logits.device)], k).cpu()
            for row, j in enumerate(greedy):
                out[j] = StepOutput(summary=summ.row(row))
        for j in range(len(reqs)):
            if out[j] is None or reqs[j].keep_logits:
                out[j] = StepOutput(logits=logits[j].cpu())
        return out

    def _emit(self, r: Request, c, phase: Phase, ctx: int, blocks: int, t0: float, t_done: float, batch: int, end: Finish | None, logits=None) -> None:
        """The step's event to the request's visitor (`blocks`: the KV blocks it held for the step); an ended
        request's stream is closed (and, once retired, forgotten)."""
        per_layer = self.lm.kv_layer_bytes(ctx)
        piece, special = self._pieces(c.token_id)
        ev = StepEvent(
            index=len(r.generated) - 1,
            phase=phase,
            token_id=c.token_id,
            text=self._dec(c.token_id),
            top=c.top,
            top_raw=c.top_raw,
            p=c.p,
            p_raw=c.p_raw,
            step_s=t_done - t0,
            t_s=t_done - r.arrived,
            context_len=ctx,
            kv_bytes_per_layer=per_layer,
            kv_bytes=sum(per_layer),
            kv_reserved_bytes=blocks * self.block_bytes,
            finished=end,
            piece=piece,
            special=special,
            engine=Runner.ENGINE,
            batch=batch,
            request_id=r.id,
            cached_tokens=r.cached if phase == Phase.PREFILL else 0,
            logits=logits,
        )
        h = self._handles.get(r.id)
        if h is not None:
            h.events.put(ev)
        if end is not None:
            if end in (Finish.EOS, Finish.LENGTH):
                self._served_tokens.append(len(r.generated))
            self._close(r, keep=r.state == State.PADDING)  # a padding row keeps its slot until its batch is done

    def _close(self, r: Request, keep: bool = False) -> None:
        h = self._handles.get(r.id)
        if h is not None:
            h.events.put(None)
        if not keep:
            self._forget(r)

    def _forget(self, r: Request) -> None:
        self._handles.pop(r.id, None)
        self._gens.pop(r.id, None)
        self._parked.pop(r.id, None)
        st = self._fallback.pop(r.id, None)
        if st is not None:
            st.close()
