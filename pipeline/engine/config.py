"""How an engine serves: one EngineConfig, with the CPU and GPU defaults in one place."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from pipeline.engine.request import Policy
from pipeline.model.loaded import CPU_KV_POOL_BYTES, LoadedModel

DEFAULT_KV_POOL_BYTES = CPU_KV_POOL_BYTES  # the KV pool on a CPU; on a GPU a quarter of the free memory (capped)
BLOCK_SIZE = 8  # tokens per KV block: the chat template's 24-token system turn fills 3 (what the prefix cache shares)


def default_kv_pool_bytes(lm: LoadedModel) -> int:
    if lm.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(lm.device)
        return min(free // 4, 16 << 30)
    return DEFAULT_KV_POOL_BYTES


@dataclass(frozen=True)
class EngineConfig:
    """How an engine serves, with the CPU and GPU defaults in one place (`for_device`). None: the device's default."""

    kv_pool_bytes: int | None = None  # the KV pool's size: DEFAULT_KV_POOL_BYTES on a CPU, a quarter of the free memory on a GPU (capped at 16 GiB)
    block_size: int = BLOCK_SIZE
    # a CPU step's time grows with its rows (16 keep a token under ~0.2 s here); a GPU's barely does until hundreds
    max_batch: int | None = None
    max_queue: int = 64
    # a GPU pass costs about the same for 64 tokens as for 512; a CPU's grows with them
    prefill_chunk: int | None = None
    request_chunk: int | None = None
    policy: Policy = Policy.CONTINUOUS
    static_batch_size: int | None = None  # Policy.STATIC: the batch it waits for
    history: int = 4096  # iteration records kept (the batching page's Gantt)
    background: bool = True  # a worker thread iterates (False: the caller drives iterate())
    park: bool = True  # decode tokens and long prompts' chunks may stop at a layer for a newcomer (see Engine._forward)
    # prompts that start alike (every chat prompt starts with the template's system turn) share the blocks already
    # computed; only the paged step writes the pool, so only it can share them
    prefix_cache: bool = True
    # a pass that gives newcomers their first token runs without the decode rows, up to 2 passes in a row
    # (measured in bench_serving.py against "engine-mixed", which has it off: the README's figures)
    max_decode_stall: int = 2
    # greedy decode rows with nobody waiting take up to this many tokens in one pass, one C call (vLLM's multi-step
    # scheduling): the engine's Python between passes (~1 ms on a 2-core CPU, where a token takes ~17) is paid once
    # for them. A newcomer or a cancel stops the pass after its current step. None: 8 with a background worker, 1
    # where the caller drives iterate() (a token a pass, to watch pass by pass: the batching page's scene, tests)
    decode_steps: int | None = None
    # decode passes as CUDA graphs, one per padded batch size (engine.graphed). None: on a GPU. True on a CPU runs the
    # graphs' body eagerly (the numbers a graph replays: the tests)
    graphs: bool | None = None

    def for_device(self, lm: LoadedModel) -> EngineConfig:
        """Every None filled with this model's device's default."""
        gpu = lm.device.type == "cuda"
        return replace(
            self,
            policy=Policy(self.policy),
            kv_pool_bytes=self.kv_pool_bytes or default_kv_pool_bytes(lm),
            max_batch=self.max_batch or (256 if gpu else 16),
            prefill_chunk=self.prefill_chunk or (2048 if gpu else 256),
            request_chunk=self.request_chunk or (512 if gpu else 64),
            decode_steps=self.decode_steps or (8 if self.background else 1),
            graphs=gpu if self.graphs is None else self.graphs,
        )
