"""silu_mul: y = silu(gate) · up; int8 takes a second pass, from each chunk's max |y| and y recomputed.
H200, T 5 x 17408: 1.1 µs (1.6 from int64 sums)."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import fixed_sum
from kernels.device import check_dense, pdl_args, pdl_wait
from kernels.norms.common import a8_pos, buf, check_a8_order, int8_scale, int8_store, rne


@triton.jit
def _silu_mul_value(g_ptr, u_ptr, offs, m, CLEAR: tl.constexpr):
    """y at offs; gate and up may be int64 sums, cleared if CLEAR."""
    dt: tl.constexpr = tl.bfloat16 if g_ptr.dtype.element_ty == tl.int64 else g_ptr.dtype.element_ty
    g = fixed_sum.load(g_ptr + offs, m)
    u = fixed_sum.load(u_ptr + offs, m)
    if CLEAR:
        fixed_sum.clear(g_ptr + offs, m)
        fixed_sum.clear(u_ptr + offs, m)
    act = rne(g * tl.sigmoid(g), dt)                             # F.silu rounds to the input dtype
    return rne(act * u, dt)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, amax_ptr, I, g_stride, u_stride, NCH,
                     WRITE_Y: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """gate, up [T, I] (row strides given), y [T, I]; grid (T, NCH). QUANT: chunk maxima to amax [T, NCH]."""
    pdl_wait(PDL)
    t, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    y = _silu_mul_value(g_ptr + t * g_stride, u_ptr + t * u_stride, offs, m, not QUANT)
    if WRITE_Y:
        tl.store(y_ptr + t * I + offs, y, mask=m)
    if QUANT:
        tl.store(amax_ptr + t * NCH + c, tl.max(tl.abs(y), 0))


@triton.jit
def _silu_mul_int8_kernel(g_ptr, u_ptr, amax_ptr, q_ptr, s_ptr, I, g_stride, u_stride, NCH,
                          A8: tl.constexpr, BLOCK: tl.constexpr, NCHP: tl.constexpr, PDL: tl.constexpr):
    """grid (T, NCH): the row's scale from amax, the chunk's codes from y recomputed (the same bits)."""
    pdl_wait(PDL)
    t, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i = tl.arange(0, NCHP)
    s = int8_scale(tl.max(tl.load(amax_ptr + t * NCH + i, mask=i < NCH, other=0.0), 0))
    if c == 0:
        tl.store(s_ptr + t, s)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    y = _silu_mul_value(g_ptr + t * g_stride, u_ptr + t * u_stride, offs, m, True)
    int8_store(q_ptr + t * I + a8_pos(offs, A8), y, s, m)


@dataclass(frozen=True)
class Config:
    block: int = 1024                # columns per program, a power of two
    num_warps: int = 8

    def chunks(self, width: int) -> int:
        """Programs per row (amax's columns)."""
        return triton.cdiv(width, self.block)


def config(width: int) -> Config:
    return Config(block=min(1024, triton.next_power_of_2(width)))


def launch(gate, up, y, q, s, amax, quant, write_y, a8_order, cfg: Config):
    T, I = gate.shape
    nch = cfg.chunks(I)
    _silu_mul_kernel[(T, nch)](gate, up, y if write_y else gate, amax if quant else gate, I, gate.stride(0),
                               up.stride(0), nch, WRITE_Y=write_y, QUANT=quant, BLOCK=cfg.block,
                               num_warps=cfg.num_warps, **pdl_args(gate.device))
    if quant:
        _silu_mul_int8_kernel[(T, nch)](gate, up, amax, q, s, I, gate.stride(0), up.stride(0), nch, A8=a8_order,
                                        BLOCK=cfg.block, NCHP=triton.next_power_of_2(nch), num_warps=cfg.num_warps,
                                        **pdl_args(gate.device))


def silu_mul(gate, up, quant=False, write_y=True, y=None, q=None, s=None, amax=None, a8_order=False, cfg=None):
    """gate, up [T, I] (unit column stride, or int64 sums) -> y [T, I], and when quant (q int8 [T, I], s [T]);
    write_y=False skips y. amax [T, cfg.chunks(I)] fp32 is the int8 scratch (pass it for graph capture)."""
    T, I = gate.shape
    assert gate.stride(1) == 1 and up.stride(1) == 1 and (write_y or quant) and gate.dtype == up.dtype
    check_a8_order(a8_order, quant, I)
    check_dense("silu_mul", y=y, q=q, s=s, amax=amax)
    cfg = cfg or config(I)
    y = buf(y, (T, I), fixed_sum.activation_dtype(gate), gate.device) if write_y else None
    if quant:
        q, s = buf(q, (T, I), torch.int8, gate.device), buf(s, (T,), torch.float32, gate.device)
        amax = buf(amax, (T, cfg.chunks(I)), torch.float32, gate.device)
    launch(gate, up, y, q, s, amax, quant, write_y, a8_order, cfg)
    return y if not quant else tuple(o for o in (y, q, s) if o is not None)
