"""Model knowledge lives in the model room: a built-in model is a row of pipeline/model/registry.py's BUILTINS and an
architecture's parts are pipeline/model/arch.py's; nothing else names them (CONTRIBUTING.md, "Adding a model")."""

import ast
import re
from pathlib import Path

import pytest

from pipeline.model import registry

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
APP = [p for d in ("pipeline", "views", "components", "appstate") for p in (ROOT / d).rglob("*.py")] + [
    ROOT / f for f in ("app.py", "hosting/demo.py", "hosting/explorer.py")
]
FACES = {ROOT / "pipeline" / "__init__.py", ROOT / "pipeline" / "model" / "__init__.py", ROOT / "pipeline" / "model" / "registry.py"}


def test_no_branch_on_a_built_in_models_key_outside_the_registry():
    keys = {b.key for b in registry.BUILTINS.values()}
    bad = []
    for p in APP:
        if p in FACES:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            named = isinstance(node, ast.Name) and node.id in ("EMBEDDED", "GEMMA") or isinstance(node, ast.Attribute) and node.attr in ("EMBEDDED", "GEMMA")
            imported = isinstance(node, ast.ImportFrom) and any(a.name in ("EMBEDDED", "GEMMA") for a in node.names)
            spelled = isinstance(node, ast.Constant) and node.value in keys  # the key itself, not a docstring naming it
            if named or imported or spelled:
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "a built-in model's key outside pipeline/model/registry.py:\n" + "\n".join(bad)


def test_architecture_names_live_in_the_adapter():
    """Norm module types (which formula our steps re-implement) are the adapter's (arch.NORM_KINDS)."""
    bad = [
        f"{p.relative_to(ROOT)}"
        for p in APP
        if p != ROOT / "pipeline" / "model" / "arch.py" and re.search(r"\"(Llama|Mistral|Qwen2|Qwen3|Gemma3)RMSNorm\"", p.read_text())
    ]
    assert not bad, bad


def test_every_built_in_model_is_one_complete_row():
    for b in registry.BUILTINS.values():
        assert b.key == registry.canonical_key(b.key) and b.name and b.picker and b.install
        assert callable(b.installed) and callable(b.gguf)
    assert registry.DEFAULT in registry.BUILTINS
    assert [m.key for m in registry.available_models()][: len(registry.BUILTINS)] == list(registry.BUILTINS)


# transformers' names for a model's parts, in the families the explorer runs (Llama-style, Gemma, Phi-3, GPT-2, OLMo-2);
# the generic ones (layers, norm, mlp, attn, h) are left out: our own objects use them too
MODULE_NAMES = {
    "embed_tokens", "embed_positions", "wte", "wpe", "ln_f", "final_layernorm", "rotary_emb",
    "self_attn", "q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "c_attn", "c_proj", "q_norm", "k_norm",
    "gate_proj", "up_proj", "gate_up_proj", "down_proj", "c_fc", "act_fn",
    "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm", "ln_1", "ln_2",
    "lm_head",
    "get_input_embeddings", "get_output_embeddings", "_attn_implementation",  # arch.embed(), unembedding(), attention_as()
}  # fmt: skip
ADAPTER = ROOT / "pipeline" / "model" / "arch.py"


def test_a_models_parts_are_named_only_in_the_adapter():
    """Every module of a loaded model is reached through the adapter's roles (arch.embed(), attn_out(i), ffn_out(i),
    in_norm(i), post_norms(i), unembedding(), qkv_projs(i), …): an attribute access or a string with a transformers
    module name anywhere else in the app fails here, so a new architecture is one place to teach."""
    bad = []
    for p in APP:
        if p == ADAPTER:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            named = isinstance(node, ast.Attribute) and node.attr in MODULE_NAMES and not isinstance(node.ctx, ast.Store)
            spelled = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODULE_NAMES
            if named or spelled:
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.attr if named else node.value}")
    assert not bad, "a transformers module name outside pipeline/model/arch.py:\n" + "\n".join(bad)
