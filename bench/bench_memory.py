"""Memory and responsiveness at 2,048 tokens: extra RSS of tracing + building the attention page's
figures (goal about 1.5 GB), the bytes those figures send, and the attention page's run time in AppTest.

    .venv/bin/python bench/bench_memory.py
"""

import time

import psutil
from common import ROOT, write


def main():

    import pipeline
    from components.attention_figures import attention_heads, mosaic_image
    from components.figures import labels_of
    from pipeline.common.telemetry import PeakMemory

    lm = pipeline.load_model()
    pipeline.trace(lm, "warm up")
    text = (
        "Why is the sky blue? Sunlight is scattered by the molecules of the air, and blue light is scattered "
        "more than red light because it has a shorter wavelength. "
    ) * 80
    ids = lm.tokenizer(text)["input_ids"][:2048]
    prompt = lm.tokenizer.decode(ids)
    rss0 = psutil.Process().memory_info().rss
    with PeakMemory(lm.device, what="rss") as m_trace:
        t = time.perf_counter()
        tr = pipeline.trace(lm, prompt)
        t_trace = time.perf_counter() - t
    with PeakMemory(lm.device, what="rss") as m_render:
        t = time.perf_counter()
        labels = labels_of(tr.tokens)
        layer = lm.facts.n_layers // 2
        full = tr.attention(layer)
        overview = tr.acts["blocks.*.attn.hook_pattern|pooled"]
        fig = attention_heads(overview[layer], labels, block=tr.acts.attn_block, layer=layer)
        fig_json = fig.to_json()
        img = mosaic_image(overview, cell=64)
        t_render = time.perf_counter() - t
    rss_end = psutil.Process().memory_info().rss
    import io

    import torch
    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(img).save(png, format="PNG")
    with torch.inference_mode():
        t = time.perf_counter()
        lm.model(torch.tensor([tr.input_ids]))
        t_plain = time.perf_counter() - t
    trace_bytes = tr.nbytes

    # the attention page itself, through AppTest, at this length
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.session_state["prompt"] = prompt
    at.run()
    at.switch_page("views/stages/attention.py")
    t = time.perf_counter()
    at.run()
    t_page_first = time.perf_counter() - t
    t = time.perf_counter()
    at.select_slider(key="attn_layer").set_value(0).run()
    t_page_layer = time.perf_counter() - t
    write(
        "memory",
        {
            "model": lm.label,
            "tokens": tr.T,
            "extra_rss_mb": {
                "trace_peak": round(m_trace.extra_mb, 1),
                "render_peak": round(m_render.extra_mb + (m_render.base - rss0) / 2**20, 1),
                "retained_after": round((rss_end - rss0) / 2**20, 1),
                "goal": 1536,
            },
            "trace_arrays_mb": round(trace_bytes / 2**20, 1),
            "attention": {
                "overview_block": tr.acts.attn_block,
                "full_layers_kept": tr.acts.layers("blocks.*.attn.hook_pattern"),
                "full_layer_shape": list(full.shape) if full is not None else None,
            },
            "seconds": {
                "trace": round(t_trace, 2),
                "plain_forward_sdpa": round(t_plain, 2),
                "build_attention_figures": round(t_render, 2),
                "attention_page_first_run_incl_trace": round(t_page_first, 2),
                "attention_page_change_layer": round(t_page_layer, 2),
            },
            "sent_to_browser_kb": {"layer_heatmaps_json": round(len(fig_json) / 1024, 1), "all_layers_mosaic_png": round(len(png.getvalue()) / 1024, 1)},
            "page_exception_text": str(at.exception[0].value)[:300] if at.exception else None,
            "page_exception": bool(at.exception),
        },
    )


if __name__ == "__main__":
    main()
