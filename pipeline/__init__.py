"""The LLM inference pipeline, instrumented. No Streamlit in here.

    >>> import pipeline
    >>> lm = pipeline.load_model()                 # embedded SmolLM2-135M-Instruct, offline
    >>> tr = pipeline.trace(lm, "The capital of France is")
    >>> pipeline.sampling.filter_probs(tr.next_logits, temperature=0.7, top_k=50, top_p=0.9)
    >>> for ev in pipeline.generate(lm, "Why is the sky blue?", 32, chat=True): print(ev.text, end="")
    >>> pipeline.speculative_generate(lm, "Rewrite ...", "prompt_lookup", gamma=4, max_new_tokens=64)
"""
from . import checks, sampling
from .models import EMBEDDED, GEMMA, LoadedModel, ModelLoadError, available_models, load_model
from .tokens import Token, Segment, tokenize
from . import generate as generate_mod
from . import trace as trace_mod
from .trace import Trace, TraceError, trace
from .generate import generate, metrics
from .speculative import speculative_generate

__all__ = ["sampling", "checks", "generate_mod", "trace_mod", "load_model", "available_models", "LoadedModel", "ModelLoadError", "EMBEDDED", "GEMMA",
           "tokenize", "Token", "Segment", "trace", "Trace", "TraceError", "generate", "metrics",
           "speculative_generate"]
