"""Every C entry point of pipeline/cpu/cpu_decode.c (through cpu_matmul's checked wrappers) driven with random shapes
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

    from pipeline.cpu import matmul as cm

    assert cm.native() is not None, "pipeline/cpu/cpu_decode.c is not built"
    rng = np.random.default_rng(seed)
    n = 0
    sizes = [0, 1, 2, 3, 5, 6, 7, 8, 13, 16, 17, 31, 33, 64, 65, 100, 129]
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
            _close(cm.rms_norm(x, scale, 1e-6), xd / np.sqrt((xd**2).mean(-1, keepdims=True) + 1e-6) * scale)
        gu = rng.standard_normal((M, 2 * K)).astype(np.float32)
        g, u = gu[:, :K].astype(np.float64), gu[:, K:].astype(np.float64)
        _close(cm.silu_mul(gu), g / (1 + np.exp(-g)) * u)
        # a greedy step's summary: argmax (the first of equal largest), log-sum-exp, the top k largest first with
        # the lower id first among equals (ties made on purpose by rounding), against float64 and a stable sort
        if N:
            lg = (np.round(rng.standard_normal((M, N)) * 4, 0 if rng.random() < 0.5 else 3) * 3).astype(np.float32)
            kk = int(rng.integers(1, N + 3))
            s = cm.greedy_summary(torch.from_numpy(lg), kk)
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
        out = cm.paged_attend(q, Kc, Vc, tables, lo, hi, bs, 0.125, 2)
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
        n += 1
    return n


if __name__ == "__main__":
    print("ok", run(int(sys.argv[1]) if len(sys.argv) > 1 else 0, int(sys.argv[2]) if len(sys.argv) > 2 else 40))
