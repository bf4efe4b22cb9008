"""The batched decode step over a paged KV memory: one forward for every running request.

    kv = PagedKV(lm, n_blocks, block_size)            # K, V: [layers, blocks, KV heads, block_size, head dim]
    step = PagedStep(lm, kv)
    logits = step.prefill(req, a, b)                  # prompt tokens a..b-1 (transformers' forward), last logits
    logits = step.decode(tokens, positions, tables)   # [B, vocab]: ONE forward for B requests

The decode step is the fused step's layer math (pipeline.fused: fused Q/K/V and gate/up, the model's own norms
and RoPE tables) with a batch dimension: every matrix multiplication runs once for all B rows, so the weights
are read once per step, not once per request. Attention is per row, over exactly that row's own tokens
(gathered from its blocks; a sliding-window layer reads only its window): no padding to the longest request.
The prompt is prefilled by transformers' own forward (in chunks for long prompts) and its keys and values are
copied into the request's blocks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fused import _norm_fn, finish_layer, fuse_weights, project_qkv, rope_tables
from ..models import LoadedModel


class PagedKV:
    """The KV pool: `n_blocks` blocks of `block_size` tokens, keys and values of every layer."""

    def __init__(self, lm: LoadedModel, n_blocks: int, block_size: int = 16):
        f = lm.facts
        shape = (f.n_layers, n_blocks, f.n_kv_heads, block_size, f.head_dim)
        self.K = torch.zeros(shape, device=lm.device, dtype=lm.dtype)
        self.V = torch.zeros(shape, device=lm.device, dtype=lm.dtype)
        self.n_blocks, self.block_size = n_blocks, block_size
        self.block_bytes_per_layer = 2 * f.n_kv_heads * block_size * f.head_dim * lm.arch.bytes_per_value

    @staticmethod
    def block_bytes(lm: LoadedModel, block_size: int) -> int:
        """Bytes of one block in every layer (K and V)."""
        f = lm.facts
        return 2 * f.n_layers * f.n_kv_heads * block_size * f.head_dim * lm.arch.bytes_per_value

    @property
    def nbytes(self) -> int:
        return self.K.numel() * self.K.element_size() * 2

    def write(self, layer: int, blocks: list[int], start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Keys / values [KV, t, D] of positions start..start+t-1 into a request's blocks."""
        bs, t, p = self.block_size, k.shape[1], 0
        while p < t:
            pos = start + p
            blk, off = blocks[pos // bs], pos % bs
            n = min(bs - off, t - p)
            self.K[layer, blk, :, off:off + n] = k[:, p:p + n]
            self.V[layer, blk, :, off:off + n] = v[:, p:p + n]
            p += n

    def read(self, layer: int, blocks: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [KV, hi-lo, D] of positions lo..hi-1 (blocks: the request's block ids, a tensor)."""
        bs = self.block_size
        b0, b1 = lo // bs, -(-hi // bs)
        ids = blocks[b0:b1]
        KV, D = self.K.shape[2], self.K.shape[4]
        k = self.K[layer].index_select(0, ids).transpose(0, 1).reshape(KV, -1, D)
        v = self.V[layer].index_select(0, ids).transpose(0, 1).reshape(KV, -1, D)
        a = lo - b0 * bs
        return k[:, a:a + hi - lo], v[:, a:a + hi - lo]


class PagedStep:
    """One model's batched decode step and chunked prefill over a PagedKV. The caller holds lm.lock."""

    def __init__(self, lm: LoadedModel, kv: PagedKV):
        self.lm, self.kv = lm, kv
        self.layers = fuse_weights(lm)
        f = lm.facts
        self.H, self.KV, self.D = f.n_heads, f.n_kv_heads, f.head_dim
        self.G = self.H // self.KV
        self.final_norm = _norm_fn(lm.arch.decoder.norm)
        self.cos, self.sin, self._rope_len = {}, {}, 0
        self.attention = "auto"         # "auto" | "rows" | "gather" (see gather())

    def _rope(self, n: int) -> None:
        """RoPE tables for positions 0..n-1 at least (grown by doubling, up to the model's limit)."""
        if n <= self._rope_len:
            return
        size = max(256, self._rope_len)
        while size < n:
            size *= 2
        size = min(size, self.lm.facts.max_positions or size)
        self.cos, self.sin = rope_tables(self.lm, self.layers, size)
        self._rope_len = size

    def prefill(self, caches: dict, key, prompt_ids: list[int], a: int, b: int, blocks: list[int]) -> torch.Tensor | None:
        """Prompt tokens a..b-1 through transformers' forward with the request's own DynamicCache (kept in
        caches[key] between chunks). After the last chunk the cache's K/V go into the blocks and the prompt's
        last logits [vocab] (float32, host) are returned; None after an earlier chunk."""
        from transformers import DynamicCache

        cache = caches.get(key)
        if cache is None:
            cache = caches[key] = DynamicCache(config=self.lm.model.config)
        ids = torch.tensor([prompt_ids[a:b]], device=self.lm.device)
        out = self.lm.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        if b < len(prompt_ids):
            return None
        T = len(prompt_ids)
        for i, layer in enumerate(cache.layers):
            k, v = layer.keys[0], layer.values[0]          # [KV, t, D]; t < T on sliding-window layers
            self.kv.write(i, blocks, T - k.shape[1], k, v)
        del caches[key]
        return out.logits[0, -1].float().cpu()        # transformers' forward applies any softcap itself

    def gather(self, lens: list[int]) -> bool:
        """Attend for the whole batch in one call (each row's blocks gathered, padded to the longest row, the
        padding masked) when that wastes little, else row by row over exactly each row's tokens. One call
        saves B-1 kernel launches per layer (what bounds a GPU, and the Python overhead on a CPU); the
        padding costs (longest - each row's length) positions of reads."""
        if self.attention != "auto":
            return self.attention == "gather"
        return len(lens) > 1 and max(lens) * len(lens) <= 2 * sum(lens)

    def _gather_plan(self, tables, pos, lens):
        """Block ids [B, nb] (padded with each row's first block) and masks [B, 1, 1, nb * block_size] per
        window: a position counts when it is at most the row's own and inside the layer's window."""
        bs, dev = self.kv.block_size, self.lm.device
        nb = -(-max(lens) // bs)
        idx = torch.tensor([t[:nb] + [t[0]] * (nb - len(t[:nb])) for t in tables], device=dev)
        ar = torch.arange(nb * bs, device=dev)[None]
        allowed = ar <= pos[:, None]
        masks = {None: allowed[:, None, None, :]}
        for w in {ly.window for ly in self.layers if ly.window}:
            masks[w] = (allowed & (ar > pos[:, None] - w))[:, None, None, :]
        return idx, masks

    def decode(self, tokens: list[int], positions: list[int], tables: list[list[int]]) -> torch.Tensor:
        """One new token per row (at positions[b], its K/V written into its blocks tables[b]); every row
        attends over its own tokens only. Returns logits [B, vocab] float32 on the host."""
        lm, kv = self.lm, self.kv
        dev, B, bs = lm.device, len(tokens), kv.block_size
        H, KV, D, G = self.H, self.KV, self.D, self.G
        self._rope(max(positions) + 1)
        pos = torch.tensor(positions, device=dev)
        blk = torch.tensor([t[p // bs] for t, p in zip(tables, positions)], device=dev)
        off = pos % bs
        rope = {lt: (self.cos[lt].index_select(0, pos), self.sin[lt].index_select(0, pos)) for lt in self.cos}
        lens = [p + 1 for p in positions]
        gathered = self.gather(lens)
        if gathered:
            idx, masks = self._gather_plan(tables, pos, lens)
        else:
            tabs = [torch.tensor(t, device=dev) for t in tables]
        core = lm.arch.decoder
        x = core.embed_tokens(torch.tensor(tokens, device=dev).view(B, 1))
        for i, (layer, ly) in enumerate(zip(core.layers, self.layers)):
            q, k, v = project_qkv(ly, x, H, KV, D, *rope[ly.rope])
            kv.K[i, blk, :, off] = k                          # [B, KV, D] into each row's slot
            kv.V[i, blk, :, off] = v
            if gathered:                                      # one attention call for the batch, masked
                kk = kv.K[i][idx].permute(0, 2, 1, 3, 4).reshape(B, KV, -1, D)
                vv = kv.V[i][idx].permute(0, 2, 1, 3, 4).reshape(B, KV, -1, D)
                att = F.scaled_dot_product_attention(q.view(B, KV, G, D), kk, vv, attn_mask=masks[ly.window],
                                                     scale=layer.self_attn.scaling)
            else:                                             # each row over exactly its own tokens
                outs = []
                for r in range(B):
                    lo = max(0, lens[r] - ly.window) if ly.window else 0
                    kk, vv = kv.read(i, tabs[r], lo, lens[r])
                    outs.append(F.scaled_dot_product_attention(q[r].view(1, KV, G, D), kk[None], vv[None],
                                                               scale=layer.self_attn.scaling))
                att = torch.cat(outs)
            x = finish_layer(layer, ly, x, att.reshape(B, 1, H * D))
        logits = lm.model.lm_head(self.final_norm(x)).float().view(B, -1)
        return lm.arch.apply_softcap(logits).cpu()
