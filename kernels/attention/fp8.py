"""fp8 e4m3 (`float8_e4m3fn`) by integer bit operations, for GPUs without a native conversion (sm_86)."""
import torch
import triton
import triton.language as tl

from kernels.device import INTERPRET

E4M3_BITS_UNIT = tl.constexpr(256.0)  # e4m3_decode returns value / 256


_PACKED = tl.constexpr(not INTERPRET)   # the interpreter runs no PTX


@triton.jit
def e4m3_decode(b):
    # Sign to fp16 bit 15, the other 7 bits to bits 13..7: value·2^-8, subnormals exact; NaN codes give ±480
    if _PACKED:
        # per fp16 half: t = code << 8 (prmt), (t & 0x8000) | ((t & 0x7F00) >> 1)
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, u;\n"
            "prmt.b32 t, $2, 0, 0x1404; and.b32 u, t, 0x7F007F00; shr.b32 u, u, 1;\n"
            "lop3.b32 $0, u, t, 0x80008000, 0xF8;\n"         # u | (t & 0x80008000)
            "prmt.b32 t, $2, 0, 0x3424; and.b32 u, t, 0x7F007F00; shr.b32 u, u, 1;\n"
            "lop3.b32 $1, u, t, 0x80008000, 0xF8; }",
            "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4)
    else:
        h = b.to(tl.uint16)
        bits = ((h & 0x80) << 8) | ((h & 0x7F) << 7)
        return bits.to(tl.float16, bitcast=True)


@triton.jit
def e4m3_encode(x):
    u = x.to(tl.uint32, bitcast=True)
    sign = (u >> 24) & 0x80
    a = tl.minimum(tl.abs(x), 448.0)
    au = a.to(tl.uint32, bitcast=True)
    # normals: mantissa rounded to 3 bits, nearest even, exponent re-biased 127 -> 7 (448 -> 0x7E, never NaN)
    normal = ((au + 0x7FFFF + ((au >> 20) & 1)) >> 20) - (120 << 3)
    # below 2^-6: the value in units of 2^-9, rounded to nearest even by the fp32 adder (+ 2^23)
    sub = (a * 512.0 + 8388608.0).to(tl.uint32, bitcast=True) - 0x4B000000
    mag = tl.where(a < 0.015625, sub, normal)
    return (sign | mag).to(tl.uint8)


@triton.jit
def _decode_kernel(bits_ptr, out_ptr, scale, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)     # a whole cache passes 2^31
    mask = offs < n
    b = tl.load(bits_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, e4m3_decode(b).to(tl.float32) * (scale * E4M3_BITS_UNIT), mask=mask)


@triton.jit
def _encode_kernel(x_ptr, bits_ptr, scale, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)     # a whole cache passes 2^31
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(bits_ptr + offs, e4m3_encode(tl.div_rn(x, scale)), mask=mask)


def decode_e4m3(bits: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """uint8 codes -> fp32 values times `scale` (Triton, integer decode)."""
    flat = bits.contiguous().view(torch.uint8).reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.float32, device=bits.device)
    _decode_kernel[(triton.cdiv(flat.numel(), 1024),)](flat, out, float(scale), flat.numel(), BLOCK=1024)
    return out.view(bits.shape)


def encode_e4m3(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Float tensor -> uint8 e4m3 codes of x / scale, saturated to ±448, round to nearest even (Triton)."""
    flat = x.contiguous().reshape(-1)
    out = torch.empty(flat.shape, dtype=torch.uint8, device=x.device)
    _encode_kernel[(triton.cdiv(flat.numel(), 1024),)](flat, out, float(scale), flat.numel(), BLOCK=1024)
    return out.view(x.shape)
