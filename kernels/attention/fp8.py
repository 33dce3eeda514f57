"""fp8 e4m3 (the `float8_e4m3fn` flavour: bias 7, no infinities, ±448 max, NaN = 0x7F/0xFF) by integer bit
operations, so it runs where Triton has no native e4m3 (sm_86, ENGINE.md §5), plus plain-torch references.

Triton helpers, for use inside other kernels:
  e4m3_decode(b)    uint8 codes -> fp16 holding value·2^-8 (multiply by E4M3_BITS_UNIT·scale to get the value)
  e4m3_encode(x)    fp32 -> uint8 codes, saturating to ±448, round to nearest even
Torch-level wrappers (`decode_e4m3`, `encode_e4m3`) run them over whole tensors; `*_ref` are the references."""
import torch
import triton
import triton.language as tl

from kernels.device import INTERPRET

E4M3_MAX = 448.0
E4M3_BITS_UNIT = tl.constexpr(256.0)  # e4m3_decode returns value / 256: the 2^(15-7) exponent re-bias, folded into the scale


_PACKED = tl.constexpr(not INTERPRET)   # the interpreter runs no PTX: it takes the plain integer form


@triton.jit
def e4m3_decode(b):
    # b: uint8 codes (any shape). Sign to fp16 bit 15, exponent+mantissa (7 bits) to fp16 bits 13..7: the fp16
    # exponent field then holds the e4m3 one, so the value is off by 2^(15-7) only; e4m3 subnormals land on fp16
    # subnormals, so they decode exactly too. NaN codes become ±480 (the writer never produces them).
    if _PACKED:
        # four codes a register, two fp16 a result register: prmt puts codes 2i, 2i+1 in the top bytes of the two
        # halves (t = code << 8), then (t & 0x8000) | ((t & 0x7F00) >> 1) per half: 2 instructions a code, where
        # the compiler's code for the form below took ~5.6 (SASS, verify attention's KV tiles). H200, verify
        # attention through this path (V keys-fastest), before -> after: B1 16k 28.6 -> 22.4 us, 64k 88.6 ->
        # 61.2, B8 16k 164 -> 113, B64 1.5k 129 -> 88.7 (native conversion: 19.9 / 50.7 / 91.7 / 72.8), same bits
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
    # x: fp32 (any shape, finite). Returns uint8 codes.
    u = x.to(tl.uint32, bitcast=True)
    sign = (u >> 24) & 0x80
    a = tl.minimum(tl.abs(x), 448.0)
    au = a.to(tl.uint32, bitcast=True)
    # normal range: round the fp32 mantissa to 3 bits, nearest even (a carry correctly bumps the exponent), then
    # re-bias the exponent from 127 to 7; 448 itself maps to 0x7E, so saturation never reaches the NaN code
    normal = ((au + 0x7FFFF + ((au >> 20) & 1)) >> 20) - (120 << 3)
    # below 2^-6 the code is the value in units of 2^-9 (8 = the smallest normal, so the two ranges join); adding
    # 2^23 makes the fp32 adder round that integer to nearest even for us
    sub = (a * 512.0 + 8388608.0).to(tl.uint32, bitcast=True) - 0x4B000000
    mag = tl.where(a < 0.015625, sub, normal)
    return (sign | mag).to(tl.uint8)


@triton.jit
def _decode_kernel(bits_ptr, out_ptr, scale, n, BLOCK: tl.constexpr):
    # bits [n] uint8 -> out [n] fp32 = value · scale
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)     # a whole cache passes 2^31
    mask = offs < n
    b = tl.load(bits_ptr + offs, mask=mask, other=0)
    tl.store(out_ptr + offs, e4m3_decode(b).to(tl.float32) * (scale * E4M3_BITS_UNIT), mask=mask)


@triton.jit
def _encode_kernel(x_ptr, bits_ptr, scale, n, BLOCK: tl.constexpr):
    # x [n] any float -> bits [n] uint8 = e4m3(x / scale)
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


def decode_e4m3_ref(bits: torch.Tensor, scale=1.0) -> torch.Tensor:
    """Reference decode through torch's float8_e4m3fn; `scale` may be a tensor broadcasting against bits."""
    return bits.view(torch.float8_e4m3fn).float() * scale


def encode_e4m3_ref(x: torch.Tensor, scale=1.0) -> torch.Tensor:
    """Reference encode through torch's float8_e4m3fn cast (round to nearest even) after saturating."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
