"""The LLM inference pipeline, instrumented. No Streamlit in here.

    >>> import pipeline
    >>> lm = pipeline.load_model()                 # embedded SmolLM2-135M-Instruct, offline
    >>> tr = pipeline.trace(lm, "The capital of France is")
    >>> pipeline.sampling.filter_probs(tr.next_logits, temperature=0.7, top_k=50, top_p=0.9)
    >>> for ev in pipeline.generate(lm, "Why is the sky blue?", 32, chat=True): print(ev.text, end="")
    >>> pipeline.speculative_generate(lm, "Rewrite ...", "prompt_lookup", gamma=4, max_new_tokens=64)
    >>> s = pipeline.serving.stream(lm, pipeline.generation.prepare(lm, "Hi", 16), pipeline.Sampling(temperature=0.7))
    >>> for ev in s: ...                            # through the shared engine, with every other request

The functions `trace` and `generate` live in the modules `pipeline.tracing` and `pipeline.generation` (no
module is shadowed by a function of the same name).
"""

from . import checks, engine, generation, models, sampling, serving, tracing
from .events import Finish, StepEvent
from .generation import GenerationRecord, generate, metrics
from .models import EMBEDDED, GEMMA, LoadedModel, ModelLoadError, available_models, load_model
from .sampling import DEFAULTS, GREEDY, Sampling
from .speculative import speculative_generate
from .tokens import Segment, Token, text_of, tokenize
from .tracing import Trace, TraceError, trace

__all__ = [
    "sampling",
    "serving",
    "Sampling",
    "GREEDY",
    "DEFAULTS",
    "Finish",
    "checks",
    "engine",
    "generation",
    "tracing",
    "models",
    "load_model",
    "available_models",
    "LoadedModel",
    "ModelLoadError",
    "EMBEDDED",
    "GEMMA",
    "text_of",
    "tokenize",
    "Token",
    "Segment",
    "trace",
    "Trace",
    "TraceError",
    "generate",
    "GenerationRecord",
    "StepEvent",
    "metrics",
    "speculative_generate",
]
