"""A linear's output as int64 sums in units of 2^-FRAC (kernels/int4/gemv.py), converted and cleared by its reader."""
import torch
import triton
import triton.language as tl

FRAC = 32
_UNIT = tl.constexpr(2.0 ** -FRAC)
_HALF_ULP = tl.constexpr((1 << 44) - 1)     # fp64 → bf16 drops 45 mantissa bits: round half to even
_KEEP = tl.constexpr(-(1 << 45))


def deferred(t: torch.Tensor) -> bool:
    """Whether a linear's output is int64 sums."""
    return t.dtype == torch.int64


def activation_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype it stands for."""
    return torch.bfloat16 if deferred(t) else t.dtype


def to_bf16_ref(sums: torch.Tensor) -> torch.Tensor:
    """int64 sums → bf16, rounded once from fp64."""
    b = (sums.double() * 2.0 ** -FRAC).view(torch.int64)
    b = (b + _HALF_ULP.value + ((b >> 45) & 1)) & _KEEP.value
    return b.view(torch.float64).float().bfloat16()


@triton.jit
def to_bf16(v):
    """int64 sums → fp32 holding their bf16, rounded once (as to_bf16_ref)."""
    b = (v.to(tl.float64) * _UNIT).to(tl.int64, bitcast=True)
    b = (b + _HALF_ULP + ((b >> 45) & 1)) & _KEEP
    return b.to(tl.float64, bitcast=True).to(tl.float32)


@triton.jit
def load(ptrs, mask):
    """A linear's output as fp32 (int64 sums converted, not cleared)."""
    if ptrs.dtype.element_ty == tl.int64:
        return to_bf16(tl.load(ptrs, mask=mask, other=0))
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def clear(ptrs, mask):
    """Zero int64 sums after this program's last read of them (stored activations: nothing). A CTA barrier comes
    first: the compiler may give the zero store another thread mapping than the loads (a [8192] int64 row: 8
    elements a thread loaded, 2 a thread stored), so without it one thread could zero an element another has yet
    to read. Call it where every thread of the program reaches it (no branch on per-thread values)."""
    if ptrs.dtype.element_ty == tl.int64:
        tl.debug_barrier()
        tl.store(ptrs, 0, mask=mask)
