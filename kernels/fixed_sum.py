"""A linear's output left as its int64 fixed-point sums and converted by the kernel that reads it.

The int4 GEMV (kernels/int4_gemv.py) adds each output element in int64 units of 2^-32 from every program that
holds part of its K range. Stored as bf16 it needs the last program to learn the total, so every add returns
a value and the launch ends with a round trip to L2 (~1.5-2 µs at 1-8 rows on the H200). Given an int64 output
instead, zero on entry, it posts its adds (`red`) and ends at once; the consumer — the norm, activation, conv or
GDN kernel that reads the linear's output next — converts each element as the GEMV's own store would have
(one rounding from fp64 to bf16: bitwise the same activations) and writes zero back for the next launch.
Every element is cleared by the one program that reads it last; the clears cost the layer chain nothing
measurable (H200, bench/layer_step at B1 T5 with every clear a no-op: GDN layer 84.9 against 83.7 µs, attention
layer 96.8 against 96.4-96.6). Deferred sums are always bf16 activations (Qwen's dtype); fp16 models keep stored
outputs. Reference: `to_bf16_ref`."""
import torch
import triton
import triton.language as tl

FRAC = 32                                   # fractional bits of the sums: int64 units of 2^-32
_UNIT = tl.constexpr(2.0 ** -FRAC)
_HALF_ULP = tl.constexpr((1 << 44) - 1)     # fp64 → bf16 drops 45 mantissa bits: round half to even
_KEEP = tl.constexpr(-(1 << 45))


def deferred(t: torch.Tensor) -> bool:
    """Whether a linear's output is its fixed-point sums (int64) rather than stored activations."""
    return t.dtype == torch.int64


def activation_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a linear's output stands for: bf16 for deferred sums."""
    return torch.bfloat16 if deferred(t) else t.dtype


def to_bf16_ref(sums: torch.Tensor) -> torch.Tensor:
    """int64 fixed-point sums → bf16, rounded once from their fp64 value (torch's double → bf16 rounds twice)."""
    b = (sums.double() * 2.0 ** -FRAC).view(torch.int64)
    b = (b + _HALF_ULP.value + ((b >> 45) & 1)) & _KEEP.value
    return b.view(torch.float64).float().bfloat16()


@triton.jit
def to_bf16(v):
    """int64 sums → fp32 holding the bf16 value the GEMV's store (cvt.rn.bf16.f64) would write. Rounded by hand
    in fp64's bits: the interpreter truncates to bf16, and fp64 → fp32 → bf16 would round twice."""
    b = (v.to(tl.float64) * _UNIT).to(tl.int64, bitcast=True)
    b = (b + _HALF_ULP + ((b >> 45) & 1)) & _KEEP
    return b.to(tl.float64, bitcast=True).to(tl.float32)


@triton.jit
def load(ptrs, mask):
    """A linear's output as fp32: stored activations as they are, int64 sums converted (not cleared)."""
    if ptrs.dtype.element_ty == tl.int64:
        return to_bf16(tl.load(ptrs, mask=mask, other=0))
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def clear(ptrs, mask):
    """After the last read of int64 sums: zero them for the GEMV's next launch (stored activations: nothing)."""
    if ptrs.dtype.element_ty == tl.int64:
        tl.store(ptrs, 0, mask=mask)
