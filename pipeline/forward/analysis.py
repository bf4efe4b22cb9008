"""Readouts over a Trace and the model's weights: embeddings, PCA, neighbours, drift, RoPE.

No forward passes here except where a function says so; everything reads the weights or a Trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.common.memo import per_object
from pipeline.forward.tokens import text_of
from pipeline.forward.tracing import Trace
from pipeline.model.loaded import LoadedModel


# ------------------------------------------------------------------------------- embeddings
def embedding_matrix(lm: LoadedModel) -> torch.Tensor:
    """[vocab, d] the embedding table (unscaled weights)."""
    return lm.arch.embed().weight


def embed_ids(lm: LoadedModel, ids: list[int]) -> np.ndarray:
    """[n, d] the embedding lookup exactly as the model does it (row of the table, times Gemma's scale)."""
    with lm.lock, torch.inference_mode():  # the lock: a concurrent trace's hooks must not see this call
        return lm.arch.embed()(torch.tensor([ids], device=lm.device))[0].float().cpu().numpy()


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
    var = s**2
    ratio = var[:k] / var.sum() if var.sum() > 0 else np.zeros(k)
    coords = u[:, :k] * s[:k]
    if coords.shape[1] < 3:
        coords = np.pad(coords, ((0, 0), (0, 3 - coords.shape[1])))
    return coords, ratio


@per_object
def _unit_rows_of(embedding: torch.nn.Module) -> torch.Tensor:
    """[vocab, d] float32 embedding rows scaled to length 1 (one copy per live model, freed with it)."""
    e = embedding.weight.detach().float()
    return e / (e.norm(dim=1, keepdim=True) + 1e-12)


def _unit_rows(lm: LoadedModel) -> torch.Tensor:
    return _unit_rows_of(lm.arch.embed())


@dataclass
class EmbeddingMap:
    """The prompt's token embeddings and reference words, projected on their first principal components."""

    coords: np.ndarray  # [n, 3] PCA coordinates (zero-padded to 3 columns)
    variance: np.ndarray  # [k] explained variance ratio of each component
    n_prompt: int  # the first n_prompt rows are the prompt's tokens, in order
    words: list[str]  # the reference words, rows n_prompt.. (in order)


def embedding_map(lm: LoadedModel, tr: Trace, words: list[str]) -> EmbeddingMap | None:
    """PCA of the prompt's embeddings together with reference words (each the mean of its pieces' rows);
    None with fewer than three vectors."""
    refs = word_vectors(lm, words)
    emb = tr.acts["hook_embed"]
    X = np.concatenate([emb] + [w[2][None] for w in refs]) if refs else emb
    if len(X) < 3:
        return None
    coords, var = pca(X, 3)
    return EmbeddingMap(coords, var, tr.T, [w[0] for w in refs])


def nearest_tokens(lm: LoadedModel, token_id: int, k: int = 10) -> list[tuple[int, str, float]]:
    """The k vocabulary entries whose embedding rows are closest (cosine) to token_id's row."""
    with torch.inference_mode():
        unit = _unit_rows(lm)  # rows scaled to length 1, computed once per model
        sims = unit @ unit[token_id]
        vals, idx = sims.topk(k + 1)
    out = []
    for s, i in zip(vals.tolist(), idx.tolist()):
        if i != token_id:
            out.append((i, text_of(lm.tokenizer, [i]), s))
    return out[:k]


def embedding_norm(tr: Trace, i: int) -> float:
    """L2 length of token i's embedding in this run."""
    return float(np.linalg.norm(tr.acts["hook_embed"][i]))


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
    return cosine(tr_a.acts["blocks.*.hook_resid_pre"][:, ia, :], tr_b.acts["blocks.*.hook_resid_pre"][:, ib, :])


# ------------------------------------------------------------------------------------ RoPE
def rope_inv_freq(lm: LoadedModel, layer: int = 0) -> np.ndarray | None:
    """[D/2] the rotation frequencies the model uses in `layer` (None for models without RoPE)."""
    f = lm.arch.inv_freq(layer)
    return None if f is None else f.float().cpu().numpy()


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


def relative_scores(q_raw: np.ndarray, k_raw: np.ndarray, inv_freq: np.ndarray, max_dist: int, at: int = 0) -> np.ndarray:
    """[max_dist+1] the query-key dot product when the key sits d positions before the query, d = 0..max_dist,
    with the query placed at position at + d (RoPE makes it depend on d only)."""
    return np.array([rotate(q_raw, at + d, inv_freq) @ rotate(k_raw, at, inv_freq) for d in range(max_dist + 1)])


def rope_theta_of(inv_freq: np.ndarray, head_dim: int) -> float:
    """The base θ behind inv_freq[i] = θ^(-2i/head_dim) (read back from the model's own frequencies)."""
    return float(inv_freq[1] ** (-head_dim / 2)) if len(inv_freq) > 1 else float("nan")


def layer_kind(lm: LoadedModel, layer: int) -> str:
    """'' for uniform models; Gemma-style models alternate local (sliding-window) and global layers."""
    return lm.arch.layer_kind(layer)


@dataclass
class RopeDemo:
    """RoPE as one layer of this run applies it, read back from the captured (rotated) query and key."""

    layer: int
    inv_freq: np.ndarray  # [D/2] rotation frequencies (radians per position)
    theta: float  # the base θ behind them
    kind: str  # '' or "a local layer ..." / "a global layer ..."
    angles: np.ndarray  # [P, D/2] angle of each pair at positions 0..P-1
    q_index: int  # the query's position (the last token)
    k_index: int  # the key's position (the first token)
    q_rot: np.ndarray  # [D] head 0's query as the model rotated it
    k_rot: np.ndarray  # [D] head 0's key as the model rotated it
    q_raw: np.ndarray  # [D] the query before rotation (RoPE is orthogonal: rotate back by -position)
    k_raw: np.ndarray  # [D]
    scores_at_0: np.ndarray  # [dmax+1] q·k with the key at 0 and the query d positions later
    scores_at_100: np.ndarray  # [dmax+1] the same, both moved 100 positions on


def rope_demo(lm: LoadedModel, tr: Trace, layer: int, n_positions: int = 512, dmax: int = 256) -> RopeDemo | None:
    """Everything the embeddings page draws about RoPE for `layer` (whose Q/K the trace kept); None without RoPE."""
    inv = rope_inv_freq(lm, layer)
    if inv is None or f"blocks.{layer}.attn.hook_q" not in tr.acts:
        return None
    q, k = tr.acts[f"blocks.{layer}.attn.hook_q"], tr.acts[f"blocks.{layer}.attn.hook_k"]
    qi, ki = tr.T - 1, 0
    q_rot, k_rot = q[0, qi].astype(np.float64), k[0, ki].astype(np.float64)
    q_raw, k_raw = rotate(q_rot, -qi, inv), rotate(k_rot, -ki, inv)
    return RopeDemo(
        layer,
        inv,
        rope_theta_of(inv, tr.facts.head_dim),
        layer_kind(lm, layer),
        rope_angles(inv, np.arange(max(64, min(tr.T, n_positions)))),
        qi,
        ki,
        q_rot,
        k_rot,
        q_raw,
        k_raw,
        relative_scores(q_raw, k_raw, inv, dmax, at=0),
        relative_scores(q_raw, k_raw, inv, dmax, at=100),
    )


def learned_positions(lm: LoadedModel, n: int) -> np.ndarray | None:
    """[n, d] the first n rows of a learned position-embedding table (GPT-2 style), or None."""
    pe = lm.arch.pos_embed()
    return None if pe is None else pe.weight[:n].detach().float().cpu().numpy()


# ------------------------------------------------------------------------------------ attention
@dataclass
class HeadScores:
    """One head's attention inputs from a trace (after RoPE) and its scaled, causally masked scores."""

    layer: int
    head: int
    kv_head: int  # the key/value head this query head shares (grouped-query attention)
    q: np.ndarray  # [T, D]
    k: np.ndarray  # [T, D]
    v: np.ndarray  # [T, D]
    scores: np.ndarray  # [T, T] float64  Q·Kᵀ × the model's scaling
    masked: np.ndarray  # [T, T] float64  the same with the future (upper triangle) set to NaN


def causal_mask(T: int) -> np.ndarray:
    """[T, T] True where a query may NOT look (a key after it)."""
    return np.triu(np.ones((T, T), bool), k=1)


def head_scores(tr: Trace, layer: int, head: int) -> HeadScores:
    f = tr.facts
    kv = head // (f.n_heads // f.n_kv_heads)
    q, k, v = (tr.acts[f"blocks.{layer}.attn.hook_{x}"][h] for x, h in (("q", head), ("k", kv), ("v", kv)))
    scores = (q.astype(np.float64) @ k.astype(np.float64).T) * f.attn_scaling
    masked = scores.copy()
    masked[causal_mask(tr.T)] = np.nan
    return HeadScores(layer, head, kv, q, k, v, scores, masked)


def masked_softmax(masked: np.ndarray) -> np.ndarray:
    """Row softmax of scores whose masked entries are NaN (they get weight 0)."""
    soft = np.exp(masked - np.nanmax(masked, axis=1, keepdims=True))
    soft = np.nan_to_num(soft, nan=0.0)
    return soft / soft.sum(1, keepdims=True)


def sink_share(tr: Trace) -> float:
    """Mean attention weight on the very first token over every layer, head and query."""
    return float(tr.acts["blocks.*.attn.hook_pattern|pooled"][..., 0].astype(np.float32).mean())
