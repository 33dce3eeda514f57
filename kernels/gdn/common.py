"""The state pool's layout and the Triton helpers of the GDN kernels (slot_row, state_tile set no layouts: the
Gluon kernel calls them too)."""
import torch
import triton
import triton.language as tl

from kernels.device import load_accepted, load_slot


def state_pool(num_slots: int, hv: int, dk: int, dv: int, dtype, device) -> torch.Tensor:
    """The engine's state slots: stored [slots, Hv, dv, dk] (dk fastest: the Gluon kernel's fastest layout),
    returned as the [slots, Hv, dk, dv] view the kernels take."""
    return torch.zeros(num_slots, hv, dv, dk, dtype=dtype, device=device).transpose(-1, -2)


def dk_fastest(state: torch.Tensor, hv: int, dk: int, dv: int) -> bool:
    """True for state_pool's layout, False for a contiguous pool; anything else fails. A compile-time flag."""
    assert state.shape[1:] == (hv, dk, dv), f"state: shape {tuple(state.shape)}, expected [slots, {hv}, {dk}, {dv}]"
    if state.is_contiguous():
        return False
    assert state.transpose(-1, -2).is_contiguous(), \
        f"state: strides {state.stride()}; expected contiguous, or the dk-fastest view of state_pool"
    return True


@triton.jit
def state_tile(h, offs_k, offs_v, DK: tl.constexpr, DV: tl.constexpr, DK_FASTEST: tl.constexpr):
    """Offsets [len(offs_k), len(offs_v)] of head h's state tile within one slot."""
    if DK_FASTEST:
        tile = h * DK * DV + offs_k[:, None] + offs_v[None, :] * DK
    else:
        tile = h * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    return tile


@triton.jit
def l2norm(x, AXIS: tl.constexpr):
    x = x.to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, axis=AXIS, keep_dims=True) + 1e-6)


@triton.jit
def softplus(x):
    # torch's threshold (x > 20 -> x); log1p(y) written as log(u) * y / (u - 1), u = 1 + y, so tiny y stays exact
    y = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + y
    lp = tl.where(u == 1.0, y, tl.log(u) * y / (u - 1.0))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def gdn_gates(a, b, A_log, dt_bias):
    """fp32 log decay g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b)."""
    g = -tl.exp(A_log) * softplus(a.to(tl.float32) + dt_bias)
    return g, tl.sigmoid(b.to(tl.float32))


@triton.jit
def slot_row(num_acc_ptr, slots_ptr, bi, ss_b, num_slots, T: tl.constexpr):
    """Sequence bi's T slots (a tuple, -1 past the pool) and its initial slot, slots[clamp(accepted - 1, 0, T - 1)]:
    selected, not loaded through the count (one dependent load less before the state)."""
    col = load_accepted(num_acc_ptr + bi, T - 1)
    slots = ()
    for t in tl.static_range(T):
        slots = slots + (load_slot(slots_ptr + bi * ss_b + t, num_slots),)
    first = slots[0]
    for t in tl.static_range(1, T):
        first = tl.where(col == t, slots[t], first)
    return slots, first
