"""The serving engine: one per loaded model per process, shared by every visitor (see core.py)."""

from .core import BLOCK_SIZE, Engine, EngineError, Handle, IterationRecord, Waiting, engine_for
from .scheduler import BlockPool, QueueFull, Request, Sampling, Scheduler, TooLarge

__all__ = [
    "Engine",
    "EngineError",
    "Handle",
    "IterationRecord",
    "engine_for",
    "BLOCK_SIZE",
    "BlockPool",
    "QueueFull",
    "Request",
    "Sampling",
    "Scheduler",
    "TooLarge",
    "Waiting",
]
