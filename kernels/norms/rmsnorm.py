"""add_rmsnorm: h = x + residual, y = RMSNorm_1p(h, w), one program per row. H200: 3 µs in the layer chain at T 5."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import fixed_sum
from kernels.device import check_dense, pdl_args, pdl_wait
from kernels.norms.common import a8_codes, buf, check_a8_order, int8_scale, int8_store, rne


@triton.jit
def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, h_ptr, y_ptr, q_ptr, s_ptr, H, eps,
                        HAS_RES: tl.constexpr, QUANT: tl.constexpr, A8: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    """x, residual, h, y [T, H] contiguous, w [H]; grid (T,). h may alias residual; x may be int64 sums."""
    d = tl.arange(0, BLOCK)
    m = d < H
    w = tl.load(w_ptr + d, mask=m, other=0.0).to(tl.float32)        # a weight: read before the wait
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    hf = fixed_sum.load(x_ptr + t * H + d, m)
    fixed_sum.clear(x_ptr + t * H + d, m)
    if HAS_RES:   # the residual add rounds to the activation dtype, as a bf16 torch add does
        hf = rne(hf + tl.load(res_ptr + t * H + d, mask=m, other=0.0).to(tl.float32), h_ptr.dtype.element_ty)
        tl.store(h_ptr + t * H + d, hf, mask=m)
    rstd = tl.rsqrt(tl.sum(hf * hf, 0) / H + eps)
    y = rne(hf * rstd * (1.0 + w), y_ptr.dtype.element_ty)
    tl.store(y_ptr + t * H + d, y, mask=m)
    if QUANT:
        s = int8_scale(tl.max(tl.abs(y), 0))
        tl.store(s_ptr + t, s)
        if A8:
            tl.store(q_ptr + t * H + d, a8_codes(y, s), mask=m)
        else:
            int8_store(q_ptr + t * H + d, y, s, m)


@dataclass(frozen=True)
class Config:
    num_warps: int


def config(x) -> Config:
    """16 warps for int64 sums' 8-byte rows, else 8."""
    return Config(num_warps=16 if fixed_sum.deferred(x) else 8)


def launch(x, residual, w, eps, h, y, q, s, quant, a8_order, cfg: Config):
    T, H = x.shape
    _add_rmsnorm_kernel[(T,)](x, x if residual is None else residual, w, h, y, q, s, H, eps,
                              HAS_RES=residual is not None, QUANT=quant, A8=a8_order,
                              BLOCK=triton.next_power_of_2(H), num_warps=cfg.num_warps, **pdl_args(x.device))


def add_rmsnorm(x, residual, w, eps, quant=False, h=None, y=None, q=None, s=None, a8_order=False, cfg=None):
    """x, residual [T, H] (residual None: h = x) -> (h, y), plus (q int8 [T, H], s [T]) when quant; a8_order: q in
    the W4A8 operand order, y and s the same. h=residual updates it in place; x may be int64 sums (with a
    residual). Outputs may be passed in, as dense rows."""
    T, H = x.shape
    check_dense("add_rmsnorm", x=x, residual=residual, w=w, h=h, y=y, q=q, s=s)
    assert residual is not None or not fixed_sum.deferred(x), "int64 sums are added to a residual"
    check_a8_order(a8_order, quant, H)
    dt = fixed_sum.activation_dtype(x)
    h = x if residual is None else buf(h, (T, H), dt, x.device)
    y = buf(y, (T, H), dt, x.device)
    q, s = (buf(q, (T, H), torch.int8, x.device), buf(s, (T,), torch.float32, x.device)) if quant else (y, w)
    launch(x, residual, w, eps, h, y, q, s, quant, a8_order, cfg or config(x))
    return (h, y, q, s) if quant else (h, y)
