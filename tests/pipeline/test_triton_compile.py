"""The trimmed step's Triton kernels compiled ahead of time for the GPUs a demo is lent (sm_90: H100, H200), without a
GPU: Triton's own compiler down to a cubin (ptxas), over SmolLM2's shape in bf16 with the block sizes a GPU launches
(pipeline.decode_step.gpu.triton_step.GPU_BLOCKS), with and without a q/k/v bias and a sliding window. The interpreter (test_triton_step)
checks what the kernels compute; this checks that the GPU's compiler takes them, which the interpreter does not."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pipeline.decode_step.gpu import triton_kernels as k
from pipeline.decode_step.gpu.triton_step import GPU_BLOCKS as B

d, H, KV, D, FF, V = 576, 9, 3, 64, 1536, 49152  # SmolLM2-135M (bench/assets/smollm2-shape)
bf, f32, i64, c = "*bf16", "*fp32", "*i64", "constexpr"
at = dict(table_ptr=i64, NB="i32", BS="i32", stride_blk="i32", stride_h="i32")  # where a row's keys and values lie
qkv = dict(x_ptr=bf, wn_ptr=bf, eps="fp32", W_ptr=bf, b_ptr=bf, cos_ptr=bf, sin_ptr=bf, pos_ptr=i64, q_ptr=bf, K_ptr=bf, V_ptr=bf,
           **at, d=c, H=c, KVH=c, D=c, HAS_BIAS=c, BK=c)
att = dict(q_ptr=bf, K_ptr=bf, V_ptr=bf, pos_ptr=i64, Wo_ptr=bf, P_ptr=f32, scale="fp32", **at, WINDOW=c, d=c, H=c, G=c, D=c, BT=c, BN=c)
cases = [
    (k.qkv_rope, qkv, dict(d=d, H=H, KVH=KV, D=D, HAS_BIAS=False, BK=B["qkv"][1])),
    (k.qkv_rope, qkv, dict(d=d, H=H, KVH=KV, D=D, HAS_BIAS=True, BK=B["qkv"][1])),
    (k.attend_out, att, dict(WINDOW=0, d=d, H=H, G=H // KV, D=D, BT=B["attend"][0], BN=B["attend"][1])),
    (k.attend_out, att, dict(WINDOW=4096, d=d, H=H, G=H // KV, D=D, BT=B["attend"][0], BN=B["attend"][1])),
    (k.gate_up, dict(x_ptr=bf, P_ptr=f32, xm_ptr=bf, wn_ptr=bf, eps="fp32", W_ptr=bf, h_ptr=bf, d=c, H=c, FF=c, BN=c, BK=c),
     dict(d=d, H=H, FF=FF, BN=B["gate_up"][0], BK=B["gate_up"][1])),
    (k.down_add, dict(xm_ptr=bf, W_ptr=bf, h_ptr=bf, x_ptr=bf, d=c, FF=c, BN=c, BK=c), dict(d=d, FF=FF, BN=B["down"][0], BK=B["down"][1])),
    (k.norm_head, dict(x_ptr=bf, wn_ptr=bf, eps="fp32", W_ptr=bf, out_ptr=f32, d=c, V=c, BN=c, BK=c), dict(d=d, V=V, BN=B["head"][0], BK=B["head"][1])),
]
out = []
for fn, sig, cons in cases:
    compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cons), target=GPUTarget("cuda", 90, 32))
    out.append([fn.__name__, len(compiled.asm["cubin"])])
print(json.dumps(out))
"""


def test_the_trimmed_kernels_compile_for_sm90_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    built = json.loads(run.stdout.strip().splitlines()[-1])
    assert [name for name, _ in built] == ["qkv_rope", "qkv_rope", "attend_out", "attend_out", "gate_up", "down_add", "norm_head"]
    assert all(size > 1000 for _, size in built), built  # a cubin for each
