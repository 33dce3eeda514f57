"""causal_conv1d (kernels/gdn): one kernel for verify (L = k + 1) and prefill, over (sequence, channels, tokens)."""
from dataclasses import dataclass

import triton
import triton.language as tl

from kernels import device as gpu, fixed_sum
from kernels.device import load_accepted, load_slot, pdl_args, pdl_wait


@dataclass(frozen=True)
class Config:
    block_l: int        # >= K - 1 if L > block_l
    block_c: int


def supports(x, cfg: Config) -> bool:
    return x.shape[1] <= cfg.block_l or not fixed_sum.deferred(x)     # sums: one token tile


def config(x) -> Config:
    """The widest channel tile that gives every SM two programs (H200, L 5, B 1: 2.2 us)."""
    B, L, C = x.shape
    bl = min(64, triton.next_power_of_2(L))
    return Config(bl, gpu.filling_tile((128, 64, 32), lambda c: B * triton.cdiv(C, c) * triton.cdiv(L, bl), x.device))


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

    # Only token tile 0 reads the old state, so it alone rewrites it, after a barrier ordering its loads before its
    # stores (and clears int64 sums, which come in one token tile)
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


def launch(x, weight, conv_state, conv_slots, num_accepted, y, cfg: Config):
    B, L, C = x.shape
    K, M = weight.shape[1], conv_state.shape[2]
    _causal_conv1d_kernel[(B, triton.cdiv(C, cfg.block_c), triton.cdiv(L, cfg.block_l))](
        x, weight, conv_state, conv_slots, conv_slots if num_accepted is None else num_accepted, y,
        conv_state.shape[0], L, C,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), conv_state.stride(0),
        y.stride(0), y.stride(1),
        K=K, M=M, MP=triton.next_power_of_2(M), HAS_NA=num_accepted is not None, BL=cfg.block_l, BC=cfg.block_c,
        **pdl_args(x.device))
