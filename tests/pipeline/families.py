"""The decoder families transformers ships, each a small seeded random model saved as a local Hugging Face folder with
the embedded model's tokenizer beside it (nothing downloaded): test_families opens each as a user opens theirs,
test_triton_step runs the trimmed step's kernels on the Llama-layout ones."""

import shutil

import torch

V = 49152  # the embedded tokenizer's vocabulary
COMMON = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=V, max_position_embeddings=512
)
FAMILIES = {
    "llama": dict(COMMON, head_dim=16),
    "qwen2": dict(COMMON),  # biases on q/k/v
    "qwen3": dict(COMMON, head_dim=16),  # q/k norms
    "mistral": dict(COMMON, head_dim=16, sliding_window=4),
    "gemma3_text": dict(COMMON, head_dim=16, sliding_window=4, query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"]),
    "phi3": dict(COMMON, pad_token_id=0),  # fused qkv_proj and gate_up_proj
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=V, n_positions=512, bos_token_id=1, eos_token_id=2),
    "olmo2": dict(COMMON, eos_token_id=2),  # post-norms
}


def family_folders(root, families=FAMILIES, long: int | None = None) -> dict:
    """{family: its folder under root}, each a seeded random model of FAMILIES' config (`long`: that many positions,
    and the sliding windows 64 wide, for long prompts)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pipeline.model.store import cached_folder

    tok = cached_folder("smollm2-135m-instruct")
    out = {}
    for family in families:
        kw = dict(FAMILIES[family])
        if long:
            kw.update({"n_positions": long + 64} if family == "gpt2" else {"max_position_embeddings": long + 64})
            if "sliding_window" in kw:
                kw["sliding_window"] = 64
        cfg = AutoConfig.for_model(family, **kw)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        with torch.no_grad():  # weights large enough that the next token is not a near-uniform guess
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0, 0.3)
        model.save_pretrained(root / family)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (tok / name).exists():
                shutil.copy(tok / name, root / family / name)
        out[family] = root / family
    return out
