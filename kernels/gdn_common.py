"""Scalar Triton helpers of the Gated DeltaNet verify update, shared by its Triton kernel (kernels/gdn_recurrent.py)
and its Gluon kernel (kernels/gdn_recurrent_gluon.py calls slot_row as it is: it uses no layouts; its own gates
fold the decay's exp in and differ in the last bits, so it keeps them).
References: kernels/gdn_recurrent.gates_reference and gdn_verify_reference."""
import triton
import triton.language as tl


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
def slot_row(num_acc_ptr, slots_ptr, bi, ss_b, T: tl.constexpr):
    """Sequence bi's T state slots (a tuple: token t's state goes to slots[t]) and the slot of its starting state,
    slots[accepted - 1] with the count clamped to [1, T] (an accepted count of 0 or garbage never indexes out of
    bounds). The start is selected from the row rather than loaded through the count: one dependent load less
    before the state load."""
    col = tl.minimum(tl.maximum(tl.load(num_acc_ptr + bi) - 1, 0), T - 1)
    slots = ()
    for t in tl.static_range(T):
        slots = slots + (tl.load(slots_ptr + bi * ss_b + t),)
    first = slots[0]
    for t in tl.static_range(1, T):
        first = tl.where(col == t, slots[t], first)
    return slots, first
