"""The lesson handout's sections for the autoregressive loop (views.handout_sections holds the rest and the helpers; views.handout the registry):
the generation with its checks and one recorded decode step over the KV cache, prefill vs decode, the KV cache."""

from __future__ import annotations

import html

from components.fmt import prob
from components.generation import kv_growth_figure, step_times_figure
from components.steps_figures import cache_strip_figure, step_attention_figure
from components.tokens import visible
from pipeline import text_of
from pipeline.generation import kv_bytes_formula, metrics, steps
from pipeline.lab import checks
from views.handout_sections import checks_html, figure_html, safely, table_html

STEPS_NEW = 6  # decode steps the handout records for the loop seen from the KV cache


def stage_generation(lm, rec):
    return (
        f"<p>{len(rec.events)} greedy tokens, our own loop, one forward pass per token:</p><pre class='verbatim'>{html.escape(rec.text())}</pre>"
        + checks_html(checks.generation_checks(lm, rec))
        + safely(_decode_steps, lm, rec)
    )


def _decode_steps(lm, rec):
    """The last of STEPS_NEW recorded decode steps at the last layer: each head's newest query over every cached key."""
    got = steps(lm, rec.prompt, new=STEPS_NEW, chat=rec.chat)
    i, layer, P = len(got.steps) - 1, lm.facts.n_layers - 1, len(got.prompt_ids)
    s = got.steps[i]
    labels = [text_of(lm.tokenizer, [t]) for t in got.ids[: s.cache_len]]
    rows = {
        "keys in the cache": f"{s.cache_len:,} ({P} from the prompt, {s.cache_len - P} generated)",
        "KV cache": f"{s.kv_bytes / 2**10:,.0f} KiB",
        "this step": f"{s.seconds * 1000:.1f} ms (the prefill: {got.steps[0].seconds * 1000:.1f} ms over {P} tokens)",
        "token chosen": f"{visible(s.token)!r} p = {prob(s.p)}",
    }
    return (
        f"<h3>The loop seen from the KV cache: decode step {i}, layer {layer}</h3><p>The new token's query attends over every cached "
        "key; only its own key and value (the last column) were computed this step, every other one was read from the cache.</p>"
        + table_html(rows)
        + figure_html(step_attention_figure(s.attention[layer], labels, P, i, layer), f"decode step {i} attention, layer {layer}")
        + figure_html(cache_strip_figure(P, s.cache_len, i), f"KV cache at step {i}")
        + checks_html([checks.check_step(lm, got, i)])
    )


def stage_prefill(lm, rec):
    m = metrics(rec.events)
    rows = {
        "time to first token (prefill)": f"{m.ttft_s * 1000:.0f} ms",
        "mean decode step": f"{m.tpot_s * 1000:.0f} ms" if m.tpot_s else "—",
        "prompt tokens": rec.prompt_tokens,
    }
    return table_html(rows) + figure_html(step_times_figure(rec.events), "time per generated token")


def stage_kv(lm, rec):
    last = rec.events[-1]
    L = lm.facts.n_layers
    rows = {
        f"formula, per token (all {L} layers)": f"{kv_bytes_formula(lm, 1):,} B",
        "… of which one layer": f"{lm.kv_token_bytes:,} B (2 × {lm.facts.n_kv_heads} KV heads × {lm.facts.head_dim} × {lm.arch.bytes_per_value} B)",
        "cache at the end": f"{last.kv_bytes / 2**20:.2f} MiB ({last.context_len} tokens)",
    }
    return (
        table_html(rows)
        + figure_html(kv_growth_figure(rec.events, lambda n: kv_bytes_formula(lm, n)), "KV cache size")
        + checks_html([checks.check_kv_bytes(lm, rec.events)])
    )
