"""The serving engine: one per loaded model per process, shared by every visitor (see core.py); which one serves a
model (in-process or Ray Serve) is registry.py's decision."""

from pipeline.engine.blocks import BlockPool
from pipeline.engine.core import BLOCK_SIZE, Engine, EngineConfig
from pipeline.engine.handle import EngineError, EngineStats, Handle, IterationRecord, Waiting, ordinal
from pipeline.engine.registry import engine_for, use_remote
from pipeline.engine.request import Chunk, PassOutput, Plan, Policy, QueueFull, Request, State, TooLarge
from pipeline.engine.scheduler import Scheduler
from pipeline.forward.sampling import Sampling

__all__ = [
    "Engine",
    "EngineConfig",
    "PassOutput",
    "Plan",
    "EngineError",
    "EngineStats",
    "Handle",
    "IterationRecord",
    "engine_for",
    "use_remote",
    "BLOCK_SIZE",
    "BlockPool",
    "Chunk",
    "Policy",
    "QueueFull",
    "Request",
    "Sampling",
    "Scheduler",
    "State",
    "TooLarge",
    "Waiting",
    "ordinal",
]
