"""The LLM inference pipeline, instrumented. No Streamlit in here.

    >>> import pipeline
    >>> lm = pipeline.load_model()                 # embedded SmolLM2-135M-Instruct, offline
    >>> tr = pipeline.trace(lm, "The capital of France is")
    >>> pipeline.sampling.filter_probs(tr.next_logits, pipeline.Sampling(temperature=0.7, top_k=50, top_p=0.9))
    >>> for ev in pipeline.generate(lm, "Why is the sky blue?", 32, chat=True): print(ev.text, end="")
    >>> pipeline.speculative_generate(lm, "Rewrite ...", "prompt_lookup", gamma=4, max_new_tokens=64)
    >>> s = pipeline.serving.stream(lm, pipeline.generation.prepare(lm, "Hi", 16), pipeline.Sampling(temperature=0.7))
    >>> for ev in s: ...                            # through the shared engine, with every other request

The rooms, from the ground up, in the order a prompt meets them (docs/architecture.md draws them):

    common/      memo, timing, telemetry: what every floor measures with
    model/       the registry, the weight store (GGUF conversion, cache integrity), the loaded model, the adapter
    forward/     one forward pass: tokens, the hooked trace, sampling, the readouts (analysis)
    decode_step/ the fast decode step on every device: THE kernel choice, the fused step; cpu/ the C kernels, gpu/ Triton and CUDA graphs
    generation/  the autoregressive loop: events, decode steps, our loop, sweeps, speculative decoding
    engine/      the continuous-batching engine that serves every visitor (scheduler, paged KV, Ray Serve)
    lab/         the measuring lab: roofline, hardware, attention kernels, sharding plans, misconceptions, checks
    serving.py   the front door: a request goes to the shared engine or to our loop

`import pipeline` keeps its names: `pipeline.models` is the model room's face (`pipeline.model`),
`pipeline.tracing`, `pipeline.sampling`, `pipeline.generation`, `pipeline.checks` name the modules as before.
(Imported by their path, the modules live in their rooms: `pipeline.forward.tracing`, `pipeline.lab.checks`.)

Each room's `__init__` is its face: the app's side (views, components, appstate, app.py, hosting/demo.py) imports `pipeline`
or `pipeline.<room>` and the names in its `__all__`, never a module by its path (tests/app/test_faces.py). This
module carries the forward room's most used names too (tokens, the trace, sampling); the rest of that room (the
activation names, attribution, the readouts) is `pipeline.forward`'s face.
"""

from pipeline import (
    engine,
    generation,  # noqa: E402,I001 - the package, whose face is the loop (pipeline.generation.generate)
    model,
    serving,
)
from pipeline.forward import sampling, tracing
from pipeline.forward.sampling import DEFAULTS, GREEDY, Sampling
from pipeline.forward.tokens import Segment, Token, display_text, text_of, tokenize
from pipeline.forward.tracing import Trace, TraceError, trace
from pipeline.generation import GenerationRecord, generate, metrics
from pipeline.generation.events import Finish, StepEvent
from pipeline.generation.speculative import speculative_generate
from pipeline.lab import checks
from pipeline.model import EMBEDDED, GEMMA, LoadedModel, ModelLoadError, available_models, load_model

models = model  # the old name of the model room's face

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
    "model",
    "models",
    "load_model",
    "available_models",
    "LoadedModel",
    "ModelLoadError",
    "EMBEDDED",
    "GEMMA",
    "text_of",
    "display_text",
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
