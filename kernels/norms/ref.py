"""The norms in plain torch, HF's rounding step by step: the model's own (layers/model.py) and the fused ops'."""
import torch
import torch.nn.functional as F


def rms_norm_1p_ref(x, weight, eps):
    """Zero-centred RMSNorm, (1 + w), in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())).to(x.dtype)


def gated_rmsnorm_ref(x, z, weight, eps):
    """GDN output norm, x, z [..., D]: plain w, gated by silu(z); x̂ rounded to x's dtype before the weight."""
    xf = x.float()
    xn = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * xn * F.silu(z.float())).to(x.dtype)


def rope_tables(positions, rotary_dim, theta, dtype):
    """cos, sin [T, rotary_dim] for positions [T]; pairs (j, j + rotary_dim/2); fp32, cast last."""
    dims = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=positions.device)
    inv_freq = 1.0 / theta ** (dims / rotary_dim)
    angles = positions.float()[:, None] * inv_freq[None]
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope_ref(x, cos, sin):
    """x [B, T, heads, D]: the first rotary_dim dims rotated."""
    rd = cos.shape[-1]
    r, rest = x[..., :rd], x[..., rd:]
    rotated = torch.cat([-r[..., rd // 2:], r[..., : rd // 2]], -1)
    return torch.cat([r * cos[:, None] + rotated * sin[:, None], rest], -1)


def int8_per_token_ref(y):
    """y [T, N] -> (q int8 [T, N], s fp32 [T])."""
    yf = y.float()
    amax = yf.abs().amax(-1)
    # tensor / tensor: CUDA torch turns / 127.0 into a multiply by the reciprocal
    s = (amax / torch.full_like(amax, 127.0)).clamp_min(1e-6)
    return torch.round(yf / s[:, None]).clamp(-127, 127).to(torch.int8), s


def add_rmsnorm_ref(x, residual, w, eps):
    h = x if residual is None else x + residual
    return h, rms_norm_1p_ref(h, w, eps)


def qk_norm_rope_ref(qg, k, q_w, k_w, cos, sin, heads, kv_heads, eps, sigmoid_gate=False):
    """As kernels/norms/rope.qk_norm_rope."""
    T = qg.shape[0]
    q, gate = qg.view(T, heads, -1).chunk(2, -1)
    k = k.view(T, kv_heads, -1)
    q = apply_rope_ref(rms_norm_1p_ref(q, q_w, eps)[None], cos, sin)[0]
    k = apply_rope_ref(rms_norm_1p_ref(k, k_w, eps)[None], cos, sin)[0]
    return q, k, torch.sigmoid(gate) if sigmoid_gate else gate.contiguous()


def silu_mul_ref(gate, up):
    return F.silu(gate) * up
