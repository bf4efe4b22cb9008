"""Production-mode decoding: our own decode step with fixed shapes, captured once as a CUDA graph on a GPU.

transformers' forward is general: per call it builds masks, position tensors and cache bookkeeping in Python
and launches hundreds of small kernels, so at batch 1 a small model spends most of a decode step waiting on
the CPU. This module writes the step the way serving engines do:

  * a static KV cache: one preallocated buffer per layer, written in place at position `pos`;
  * fused projections: Q, K and V are one matmul, gate and up are one matmul. The model's own q/k/v and
    gate/up weights are re-pointed as views into the fused tensors (`fuse_weights`), so nothing is copied
    and every other page keeps working on the very same parameters;
  * grouped-query attention without repeating K and V: the G query heads that share a KV head are passed to
    SDPA as G "query positions" of that head, over the whole buffer with a mask `position <= pos`
    (and `> pos - window` on sliding-window layers);
  * no Python-visible data dependence: the token and the position live in device tensors, so on CUDA the
    step is captured once with `torch.cuda.CUDAGraph` and each decode step is one `replay()`; optionally the
    step is first compiled by `torch.compile` (fewer, fused kernels) and the compiled kernels are captured;
  * trimmed on a GPU: for Llama-layout models the step is four Triton kernels a layer (pipeline.decode_step.gpu.triton_step),
    checked against the torch step once when the decoder is built, and that is what the graph captures.

The activation, the embedding and the LM head are the model's own modules, called inside the step; each
RMSNorm is one `F.rms_norm` with the module's own weight, epsilon and formula (Llama-style or Gemma's 1 + w).
The prefill is transformers' own forward (one pass over the prompt); its K/V are copied into the buffers.
Supported: Llama-style decoders (Llama, SmolLM2, Mistral, Qwen2, Qwen3) and Gemma 3; `supported(lm)` says why
not otherwise. What the production page measures of this step (its check against a plain transformers forward, its
launches, its floor) is pipeline.decode_step.fused_measures.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu.greedy import greedy_summary
from pipeline.decode_step.cpu.matmul import linear
from pipeline.decode_step.cpu.row_kv import BufferKV
from pipeline.decode_step.cpu.row_step import row_step
from pipeline.decode_step.fused_weights import SUPPORTED_TYPES, FusedModel, FusedUnsupported, _Layer, fuse_weights, fused_model, supported  # noqa: F401 - re-exported
from pipeline.decode_step.gpu.graphs import capture_step, compile_step
from pipeline.decode_step.kv_layout import visible
from pipeline.forward.sampling import GreedySummary

MIN_BUCKET = 256


def project(mod, x: torch.Tensor) -> torch.Tensor:
    """A model's own projection (attention's output, the down projection) through `linear` when it is a plain nn.Linear."""
    return linear(x, mod.weight, mod.bias) if type(mod) is torch.nn.Linear else mod(x)


def project_qkv(ly: _Layer, x: torch.Tensor, H: int, KV: int, D: int, cos: torch.Tensor, sin: torch.Tensor):
    """The layer's norm and fused Q/K/V projection for B new tokens x [B, 1, d], with RoPE at each token's own
    position (cos, sin [B, D]). Returns q [B, H, D], k [B, KV, D], v [B, KV, D]. Queries and keys rotate together."""
    B = x.shape[0]
    qkv = linear(ly.norm_in(x), ly.wqkv, ly.bqkv).view(B, H + 2 * KV, D)
    qk, v = qkv[:, : H + KV], qkv[:, H + KV :]
    if ly.norm_q is not None:
        qk = torch.cat([ly.norm_q(qk[:, :H]), ly.norm_k(qk[:, H:])], dim=1)
    qk = qk * cos[:, None] + _rotate_half(qk) * sin[:, None]
    return qk[:, :H], qk[:, H:], v


def finish_layer(ly: _Layer, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """The rest of a layer after attention: att [B, 1, H*D] through the output projection into the residual
    stream x [B, 1, d], then the feed-forward network (fused gate/up), with Llama's or Gemma's norms."""
    o = project(ly.out, att)
    if ly.norm_ff is not None:  # Gemma: norms after attention, before and after the MLP
        x = x + ly.norm_mid(o)
        h = ly.norm_ff(x)
    else:
        x = x + o
        h = ly.norm_mid(x)
    g, u = linear(h, ly.wgu).chunk(2, dim=-1)
    m = project(ly.down, ly.act(g) * u)
    return x + (ly.norm_out(m) if ly.norm_out is not None else m)


def window_masks(q_pos: torch.Tensor, k_pos: torch.Tensor, windows) -> dict:
    """The attention masks of one pass, by layer window: {None: causal, w: causal within the last w tokens}, each
    [..., n_q, n_k] bool. A query at q_pos sees a key at k_pos <= q_pos (and > q_pos - w on a sliding-window
    layer). The one definition the fused step and the engine's batched step share."""
    q, k = q_pos.unsqueeze(-1), k_pos.unsqueeze(-2)
    return {None: visible(q, k, None)} | {w: visible(q, k, w) for w in windows}


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class FusedDecoder:
    """Static-shape decode for one model and one maximum length (prompt + new tokens, rounded up to a power
    of two so a few graphs cover every request).

        dec = FusedDecoder(fused_model(lm), max_len)   # graph=True on CUDA by default
        logits = dec.prefill(ids)                # [vocab] float32, the prompt's last position
        logits = dec.step(token_id, position)    # one decode step (a graph replay on CUDA)
    """

    def __init__(self, fm: FusedModel, max_len: int, graph: bool | None = None, compile: bool = False, n_top: int = 10, trimmed: bool | None = None):
        self.fm, self.lm = fm, fm.lm
        self.layers = fm.layers
        self.max_len = int(max_len)
        limit = fm.lm.facts.max_positions or self.max_len
        if self.max_len > limit:
            raise ValueError(f"max_len {self.max_len} exceeds the model's {limit} positions")
        self.H, self.KV, self.D, self.G = fm.H, fm.KV, fm.D, fm.G
        dev, dt = fm.lm.device, fm.lm.dtype
        self.n_top = n_top
        with torch.no_grad():
            self.cos, self.sin = fm.rope.upto(self.max_len)  # the model's tables, at least max_len positions
            shape = (len(self.layers), self.KV, self.max_len, self.D)
            self.K = torch.zeros(shape, device=dev, dtype=dt)
            self.V = torch.zeros(shape, device=dev, dtype=dt)
            self.ar = torch.arange(self.max_len, device=dev)
            self.tok = torch.zeros(1, dtype=torch.long, device=dev)
            self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.windows = fm.windows
        self.final_norm = fm.final_norm
        self.embed, self.head = fm.lm.arch.embed(), fm.lm.arch.unembedding()  # the model's own modules, found once
        self._run = self._body
        self.out_logits = self.out_summary = self.graph = None
        self.capture_s = self.compile_s = None
        self.problems: list[str] = []  # a compile or capture that failed, and what ran instead
        use_graph = (dev.type == "cuda") if graph is None else graph
        if use_graph and dev.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.pos.fill_(self.max_len - 1)  # warm-up writes (compile, capture) land in the last slot, masked until used
        if compile:
            compiled, problem, self.compile_s = compile_step(self._body, fm.lm.lock)
            self._run = compiled or self._body
            self.problems += [problem] if problem else []
        self.compiled = self._run != self._body
        self.trimmed = None  # pipeline.decode_step.gpu.triton_step's kernels where they serve (None: the torch step's)
        if CHOICE.trimmed_step(fm, compile) is None if trimmed is None else trimmed:
            self._trim()
        if use_graph:
            self.graph, outputs, problem, self.capture_s = capture_step(self._run, fm.lm.lock, dev)
            self.out_logits, self.out_summary = outputs or (None, None)
            self.problems += [problem] if problem else []
        # on a CPU in fp32 (and not compiled) each step is pipeline.decode_step.cpu.row_step's: the same maths over numpy views
        self.row = None if (self.compiled or self.trimmed or self.graph is not None) else row_step(fm)
        self._row_kv = BufferKV(self.K, self.V) if self.row is not None else None
        first = "torch.compile + " if self.compiled else ("Triton kernels + " if self.trimmed else "")
        self.mode = first + ("CUDA graph" if self.graph else ("CPU row step" if self.row else "eager"))
        self.claimed = False  # in a generation (acquire_decoder / release)

    def release(self):
        """Hand the decoder back after a generation (see acquire_decoder)."""
        with _dec_lock:
            self.claimed = False

    # -- the step ---------------------------------------------------------------------------------------------
    def _body(self):
        """One token through the model at position self.pos; returns (logits, packed) where packed =
        [argmax, logsumexp, top values..., top ids...] (float32), all computed on the device."""
        pos = self.pos
        x = self.embed(self.tok.view(1, 1))
        masks = {w: m.view(1, 1, 1, -1) for w, m in window_masks(pos.view(1), self.ar, self.windows).items()}
        rope = {lt: (self.cos[lt].index_select(0, pos), self.sin[lt].index_select(0, pos)) for lt in self.cos}
        H, KV, D, G = self.H, self.KV, self.D, self.G
        for i, ly in enumerate(self.layers):
            q, k, v = project_qkv(ly, x, H, KV, D, *rope[ly.rope])
            self.K[i, :, pos] = k.view(KV, 1, D)  # index_put_: in place, also under torch.compile
            self.V[i, :, pos] = v.reshape(KV, 1, D)
            att = F.scaled_dot_product_attention(q.view(1, KV, G, D), self.K[i][None], self.V[i][None], attn_mask=masks[ly.window], scale=ly.scale)
            x = finish_layer(ly, x, att.reshape(1, 1, H * D))
        logits = self.lm.arch.apply_softcap(project(self.head, self.final_norm(x)).float().view(-1))
        return logits, self._summary(logits)

    def _trim(self):
        """Run the step as pipeline.decode_step.gpu.triton_step's kernels (4 a layer), where one token's logits through them agree
        with the torch step's within the dtype's tolerance (written at the warm-up slot); else say why in `problems`."""
        from pipeline.decode_step.gpu.triton_step import TrimmedStep

        try:
            with self.lm.lock, torch.inference_mode():
                ref = self._body()[0].clone()
                self.trimmed, self._table = TrimmedStep(self.fm, 1, self.cos, self.sin), torch.zeros((1, 1), dtype=torch.long, device=self.tok.device)
                err = float((self._trimmed_body()[0] - ref).norm() / ref.norm())
        except Exception as e:  # noqa: BLE001 - a Triton build or launch error: the torch step serves
            self.trimmed, err = None, f"failed ({type(e).__name__}: {str(e)[:200]})"
        if self.trimmed is not None and err <= self.lm.arch.tol:
            self.trimmed_err, self._run = err, self._trimmed_body
            return
        self.trimmed = None
        self.problems.append(f"the trimmed step {err if isinstance(err, str) else f'differs from the torch step by {err:.2g}'}; the torch step runs")

    def _trimmed_body(self):
        logits = self.trimmed.body(self.tok, self.pos, self._table, self.K, self.V)[0].clone()
        return logits, self._summary(logits)

    def _summary(self, logits) -> GreedySummary:
        return greedy_summary(logits, self.n_top)

    def step(self, token_id: int, position: int):
        """Decode one token at `position` (its K/V are written there). Returns (logits, summary) on the device;
        with a graph they are the graph's static outputs, overwritten by the next step."""
        if not 0 <= position < self.max_len:
            raise ValueError(f"position {position} outside the buffer of {self.max_len}")
        if self.row is not None:
            self._row_kv.pos = int(position)
            logits = self.row.logits([token_id], [position], self._row_kv)[0]
            return logits, self._summary(logits)
        with torch.inference_mode():
            self.tok.fill_(int(token_id))
            self.pos.fill_(int(position))
            if self.graph is not None:
                self.graph.replay()
                return self.out_logits, self.out_summary
            return self._run()

    def prefill(self, ids: torch.Tensor):
        """transformers' forward over the prompt [1, T]; its keys and values are copied into the buffers.
        Returns (logits, summary) for the last position."""
        from transformers import DynamicCache

        T = ids.shape[1]
        if T >= self.max_len:
            raise ValueError(f"prompt of {T} tokens does not fit a buffer of {self.max_len}")
        with torch.inference_mode():
            cache = DynamicCache(config=self.lm.model.config)
            out = self.lm.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            for i, (keys, values) in enumerate(self.lm.arch.cache_kv(cache)):
                k, v = keys[0], values[0]  # [KV, t, D]; t < T on sliding layers
                t = k.shape[1]
                self.K[i, :, T - t : T].copy_(k)
                self.V[i, :, T - t : T].copy_(v)
            logits = out.logits[0, -1].float()
            return logits, self._summary(logits)

    def kv_bytes_reserved_per_layer(self) -> list[int]:
        """Each layer's K and V buffers, set aside whole for max_len positions (not the context's: that is
        LoadedModel.kv_layer_bytes)."""
        per = 2 * self.KV * self.max_len * self.D * self.K.element_size()
        return [per] * len(self.layers)


def bucket(n: int, limit: int | None = None) -> int:
    """The buffer length for n positions: the next power of two, at least MIN_BUCKET, at most the model's limit."""
    b = MIN_BUCKET
    while b < n:
        b *= 2
    return min(b, limit) if limit else b


_dec_lock = threading.Lock()


def acquire_decoder(fm: FusedModel, n_positions: int, graph: bool | None = None, compile: bool = False, trimmed: bool | None = None) -> FusedDecoder:
    """A FusedDecoder of the model's `fm` (fused_model(lm)) whose buffers hold n_positions, for one generation: call
    `.release()` when done. Decoders (buffers and captured graphs) are reused across requests, one per model and
    bucket, kept on the model's FusedModel; one busy in another generation is never shared (its KV buffers are that
    generation's), a fresh one is built. `trimmed`: FusedDecoder's (None: where the kernel choice says)."""
    size = bucket(n_positions, fm.lm.facts.max_positions)
    key = (size, graph, compile, trimmed)
    with _dec_lock:
        cache = fm.decoders
        dec = cache.get(key)
        if dec is not None and not dec.claimed:
            dec.claimed = True
            return dec
    dec = FusedDecoder(fm, size, graph=graph, compile=compile, trimmed=trimmed)
    with _dec_lock:
        dec.claimed = True
        if key not in cache:
            while len(cache) >= 2:  # keep the few most recent
                cache.pop(next(iter(cache)))
            cache[key] = dec
    return dec
