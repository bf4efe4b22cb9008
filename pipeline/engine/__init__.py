"""The serving engine: one per loaded model per process, shared by every visitor (see core.py); which one serves a
model (in-process or Ray Serve) is registry.py's decision."""

from ..sampling import Sampling
from .core import BLOCK_SIZE, Engine, EngineError, EngineStats, Handle, IterationRecord, Waiting
from .registry import engine_for, use_remote
from .scheduler import BlockPool, Chunk, Policy, QueueFull, Request, Scheduler, State, TooLarge

__all__ = [
    "Engine",
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
]
