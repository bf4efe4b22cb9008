"""Every page of the explorer, defined once: its slug (the link's path), its stage number, its name, the heading it
opens with, its one-sentence takeaway, its icon, its file, and whether the lesson handout computes its section from
the prompt (`handout="trace"` or `"run"`) or recalls the figures this session drew there (None). app.py's navigation,
the page header (its heading, the presentation mode's previous/next links), the handout, the exports and the tests
read this table: renaming or renumbering a page is one edit here. No Streamlit in here."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PageSpec:
    slug: str  # the link's path ("" for the overview, the app's front page)
    number: int | None  # the stage's number in the article's order (None: not a stage)
    name: str
    icon: str
    takeaway: str
    heading: str = ""  # the page's h1 (after its number) when it says more than its name
    handout: str | None = None  # "trace" / "run": the handout computes this stage from the prompt; None: recalled figures
    hidden: bool = False  # reachable by its link only (the operator page)
    summary: str = ""  # the article's words for the stage (the overview's list)
    settings: tuple[str, ...] = ()  # the keys of the page's widgets bound to the link: what a live class's view carries
    # (tests/views/test_live.py renders every page and checks that each widget it binds is named here)

    @property
    def title(self) -> str:
        """The navigation's label: "3 · Attention"."""
        return self.name if self.number is None else f"{self.number} · {self.name}"

    @property
    def short(self) -> str:
        """The presentation mode's previous/next label: the number (one line at 1280 px)."""
        return self.name if self.number is None else str(self.number)

    @property
    def h1(self) -> str:
        """The page's heading: the title, or the number with the longer heading."""
        if not self.heading:
            return self.title
        return self.heading if self.number is None else f"{self.number} · {self.heading}"

    @property
    def file(self) -> str:
        """The page's script, relative to the app's folder (named by its slug, so a renumbered page keeps its file)."""
        return f"views/stages/{(self.slug or 'overview').replace('-', '_')}.py"

    @property
    def explanation(self) -> str:
        """The page's opening explanation (its render.intro text, Markdown), read from its script without running it:
        what the lesson handout prints under the takeaway, so a student reading it alone learns what the page says."""
        return _intro_of(self.file)

    @property
    def stage(self) -> str:
        """The overview's line for it: "3 · Attention: query, key, value, heads"."""
        return f"{self.number} · {self.summary}" if self.number is not None else self.name


@functools.cache
def _intro_of(file: str) -> str:
    src = (Path(__file__).resolve().parents[1] / file).read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "intro" and node.args and isinstance(node.args[0], ast.Constant):
            return str(node.args[0].value)
    return ""


def _p(slug, number, name, icon, takeaway, heading="", handout=None, hidden=False, summary="", settings=()) -> PageSpec:
    return PageSpec(slug, number, name, f":material/{icon}:", takeaway, heading, handout, hidden, summary or name, tuple(settings))


# in the article's order of stages
STAGES: tuple[PageSpec, ...] = (
    _p("", None, "Overview", "explore",
       "A real model runs on your prompt; every number on these pages is measured on that very run, and each page shows how we know it is right.",
       heading="What happens between Enter and the first token"),
    _p("tokens", 1, "Prompt & tokens", "content_cut",
       "The model never sees letters or words: your text becomes a list of token ids, wrapped in a chat template.", handout="trace",
       summary="Tokenize: pieces, ids, special tokens, chat template"),
    _p("embeddings", 2, "Embeddings & positions", "scatter_plot",
       "Each token id picks one row of a big matrix: a vector of numbers; RoPE then rotates it by its position.", handout="trace",
       summary="Embeddings and positions (RoPE)",
       settings=("emb_token", "emb_refs", "emb_dims", "rope_layer")),
    _p("attention", 3, "Attention", "visibility",
       "Each token looks back at the tokens before it and takes a weighted mix of what they carry; each head looks for something else.",
       handout="trace",
       summary="Attention: query, key, value, heads",
       settings=("attn_layer", "attn_sink", "attn_scale", "attn_present_head", "attn_head", "bv_view", "bv_layers")),
    _p("layer", 4, "Inside a layer", "layers",
       "Every layer adds what attention and the feed-forward network found to a running sum, and the answer forms layer by layer.",
       handout="trace",
       summary="Inside a layer: norm, feed-forward, residual, logit lens",
       settings=("layer_pos",)),
    _p("next-token", 5, "Next token", "casino",
       "The last layer gives a score to every token in the vocabulary; softmax, temperature and top-k/top-p turn the scores into one choice.",
       handout="trace",
       summary="Logits → softmax → temperature → top-k / top-p → sample",
       settings=("temperature", "top_k", "top_p", "min_p", "seed", "n_show")),
    _p("generation", 6, "Generation", "autorenew",
       "The chosen token is appended and the model runs again, one token at a time, until it stops.",
       heading="Generation: the autoregressive loop", handout="run",
       summary="The autoregressive loop",
       settings=("gen_n", "gen_t", "gen_k", "gen_p", "gen_minp", "gen_seed", "steps_new", "steps_on", "steps_step", "steps_layer")),
    _p("prefill-decode", 7, "Prefill vs decode", "speed",
       "Prefill reads the whole prompt in one pass; each decode step then pays mostly for reading the weights, for one token.", handout="run",
       settings=("sweep_max",)),
    _p("kv-cache", 8, "KV cache", "memory",
       "Keys and values of past tokens are kept, so each step computes only the newest: memory that grows with every token.",
       heading="The KV cache", handout="run",
       summary="The KV cache"),
    _p("hardware", 9, "Hardware", "developer_board",
       "Generation is mostly matrix multiplication; at batch 1 it waits on memory, not on arithmetic.",
       summary="GPU vs CPU, matrix multiplication",
       settings=("hw_n",)),
    _p("roofline", 10, "Roofline", "show_chart",
       "Prefill is compute-bound, decode is memory-bound: the ridge point of this device says where one turns into the other.",
       heading="Roofline: compute-bound or memory-bound?",
       summary="Compute-bound or memory-bound",
       settings=("roof_T", "roof_C")),
    _p("attention-kernels", 11, "Attention kernels", "bolt",
       "Fused attention kernels give the same numbers without writing the T×T score matrix to memory.",
       heading='Attention kernels ("FlashAttention")',
       summary="FlashAttention-style kernels",
       settings=("kern_max",)),
    _p("production", 12, "Production mode", "factory",
       "A static cache and a fused step cut the overheads around the same arithmetic.",
       heading="Production mode: static cache, fused step, CUDA graph",
       settings=("prod_n",)),
    _p("speculative", 13, "Speculative decoding", "fast_forward",
       "A cheap draft guesses several tokens, the big model checks them all in one pass: same output, fewer passes.",
       settings=("spec_own", "spec_prompt", "spec_kind", "spec_gamma", "spec_n", "spec_t")),
    _p("streaming-sharding", 14, "Streaming & sharding", "lan",
       "Tokens are sent the moment they are sampled; a model too big for one device is split across several.", handout="run",
       summary="Streaming, tensor parallelism and sharding",
       settings=("shard_n",)),
    _p("batching", 15, "Continuous batching", "groups",
       "One engine serves everyone: requests join and leave the batch at every step, so nobody waits for the longest answer.",
       heading="Continuous batching: serving many users",
       summary="Continuous batching of many users",
       settings=("batch_lib", "batch_eos")),
    _p("misconceptions", 16, "Misconceptions, tested", "fact_check",
       "It writes one token at a time, reads tokens not words, knows no more when hotter, pays for every token of context, and forgets you.",
       heading="Common misconceptions, tested", handout="trace",
       summary="Common misconceptions, tested",
       settings=("myth_at",)),
    _p("why", 17, "Why this token", "psychology",
       "Every head and feed-forward block adds a share to the chosen token's logit; switching the largest off shows which ones the answer needs.",
       handout="trace", summary="Why this token: attribution and interventions"),
)  # fmt: skip
OPERATOR = _p("operator", None, "Operator", "admin_panel_settings", "", hidden=True)
ALL: tuple[PageSpec, ...] = (*STAGES, OPERATOR)
BY_SLUG: dict[str, PageSpec] = {p.slug: p for p in ALL}
BY_TITLE: dict[str, PageSpec] = {p.title: p for p in ALL}
SHARED_SETTINGS = ("model_choice", "prompt", "chat")  # the sidebar's bound widgets: part of every page's view


def view_of(slug: str, state) -> dict:
    """What a live class's view of page `slug` may carry from `state` (a mapping of widget keys to values): the
    page's model, prompt and chat mode (SHARED_SETTINGS) and its own bound settings (PageSpec.settings), nothing
    else: no identity, no limit, nothing of the live class itself, no key that starts with "_", and nothing at all for
    a slug that is no page or a hidden one. The one allowlist: the presenter publishes through it and a follower
    applies through it."""
    spec = BY_SLUG.get(slug) if isinstance(slug, str) else None
    if spec is None or spec.hidden:
        return {}
    return {k: state[k] for k in (*SHARED_SETTINGS, *spec.settings) if k in state and not k.startswith("_")}


def neighbours(spec: PageSpec) -> tuple[PageSpec | None, PageSpec | None]:
    """The previous and next stage in the article's order (None at either end, and for a hidden page)."""
    if spec not in STAGES:
        return None, None
    at = STAGES.index(spec)
    return (STAGES[at - 1] if at > 0 else None), (STAGES[at + 1] if at + 1 < len(STAGES) else None)
