"""Every C entry point of pipeline/decode_step/cpu/cpu_decode.c (through its checked wrappers) driven with random shapes
(1-129 rows, odd sizes, empty) against numpy in float64. Imported by test_kernels_c.py, and run as a script by its
sanitizer test (`python tests/pipeline/kernel_shapes.py [SEED] [CASES]` in a process with the library built with
-fsanitize=address,undefined): prints "ok N" when every case agrees."""

from __future__ import annotations

import sys

import numpy as np


def _close(a, b, tol=2e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.size:
        err = np.abs(a - b).max() / (np.abs(b).max() + 1e-6)
        assert err < tol, err


def run(seed: int = 0, cases: int = 40) -> int:
    import torch

    from pipeline.decode_step.choice import CHOICE
    from pipeline.decode_step.cpu import greedy, norms, paged_attention
    from pipeline.decode_step.cpu import matmul as cm

    assert CHOICE.c_kernels(), "pipeline/decode_step/cpu/cpu_decode.c is not built"
    rng = np.random.default_rng(seed)
    n = 0
    # 300 and 520 outputs: enough panels (19, 33) for one row's units of four panels over the product's quarters
    sizes = [0, 1, 2, 3, 5, 6, 7, 8, 13, 16, 17, 31, 33, 64, 65, 100, 129, 300, 520]
    for _ in range(cases):
        M, N, K = int(rng.choice(sizes)), int(rng.choice(sizes[1:])), int(rng.choice(sizes[1:]))
        x = rng.standard_normal((M, K)).astype(np.float32)
        w = rng.standard_normal((N, K)).astype(np.float32)
        b = rng.standard_normal(N).astype(np.float32)
        ref = x.astype(np.float64) @ w.astype(np.float64).T
        _close(cm.panel_rows(x, torch.from_numpy(w)), ref)
        _close(cm.panel_rows(x, torch.from_numpy(w), torch.from_numpy(b)), ref + b)
        # bf16 (uint16 bits) and int8 with a scale per row
        wb = torch.from_numpy(w).to(torch.bfloat16)
        pb = cm.packed_panels(wb.view(torch.int16).numpy().view(np.uint16))
        _close(cm.panel_product(x, pb, N, K), x.astype(np.float64) @ wb.float().numpy().astype(np.float64).T)
        sc = (np.abs(w).max(1) / 127 + 1e-6).astype(np.float32)
        w8 = np.clip(np.round(w / sc[:, None]), -127, 127).astype(np.int8)
        _close(cm.panel_product(x, cm.packed_panels(w8), N, K, b, scale=sc), x.astype(np.float64) @ (w8 * sc[:, None]).astype(np.float64).T + b)
        # norms and SiLU * up
        if M:
            scale = rng.standard_normal(K).astype(np.float32)
            xd = x.astype(np.float64)
            _close(norms.rms_norm(x, scale, 1e-6), xd / np.sqrt((xd**2).mean(-1, keepdims=True) + 1e-6) * scale)
        gu = rng.standard_normal((M, 2 * K)).astype(np.float32)
        g, u = gu[:, :K].astype(np.float64), gu[:, K:].astype(np.float64)
        _close(norms.silu_mul(gu), g / (1 + np.exp(-g)) * u)
        # a greedy step's summary: argmax (the first of equal largest), log-sum-exp, the top k largest first with
        # the lower id first among equals (ties made on purpose by rounding), against float64 and a stable sort
        if N:
            lg = (np.round(rng.standard_normal((M, N)) * 4, 0 if rng.random() < 0.5 else 3) * 3).astype(np.float32)
            kk = int(rng.integers(1, N + 3))
            s = greedy.greedy_summary(torch.from_numpy(lg), kk)
            order = np.argsort(-lg, axis=-1, kind="stable")[:, : min(kk, N)]
            assert np.array_equal(s.argmax.numpy(), lg.argmax(-1)) and np.array_equal(s.ids.numpy(), order)
            assert np.array_equal(s.values.numpy(), np.take_along_axis(lg, order, -1))
            ld = lg.astype(np.float64)
            if M:
                _close(s.logsumexp, ld.max(-1) + np.log(np.exp(ld - ld.max(-1, keepdims=True)).sum(-1)), 1e-6)
        # paged attention: B rows, random block tables, random windows
        B, KV, G, D, bs = (
            int(rng.integers(0, 6)),
            int(rng.integers(1, 4)),
            int(rng.integers(1, 4)),
            int(rng.choice([1, 7, 8, 16, 64, 65])),
            int(rng.choice([1, 3, 8])),
        )
        blocks = int(rng.integers(1, 12))
        Kc = rng.standard_normal((blocks, KV, bs, D)).astype(np.float32)
        Vc = rng.standard_normal((blocks, KV, bs, D)).astype(np.float32)
        width = int(rng.integers(1, 6))
        tables = rng.integers(0, blocks, (B, width)).astype(np.int32)
        hi = rng.integers(1, width * bs + 1, B).astype(np.int32)
        lo = np.array([rng.integers(0, h) for h in hi], dtype=np.int32)
        q = rng.standard_normal((B, KV, G, D)).astype(np.float32)
        out = paged_attention.paged_attend(q, Kc, Vc, tables, lo, hi, bs, 0.125, 2)
        ref = np.zeros((B, KV, G, D))
        for r in range(B):
            pos = np.arange(lo[r], hi[r])
            k = Kc[tables[r, pos // bs], :, pos % bs].astype(np.float64)  # [n, KV, D]
            v = Vc[tables[r, pos // bs], :, pos % bs].astype(np.float64)
            for h in range(KV):
                s = 0.125 * q[r, h].astype(np.float64) @ k[:, h].T  # [G, n]
                p = np.exp(s - s.max(-1, keepdims=True))
                ref[r, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h]
        _close(out, ref.reshape(B, KV * G * D))
        _layers_case(rng)
        n += 1
    return n


def _layers_case(rng) -> None:
    """row_layers over random small layers (rows 1-9, the last layer's head for some of them) against row_layer a
    layer and the head through rms_norm and panel_rows: the same kernels, so the same bits (the products' units are
    handed out to the threads as they finish, the head runs in the same call)."""
    import torch

    from pipeline.decode_step.cpu import layer_call as lc
    from pipeline.decode_step.cpu import matmul as cm
    from pipeline.decode_step.cpu import norms

    L, KV, G, D, bs = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.choice([2, 8, 16])), 4
    H, d, inner, vocab, M = (
        KV * G,
        int(rng.choice([8, 24, 40])),
        int(rng.choice([8, 40, 72, 136])),
        int(rng.choice([5, 33, 100, 300])),
        int(rng.integers(1, 10)),
    )

    def t(*shape):
        return torch.from_numpy((rng.standard_normal(shape) * 0.3).astype(np.float32))

    def arr(*shape):
        return t(*shape).numpy()

    ws_ = [
        lc.LayerWeights(t((H + 2 * KV) * D, d), None, t(d, H * D), None, t(2 * inner, d), None, t(d, inner), None, arr(d), 1e-5, arr(d), 1e-5, H, KV, D)
        for _ in range(L)
    ]
    wh, bh = t(vocab, d), t(vocab) if rng.random() < 0.5 else None
    head = lc.Head(arr(d), 1e-5, wh, bh)
    blocks = 3 * M  # every row its own blocks (two rows writing one slot would race)
    tables = rng.permutation(blocks).reshape(M, 3).astype(np.int32)
    K0, V0 = arr(L, blocks, KV, bs, D), arr(L, blocks, KV, bs, D)
    pos = rng.integers(0, 3 * bs, M)
    blk, off = tables[np.arange(M), pos // bs], pos % bs
    cos, sin = arr(M, D), arr(M, D)
    keep = np.sort(rng.choice(M, int(rng.integers(0, M + 1)), replace=False))
    x0 = arr(M, d)
    x1, K1, V1 = x0.copy(), K0.copy(), V0.copy()
    out = lc.row_layers(x1, lc.LayerStack(ws_), lc.LayerRows(K1, V1, blk, off, tables, pos + 1, bs), cos, sin, 0.3, head=head, keep=keep)
    x2, K2, V2 = x0.copy(), K0.copy(), V0.copy()
    rows = lc.LayerRows(K2, V2, blk, off, tables, pos + 1, bs)
    for i, w in enumerate(ws_):
        lc.row_layer(i, x2, w, rows, cos, sin, None, 0.3)
    ref = cm.panel_rows(norms.rms_norm(np.ascontiguousarray(x2[keep]), head.scale, head.eps), wh, bh) if len(keep) else np.empty((0, vocab), np.float32)
    assert np.array_equal(x1, x2) and np.array_equal(K1, K2) and np.array_equal(V1, V2)
    assert out.shape == (len(keep), vocab) and np.array_equal(out, ref)


if __name__ == "__main__":
    print("ok", run(int(sys.argv[1]) if len(sys.argv) > 1 else 0, int(sys.argv[2]) if len(sys.argv) > 2 else 40))
