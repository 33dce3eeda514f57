"""Shared by the int4 kernels."""
from triton.experimental import gluon

GROUP = 128             # inputs per scale (layers/quant.py)
MAX_ROWS = 24           # W4A16 calls up to this many rows take the GEMV (gemv.py)


def exact_log2(v: int) -> int:
    assert v & (v - 1) == 0, v
    return v.bit_length() - 1


@gluon.jit
def range_start(p, P, units):
    """First work unit of program p's range: `units` cut into P equal ranges."""
    return p * units // P


@gluon.jit
def prog_of(u, P, units):
    """The program whose range holds unit u."""
    return ((u + 1) * P - 1) // units
