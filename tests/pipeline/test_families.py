"""Eight decoder families that transformers ships, each a small seeded random model saved as a local Hugging Face folder
(safetensors, the embedded model's tokenizer beside it; nothing downloaded), opened as a user opens theirs
(`load_model(folder)`): the traced next-token distribution against a plain transformers forward, direct logit
attribution summing to the model's own logit, and a feed-forward block switched off against the model with that
block's output projection zeroed. The model parts each of these reads come from the adapter (pipeline.model.arch):
GPT-2 (learned positions, LayerNorm with bias, Conv1D), Phi-3 (fused qkv and gate_up) and OLMo-2 (norms after the
sublayers) failed here before."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from families import FAMILIES, V, family_folders  # noqa: E402

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return family_folders(tmp_path_factory.mktemp("families"))


def _plain(folder, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model, model(torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_opened_from_its_folder_traces_explains_and_ablates_like_the_model(folders, family):
    from pipeline import trace
    from pipeline.forward.attribution import ablate, attribute
    from pipeline.model.loaded import load_model

    lm = load_model(str(folders[family]))
    tr = trace(lm, PROMPT)
    model, ref = _plain(folders[family], list(tr.input_ids))
    # the hooked trace against transformers' own eager forward: every layer's residual stream and attention map
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(torch.tensor([list(tr.input_ids)]), output_hidden_states=True, output_attentions=True)
    hs = torch.stack([h[0] for h in out.hidden_states]).float()  # [L+1, T, d]; the last one after the final norm
    ours = torch.as_tensor(tr.acts["blocks.*.hook_resid_pre"])
    assert torch.allclose(ours[:-1], hs[:-1], atol=1e-4, rtol=1e-4), (family, float((ours[:-1] - hs[:-1]).abs().max()))
    assert tr.acts.attn_block == 1 and np.allclose(tr.acts["blocks.*.attn.hook_pattern"], torch.stack([a[0] for a in out.attentions]).numpy(), atol=2e-3), (
        family
    )
    p_ours = torch.softmax(torch.as_tensor(tr.next_logits).double(), -1)
    p_ref = torch.softmax(ref.double(), -1)
    top = int(p_ref.argmax())
    assert int(p_ours.argmax()) == top and abs(float(p_ours[top] - p_ref[top])) < 1e-4, (family, float(p_ours[top]), float(p_ref[top]))
    assert float(p_ref[top]) > 2 / V, "the fixture's top token stands out of a uniform guess"

    a = attribute(lm, tr)
    assert a.target == top
    assert abs(a.total - a.logit) < 1e-4 * max(1.0, abs(a.logit)), (family, a.total, a.logit)
    assert abs(a.logit - float(ref[top])) < 1e-3 * max(1.0, abs(float(ref[top]))), "the model's own logit"

    # the last layer's feed-forward block switched off = the same model with that block's output projection zeroed
    last = lm.facts.n_layers - 1
    off = ablate(lm, tr, [f"L{last} FFN"])
    out = lm.arch.ffn_out(last)
    zeroed = dict(lm.model.named_modules())
    name = next(n for n, m in zeroed.items() if m is out)
    with torch.no_grad():
        mod = dict(model.named_modules())[name]
        mod.weight.zero_()
        if getattr(mod, "bias", None) is not None:
            mod.bias.zero_()
        want = model(torch.tensor([list(tr.input_ids)])).logits[0, -1]
    assert torch.allclose(off.logits_after, want.float(), atol=1e-4), (family, float((off.logits_after - want).abs().max()))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_generates_as_transformers_and_patching_its_last_layer_restores_the_clean_answer(folders, family):
    """Our own generation loop against transformers' greedy `generate`; and causal tracing's last-layer property: the
    clean run's residual stream restored after the last layer at the last position gives back all of the clean
    logit difference (the grid's corner is 1)."""
    from pipeline import trace
    from pipeline.forward.attribution import patch
    from pipeline.generation import generate, prepare
    from pipeline.model.loaded import load_model

    lm = load_model(str(folders[family]))
    ids = prepare(lm, PROMPT, 1).prompt_ids
    model, _ = _plain(folders[family], ids)
    model.generation_config.eos_token_id = None
    ours = [e.token_id for e in generate(lm, PROMPT, 8, cache="dynamic", stop_ids=set())]
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(ids) :].tolist()
    assert ours == want, family
    clean, corrupt = trace(lm, "The capital of France is"), trace(lm, "The capital of Italy is")
    assert clean.T == corrupt.T
    p = patch(lm, clean, corrupt)
    assert abs(p.grid[-1, -1] - 1.0) < 1e-3, (family, p.grid[-1, -1])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_engine_serves_a_family_with_transformers_answers(folders, family):
    """Three requests at once through the engine every visitor shares (on the C kernels where they implement the
    family, on the torch path elsewhere), each equal to transformers' greedy `generate` on that prompt alone."""
    from pipeline.engine import Engine
    from pipeline.generation import prepare
    from pipeline.model.loaded import load_model

    lm = load_model(str(folders[family]))
    prompts = ["The capital of France is", "Dog bites man.", "Alice, Bob, Charlie and Diana each ordered"]
    model, _ = _plain(folders[family], prepare(lm, prompts[0], 1).prompt_ids)
    model.generation_config.eos_token_id = None
    eng = Engine(lm, kv_pool_bytes=8 << 20, background=False)
    hs = {p: eng.submit(prepare(lm, p, 1).prompt_ids, 8, stop_ids=frozenset()) for p in prompts}
    while eng.iterate() is not None:
        pass
    for p, h in hs.items():
        ids = prepare(lm, p, 1).prompt_ids
        with torch.no_grad():
            want = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0, len(ids) :].tolist()
        assert [e.token_id for e in h] == want, (family, p)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_page_renders_on_a_family_opened_as_a_local_folder(folders, family):
    """Every page of the app (AppTest) on the family's folder chosen as a visitor does ("Local folder…" and its path):
    drawn without an exception or an error message."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from views.loading import LOCAL
    from views.pages import ALL

    app = str(Path(__file__).resolve().parents[2] / "app.py")
    for spec in ALL:
        if spec.hidden:
            continue
        at = AppTest.from_file(app, default_timeout=300)
        at.session_state["model_choice"] = LOCAL
        at.session_state["local_path"] = str(folders[family])
        at.run()
        if spec.slug:
            at.switch_page(spec.file).run()
        assert not at.exception, (family, spec.slug, [e.value for e in at.exception])
        assert not at.error, (family, spec.slug, [e.value for e in at.error])
        if not spec.slug:  # the model the pages ran is the family's, not a fallback
            said = "\n".join(str(e.value) for kind in ("markdown", "caption", "info") for e in getattr(at, kind))
            assert f"Loaded from `{folders[family]}`" in said, said[:500]


def test_a_measurement_a_family_cannot_take_is_said_in_the_page(folders):
    """The roofline's per-operation timing takes Llama-layout layers: on GPT-2 its button says so, never a traceback."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from views.loading import LOCAL

    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=300)
    at.session_state["model_choice"] = LOCAL
    at.session_state["local_path"] = str(folders["gpt2"])
    at.run()
    at.switch_page("views/stages/roofline.py").run()
    at.button(key="roof_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Llama layout" in str(w.value) and "gpt2" in str(w.value) for w in at.warning), [w.value for w in at.warning]
