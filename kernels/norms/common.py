"""Shared by the norm kernels: bf16 rounding, and the int8 per-token epilogue (s = max|y| / 127, at least 1e-6;
q = round-half-even(y / s)), in natural order or the W4A8 operand order (layers.quant.a8_permute)."""
import torch
import triton
import triton.language as tl


@triton.jit
def rne(x, dtype: tl.constexpr):
    """fp32 x rounded to `dtype`, as fp32 (bf16 by hand: the interpreter truncates)."""
    if dtype == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def int8_scale(amax):
    return tl.maximum(tl.div_rn(amax, 127.0), 1e-6)


@triton.jit
def a8_pos(k, A8: tl.constexpr):
    """Column k's place: k, or with A8 in the W4A8 order (k's bits q0 r t1 t0 q1 become r t1 t0 q1 q0)."""
    if A8:
        return (k & ~31) | (((k >> 3) & 1) << 4) | (((k >> 1) & 3) << 2) | ((k & 1) << 1) | ((k >> 4) & 1)
    else:
        return k


@triton.jit
def int8_codes(y, s):
    """round-half-even(y / s) by the 1.5·2^23 shift (exact for |v| < 2^22)."""
    v = tl.div_rn(y, s)
    v = (v + 12582912.0) - 12582912.0
    return tl.minimum(tl.maximum(v, -127.0), 127.0).to(tl.int8)


@triton.jit
def int8_store(q_ptr, y, s, mask):
    tl.store(q_ptr, int8_codes(y, s), mask=mask)


@triton.jit
def a8_codes(y, s):
    """int8_codes in the W4A8 order within each 32 elements (tile rows of whole blocks), permuted in registers: a
    scattered store would change the kernel's layout, and so the bits of its reductions (docs/notes/norms.md)."""
    c = int8_codes(y, s)
    return tl.reshape(tl.permute(tl.reshape(c, [c.numel // 32, 2, 2, 4, 2]), (0, 2, 3, 4, 1)), c.shape)


def buf(t, shape, dtype, device):
    """An output as given (graph capture), or allocated."""
    return t if t is not None else torch.empty(shape, dtype=dtype, device=device)


def check_a8_order(a8_order, quant, width):
    assert not a8_order or (quant and width % 32 == 0), "a8_order: int8 output, whole 32-column blocks"
