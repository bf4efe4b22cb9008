"""Readouts over a Trace and the model's weights: embeddings, PCA, neighbours, drift, RoPE.

No forward passes here except where a function says so; everything reads the weights or a Trace.
"""
from __future__ import annotations

import numpy as np
import torch

from .models import LoadedModel
from .trace import Trace


# ------------------------------------------------------------------------------- embeddings
def embedding_matrix(lm: LoadedModel) -> torch.Tensor:
    """[vocab, d] the embedding table (unscaled weights)."""
    return lm.model.get_input_embeddings().weight


def embed_ids(lm: LoadedModel, ids: list[int]) -> np.ndarray:
    """[n, d] the embedding lookup exactly as the model does it (row of the table, times Gemma's scale)."""
    with lm.lock, torch.inference_mode():   # the lock: a concurrent trace's hooks must not see this call
        return lm.model.get_input_embeddings()(torch.tensor([ids], device=lm.device))[0].float().cpu().numpy()


def word_vectors(lm: LoadedModel, words: list[str]) -> list[tuple[str, list[str], np.ndarray]]:
    """Each reference word (with a leading space, as it appears mid-sentence) -> (word, its pieces, mean
    of its token embeddings [d])."""
    out = []
    for w in words:
        w = w.strip()
        if not w:
            continue
        ids = lm.tokenizer(" " + w, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if not ids:
            continue
        out.append((w, lm.tokenizer.convert_ids_to_tokens(ids), embed_ids(lm, ids).mean(axis=0)))
    return out


def pca(x: np.ndarray, k: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Principal components of the rows of x [n, d]: (coordinates [n, k], explained variance ratio [k])."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(axis=0, keepdims=True)
    u, s, _ = np.linalg.svd(xc, full_matrices=False)
    k = min(k, len(s))
    var = s ** 2
    ratio = var[:k] / var.sum() if var.sum() > 0 else np.zeros(k)
    coords = u[:, :k] * s[:k]
    if coords.shape[1] < 3:
        coords = np.pad(coords, ((0, 0), (0, 3 - coords.shape[1])))
    return coords, ratio


_UNIT: dict[int, torch.Tensor] = {}


def _unit_rows(lm: LoadedModel) -> torch.Tensor:
    if id(lm.model) not in _UNIT:
        e = embedding_matrix(lm).detach().float()
        _UNIT[id(lm.model)] = e / (e.norm(dim=1, keepdim=True) + 1e-12)
    return _UNIT[id(lm.model)]


def nearest_tokens(lm: LoadedModel, token_id: int, k: int = 10) -> list[tuple[int, str, float]]:
    """The k vocabulary entries whose embedding rows are closest (cosine) to token_id's row."""
    with torch.inference_mode():
        unit = _unit_rows(lm)                   # rows scaled to length 1, computed once per model
        sims = unit @ unit[token_id]
        vals, idx = sims.topk(k + 1)
    out = []
    for s, i in zip(vals.tolist(), idx.tolist()):
        if i != token_id:
            out.append((i, lm.tokenizer.decode([i]), s))
    return out[:k]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def find_token(tr: Trace, word: str) -> int | None:
    """Index of the first non-special token whose text (stripped) starts the word, e.g. 'Apple'."""
    w = word.strip().lower()
    for i, t in enumerate(tr.tokens):
        s = t.text.strip().lower()
        if not t.special and s and (s == w or (w.startswith(s) and len(s) >= 2)):
            return i
    return None


def drift(tr_a: Trace, ia: int, tr_b: Trace, ib: int) -> np.ndarray:
    """[L+1] cosine similarity of one token's residual-stream vector in two prompts, layer by layer."""
    return cosine(tr_a.hidden_states[:, ia, :], tr_b.hidden_states[:, ib, :])


# ------------------------------------------------------------------------------------ RoPE
def rope_inv_freq(lm: LoadedModel, layer: int = 0) -> np.ndarray | None:
    """[D/2] the rotation frequencies the model uses in `layer` (None for models without RoPE)."""
    base = lm.model.get_decoder() if hasattr(lm.model, "get_decoder") else lm.model.model
    rot = getattr(base, "rotary_emb", None)
    if rot is None:
        return None
    if hasattr(rot, "inv_freq"):
        return rot.inv_freq.float().cpu().numpy()
    types = getattr(lm.model.config, "layer_types", None) or []
    name = f"{types[layer]}_inv_freq" if layer < len(types) else None
    if name and hasattr(rot, name):
        return getattr(rot, name).float().cpu().numpy()
    return None


def rope_angles(inv_freq: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """[P, D/2] the angle (radians) each 2-D pair of a query/key is rotated by at each position."""
    return np.outer(np.asarray(positions, np.float64), np.asarray(inv_freq, np.float64))


def rotate(x: np.ndarray, pos: float, inv_freq: np.ndarray) -> np.ndarray:
    """Apply RoPE at position `pos` to vectors x [..., D], in transformers' rotate-half layout."""
    ang = np.asarray(inv_freq, np.float64) * pos
    cos, sin = np.concatenate([np.cos(ang)] * 2), np.concatenate([np.sin(ang)] * 2)
    h = x.shape[-1] // 2
    rot_half = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot_half * sin


def relative_scores(q_raw: np.ndarray, k_raw: np.ndarray, inv_freq: np.ndarray, max_dist: int,
                    at: int = 0) -> np.ndarray:
    """[max_dist+1] the query-key dot product when the key sits d positions before the query, d = 0..max_dist,
    with the query placed at position at + d (RoPE makes it depend on d only)."""
    return np.array([rotate(q_raw, at + d, inv_freq) @ rotate(k_raw, at, inv_freq) for d in range(max_dist + 1)])


def rope_theta_of(inv_freq: np.ndarray, head_dim: int) -> float:
    """The base θ behind inv_freq[i] = θ^(-2i/head_dim) (read back from the model's own frequencies)."""
    return float(inv_freq[1] ** (-head_dim / 2)) if len(inv_freq) > 1 else float("nan")


def layer_kind(lm: LoadedModel, layer: int) -> str:
    """'' for uniform models; Gemma-style models alternate local (sliding-window) and global layers."""
    types = getattr(lm.model.config, "layer_types", None)
    if not types or len(set(types)) < 2:
        return ""
    if types[layer] == "sliding_attention":
        return f"a local layer: attends to the last {lm.model.config.sliding_window:,} tokens only"
    return "a global layer: attends to every earlier token"
