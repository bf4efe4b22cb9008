"""A model opened the way users have it: by its Hugging Face id, from the local Hugging Face cache laid out as the hub
lays it out (blobs, refs/main, snapshots/<revision> of links), never downloaded; its size and the free memory said
before it loads, a model that cannot fit refused with that sentence, and an architecture the explorer cannot take
apart refused with a sentence naming it."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The embedded model in a fresh Hugging Face cache, as the hub lays it out."""
    from pipeline.model.store import cached_folder

    src = cached_folder("smollm2-135m-instruct")
    cache = tmp_path_factory.mktemp("hf") / "hub"
    repo = cache / ("models--" + MODEL_ID.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    snap = repo / "snapshots" / REVISION
    snap.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "explorer_source.json":
            blob = repo / "blobs" / f"blob-{f.name}"
            shutil.copy(f, blob)
            (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    return cache


def test_the_cli_opens_a_cached_model_by_its_id_and_says_its_size_first(hub):
    env = dict(os.environ, HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, "-m", "pipeline", "--model", MODEL_ID, "next", "The capital of France is", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{MODEL_ID}: 134.5 M parameters" in r.stderr and "free on this machine" in r.stderr, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["model"] == MODEL_ID and out["top"][0]["text"] == " Paris" and abs(out["top"][0]["p"] - 0.7725) < 1e-3, out["top"][0]


def test_the_app_opens_a_cached_model_by_its_id(hub, monkeypatch):
    from huggingface_hub import constants
    from streamlit.testing.v1 import AppTest

    from views.loading import LOCAL

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.session_state["model_choice"] = LOCAL
    at.session_state["local_path"] = MODEL_ID
    at.run()
    assert not at.exception and not at.error, ([e.value for e in at.exception], [e.value for e in at.error])
    said = "\n".join(str(e.value) for kind in ("markdown", "caption", "info") for e in getattr(at, kind))
    assert f"snapshots/{REVISION}" in said and "Before it loaded: 134.5 M parameters" in said and "free on this machine" in said, said[:800]


def test_a_model_that_cannot_fit_is_refused_with_its_size_and_the_free_memory(hub, monkeypatch):
    import psutil
    from huggingface_hub import constants

    from pipeline.model import ModelLoadError, load_model
    from pipeline.model.registry import hub_folder

    class Tiny:
        available = 100 * 2**20

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tiny)
    with pytest.raises(ModelLoadError, match=r"134\.5 M parameters: 0\.5\d GB in its files.*0\.10 GB of memory is free.*does not fit, so it is not loaded"):
        load_model(MODEL_ID)  # its cached snapshot, found by id
    assert hub_folder("no-such/model") is None and hub_folder("not an id") is None


@pytest.mark.parametrize(
    "config, what",
    [
        (
            {
                "model_type": "bert",
                "architectures": ["BertForMaskedLM"],
                "vocab_size": 100,
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 64,
            },
            "encoder-only",
        ),
        (
            {
                "model_type": "t5",
                "architectures": ["T5ForConditionalGeneration"],
                "vocab_size": 100,
                "d_model": 32,
                "num_layers": 1,
                "num_heads": 2,
                "d_ff": 64,
                "d_kv": 16,
            },
            "encoder-decoder",
        ),
        (
            {
                "model_type": "mixtral",
                "architectures": ["MixtralForCausalLM"],
                "vocab_size": 100,
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "intermediate_size": 64,
                "num_local_experts": 4,
            },
            "mixture of experts",
        ),
    ],
)
def test_an_architecture_the_explorer_cannot_take_apart_is_named_and_refused(tmp_path, config, what):
    import torch
    from safetensors.torch import save_file

    from pipeline.model import ModelLoadError, load_model

    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=f"{re.escape(what)}.*The explorer runs decoder-only causal language models: Llama"):
        load_model(str(tmp_path))
