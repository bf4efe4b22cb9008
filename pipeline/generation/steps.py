"""The decode loop seen from the cache (issue 57): for every step of a generation, the newest query's attention over
every cached key, at every layer and head, recorded from the run itself.

`steps(lm, prompt, new=N)` runs the model as a generation does (one prefill, then one token at a time over a KV
cache) with the capturing attention (pipeline.model.capture) bound only to this call: step 0 is the prompt's last
query over the prompt (it chooses the first token); step s feeds the s-th generated token, whose query attends over
the prompt and every token before it plus itself. Each step keeps one row per head and layer ([H, cache_len]; a
sliding-window layer's row is 0 before its window), the cache's length and bytes (LoadedModel.kv_layer_bytes), the
token chosen (greedy unless a temperature is given) and its probability, and the step's time. A generation nobody
records runs without any of this (the engine and pipeline.generation.loop never bind a capture)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.forward.tokens import text_of, tokenize
from pipeline.model.capture import Capture, capturing


@dataclass
class Step:
    token_id: int  # the token this step chose
    token: str
    p: float  # its probability under the step's distribution (the temperature applied)
    cache_len: int  # keys the newest query attended over (the prompt, the tokens before it, itself)
    kv_bytes: int  # the KV cache's bytes after this step, every layer (LoadedModel.kv_layer_bytes)
    seconds: float  # the step's forward (step 0: the prefill)
    attention: list[np.ndarray]  # per layer: [H, cache_len] float32, the newest query's weights


@dataclass
class Steps:
    prompt_ids: list[int]
    steps: list[Step]

    @property
    def ids(self) -> list[int]:
        """The prompt and every generated token."""
        return self.prompt_ids + [s.token_id for s in self.steps]


def _rows(cap: Capture, n_layers: int, cache_len: int) -> list[np.ndarray]:
    out = []
    for i in range(n_layers):
        row = cap.last_row[i].numpy()
        if row.shape[-1] < cache_len:  # a sliding layer's cache keeps its window only: the earlier keys weigh 0
            row = np.concatenate([np.zeros((row.shape[0], cache_len - row.shape[-1]), np.float32), row], axis=-1)
        out.append(row.astype(np.float32))
    return out


def steps(lm, prompt: str, new: int = 8, chat: bool = False, temperature: float = 0.0, seed: int = 0) -> Steps:
    """`new` decode steps over the KV cache with every layer's newest-query row recorded (see the module)."""
    from transformers import DynamicCache

    ids = tokenize(lm.tokenizer, prompt, chat=chat).input_ids
    L = lm.facts.n_layers
    gen = torch.Generator().manual_seed(seed)
    out: list[Step] = []
    with lm.lock, torch.inference_mode():
        cache = DynamicCache(config=lm.model.config)
        feed = torch.tensor([ids], device=lm.device)
        pos = 0
        for _ in range(new):
            cap = Capture(last_only=True)  # one row per head and layer, nothing else kept
            t = time.perf_counter()
            with capturing(cap):
                logits = lm.model(
                    input_ids=feed, past_key_values=cache, use_cache=True, cache_position=torch.arange(pos, pos + feed.shape[1], device=lm.device)
                ).logits[0, -1]
            seconds = time.perf_counter() - t
            pos += feed.shape[1]
            logits = logits.float().cpu()  # the model's own output (a final softcap already applied)
            probs = torch.softmax(logits / temperature if temperature > 0 else logits, -1)
            tid = int(torch.multinomial(probs, 1, generator=gen)) if temperature > 0 else int(probs.argmax())
            out.append(Step(tid, text_of(lm.tokenizer, [tid]), float(probs[tid]), pos, sum(lm.kv_layer_bytes(pos)), seconds, _rows(cap, L, pos)))
            feed = torch.tensor([[tid]], device=lm.device)
    return Steps(list(ids), out)
