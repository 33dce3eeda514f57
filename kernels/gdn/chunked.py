"""Gated DeltaNet over a long prompt chunk (prefill), chunked WY/UT form (MODEL.md §3.3).

Derivation (per v-head, chunk of C tokens, state S0 [dk, dv] at its start). With gamma_t = sum_{s<=t} g_s and
Gamma_t = exp(gamma_t), unrolling S_t = e^{g_t} S_{t-1} + k_t delta_t^T gives
    S_t     = Gamma_t S0 + sum_{s<=t} e^{gamma_t - gamma_s} k_s delta_s^T
    delta_t = beta_t (v_t - Gamma_t S0^T k_t - sum_{s<t} e^{gamma_t - gamma_s} (k_t.k_s) delta_s)
i.e. (I + A) Delta = diag(beta) V - diag(beta Gamma) K S0 with A[t,s] = beta_t e^{gamma_t-gamma_s} k_t.k_s (s < t).
With Ti = (I + A)^-1 (unit lower triangular):  W = Ti diag(beta Gamma) K,  U = Ti diag(beta) V,  Delta = U - W S0,
    O    = diag(Gamma) Q S0 + (D o Q K^T) Delta,          D[t,s] = e^{gamma_t - gamma_s} for s <= t, else 0
    S_C  = Gamma_C S0 + (diag(e^{gamma_C - gamma}) K)^T Delta.
Two kernels: `_chunk_prepare_kernel` computes W, U for every (chunk, head) in parallel (nothing there depends on
the state); `_chunk_state_kernel` walks the chunks of one (sequence, head, V-tile) in order with S in registers.
Ti: diagonal 16x16 blocks by forward substitution, then block doubling X_2b = X_b - X_b (A o M_b) X_b (M_b: the
off-diagonal b-blocks inside each 2b-block), which is exact block substitution: no power series, no blow-up.
Precision: gating, l2norm, the diagonal blocks and the state stay fp32; the doubling dots run in tf32x3; the other
dot operands are fp16 (the same 10-bit mantissa as tf32, half its shared memory: the 99 KiB of an sm_86 block),
so W, U and |v| must stay below fp16's 65504 (true for post-conv activations).

Shapes (per layer): q, k [B, L, Hk, dk]; v [B, L, Hv, dv]; a, b [B, L, Hv]; A_log, dt_bias [Hv];
state [num_slots, Hv, dk, dv] fp16/fp32 (dv or dk fastest: kernels/gdn_common.state_pool); initial_slots,
final_slots [B] int32 (initial < 0: start from zeros, final < 0: no write; they may be equal; a slot >= num_slots
counts as < 0); o [B, L, Hv, dv] in v's dtype.
Workspace: W [B, Hv, Lp, dk], U [B, Hv, Lp, dv] fp16, scratch [B * Hv * n_chunks, C, C] fp32; Lp = n_chunks * C.
"""
import torch
import triton
import triton.language as tl

from kernels import device as gpu
from kernels.gdn_common import dk_fastest, gdn_gates, state_tile
from kernels.gdn_recurrent import l2norm


# --- plain-torch reference -------------------------------------------------------------------------------------

def chunked_reference(q, k, v, g, beta, state, chunk=64):
    """The derivation above in fp32 torch, chunk by chunk. q, k [B, L, Hv, dk] normalised and scaled (k-heads
    repeated), v [B, L, Hv, dv], g, beta [B, L, Hv], state [B, Hv, dk, dv]. Returns o [B, L, Hv, dv], final state."""
    S = state.float()
    outs = []
    for c0 in range(0, q.shape[1], chunk):
        Q, K, V = (x[:, c0:c0 + chunk].float().transpose(1, 2) for x in (q, k, v))     # [B, Hv, C, d]
        gam = g[:, c0:c0 + chunk].float().transpose(1, 2).cumsum(-1)                   # [B, Hv, C]
        be = beta[:, c0:c0 + chunk].float().transpose(1, 2)
        n = Q.shape[2]
        lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = torch.where(lower, gam[..., :, None] - gam[..., None, :], -torch.inf).exp()
        A = (be[..., None] * decay * (K @ K.mT)).tril(-1)
        eye = torch.eye(n, device=q.device).expand_as(A)
        rhs = torch.cat([(be * gam.exp())[..., None] * K, be[..., None] * V], -1)
        WU = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        W, U = WU.split([K.shape[-1], V.shape[-1]], -1)
        delta = U - W @ S
        outs.append(gam.exp()[..., None] * (Q @ S) + (decay * (Q @ K.mT)) @ delta)
        last = gam[..., -1:]
        S = last.exp()[..., None] * S + (K * (last - gam).exp()[..., None]).mT @ delta
    return torch.cat(outs, 2).transpose(1, 2), S


# --- kernels ----------------------------------------------------------------------------------------------------

@triton.jit
def _chunk_gates(a_ptrs, b_ptrs, A_log_ptr, dt_bias_ptr, tmask, h):
    """Log decay g and beta of the chunk rows (zero past the end: padded rows neither decay nor write) and the
    in-chunk cumulative log decay gamma."""
    g, beta = gdn_gates(tl.load(a_ptrs, mask=tmask, other=0.0), tl.load(b_ptrs, mask=tmask, other=0.0),
                        tl.load(A_log_ptr + h).to(tl.float32), tl.load(dt_bias_ptr + h).to(tl.float32))
    g = tl.where(tmask, g, 0.0)
    return g, tl.where(tmask, beta, 0.0), tl.cumsum(g, 0)


@triton.jit
def _chunk_prepare_kernel(k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, w_ptr, u_ptr, scr_ptr, L, LP,
                          sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sa_b, sa_t, sb_b, sb_t,
                          HV: tl.constexpr, KV_GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                          KP: tl.constexpr, VP: tl.constexpr, CH: tl.constexpr, LOG2_NB: tl.constexpr):
    # KP, VP: dk, dv padded to at least 64 (masked): with narrower operands Triton 3.6's sm_90 code for the dots
    # below came out wrong (H200, 64-token chunks, dk or dv of 16 / 32: W / U off by ~1 relative). The production
    # head dims (128) compile exactly as before.
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

    # Diagonal 16x16 blocks of Ti by forward substitution, all CH/16 blocks at once, reading A's rows back from
    # this program's scratch tile (a register tile cannot be indexed by row).
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
    """W, U (fp16) and scratch (fp32) for gdn_prefill; allocate once per bucket to keep the call allocation-free."""
    n = triton.cdiv(L, chunk)
    return (torch.empty(B, HV, n * chunk, DK, device=device, dtype=torch.float16),
            torch.empty(B, HV, n * chunk, DV, device=device, dtype=torch.float16),
            torch.empty(B * HV * n, chunk, chunk, device=device))


def default_launch(capability: tuple) -> tuple:
    """((prepare warps, state warps), state kernel's V tile) at dk = dv = 128. sm_90: the H200 sweep's best
    (kernels-gdn-sweep-h200.md). Below sm_90 (untimed: no such GPU here) the launch that spills least
    (tests/aot_compile.py, sm_86, bf16 inputs): the prepare kernel at 8 warps 648 bytes of stack against 1,360 at
    4, the state walk on 32-column tiles at 8 warps 8 bytes against 592 on 64 at 4 (90 KB of shared memory)."""
    return ((4, 4), 64) if capability >= (9, 0) else ((8, 8), 32)


def chunk_prepare(k, v, a, b, A_log, dt_bias, workspace, chunk=64, num_warps=None):
    """First pass of gdn_prefill: W and U of every (chunk, head) into the workspace."""
    B, L, HK, DK = k.shape
    HV, DV = v.shape[2], v.shape[3]
    n = triton.cdiv(L, chunk)
    w, u, scr = workspace
    assert w.shape[2] == n * chunk and scr.shape[0] >= B * HV * n
    _chunk_prepare_kernel[(n, B * HV)](
        k, v, a, b, A_log, dt_bias, w, u, scr, L, n * chunk,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        HV=HV, KV_GROUP=HV // HK, DK=DK, DV=DV, KP=max(DK, 64), VP=max(DV, 64), CH=chunk,
        LOG2_NB=(chunk // 16).bit_length() - 1,
        num_warps=num_warps or default_launch(gpu.capability(k.device))[0][0])


def chunk_states(q, k, a, b, A_log, dt_bias, state, initial_slots, final_slots, o, workspace, chunk=64,
                 block_v=None, num_warps=None):
    """Second pass of gdn_prefill: the state walk over the chunks, writing o and the final state."""
    B, L, HK, DK = q.shape
    HV, DV = o.shape[2], o.shape[3]
    w, u, _ = workspace
    (_, dflt_warps), dflt_bv = default_launch(gpu.capability(q.device))
    bv, num_warps = block_v or min(dflt_bv, DV), num_warps or dflt_warps
    # the pipelined chunk loop needs 188 KB of shared memory at 3 stages (sm_90: 227 KB); sm_8x has 99 KB, where
    # 2 stages take 90 KB on 32 columns, 98 on 64 (tests/aot_compile.py); fp32 inputs take a stage less (dk 128:
    # 164 / 131 KB at 2)
    stages = (3 if gpu.capability(q.device) >= (9, 0) else 2) - (q.element_size() > 2)
    assert DV % bv == 0
    _chunk_state_kernel[(B * HV, DV // bv)](
        q, k, a, b, A_log, dt_bias, w, u, state, initial_slots, final_slots, o, state.shape[0], L, w.shape[2],
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), o.stride(0), o.stride(1), o.stride(2), DK ** -0.5,
        HV=HV, KV_GROUP=HV // HK, DK=DK, DV=DV, BV=bv, CH=chunk, DK_FASTEST=dk_fastest(state, HV, DK, DV),
        num_warps=num_warps, num_stages=stages)


def gdn_prefill(q, k, v, a, b, A_log, dt_bias, state, initial_slots, final_slots, out=None, workspace=None,
                chunk=64, block_v=None, num_warps=(None, None)):
    """Gated DeltaNet over L prompt tokens per sequence from slot `initial_slots`, final state into
    `final_slots` (module docstring). Returns o [B, L, Hv, dv]. num_warps = (prepare kernel, state kernel);
    None: default_launch."""
    B, L, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    assert k.shape == q.shape and v.shape[:2] == (B, L) and a.shape == b.shape == (B, L, HV)
    assert HV % HK == 0
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and a.stride(-1) == b.stride(-1) == 1
    assert chunk in (16, 32, 64) and initial_slots.shape == final_slots.shape == (B,)
    gpu.check_dense("gdn_prefill", initial_slots=initial_slots, final_slots=final_slots, A_log=A_log,
                    dt_bias=dt_bias)
    ws = workspace or prefill_workspace(B, L, HV, DK, DV, q.device, chunk)
    o = torch.empty(B, L, HV, DV, dtype=v.dtype, device=v.device) if out is None else out
    assert o.shape == (B, L, HV, DV) and o.stride(-1) == 1, f"gdn_prefill: out {tuple(o.shape)}, unit last stride"
    chunk_prepare(k, v, a, b, A_log, dt_bias, ws, chunk, num_warps[0])
    chunk_states(q, k, a, b, A_log, dt_bias, state, initial_slots, final_slots, o, ws, chunk, block_v,
                 num_warps[1])
    return o
