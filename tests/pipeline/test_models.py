import io
import json
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.model import ModelLoadError, check_folder, load_model

pytestmark = pytest.mark.model


def test_embedded_model_facts(smol):
    f = smol.facts
    assert (f.n_layers, f.n_heads, f.n_kv_heads, f.head_dim, f.d_model, f.vocab) == (30, 9, 3, 64, 576, 49152)
    assert f.positional == "rope" and f.rope_theta == 1e5 and f.norm == "RMSNorm" and f.tied_embeddings
    assert smol.device.type in ("cpu", "cuda")


def test_gemma_facts(lm):
    if lm.key != pipeline.GEMMA:
        pytest.skip("gemma only")
    f = lm.facts
    assert (f.n_layers, f.n_heads, f.n_kv_heads, f.vocab) == (18, 4, 1, 262144)


def test_local_folder_loads_the_same_model(smol):
    # the safetensors cache is an ordinary Hugging Face folder: load it by path
    other = load_model(smol.source)
    a = pipeline.trace(smol, "Hello")
    b = pipeline.trace(other, "Hello")
    # not bit-equal once other tests have fused smol's weights (the same values, read through views into one
    # fused tensor, so the matmul kernels may differ in the last bit)
    assert np.allclose(a.next_logits, b.next_logits, atol=1e-4) and a.next_logits.argmax() == b.next_logits.argmax()


@pytest.mark.unit
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda p: p / "missing", "No such folder"),
        (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "is a file"),
        (lambda p: p, "no config.json"),
        (lambda p: ((p / "config.json").write_text("{}"), p)[1], "no \\*.safetensors"),
        (lambda p: ((p / "config.json").write_text("{}"), (p / "pytorch_model.bin").write_bytes(b"\x80"), p)[2], "pickle"),
    ],
)
def test_bad_folders_give_clear_errors(tmp_path, make, match):
    path = make(tmp_path)
    with pytest.raises(ModelLoadError, match=match):
        load_model(str(path))


@pytest.mark.unit
def test_broken_safetensors_folder_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"not really")
    with pytest.raises(ModelLoadError, match="not a safetensors file"):
        load_model(str(tmp_path))
    assert check_folder(tmp_path) == tmp_path


def _fake_folder(tmp_path, smol, tensors: dict, **config):
    """A folder with the embedded model's config (edited) and a safetensors file holding `tensors`."""
    from safetensors.torch import save_file

    cfg = json.loads((Path(smol.source) / "config.json").read_text())
    cfg.update(config)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.model
def test_weights_that_do_not_match_the_config_are_refused_before_loading(tmp_path, smol):
    """A config with a dummy safetensors file used to load silently as a random-weights model."""
    import torch

    _fake_folder(tmp_path, smol, {"dummy": torch.zeros(2)})
    with pytest.raises(ModelLoadError, match="do not match its config.json.*missing.*unexpected.*random weights"):
        load_model(str(tmp_path))


@pytest.mark.model
def test_a_config_asking_for_10000_layers_is_refused_without_allocating(tmp_path, smol):
    import resource

    from safetensors.torch import load_file

    real = load_file(str(Path(smol.source) / "model.safetensors"))
    _fake_folder(tmp_path, smol, {k: v for k, v in real.items() if ".layers.0." in k or "layers" not in k}, num_hidden_layers=10_000)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelLoadError, match="asks for 10,000 layers but the weight files hold 1"):
        load_model(str(tmp_path))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 500_000  # KiB: 10,000 layers never allocated


@pytest.mark.model
def test_wrong_shapes_are_refused(tmp_path, smol):
    from safetensors.torch import load_file

    real = load_file(str(Path(smol.source) / "model.safetensors"))
    real["model.norm.weight"] = real["model.norm.weight"][:10].clone()
    _fake_folder(tmp_path, smol, real)
    with pytest.raises(ModelLoadError, match="wrong shape.*model.norm.weight"):
        load_model(str(tmp_path))


@pytest.mark.unit
def test_one_folder_is_one_key_however_it_is_typed(tmp_path):
    from pipeline.model import canonical_key

    (tmp_path / "m").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "m")
    keys = {
        canonical_key(str(tmp_path / "m")),
        canonical_key(str(tmp_path / "m") + "/"),
        canonical_key(str(tmp_path / "m") + "//"),
        canonical_key(str(tmp_path / "link")),
        canonical_key(f" {tmp_path}/./m "),
    }
    assert keys == {str((tmp_path / "m").resolve())}
    assert canonical_key(pipeline.EMBEDDED) == pipeline.EMBEDDED and canonical_key(None) == pipeline.EMBEDDED


@pytest.mark.model
def test_cli_next_and_trace_json():
    from pipeline.__main__ import main

    buf = io.StringIO()
    assert main(["next", "The capital of France is", "--top-k", "5", "--json"], out=buf) == 0
    data = json.loads(buf.getvalue())
    assert data["top"][0]["text"] == " Paris" and data["candidates_kept"] == 5
    assert abs(sum(c["p"] for c in data["top"]) - 1) < 1e-4
    buf = io.StringIO()
    assert main(["trace", "Why is the sky blue?", "--chat", "--json"], out=buf) == 0
    data = json.loads(buf.getvalue())
    assert data["shapes"]["activations"]["blocks.*.hook_resid_pre"][0] == 31 and data["config"]["kv_heads"] == 3
    assert main(["trace", "  "], out=io.StringIO()) == 2


@pytest.mark.load  # a fresh GGUF conversion; the damaged-cache test below converts too, in make test
def test_first_load_converts_once_with_progress_then_uses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_EXPLORER_CACHE", str(tmp_path))
    seen = []
    first = load_model(pipeline.EMBEDDED, progress=lambda f, m: seen.append((f, m)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any("dequantising" in m for _, m in seen)
    assert list(tmp_path.glob("smollm2*/model.safetensors"))
    seen.clear()
    again = load_model(pipeline.EMBEDDED, progress=lambda f, m: seen.append((f, m)))
    assert not any("dequantising" in m for _, m in seen)  # loaded from the safetensors cache
    a, b = pipeline.trace(first, "Hi"), pipeline.trace(again, "Hi")
    assert np.array_equal(a.next_logits, b.next_logits)


def test_a_damaged_cache_is_rebuilt_and_the_model_again_answers_paris(tmp_path, monkeypatch, smol):
    """Each start checks every cached file against the SHA-256 recorded at conversion and rebuilds the cache from
    the GGUF on any mismatch, with progress as on a first start (a tokenizer.json cut short used to fail every
    start; 50 MB of random bytes over the weights loaded with 51,043 non-finite weights). One rebuild here for every
    damage at once, and a conversion killed mid-way (its temp folder) cleaned up; which damage each check catches
    is the unit tier's (tests/app/test_demo.py, test_the_cache_digest_catches_every_damage)."""
    import os
    import shutil

    monkeypatch.setenv("LLM_EXPLORER_CACHE", str(tmp_path))
    folder = tmp_path / Path(smol.source).name
    shutil.copytree(smol.source, folder)  # the intact cache, as a running server has it
    weights, tok = folder / "model.safetensors", folder / "tokenizer.json"
    size = weights.stat().st_size
    tok.write_bytes(tok.read_bytes()[:1000])
    with weights.open("r+b") as f:
        f.seek(size - 50 * 2**20)
        f.write(os.urandom(50 * 2**20))
    (tmp_path / f"{folder.name}.tmp-99999").mkdir()
    seen = []
    lm = load_model(pipeline.EMBEDDED, progress=lambda f, m: seen.append(m))
    assert any("damaged" in m for m in seen) and any("dequantising" in m for m in seen)
    assert weights.stat().st_size == size and pipeline.model.cache_problem(folder) is None and not list(tmp_path.glob("*.tmp-*"))
    tr = pipeline.trace(lm, "The capital of France is")
    assert lm.tokenizer.decode([int(tr.next_logits.argmax())]) == " Paris"
    assert all(bool(p.isfinite().all()) for p in lm.model.parameters())


def test_random_weight_model_has_the_same_shape(smol):
    from pathlib import Path

    from pipeline.model import random_model

    rnd = random_model(Path(__file__).resolve().parents[2] / "bench" / "assets" / "smollm2-shape", device="cpu")
    assert "random weights" in rnd.label
    a, b = rnd.facts, smol.facts
    assert (a.n_layers, a.n_heads, a.n_kv_heads, a.head_dim, a.vocab, a.n_params) == (b.n_layers, b.n_heads, b.n_kv_heads, b.head_dim, b.vocab, b.n_params)
    assert rnd.tokenizer("Hi")["input_ids"] == smol.tokenizer("Hi")["input_ids"]


@pytest.mark.unit
def test_one_conversion_at_a_time_across_processes(tmp_path):
    """Two processes converting the same cache folder: the second waits for the first's lock (test workers that
    converted at once used to delete each other's half-written folder)."""
    import multiprocessing as mp
    import os
    import time

    from pipeline.model.store import _alive, _conversion_lock

    ctx = mp.get_context("fork")
    out = tmp_path / "model"
    started, released = ctx.Event(), ctx.Event()

    def hold():
        with _conversion_lock(out):
            started.set()
            time.sleep(1.0)
            released.set()

    p = ctx.Process(target=hold)
    p.start()
    assert started.wait(30)
    with _conversion_lock(out):
        assert released.is_set()  # this process got the lock only once the other let it go
    p.join()
    assert _alive(os.getpid()) and not _alive(p.pid)  # a finished process's temp folder is a leftover
