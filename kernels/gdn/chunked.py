"""gdn_prefill in the chunked WY/UT form (ref.delta_rule_chunked_ref). Per chunk from S0, gamma_t = sum_{s<=t} g_s,
Gamma = e^gamma, A[t,s] = beta_t e^{gamma_t-gamma_s} k_t.k_s (s < t), D[t,s] = e^{gamma_t-gamma_s} (s <= t):
Ti = (I + A)^-1, W = Ti diag(beta Gamma) K, U = Ti diag(beta) V, Delta = U - W S0,
O = diag(Gamma) Q S0 + (D o Q K^T) Delta, S_C = Gamma_C S0 + (diag(e^{gamma_C - gamma}) K)^T Delta.
_chunk_prepare_kernel makes W, U of all (chunk, head) in parallel; _chunk_state_kernel walks one (sequence, head,
V-tile)'s chunks with S in registers. Ti: 16x16 diagonal blocks by forward substitution, then exact block doubling
X_2b = X_b - X_b (A o M_b) X_b. Gates, norms, Ti's blocks and S in fp32, the doubling in tf32x3, other dot operands
fp16 (W, U, |v| < 65504).
Workspace: W [B, Hv, Lp, dk], U [B, Hv, Lp, dv] fp16, scratch [B * Hv * n_chunks, C, C] fp32; Lp = n_chunks * C."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import device as gpu
from kernels.gdn.common import dk_fastest, gdn_gates, l2norm, state_tile


@dataclass(frozen=True)
class Config:
    chunk: int              # 16, 32 or 64
    prepare_warps: int
    state_warps: int
    block_v: int            # of the state walk
    num_stages: int         # of the state walk


# bench/kernels_gdn.py --sweep: fields replaced in config()'s
SWEEP = tuple(dict(block_v=bv, prepare_warps=p, state_warps=s) for bv in (32, 64) for p, s in ((4, 4), (8, 4), (8, 8)))


def supports(q, v, cfg: Config) -> bool:
    return cfg.chunk in (16, 32, 64) and v.shape[3] % cfg.block_v == 0


def config(q, v, capability: tuple | None = None) -> Config:
    """sm_90: the H200 sweep's best; below, what spills least and fits 99 KB (docs/notes/gdn.md)."""
    sm90 = (capability or gpu.capability(q.device)) >= (9, 0)
    warps, bv = (4, 64) if sm90 else (8, 32)
    return Config(64, warps, warps, min(bv, v.shape[3]), (3 if sm90 else 2) - (q.element_size() > 2))


@triton.jit
def _chunk_gates(a_ptrs, b_ptrs, A_log_ptr, dt_bias_ptr, tmask, h):
    """g, beta (zero past the end) and the in-chunk cumulative log decay gamma."""
    g, beta = gdn_gates(tl.load(a_ptrs, mask=tmask, other=0.0), tl.load(b_ptrs, mask=tmask, other=0.0),
                        tl.load(A_log_ptr + h).to(tl.float32), tl.load(dt_bias_ptr + h).to(tl.float32))
    g = tl.where(tmask, g, 0.0)
    return g, tl.where(tmask, beta, 0.0), tl.cumsum(g, 0)


@triton.jit
def _chunk_prepare_kernel(k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, w_ptr, u_ptr, scr_ptr, L, LP,
                          sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sa_b, sa_t, sb_b, sb_t,
                          HV: tl.constexpr, KV_GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                          KP: tl.constexpr, VP: tl.constexpr, CH: tl.constexpr, LOG2_NB: tl.constexpr):
    # KP, VP: dk, dv padded to >= 64 (masked): narrower dots compiled wrong on sm_90 (docs/notes/gdn.md)
    c = tl.program_id(0)
    bh = tl.program_id(1)
    bi = bh // HV
    h = bh % HV
    t = c * CH + tl.arange(0, CH)
    tm = t < L
    offs_k = tl.arange(0, KP)
    offs_v = tl.arange(0, VP)
    k_in = tm[:, None] & (offs_k < DK)[None, :] if KP > DK else tm[:, None]
    v_in = tm[:, None] & (offs_v < DV)[None, :] if VP > DV else tm[:, None]
    rows = tl.arange(0, CH)[:, None]
    cols = tl.arange(0, CH)[None, :]

    k_rows = k_ptr + bi * sk_b + t[:, None] * sk_t + (h // KV_GROUP) * sk_h + offs_k[None, :]
    K16 = l2norm(tl.load(k_rows, mask=k_in, other=0.0), 1).to(tl.float16)
    g, beta, gam = _chunk_gates(a_ptr + bi * sa_b + t * sa_t + h, b_ptr + bi * sb_b + t * sb_t + h,
                                A_log_ptr, dt_bias_ptr, tm, h)
    strict = rows > cols
    decay = tl.exp(tl.where(strict, gam[:, None] - gam[None, :], 0.0))
    A = tl.where(strict, beta[:, None] * decay * tl.dot(K16, tl.trans(K16)), 0.0)

    # Ti's diagonal 16x16 blocks by forward substitution, reading A's rows back from scratch
    scr = scr_ptr + (bh * tl.num_programs(0) + c).to(tl.int64) * CH * CH
    tl.store(scr + rows * CH + cols, A)
    tl.debug_barrier()
    blk = tl.arange(0, CH // 16)[:, None, None] * 16
    i3 = tl.arange(0, 16)[None, :, None]
    j3 = tl.arange(0, 16)[None, None, :]
    X = tl.where(i3 == j3 + blk * 0, 1.0, 0.0)
    for i in range(1, 16):
        # row i of a block: X[i, :] = e_i - sum_{j<i} A[i, j] X[j, :]  (rows j < i are final)
        a_row = tl.load(scr + (blk + i) * CH + blk + i3, mask=i3 < i, other=0.0)      # [NB, 16(j), 1]
        X = X - tl.where(i3 == i, tl.sum(a_row * X, axis=1)[:, None, :], 0.0)
    tl.debug_barrier()
    tl.store(scr + (blk + i3) * CH + blk + j3, X)
    tl.debug_barrier()
    Ti = tl.load(scr + rows * CH + cols, mask=rows // 16 == cols // 16, other=0.0)
    for s in tl.static_range(LOG2_NB):
        off_block = (rows // (32 << s) == cols // (32 << s)) & (rows // (16 << s) != cols // (16 << s))
        Ti = Ti - tl.dot(Ti, tl.dot(tl.where(off_block, A, 0.0), Ti, input_precision="tf32x3"),
                         input_precision="tf32x3")

    Ti16 = Ti.to(tl.float16)
    K = l2norm(tl.load(k_rows, mask=k_in, other=0.0), 1)               # reloaded: fewer live registers above
    W = tl.dot(Ti16, (K * (beta * tl.exp(gam))[:, None]).to(tl.float16))
    V = tl.load(v_ptr + bi * sv_b + t[:, None] * sv_t + h * sv_h + offs_v[None, :], mask=v_in, other=0.0)
    U = tl.dot(Ti16, (V.to(tl.float32) * beta[:, None]).to(tl.float16))
    row = (bh * LP + t).to(tl.int64)[:, None]
    tl.store(w_ptr + row * DK + offs_k[None, :], W.to(w_ptr.dtype.element_ty), mask=k_in)
    tl.store(u_ptr + row * DV + offs_v[None, :], U.to(u_ptr.dtype.element_ty), mask=v_in)


@triton.jit
def _chunk_state_kernel(q_ptr, k_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, w_ptr, u_ptr, state_ptr, init_ptr,
                        final_ptr, o_ptr, num_slots, L, LP,
                        sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sa_b, sa_t, sb_b, sb_t, so_b, so_t, so_h, scale,
                        HV: tl.constexpr, KV_GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                        BV: tl.constexpr, CH: tl.constexpr, DK_FASTEST: tl.constexpr):
    bh = tl.program_id(0)
    bi = bh // HV
    h = bh % HV
    kh = h // KV_GROUP
    offs_k = tl.arange(0, DK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    rows = tl.arange(0, CH)[:, None]
    cols = tl.arange(0, CH)[None, :]

    tile = state_tile(h, offs_k, offs_v, DK, DV, DK_FASTEST)
    first = gpu.load_slot(init_ptr + bi, num_slots)
    S = tl.load(state_ptr + first.to(tl.int64) * (HV * DK * DV) + tile, mask=first >= 0, other=0.0)
    S = S.to(tl.float32)
    for c in range(0, tl.cdiv(L, CH)):
        t = c * CH + tl.arange(0, CH)
        tm = t < L
        Q = (l2norm(tl.load(q_ptr + bi * sq_b + t[:, None] * sq_t + kh * sq_h + offs_k[None, :],
                            mask=tm[:, None], other=0.0), 1) * scale).to(tl.float16)
        K = l2norm(tl.load(k_ptr + bi * sk_b + t[:, None] * sk_t + kh * sk_h + offs_k[None, :],
                           mask=tm[:, None], other=0.0), 1)
        g, _, gam = _chunk_gates(a_ptr + bi * sa_b + t * sa_t + h, b_ptr + bi * sb_b + t * sb_t + h,
                                 A_log_ptr, dt_bias_ptr, tm, h)
        row = (bh * LP + t).to(tl.int64)[:, None]
        W = tl.load(w_ptr + row * DK + offs_k[None, :], mask=tm[:, None], other=0.0)
        U = tl.load(u_ptr + row * DV + offs_v[None, :], mask=tm[:, None], other=0.0).to(tl.float32)

        S16 = S.to(tl.float16)
        delta = U - tl.dot(W, S16)
        delta16 = delta.to(tl.float16)
        causal = rows >= cols
        P = tl.where(causal, tl.exp(tl.where(causal, gam[:, None] - gam[None, :], 0.0)), 0.0)
        P = P * tl.dot(Q, tl.trans(K.to(tl.float16)))
        O = tl.dot(Q, S16) * tl.exp(gam)[:, None] + tl.dot(P.to(tl.float16), delta16)
        tl.store(o_ptr + bi * so_b + t[:, None] * so_t + h * so_h + offs_v[None, :],
                 O.to(o_ptr.dtype.element_ty), mask=tm[:, None])
        last = tl.sum(g, 0)
        S = S * tl.exp(last) + tl.dot(tl.trans((K * tl.exp(last - gam)[:, None]).to(tl.float16)), delta16)
    fin = gpu.load_slot(final_ptr + bi, num_slots)
    tl.store(state_ptr + fin.to(tl.int64) * (HV * DK * DV) + tile, S.to(state_ptr.dtype.element_ty), mask=fin >= 0)


def prefill_workspace(B, L, HV, DK, DV, device, chunk=64):
    """gdn_prefill's workspace at `chunk` tokens a chunk."""
    n = triton.cdiv(L, chunk)
    return (torch.empty(B, HV, n * chunk, DK, device=device, dtype=torch.float16),
            torch.empty(B, HV, n * chunk, DV, device=device, dtype=torch.float16),
            torch.empty(B * HV * n, chunk, chunk, device=device))


def chunk_prepare(k, v, a, b, A_log, dt_bias, workspace, cfg: Config):
    """First pass: W and U of every (chunk, head) into the workspace."""
    B, L, HK, DK = k.shape
    HV, DV = v.shape[2], v.shape[3]
    n = triton.cdiv(L, cfg.chunk)
    w, u, scr = workspace
    assert w.shape[2] == n * cfg.chunk and scr.shape[0] >= B * HV * n
    _chunk_prepare_kernel[(n, B * HV)](
        k, v, a, b, A_log, dt_bias, w, u, scr, L, n * cfg.chunk,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        HV=HV, KV_GROUP=HV // HK, DK=DK, DV=DV, KP=max(DK, 64), VP=max(DV, 64), CH=cfg.chunk,
        LOG2_NB=(cfg.chunk // 16).bit_length() - 1, num_warps=cfg.prepare_warps)


def chunk_states(q, k, a, b, A_log, dt_bias, state, initial_slots, final_slots, o, workspace, cfg: Config):
    """Second pass: the state walk over the chunks, writing o and the final state."""
    B, L, HK, DK = q.shape
    HV, DV = o.shape[2], o.shape[3]
    w, u, _ = workspace
    _chunk_state_kernel[(B * HV, DV // cfg.block_v)](
        q, k, a, b, A_log, dt_bias, w, u, state, initial_slots, final_slots, o, state.shape[0], L, w.shape[2],
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), o.stride(0), o.stride(1), o.stride(2), DK ** -0.5,
        HV=HV, KV_GROUP=HV // HK, DK=DK, DV=DV, BV=cfg.block_v, CH=cfg.chunk,
        DK_FASTEST=dk_fastest(state, HV, DK, DV), num_warps=cfg.state_warps, num_stages=cfg.num_stages)


def launch(q, k, v, a, b, A_log, dt_bias, state, initial_slots, final_slots, o, workspace, cfg: Config):
    chunk_prepare(k, v, a, b, A_log, dt_bias, workspace, cfg)
    chunk_states(q, k, a, b, A_log, dt_bias, state, initial_slots, final_slots, o, workspace, cfg)
