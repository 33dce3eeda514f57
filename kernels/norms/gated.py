"""gated_rmsnorm: y = (w · x̂.to(dtype)) · silu(z) per head (the GDN output norm); a program takes `heads` heads of
a token. H200, 48 heads of 128, T 5: 1.3 µs (1.4 from int64 sums)."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import fixed_sum
from kernels.device import check_dense, filling_tile, pdl_args, pdl_wait
from kernels.norms.common import a8_codes, buf, check_a8_order, int8_scale, int8_store, rne


@triton.jit
def _gated_rmsnorm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, q_ptr, s_ptr, c_ptr, NH, D, stride_z, NC, stride_c, eps,
                          QUANT: tl.constexpr, A8: tl.constexpr, W_ROUNDS: tl.constexpr, BH: tl.constexpr,
                          BD: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr):
    """x, y [T, NH, D] contiguous, z likewise with row stride stride_z (or int64 sums), w [D]; c [T, NC] int64
    sums cleared by the token's first program. Grid (T, cdiv(NH, BH)): a [BH, BD] tile of heads."""
    d = tl.arange(0, BD)[None, :]
    w = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)     # a weight: read before the wait
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    hh = tl.program_id(1) * BH + tl.arange(0, BH)[:, None]
    m = (hh < NH) & (d < D)
    offs = t * NH * D + hh * D + d
    dt = y_ptr.dtype.element_ty
    xf = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    xn = rne(xf * tl.rsqrt(tl.sum(xf * xf, 1) / D + eps)[:, None], dt)
    g = w * xn
    if W_ROUNDS:   # w in the activation dtype: HF's w · x̂ product is rounded to it
        g = rne(g, dt)
    z = fixed_sum.load(z_ptr + t * stride_z + hh * D + d, m)
    fixed_sum.clear(z_ptr + t * stride_z + hh * D + d, m)
    if BC > 0:
        cols = tl.arange(0, BC)
        fixed_sum.clear(c_ptr + t * stride_c + cols, (cols < NC) & (tl.program_id(1) == 0))
    y = rne(g * (z * tl.sigmoid(z)), dt)
    tl.store(y_ptr + offs, y, mask=m)
    if QUANT:
        s = int8_scale(tl.max(tl.max(tl.abs(y), 1), 0))
        tl.store(s_ptr + t, s)
        if A8:
            tl.store(q_ptr + t * NH * D + hh * D + d, a8_codes(y, s), mask=m)
        else:
            int8_store(q_ptr + t * NH * D + (hh * D + d), y, s, m)


@dataclass(frozen=True)
class Config:
    heads: int                       # per program, a power of two (int8: all)

    @property
    def num_warps(self) -> int:
        return max(1, min(8, self.heads // 2))


def config(T, NH, quant, device) -> Config:
    """All heads with int8; else the most that give every SM two programs, at least 2."""
    top = triton.next_power_of_2(NH)
    if quant:
        return Config(top)
    return Config(filling_tile([top >> i for i in range(top.bit_length() - 1)] or [1],
                               lambda h: T * triton.cdiv(NH, h), device))


def launch(x, z, w, eps, y, q, s, clear, quant, a8_order, cfg: Config):
    T, NH, D = x.shape
    assert cfg.heads == triton.next_power_of_2(cfg.heads) and (not quant or cfg.heads >= NH)
    c, nc = (clear, clear.shape[1]) if clear is not None else (z, 0)
    _gated_rmsnorm_kernel[(T, triton.cdiv(NH, cfg.heads))](
        x, z, w, y, q, s, c, NH, D, z.stride(0), nc, c.stride(0), eps, QUANT=quant, A8=a8_order,
        W_ROUNDS=w.dtype == x.dtype, BH=cfg.heads, BD=triton.next_power_of_2(D),
        BC=triton.next_power_of_2(nc) if nc else 0, num_warps=cfg.num_warps, **pdl_args(x.device))


def gated_rmsnorm(x, z, w, eps, quant=False, y=None, q=None, s=None, clear=None, a8_order=False, cfg=None):
    """x [T, heads, D] contiguous, z [T, heads, D] (any row stride, or int64 sums) -> y [T, heads, D], plus
    (q int8 [T, heads·D], s [T]) when quant (a8_order: D % 32 == 0). clear: int64 sums [T, n] to zero here (the
    GDN layer's b and a, which gdn_verify reads but cannot clear)."""
    T, NH, D = x.shape
    assert x.is_contiguous() and z.shape == x.shape and z.stride(2) == 1 and z.stride(1) == D
    assert clear is None or (fixed_sum.deferred(clear) and clear.shape[0] == T and clear.stride(1) == 1)
    check_dense("gated_rmsnorm", w=w, y=y, q=q, s=s)
    check_a8_order(a8_order, quant, D)
    y = buf(y, (T, NH, D), x.dtype, x.device)
    q, s = (buf(q, (T, NH * D), torch.int8, x.device), buf(s, (T,), torch.float32, x.device)) if quant else (y, w)
    launch(x, z, w, eps, y, q, s, clear, quant, a8_order, cfg or config(T, NH, quant, x.device))
    return (y, q, s) if quant else y
