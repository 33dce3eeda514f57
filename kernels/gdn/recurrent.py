"""gdn_verify in Triton (the interpreter's; the GPU's where recurrent_gluon does not fit). A program owns one
(sequence, v-head, V-tile), its state tile in fp32 registers; each token starts from the state as stored, so token
t of a verify is bitwise token t decoded alone at the same launch."""
from dataclasses import dataclass

import triton
import triton.language as tl

from kernels import device as gpu, fixed_sum
from kernels.device import pdl_wait
from kernels.gdn.common import dk_fastest, gdn_gates, slot_row, state_tile


@dataclass(frozen=True)
class Config:
    block_v: int
    num_warps: int


SWEEP = (Config(16, 1), Config(32, 2), Config(64, 4))       # bench/kernels_gdn.py --sweep, the GPU tests


def supports(q, v, cfg: Config) -> bool:
    return v.shape[3] % cfg.block_v == 0


def config(v, state) -> Config:
    """By programs per SM (docs/notes/gdn.md); never by T."""
    B, _, HV, DV = v.shape
    sms = gpu.num_sms(v.device)
    fits = DV & -DV                     # the largest power of two dividing DV: blocks tile it exactly
    if B * HV * triton.cdiv(DV, 16) <= 4 * sms:
        return Config(min(16, fits), 1)
    if state.element_size() == 2 and B * HV * triton.cdiv(DV, 32) <= 16 * sms:
        return Config(min(32, fits), 2)
    return Config(min(64, fits), 4)


@triton.jit
def _gdn_verify_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr,
                       num_acc_ptr, o_ptr,
                       sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sa_b, sa_t, sb_b, sb_t,
                       so_b, so_t, so_h, ss_b, num_slots,
                       scale, T: tl.constexpr, HV: tl.constexpr, KV_GROUP: tl.constexpr,
                       DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, DK_FASTEST: tl.constexpr,
                       PDL: tl.constexpr):
    # Grid (B, Hv, DV / BV); token loops unrolled, per-token values in tuples
    bi = tl.program_id(0)
    h = tl.program_id(1)
    kh = h // KV_GROUP
    offs_k = tl.arange(0, DK)
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)
    tile = state_tile(h, offs_k, offs_v, DK, DV, DK_FASTEST)
    A_log = tl.load(A_log_ptr + h).to(tl.float32)      # weights: read while the previous kernel finishes
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    pdl_wait(PDL)

    # every load up front: none can be hoisted past a state store (may alias), each would cost a round trip
    slots, first = slot_row(num_acc_ptr, slots_ptr, bi, ss_b, num_slots, T)
    S0_ptrs = state_ptr + first.to(tl.int64) * (HV * DK * DV) + tile
    S0 = tl.load(S0_ptrs, mask=first >= 0, other=0.0)
    qr, kr, vs, a_s, b_s = (), (), (), (), ()
    for t in tl.static_range(T):
        qr = qr + (tl.load(q_ptr + bi * sq_b + t * sq_t + kh * sq_h + offs_k).to(tl.float32),)
        kr = kr + (tl.load(k_ptr + bi * sk_b + t * sk_t + kh * sk_h + offs_k).to(tl.float32),)
        vs = vs + (tl.load(v_ptr + bi * sv_b + t * sv_t + h * sv_h + offs_v).to(tl.float32),)
        a_s = a_s + (fixed_sum.load(a_ptr + bi * sa_b + t * sa_t + h, True),)
        b_s = b_s + (fixed_sum.load(b_ptr + bi * sb_b + t * sb_t + h, True),)

    # while the state is in flight
    ks, qs, es, betas = (), (), (), ()
    for t in tl.static_range(T):
        rk = tl.rsqrt(tl.sum(kr[t] * kr[t], axis=0) + 1e-6)
        rq = tl.rsqrt(tl.sum(qr[t] * qr[t], axis=0) + 1e-6) * scale
        ks, qs = ks + (kr[t] * rk,), qs + (qr[t] * rq,)
        g, beta = gdn_gates(a_s[t], b_s[t], A_log, dt_bias)
        es, betas = es + (tl.exp(g),), betas + (beta,)

    S = S0.to(tl.float32)
    # k_t.S and q_t.S both of S_{t-1} (o_t = e^g_t q_t.S_{t-1} + (q_t.k_t) delta_t): side by side
    for t in tl.static_range(T):
        u = tl.sum(S * ks[t][:, None], axis=0)
        w = tl.sum(S * qs[t][:, None], axis=0)
        d = (vs[t] - es[t] * u) * betas[t]
        S = S * es[t] + ks[t][:, None] * d[None, :]
        tl.store(state_ptr + slots[t].to(tl.int64) * (HV * DK * DV) + tile, S.to(state_ptr.dtype.element_ty),
                 mask=slots[t] >= 0)
        # the next token starts from the state as stored (width invariance)
        S = S.to(state_ptr.dtype.element_ty).to(tl.float32)
        o = es[t] * w + tl.sum(qs[t] * ks[t], axis=0) * d
        tl.store(o_ptr + bi * so_b + t * so_t + h * so_h + offs_v, o.to(o_ptr.dtype.element_ty))


def launch(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o, cfg: Config):
    B, T, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    _gdn_verify_kernel[(B, HV, triton.cdiv(DV, cfg.block_v))](
        q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        o.stride(0), o.stride(1), o.stride(2), state_slots.stride(0), state.shape[0],
        DK ** -0.5, T=T, HV=HV, KV_GROUP=HV // HK, DK=DK, DV=DV, BV=cfg.block_v,
        DK_FASTEST=dk_fastest(state, HV, DK, DV), num_warps=cfg.num_warps, **gpu.pdl_args(v.device))
