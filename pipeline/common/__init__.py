"""What every floor measures with: per-object memos that die with their object (memo), clocks and the server's
activity record (timing), and the hardware sampler (telemetry). The face: what the app's side uses of them."""

from pipeline.common.memo import LRU, MAX_BYTES, MAX_ENTRIES, digest, fresh_for, give_back_freed_memory, shared
from pipeline.common.telemetry import Sampler
from pipeline.common.timing import ACTIVITY, Samples

__all__ = ["ACTIVITY", "LRU", "MAX_BYTES", "MAX_ENTRIES", "Sampler", "Samples", "digest", "fresh_for", "give_back_freed_memory", "shared"]
