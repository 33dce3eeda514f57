"""Fused small ops at the 27B shapes for T ∈ {1, 5, 320} tokens (decode, MTP-4 verify, 64 sequences × 5):
add + RMSNorm (H 5120), GDN gated RMSNorm (48 × 128), q/k norm + partial RoPE + gate split (24 + 4 heads × 256,
rd 64), SiLU·mul (I 17408); bf16 and with the int8 per-token output; the unfused torch reference as the peer at
T = 1. Bytes counted: every input read once and every output written once. Nothing rotates: the operands (up to
33 MB at T 320) stay in L2 across the timed calls, as a step's activations may after the kernel that wrote them,
so a fraction of the copy peak here is not an HBM fraction (no target reads these rows)."""
import torch

from bench.harness import time_us
from kernels import norms as N
from kernels.norms import ref as R
from kernels.norms.ref import rope_tables
from layers.config import qwen38_27b
from tools.targets import row

DEV, BF = "cuda", torch.bfloat16
_M = qwen38_27b()
H, HV, DV, I = _M.hidden_size, _M.linear_num_value_heads, _M.linear_value_head_dim, _M.intermediate_size
HQ, HKV, D, RD = _M.num_attention_heads, _M.num_key_value_heads, _M.head_dim, _M.rotary_dim


def rnd(*shape):
    return torch.randn(*shape, device=DEV, dtype=BF)


def cases(T):
    """(name, fused call, unfused torch call, bytes moved)."""
    x, res, w = rnd(T, H), rnd(T, H), rnd(H)
    gx, gz, gw = rnd(T, HV, DV), rnd(T, HV, DV), rnd(DV)
    qg, k, qw, kw = rnd(T, HQ * 2 * D), rnd(T, HKV * D), rnd(D), rnd(D)
    cos, sin = rope_tables(torch.arange(T, device=DEV), RD, _M.rope_theta, BF)
    gu = rnd(T, 2 * I)
    g, u = gu[:, :I], gu[:, I:]
    outs = dict(h=torch.empty_like(x), y=torch.empty_like(x))
    q8 = dict(q=torch.empty(T, H, dtype=torch.int8, device=DEV), s=torch.empty(T, device=DEV))
    return [
        ("add_rmsnorm", lambda: N.add_rmsnorm(x, res, w, 1e-6, **outs), lambda: R.add_rmsnorm_ref(x, res, w, 1e-6),
         2 * (4 * T * H + H)),
        ("add_rmsnorm +int8", lambda: N.add_rmsnorm(x, res, w, 1e-6, quant=True, **outs, **q8), None,
         2 * (4 * T * H + H) + T * H + 4 * T),
        ("gated_rmsnorm", lambda: N.gated_rmsnorm(gx, gz, gw, 1e-6), lambda: R.gated_rmsnorm_ref(gx, gz, gw, 1e-6),
         2 * (3 * T * HV * DV + DV)),
        ("gated_rmsnorm +int8", lambda: N.gated_rmsnorm(gx, gz, gw, 1e-6, quant=True), None,
         2 * (3 * T * HV * DV + DV) + T * HV * DV + 4 * T),
        ("qk_norm_rope+gate", lambda: N.qk_norm_rope(qg, k, qw, kw, cos, sin, HQ, HKV, 1e-6, sigmoid_gate=True),
         lambda: R.qk_norm_rope_ref(qg, k, qw, kw, cos, sin, HQ, HKV, 1e-6, sigmoid_gate=True),
         2 * (2 * T * (HQ * 2 * D + HKV * D) + 2 * D + 2 * T * RD)),
        ("silu_mul", lambda: N.silu_mul(g, u), lambda: R.silu_mul_ref(g, u), 2 * 3 * T * I),
        ("silu_mul int8 only", lambda: N.silu_mul(g, u, quant=True, write_y=False), None,
         2 * 2 * T * I + T * I + 4 * T),
    ]


def run(peak_Bps):
    rows = []
    for T in (1, 5, 320):
        for name, fused, unfused, nbytes in cases(T):
            rows.append(row(name, f"T{T}", time_us(fused), nbytes, 0, peak_Bps))
            if T == 1 and unfused is not None:
                rows.append(row("peer torch " + name, f"T{T}", time_us(unfused), nbytes, 0, peak_Bps))
    return rows
