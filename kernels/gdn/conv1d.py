"""Causal depthwise conv1d + SiLU of the GDN layer (MODEL.md §3.3) from a per-sequence conv state, for the verify
step (L = k + 1 new columns) and for prefill chunks (any L); one kernel, tiled over (sequence, channels, tokens).

Conv state (ENGINE.md §1.1): `[C, M]` pre-conv columns per sequence, M = (K - 1) + k (widened by the k draft
columns). The K - 1 history columns of the new tokens start at column `off = clamp(num_accepted - 1, 0, M - K + 1)`
(after a verify round with a accepted drafts, num_accepted = a + 1); without num_accepted (prefill of a state that
ends with committed columns) off = M - K + 1, the last K - 1 columns. Everything up to the end of that window is
committed history, so the state afterwards is the last M columns of [state[:, :off + K - 1], x^T]: it ends with the
L new columns, and the next round finds its window at offset num_accepted - 1 again.

Shapes: x [B, L, C] (any float dtype, channels contiguous; or, in one token tile, a linear's int64 sums:
kernels/fixed_sum.py, converted and cleared); weight [C, K] (conv1d.weight[:, 0, :]); conv_state [num_slots, C, M]
(columns contiguous); conv_slots [B] int32 (< 0: padding, zero history, no write; >= num_slots, the caller's error,
as < 0); num_accepted [B] int32 or None; y [B, L, C] = silu(conv) in x's (activation) dtype.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import device as gpu, fixed_sum
from kernels.device import check_dense, load_accepted, load_slot, pdl_args, pdl_wait


def causal_conv1d_reference(x, weight, conv_state, conv_slots, num_accepted=None):
    """Same contract as causal_conv1d in plain torch (updates conv_state in place, returns y)."""
    B, L, C = x.shape
    K, M = weight.shape[1], conv_state.shape[2]
    y = torch.empty_like(x)
    for b in range(B):
        slot = int(conv_slots[b])
        old = conv_state[slot].float() if slot >= 0 else torch.zeros(C, M, device=x.device)
        off = M - (K - 1) if num_accepted is None else min(max(int(num_accepted[b]) - 1, 0), M - (K - 1))
        seq = torch.cat([old[:, :off + K - 1], x[b].float().T], 1)          # committed history, then new inputs
        conv = F.conv1d(seq[None, :, off:], weight.float()[:, None, :], groups=C)[0]
        y[b] = F.silu(conv).T.to(x.dtype)
        if slot >= 0:
            conv_state[slot] = F.pad(seq, (max(M - seq.shape[1], 0), 0))[:, -M:].to(conv_state.dtype)
    return y


@triton.jit
def _causal_conv1d_kernel(x_ptr, w_ptr, state_ptr, slots_ptr, num_acc_ptr, y_ptr, num_slots, L, C,
                          sx_b, sx_t, sw_c, sw_k, ss_n, sy_b, sy_t,
                          K: tl.constexpr, M: tl.constexpr, MP: tl.constexpr, HAS_NA: tl.constexpr,
                          BL: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr):
    # x/y tile [BL tokens, BC channels]; state tile [BC, MP] of a [C, M] per-sequence state
    bi = tl.program_id(0)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    cm = c < C
    ws = ()                                         # the taps, read before the wait: no kernel of the step writes them
    for j in tl.static_range(K):
        ws = ws + (tl.load(w_ptr + c * sw_c + j * sw_k, mask=cm, other=0.0).to(tl.float32),)
    pdl_wait(PDL)
    t = tl.program_id(2) * BL + tl.arange(0, BL)
    tm = t < L
    slot = load_slot(slots_ptr + bi, num_slots)
    valid = slot >= 0
    if HAS_NA:
        off = load_accepted(num_acc_ptr + bi, M - (K - 1))
    else:
        off = M - (K - 1)
    xb = x_ptr + bi * sx_b
    sb = state_ptr + slot.to(tl.int64) * ss_n

    acc = tl.zeros([BL, BC], dtype=tl.float32)
    for j in tl.static_range(K):
        p = t + (j - (K - 1))                       # input position; p < 0 is history column off + K - 1 + p
        xv = fixed_sum.load(xb + p[:, None] * sx_t + c[None, :], ((p >= 0) & tm)[:, None] & cm[None, :])
        hv = tl.load(sb + c[None, :] * M + (off + K - 1 + p)[:, None],
                     mask=((p < 0) & tm)[:, None] & cm[None, :] & valid, other=0.0)
        acc += (xv + hv.to(tl.float32)) * ws[j][None, :]
    y = acc * tl.sigmoid(acc)
    tl.store(y_ptr + bi * sy_b + t[:, None] * sy_t + c[None, :], y.to(y_ptr.dtype.element_ty),
             mask=tm[:, None] & cm[None, :])

    # Only token tile 0 reads the old state (needs BL >= K - 1 when there are several tiles), so it alone
    # rewrites it, after a barrier that orders all of this program's loads before its stores (int64 sums come in
    # one token tile, so the program that read them all clears them then).
    if tl.program_id(2) == 0:
        col = tl.arange(0, MP)[None, :]
        pos = L - M + col                           # new column's input position; < 0: kept from the old state
        src = off + K - 1 + pos
        cmask = (col < M) & cm[:, None]
        new_x = fixed_sum.load(xb + pos * sx_t + c[:, None], (pos >= 0) & cmask)
        kept = tl.load(sb + c[:, None] * M + src, mask=(pos < 0) & (src >= 0) & cmask & valid, other=0.0)
        tl.debug_barrier()
        tl.store(sb + c[:, None] * M + col, (new_x + kept.to(tl.float32)).to(state_ptr.dtype.element_ty),
                 mask=cmask & valid)
        fixed_sum.clear(xb + t[:, None] * sx_t + c[None, :], tm[:, None] & cm[None, :])


def causal_conv1d(x, weight, conv_state, conv_slots, num_accepted=None, out=None, block_c=None):
    """silu(causal depthwise conv1d) of L new columns per sequence, conv state updated in place (module
    docstring). Returns y [B, L, C]; `out` may be passed (CUDA graphs). block_c: channels per program, by default
    the widest of 128 / 64 / 32 that gives every SM two programs (H200, L 5, C 10240: B 1 256 / 128 / 64 / 32
    channels bf16 x 3.39 / 2.69 / 2.36 / 2.22 µs, int64 sums 5.22 / 4.11 / 3.19 / 2.76; B 8 / 64 128 4.1-4.9 / 29-30 µs,
    32 6.2 / 39)."""
    B, L, C = x.shape
    K, M = weight.shape[1], conv_state.shape[2]
    assert weight.shape[0] == C and conv_state.shape[1] == C and M >= K - 1 and conv_slots.shape == (B,)
    assert x.stride(-1) == 1 and conv_state.stride(2) == 1 and conv_state.stride(1) == M
    check_dense("causal_conv1d", conv_slots=conv_slots, num_accepted=num_accepted)
    y = torch.empty(x.shape, dtype=fixed_sum.activation_dtype(x), device=x.device) if out is None else out
    assert y.shape == x.shape and y.stride(-1) == 1, f"causal_conv1d: out {tuple(y.shape)} with unit channel stride"
    bl = min(64, triton.next_power_of_2(L))        # verify: one token tile; prefill: tiles of 64 (>= K - 1)
    block_c = block_c or gpu.filling_tile((128, 64, 32), lambda c: B * triton.cdiv(C, c) * triton.cdiv(L, bl),
                                          x.device)
    assert L <= bl or not fixed_sum.deferred(x), "int64 sums: one token tile reads (and clears) them"
    _causal_conv1d_kernel[(B, triton.cdiv(C, block_c), triton.cdiv(L, bl))](
        x, weight, conv_state, conv_slots, conv_slots if num_accepted is None else num_accepted, y,
        conv_state.shape[0], L, C,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), conv_state.stride(0),
        y.stride(0), y.stride(1),
        K=K, M=M, MP=triton.next_power_of_2(M), HAS_NA=num_accepted is not None, BL=bl, BC=block_c,
        **pdl_args(x.device))
    return y
