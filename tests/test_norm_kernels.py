"""kernels/norms against its torch references (kernels/norms/ref.py, the model's maths) at odd shapes: relative error on the
outputs (rsqrt/exp differ in the last bits), exact residual sums and exact int8 epilogues given y. Outputs are
poisoned with NaN / a sentinel so unwritten elements show. The @gpu tests use the 27B shapes."""
import json
import os
import subprocess
import sys

import pytest
import torch

from kernels import norms as N
from kernels.attention import kv_cache, write_kv
from kernels.norms import ref as R
from kernels.norms.ref import rope_tables
from kernels.norms.silu import Config as SiluConfig
from layers.config import qwen38_27b
from layers.quant import a8_permute

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16


def rel(out, ref):
    out, ref = out.float(), ref.float()
    assert torch.isfinite(out).all(), "unwritten or non-finite output"
    return ((out - ref).norm() / ref.norm()).item()


def nan_like(shape, dtype=BF16):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def sentinel_int8(shape):
    return torch.full(shape, -128, dtype=torch.int8, device=DEV)


def check_int8(q, s, y):
    """The epilogue is exact given y: same scale and codes as the reference quantiser; no -128 left."""
    q_ref, s_ref = R.int8_per_token_ref(y.reshape(y.shape[0], -1))
    assert torch.equal(s, s_ref) and torch.equal(q.reshape(q_ref.shape), q_ref)
    assert (q != -128).all()


def randn(*shape, scale=1.0, dtype=BF16):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


@pytest.mark.parametrize("T, H, with_res, quant", [(3, 200, True, True), (2, 77, False, True), (1, 130, True, False)])
def test_add_rmsnorm(T, H, with_res, quant):
    x, res, w = randn(T, H, scale=3), randn(T, H), randn(H, scale=0.3)
    outs = dict(h=nan_like((T, H)), y=nan_like((T, H)))
    if quant:
        outs.update(q=sentinel_int8((T, H)), s=torch.full((T,), float("nan"), device=DEV))
    got = N.add_rmsnorm(x, res if with_res else None, w, 1e-6, quant=quant, **outs)
    h_ref, y_ref = R.add_rmsnorm_ref(x, res if with_res else None, w, 1e-6)
    assert torch.equal(got[0], h_ref)
    assert rel(got[1], y_ref) < 1e-2
    if quant:
        check_int8(got[2], got[3], got[1])


def test_add_rmsnorm_updates_residual_in_place():
    x, res, w = randn(2, 96), randn(2, 96), randn(96)
    h_ref, _ = R.add_rmsnorm_ref(x, res, w, 1e-6)
    h, _ = N.add_rmsnorm(x, res, w, 1e-6, h=res)
    assert h.data_ptr() == res.data_ptr() and torch.equal(res, h_ref)


@pytest.mark.parametrize("T, NH, D, w_dtype, quant", [(3, 5, 48, BF16, True), (2, 3, 40, torch.float32, False)])
def test_gated_rmsnorm(T, NH, D, w_dtype, quant):
    # z as the tail of wider rows (a fused projection's output)
    x, w = randn(T, NH, D, scale=2), randn(D, dtype=w_dtype) + 1
    z = randn(T, NH * D + 24, scale=2)[:, 24:].view(T, NH, D)
    outs = dict(y=nan_like((T, NH, D)))
    if quant:
        outs.update(q=sentinel_int8((T, NH * D)), s=torch.full((T,), float("nan"), device=DEV))
    got = N.gated_rmsnorm(x, z, w, 1e-6, quant=quant, **outs)
    y = got[0] if quant else got
    assert rel(y, R.gated_rmsnorm_ref(x, z, w, 1e-6)) < 1e-2
    if quant:
        check_int8(got[1], got[2], y)


@pytest.mark.parametrize("sigmoid_gate", [False, True])
def test_qk_norm_rope(sigmoid_gate):
    T, HQ, HKV, D, RD = 3, 3, 2, 48, 16
    qg, k = randn(T, HQ * 2 * D, scale=2), randn(T, HKV * D, scale=2)
    qw, kw = randn(D, scale=0.3), randn(D, scale=0.3)
    cos, sin = rope_tables(torch.tensor([5, 1000, 77], device=DEV), RD, 1e7, BF16)
    outs = dict(q=nan_like((T, HQ, D)), k_out=nan_like((T, HKV, D)), gate=nan_like((T, HQ, D)))
    q, k_out, gate = N.qk_norm_rope(qg, k, qw, kw, cos, sin, HQ, HKV, 1e-6, sigmoid_gate, **outs)
    q_ref, k_ref, g_ref = R.qk_norm_rope_ref(qg, k, qw, kw, cos, sin, HQ, HKV, 1e-6, sigmoid_gate)
    assert rel(q, q_ref) < 1e-2 and rel(k_out, k_ref) < 1e-2
    assert (torch.equal(gate, g_ref) if not sigmoid_gate else rel(gate, g_ref) < 1e-2)
    # the pass-through dims are exactly the normed input, the rotated ones are not
    assert rel(q[..., RD:], q_ref[..., RD:]) < 1e-2 and not torch.equal(q[..., :RD], q_ref[..., RD:2 * RD])


def assert_kv_write_fused(B, n_new, HQ, HKV, D, RD, fp8, seed=0):
    """qk_norm_rope with the caches (kv=...) gives the q, k and gate it gives alone, and caches bitwise those of
    write_kv on its k: fp8 codes or bf16, V keys-fastest, a padding row (slot -1) left unwritten."""
    torch.manual_seed(seed)
    T = B * n_new
    qg, k, v = randn(T, HQ * 2 * D, scale=2), randn(T, HKV * D, scale=2), randn(T, 2 * HKV * D)[:, HKV * D:]
    qw, kw = randn(D, scale=0.3), randn(D, scale=0.3)
    cos, sin = rope_tables(torch.arange(100, 100 + T, device=DEV), RD, 1e7, BF16)
    kc, vc = kv_cache(B + 1, HKV, 64, D, torch.uint8 if fp8 else BF16, DEV)
    kc.random_(0, 256 if fp8 else 2)
    vc.random_(0, 256 if fp8 else 2)
    caches = [(kc, vc), (kc.clone(), vc.clone())]                  # clone keeps V keys-fastest
    scales = torch.rand(HKV, device=DEV) + 0.05, torch.rand(HKV, device=DEV) + 0.05
    rows = torch.tensor(([2, -1, 0, 1] * B)[:B], dtype=torch.int32, device=DEV)
    lens = torch.tensor(([20, 7, 64, 9] * B)[:B], dtype=torch.int32, device=DEV)
    alone = N.qk_norm_rope(qg, k, qw, kw, cos, sin, HQ, HKV, 1e-6, True)
    fused = N.qk_norm_rope(qg, k, qw, kw, cos, sin, HQ, HKV, 1e-6, True, v=v, kv=(*caches[0], *scales, rows, lens))
    assert all(torch.equal(a, b) for a, b in zip(alone, fused))
    write_kv(alone[1].view(B, n_new, HKV, D), v.view(B, n_new, HKV, D), *caches[1], *scales, rows, lens)
    assert all(torch.equal(a, b) for a, b in zip(caches[0], caches[1]))


@pytest.mark.parametrize("fp8", [True, False])
def test_qk_norm_rope_writes_kv(fp8):
    assert_kv_write_fused(B=3, n_new=2, HQ=4, HKV=2, D=32, RD=16, fp8=fp8)


def test_int8_in_a8_order():
    """a8_order puts each int8 output's codes in the W4A8 operand order (layers.quant.a8_permute), every code
    written (sentinels), the same codes and scales otherwise; rows of 5 and 3 blocks of 32 columns."""
    x, res, w = randn(3, 160, scale=3), randn(3, 160), randn(160, scale=0.3)
    q = sentinel_int8((3, 160))
    _, _, q_nat, s_nat = N.add_rmsnorm(x, res, w, 1e-6, quant=True)
    _, _, q, s = N.add_rmsnorm(x, res, w, 1e-6, quant=True, q=q, a8_order=True)
    assert torch.equal(q, a8_permute(q_nat)) and torch.equal(s, s_nat)
    x, z, gw = randn(2, 3, 32), randn(2, 3, 32), randn(32) + 1
    _, q_nat, _ = N.gated_rmsnorm(x, z, gw, 1e-6, quant=True)
    _, q, _ = N.gated_rmsnorm(x, z, gw, 1e-6, quant=True, q=sentinel_int8((2, 96)), a8_order=True)
    assert torch.equal(q, a8_permute(q_nat))
    gate, up = randn(2, 96, scale=2), randn(2, 96, scale=2)
    q_nat = N.silu_mul(gate, up, quant=True, write_y=False, cfg=SiluConfig(64))[0]
    q = N.silu_mul(gate, up, quant=True, write_y=False, cfg=SiluConfig(64), q=sentinel_int8((2, 96)), a8_order=True)[0]
    assert torch.equal(q, a8_permute(q_nat))


# Compiles add_rmsnorm's and gated_rmsnorm's kernels (27B shapes, 64 rows) for sm_90 and sm_86, natural and a8_order,
# and prints the layouts of each kernel's reductions: the layout decides the order of the sum of squares.
REDUCE_LAYOUTS = r"""
import json, re, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
import kernels.device as gpu
from kernels.norms import add_rmsnorm, gated_rmsnorm
from tools.aot_compile import signature
from layers.config import qwen38_27b
m = qwen38_27b()
H, HV, DV = m.hidden_size, m.linear_num_value_heads, m.linear_value_head_dim
e = lambda *s, dtype=torch.bfloat16: torch.empty(*s, dtype=dtype, device="meta")
out, rec, run = {}, [], JITFunction.run
JITFunction.run = lambda self, *a, grid, warmup, **kw: rec.append((self, a, kw))
for arch in (90, 86):
    with gpu.simulated(gpu.Gpu(divmod(arch, 10), 132, 233472)):
        for a8 in (False, True):
            add_rmsnorm(e(64, H), e(64, H), e(H), 1e-6, quant=True, a8_order=a8)
            gated_rmsnorm(e(64, HV, DV), e(64, HV, DV), e(DV, dtype=torch.float32), 1e-6, quant=True, a8_order=a8)
            for fn, a, kw in rec:
                sig, constants, attrs = signature(fn, a, kw)
                ck = triton.compile(ASTSource(fn, sig, constexprs=constants, attrs=attrs),
                                    target=GPUTarget("cuda", arch, 32),
                                    options={k: kw[k] for k in ("num_warps", "launch_pdl") if k in kw})
                ir = ck.asm["ttgir"]
                alias = dict(re.findall(r"^(#\w+) = (.*)$", ir, re.M))
                types = re.findall(r"\}\) : \(([^)]*)\) ->", ir)
                key = f"sm_{arch} {fn.__name__} a8={a8}"
                out[key] = [re.sub(r"#\w+", lambda m: alias.get(m[0], m[0]), t) for t in types]
            rec.clear()
JITFunction.run = run
print(json.dumps(out))
"""


def test_a8_order_compiles_as_natural():
    """With a8_order the codes land in the W4A8 operand order, and y and s stay bit for bit those of the natural
    order: the compiler reduces the row's squares in the same layout. (A scattered store of the codes made it pick
    another layout for the whole kernel: an H200 then rounded rstd differently in some rows, flipping y elements and
    now and then a code, at 64 rows of 5120 for one.) The interpreter has no layouts: compiled for sm_90 and sm_86."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", REDUCE_LAYOUTS], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    layouts = json.loads(run.stdout.splitlines()[-1])
    assert len(layouts) == 8
    for key, reduces in layouts.items():
        if key.endswith("a8=True"):
            assert reduces and reduces == layouts[key.replace("a8=True", "a8=False")], key


@pytest.mark.parametrize("quant, write_y", [(False, True), (True, True), (True, False)])
def test_silu_mul(quant, write_y):
    T, I = 3, 1000
    gate_up = randn(T, 2 * I, scale=2)
    gate, up = gate_up[:, :I], gate_up[:, I:]                      # strided halves of a merged projection
    outs = dict(y=nan_like((T, I)) if write_y else None)
    if quant:
        outs.update(q=sentinel_int8((T, I)), s=torch.full((T,), float("nan"), device=DEV))
    got = N.silu_mul(gate, up, quant=quant, write_y=write_y, cfg=SiluConfig(256), **outs)
    ref = R.silu_mul_ref(gate, up)
    if write_y:
        assert rel(got[0] if quant else got, ref) < 1e-2
    if quant:
        q, s = got[-2:]
        y = got[0] if write_y else ref
        if write_y:
            check_int8(q, s, y)
        else:   # no y to compare against bit for bit: codes within one step of the reference's
            q_ref, s_ref = R.int8_per_token_ref(ref)
            assert (q.int() - q_ref.int()).abs().max() <= 1 and torch.allclose(s, s_ref, rtol=1e-2)


# ------------------------------------------------------------------------------------------------ GPU, 27B shapes
M27 = qwen38_27b()


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 5, 64])
def test_gpu_27b_shapes(T):
    H, I, eps = M27.hidden_size, M27.intermediate_size, M27.rms_norm_eps
    HV, DV = M27.linear_num_value_heads, M27.linear_value_head_dim
    HQ, HKV, D = M27.num_attention_heads, M27.num_key_value_heads, M27.head_dim
    x, res, w = randn(T, H, scale=3), randn(T, H), randn(H, scale=0.3)
    h, y, q, s = N.add_rmsnorm(x, res, w, eps, quant=True)
    h_ref, y_ref = R.add_rmsnorm_ref(x, res, w, eps)
    assert torch.equal(h, h_ref) and rel(y, y_ref) < 1e-2
    check_int8(q, s, y)
    assert torch.equal(N.add_rmsnorm(x, res, w, eps, quant=True, a8_order=True)[2], a8_permute(q))
    x, z, gw = randn(T, HV, DV), randn(T, HV, DV), randn(DV) + 1
    y, q, s = N.gated_rmsnorm(x, z, gw, eps, quant=True)
    assert rel(y, R.gated_rmsnorm_ref(x, z, gw, eps)) < 1e-2
    check_int8(q, s, y)
    assert torch.equal(N.gated_rmsnorm(x, z, gw, eps, quant=True, a8_order=True)[1], a8_permute(q))
    qg, k = randn(T, HQ * 2 * D, scale=2), randn(T, HKV * D, scale=2)
    qw, kw = randn(D, scale=0.3), randn(D, scale=0.3)
    cos, sin = rope_tables(torch.arange(1000, 1000 + T, device=DEV), M27.rotary_dim, M27.rope_theta, BF16)
    got = N.qk_norm_rope(qg, k, qw, kw, cos, sin, HQ, HKV, eps, sigmoid_gate=True)
    for a, b in zip(got, R.qk_norm_rope_ref(qg, k, qw, kw, cos, sin, HQ, HKV, eps, sigmoid_gate=True)):
        assert rel(a, b) < 1e-2
    gate_up = randn(T, 2 * I, scale=2)
    y, q, s = N.silu_mul(gate_up[:, :I], gate_up[:, I:], quant=True)
    assert rel(y, R.silu_mul_ref(gate_up[:, :I], gate_up[:, I:])) < 1e-2
    check_int8(q, s, y)
    assert torch.equal(N.silu_mul(gate_up[:, :I], gate_up[:, I:], quant=True, a8_order=True)[1], a8_permute(q))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [True, False])
def test_gpu_qk_norm_rope_writes_kv_27b(fp8):
    assert_kv_write_fused(B=3, n_new=5, HQ=M27.num_attention_heads, HKV=M27.num_key_value_heads, D=M27.head_dim,
                          RD=M27.rotary_dim, fp8=fp8, seed=1)
