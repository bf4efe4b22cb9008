"""The trimmed step's layer as four Triton kernels (pipeline.decode_step.gpu.triton_step runs them), for B rows of one token each.

    A  qkv_rope     the input norm, the fused Q/K/V product, RoPE on queries and keys, K and V written at the row's
                    position
    B  attend_out   one query head's attention over its KV head's cache up to the row's position (online softmax),
                    then that head's share of the output projection, Wo[:, head] @ o_head, into a [B, H, d] fp32 partial
    C  gate_up      the residual (x + the partials' sum), the post-attention norm, the fused gate/up product, SiLU(g)*u
    D  down_add     the down product added into the residual stream
    E  norm_head    the final norm and the LM head (fp32 logits)

Grid (programs, B): program_id(1) is the row. Where a row's keys and values lie is one addressing for both caches:
position t of KV head h is at blk * stride_blk + h * stride_h + (t % BS) * D, blk = table[row, t // BS]. The engine's
paged pool ([blocks, KV, BS, D] a layer) passes its block tables; the fused step's buffer ([KV, max_len, D]) passes
BS = max_len and a table of one 0.

Each program of a product kernel reads a block of the weight's rows once, in chunks along the input, and keeps its
sums in fp32; every value the model's own step rounds to its dtype (a product's output, the attention's output, the
residual stream) is rounded here at the same point, so the step differs from the torch step only in the order of
the sums. The residual stream ping-pongs between two buffers (C writes xm from x, D writes x from xm), so no
kernel reads what another program of it writes. Positions, tokens and tables are read on the device: the kernels go
into one CUDA graph. On a machine without a GPU, Triton's interpreter runs them (TRITON_INTERPRET=1: the tests).
"""

import triton
import triton.language as tl


@triton.jit
def _rstd(x_ptr, K: tl.constexpr, eps, BK: tl.constexpr):
    """1 / rms of the K values at x_ptr (fp32)."""
    acc = tl.zeros([BK], dtype=tl.float32)
    for k0 in range(0, K, BK):
        c = k0 + tl.arange(0, BK)
        v = tl.load(x_ptr + c, mask=c < K, other=0.0).to(tl.float32)
        acc += v * v
    return 1.0 / tl.sqrt(tl.sum(acc, axis=0) / K + eps)


@triton.jit
def _normed(x_ptr, w_ptr, c, K: tl.constexpr, rstd):
    """Llama's RMSNorm of the chunk `c`: w * (x * rstd rounded to the model's dtype), rounded again, as fp32."""
    dt = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + c, mask=c < K, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c, mask=c < K, other=0.0).to(tl.float32)
    return (w * (x * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)


@triton.jit
def _rows(BN: tl.constexpr):
    """(this program's batch row, its block of BN output rows): program (i, b) of a product kernel's grid."""
    return tl.program_id(1), tl.program_id(0) * BN + tl.arange(0, BN)


@triton.jit
def _dot_rows(W_ptr, r, c, N: tl.constexpr, K: tl.constexpr, v):
    """W[r, c] @ v for the rows r (< N) and the chunk c (< K) of a row-major [N, K] weight: [len(r)] fp32."""
    w = tl.load(W_ptr + r[:, None] * K + c[None, :], mask=(r[:, None] < N) & (c[None, :] < K), other=0.0).to(tl.float32)
    return tl.sum(w * v[None, :], axis=1)


@triton.jit
def _slot(table_ptr, NB, b, t, BS, stride_blk, D: tl.constexpr, mask):
    """Where position t of row b lies in a KV head (add h * stride_h): its block's offset plus its row in the block."""
    blk = tl.load(table_ptr + b * NB + t // BS, mask=mask, other=0)
    return blk * stride_blk + (t % BS) * D


@triton.jit
def qkv_rope(
    x_ptr, wn_ptr, eps, W_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, K_ptr, V_ptr, table_ptr, NB, BS, stride_blk, stride_h,
    d: tl.constexpr, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, HAS_BIAS: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """Program (p, b): output head p of row b's fused Q/K/V (p < H a query head, then KVH key heads, then KVH value
    heads)."""
    p = tl.program_id(0)
    b = tl.program_id(1)
    dt = x_ptr.dtype.element_ty
    half: tl.constexpr = D // 2
    j = tl.arange(0, half)
    r1, r2 = p * D + j, p * D + half + j  # the head's two halves (RoPE rotates element j with j + D/2)
    x_ptr += b * d
    rstd = _rstd(x_ptr, d, eps, BK)
    a1 = tl.zeros([half], dtype=tl.float32)
    a2 = tl.zeros([half], dtype=tl.float32)
    for k0 in range(0, d, BK):
        c = k0 + tl.arange(0, BK)
        xn = _normed(x_ptr, wn_ptr, c, d, rstd)
        a1 += _dot_rows(W_ptr, r1, c, (H + 2 * KVH) * D, d, xn)
        a2 += _dot_rows(W_ptr, r2, c, (H + 2 * KVH) * D, d, xn)
    if HAS_BIAS:
        a1 += tl.load(b_ptr + r1).to(tl.float32)
        a2 += tl.load(b_ptr + r2).to(tl.float32)
    y1, y2 = a1.to(dt).to(tl.float32), a2.to(dt).to(tl.float32)  # the product's output in the model's dtype
    pos = tl.load(pos_ptr + b)
    if p < H + KVH:  # queries and keys rotate: x * cos + rotate_half(x) * sin
        c1 = tl.load(cos_ptr + pos * D + j).to(tl.float32)
        c2 = tl.load(cos_ptr + pos * D + half + j).to(tl.float32)
        s1 = tl.load(sin_ptr + pos * D + j).to(tl.float32)
        s2 = tl.load(sin_ptr + pos * D + half + j).to(tl.float32)
        y1, y2 = y1 * c1 - y2 * s1, y2 * c2 + y1 * s2
    if p < H:
        tl.store(q_ptr + (b * H + p) * D + j, y1.to(dt))
        tl.store(q_ptr + (b * H + p) * D + half + j, y2.to(dt))
    else:
        at = _slot(table_ptr, NB, b, pos, BS, stride_blk, D, pos >= 0)
        if p < H + KVH:
            tl.store(K_ptr + (p - H) * stride_h + at + j, y1.to(dt))
            tl.store(K_ptr + (p - H) * stride_h + at + half + j, y2.to(dt))
        else:
            tl.store(V_ptr + (p - H - KVH) * stride_h + at + j, y1.to(dt))
            tl.store(V_ptr + (p - H - KVH) * stride_h + at + half + j, y2.to(dt))


@triton.jit
def attend_out(
    q_ptr, K_ptr, V_ptr, pos_ptr, Wo_ptr, P_ptr, scale, table_ptr, NB, BS, stride_blk, stride_h,
    WINDOW: tl.constexpr, d: tl.constexpr, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    """Program (h, b): row b's query head h over the keys 0..pos of its KV head (those > pos - WINDOW where WINDOW > 0),
    its output rounded to the model's dtype, then P[b, h] = Wo[:, h*D:(h+1)*D] @ o (fp32)."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    dt = q_ptr.dtype.element_ty
    j = tl.arange(0, D)
    pos = tl.load(pos_ptr + b)
    lo = pos * 0
    if WINDOW > 0:
        lo = tl.maximum(pos - WINDOW + 1, 0)
    q = tl.load(q_ptr + (b * H + h) * D + j).to(tl.float32)
    head = (h // G) * stride_h
    m_i = tl.max(tl.full([BT], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BT], dtype=tl.float32), axis=0)
    acc = tl.zeros([D], dtype=tl.float32)
    for t0 in range((lo // BT) * BT, pos + 1, BT):  # from the block holding lo: no block is wholly masked
        t = t0 + tl.arange(0, BT)
        ok = (t <= pos) & (t >= lo)
        at = head + _slot(table_ptr, NB, b, t, BS, stride_blk, D, ok)
        k = tl.load(K_ptr + at[:, None] + j[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(s - m_new)
        v = tl.load(V_ptr + at[:, None] + j[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(pr[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(pr, axis=0)
        m_i = m_new
    o = (acc / l_i).to(dt).to(tl.float32)
    for r0 in range(0, d, BN):
        r = r0 + tl.arange(0, BN)
        w = tl.load(Wo_ptr + r[:, None] * (H * D) + h * D + j[None, :], mask=r[:, None] < d, other=0.0).to(tl.float32)
        tl.store(P_ptr + (b * H + h) * d + r, tl.sum(w * o[None, :], axis=1), mask=r < d)


@triton.jit
def _residual(x_ptr, P_ptr, c, d: tl.constexpr, H: tl.constexpr):
    """x + the output projection (the heads' partials summed, rounded to the model's dtype) at the chunk c, rounded."""
    dt = x_ptr.dtype.element_ty
    o = tl.zeros(c.shape, dtype=tl.float32)
    for h in range(H):
        o += tl.load(P_ptr + h * d + c, mask=c < d, other=0.0)
    x = tl.load(x_ptr + c, mask=c < d, other=0.0).to(tl.float32)
    return (x + o.to(dt).to(tl.float32)).to(dt).to(tl.float32)


@triton.jit
def gate_up(
    x_ptr, P_ptr, xm_ptr, wn_ptr, eps, W_ptr, h_ptr,
    d: tl.constexpr, H: tl.constexpr, FF: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """Program (i, b): rows i*BN.. of row b's gate and up products over its normed residual; program (0, b) also writes
    the residual (xm) for D. Each program sums the residual itself (d values), so no program waits for another."""
    b, r = _rows(BN)
    dt = x_ptr.dtype.element_ty
    x_ptr += b * d
    P_ptr += b * H * d
    xm_ptr += b * d
    h_ptr += b * FF
    ss = tl.zeros([BK], dtype=tl.float32)
    for k0 in range(0, d, BK):
        c = k0 + tl.arange(0, BK)
        xr = _residual(x_ptr, P_ptr, c, d, H)
        ss += xr * xr
        if tl.program_id(0) == 0:
            tl.store(xm_ptr + c, xr.to(dt), mask=c < d)
    rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / d + eps)
    g = tl.zeros([BN], dtype=tl.float32)
    u = tl.zeros([BN], dtype=tl.float32)
    for k0 in range(0, d, BK):
        c = k0 + tl.arange(0, BK)
        xr = _residual(x_ptr, P_ptr, c, d, H)
        w = tl.load(wn_ptr + c, mask=c < d, other=0.0).to(tl.float32)
        xn = (w * (xr * rstd).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        g += _dot_rows(W_ptr, r, c, FF, d, xn)
        u += _dot_rows(W_ptr + FF * d, r, c, FF, d, xn)  # the up rows follow the gate's
    g = g.to(dt).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)  # SiLU, rounded as the model's activation is
    tl.store(h_ptr + r, (a * u.to(dt).to(tl.float32)).to(dt), mask=r < FF)


@triton.jit
def down_add(xm_ptr, W_ptr, h_ptr, x_ptr, d: tl.constexpr, FF: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (i, b): row b's x[rows] = xm[rows] + (Wd[rows] @ h rounded), rounded."""
    b, r = _rows(BN)
    dt = x_ptr.dtype.element_ty
    xm_ptr += b * d
    h_ptr += b * FF
    x_ptr += b * d
    acc = tl.zeros([BN], dtype=tl.float32)
    for k0 in range(0, FF, BK):
        c = k0 + tl.arange(0, BK)
        acc += _dot_rows(W_ptr, r, c, d, FF, tl.load(h_ptr + c, mask=c < FF, other=0.0).to(tl.float32))
    xm = tl.load(xm_ptr + r, mask=r < d, other=0.0).to(tl.float32)
    tl.store(x_ptr + r, (xm + acc.to(dt).to(tl.float32)).to(dt), mask=r < d)


@triton.jit
def norm_head(x_ptr, wn_ptr, eps, W_ptr, out_ptr, d: tl.constexpr, V: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (i, b): row b's logits i*BN.. = W[rows] @ norm(x), rounded to the model's dtype, stored fp32."""
    b, r = _rows(BN)
    dt = x_ptr.dtype.element_ty
    x_ptr += b * d
    out_ptr += b * V
    rstd = _rstd(x_ptr, d, eps, BK)
    acc = tl.zeros([BN], dtype=tl.float32)
    for k0 in range(0, d, BK):
        c = k0 + tl.arange(0, BK)
        acc += _dot_rows(W_ptr, r, c, V, d, _normed(x_ptr, wn_ptr, c, d, rstd))
    tl.store(out_ptr + r, acc.to(dt).to(tl.float32), mask=r < V)
