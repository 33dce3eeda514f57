"""Triton helpers of the Gated DeltaNet kernels, shared by the verify update's Triton kernel (kernels/gdn_recurrent.py)
and Gluon kernel (kernels/gdn_recurrent_gluon.py calls slot_row and state_tile as they are: they set no layouts;
its own gates fold the decay's exp in and differ in the last bits, so it keeps them) and the chunked prefill
(kernels/gdn_chunked.py); plus the state pool's layout (state_pool, dk_fastest).
References: kernels/gdn_recurrent.gates_reference and gdn_verify_reference."""
import torch
import triton
import triton.language as tl

from kernels.device import load_accepted, load_slot


def state_pool(num_slots: int, hv: int, dk: int, dv: int, dtype, device) -> torch.Tensor:
    """The recurrent-state slots as the engine keeps them: [slots, Hv, dv, dk] in memory (dk fastest), returned as
    the [slots, Hv, dk, dv] view that the kernels and references take. Why dk fastest: the Gluon verify kernel's
    threads then store 16 contiguous bytes of a row, and one launch serves every width, 4-15% faster than the
    best launches on transformers' dv-fastest layout (kernels/gdn_recurrent_gluon.py, H200)."""
    return torch.zeros(num_slots, hv, dv, dk, dtype=dtype, device=device).transpose(-1, -2)


def dk_fastest(state: torch.Tensor, hv: int, dk: int, dv: int) -> bool:
    """Check a state pool [slots, Hv, dk, dv]: dv fastest (contiguous, transformers' layout) or dk fastest
    (state_pool's); True for the latter, which the kernels take as a compile-time flag (constant strides: runtime
    ones cost the dv-fastest Gluon launches 20-60% on the H200)."""
    assert state.shape[1:] == (hv, dk, dv), f"state: shape {tuple(state.shape)}, expected [slots, {hv}, {dk}, {dv}]"
    if state.is_contiguous():
        return False
    assert state.transpose(-1, -2).is_contiguous(), \
        f"state: strides {state.stride()}; expected contiguous, or the dk-fastest view of state_pool"
    return True


@triton.jit
def state_tile(h, offs_k, offs_v, DK: tl.constexpr, DV: tl.constexpr, DK_FASTEST: tl.constexpr):
    """Offsets [len(offs_k), len(offs_v)] of head h's state rows offs_k (dk) and columns offs_v (dv) within one slot
    of a pool [slots, Hv, dk, dv]: dv fastest, or dk fastest (stored [slots, Hv, dv, dk]: state_pool). The strides
    are constants (see dk_fastest); the layouts of offs_k and offs_v carry over (Triton and Gluon kernels alike)."""
    if DK_FASTEST:
        tile = h * DK * DV + offs_k[:, None] + offs_v[None, :] * DK
    else:
        tile = h * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    return tile


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
    """Sequence bi's T state slots (a tuple: token t's state goes to slots[t]; -1, padding, for a slot id past the
    pool's num_slots: device.load_slot) and the slot of its starting state, slots[accepted - 1] with the count
    clamped to [1, T] (device.load_accepted: a count of 0 or garbage never indexes out of bounds). The start is
    selected from the row rather than loaded through the count: one dependent load less before the state load."""
    col = load_accepted(num_acc_ptr + bi, T - 1)
    slots = ()
    for t in tl.static_range(T):
        slots = slots + (load_slot(slots_ptr + bi * ss_b + t, num_slots),)
    first = slots[0]
    for t in tl.static_range(1, T):
        first = tl.where(col == t, slots[t], first)
    return slots, first
