"""Gated DeltaNet recurrent update for decode / speculative verify (MODEL.md §3.3, slot scheme ENGINE.md §1.1).

One program owns one (sequence, v-head, V-tile): it loads the state tile S[dk, BV] from the slot picked by
`num_accepted`, keeps it in fp32 registers for all T tokens and stores the state after token t into the slot of
column t. Gating (g, beta), the l2norm of q and k and the dk^-0.5 query scale are computed in the kernel.
Two schemes. By default the delta rule runs token by token (two reductions over dk per token), each token starting
from the state as stored: token t of a verify step is then bitwise token t decoded alone (T = 1), which greedy
output with drafting == greedy output without needs. Opt-in (proj_dot=True): the 2T projections k_t.S0, q_t.S0 are
one tensor-core product and the tokens one chunk of the chunked form (only [BV]-vector work chains the tokens),
6-19% faster at T = 5 (H200, B 1 / 8 / 64: 7.4 / 39.2 / 303 against 8.3 / 41.8 / 373 µs) but not width-invariant:
its fp32 chain never rounds the intermediate states.

Shapes (per layer):
    q, k          [B, T, Hk, dk]   post-conv activations, any float dtype, last dim contiguous
    v             [B, T, Hv, dv]
    a, b          [B, T, Hv]       raw projections (gating is applied here), or their int64 sums
                                   (kernels/fixed_sum.py: converted, not cleared — every program of a head reads
                                   them; gated_rmsnorm's `clear` zeroes them)
    A_log, dt_bias [Hv]
    state         [num_slots, Hv, dk, dv]  fp16 or fp32: dv fastest (transformers' layout) or dk fastest (the
                                   engine's: kernels/gdn_common.state_pool)
    state_slots   [B, T] int32     slot id per draft position; a negative id = padding (see below)
    num_accepted  [B] int32        accepted drafts + 1 from the previous round; initial state = slot column
                                   clamp(num_accepted - 1, 0, T - 1), so 0 or garbage never indexes out of bounds
    o             [B, T, Hv, dv]   dtype of v
Padding: a sequence whose initial slot id is negative starts from a zero state; any negative slot id is not
written; a slot id >= num_slots (the caller's error) counts as negative: nothing outside the pool is read or
written. T = 1 with one slot per sequence is the plain decode step (read and write the same slot).
"""
import torch
import triton
import triton.language as tl

from kernels import device as gpu, fixed_sum
from kernels import gdn_recurrent_gluon as gdn_gluon
from kernels.device import pdl_wait
from kernels.gdn_common import dk_fastest, gdn_gates, slot_row, state_tile

L2NORM_EPS = 1e-6


# --- plain-torch reference -------------------------------------------------------------------------------------

def gates_reference(a, b, A_log, dt_bias):
    """g = -exp(A_log) * softplus(a + dt_bias) (log decay, <= 0) and beta = sigmoid(b), both fp32."""
    g = -torch.exp(A_log.float()) * torch.nn.functional.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def l2norm_reference(x):
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def recurrent_reference(q, k, v, g, beta, state):
    """The gated delta rule token by token in fp32. q, k [B, T, Hv, dk] already normalised and scaled (k-heads
    repeated to v-heads), v [B, T, Hv, dv], g, beta [B, T, Hv], state [B, Hv, dk, dv].
    Returns o [B, T, Hv, dv] fp32 and the states after every token [B, T, Hv, dk, dv] fp32."""
    S = state.float()
    outs, states = [], []
    for t in range(q.shape[1]):
        S = S * g[:, t, :, None, None].exp()
        kt, qt = k[:, t].float(), q[:, t].float()
        delta = (v[:, t].float() - torch.einsum("bhk,bhkv->bhv", kt, S)) * beta[:, t, :, None]
        S = S + kt[..., None] * delta[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qt, S))
        states.append(S)
    return torch.stack(outs, 1), torch.stack(states, 1)


def prepare_qk_reference(q, k, hv):
    """l2norm + dk^-0.5 scale on q, l2norm on k, k-head j // (Hv/Hk) for v-head j: [B, T, Hv, dk] fp32."""
    r = hv // q.shape[2]
    q = l2norm_reference(q).repeat_interleave(r, dim=2) * q.shape[-1] ** -0.5
    return q, l2norm_reference(k).repeat_interleave(r, dim=2)


def gdn_verify_reference(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted):
    """Same contract as gdn_verify (updates `state` in place, returns o) in plain torch."""
    B, T = state_slots.shape
    hv = v.shape[2]
    col = (num_accepted.long() - 1).clamp(0, T - 1)
    first = state_slots.long().gather(1, col[:, None])[:, 0]
    init = torch.where((first >= 0)[:, None, None, None], state[first.clamp(min=0)].float(), 0.0)
    qn, kn = prepare_qk_reference(q, k, hv)
    g, beta = gates_reference(a, b, A_log, dt_bias)
    o, states = recurrent_reference(qn, kn, v, g, beta, init)
    for bi in range(B):
        for t in range(T):
            slot = int(state_slots[bi, t])
            if slot >= 0:
                state[slot] = states[bi, t].to(state.dtype)
    return o.to(v.dtype)


# --- Triton helpers shared with the chunked kernel ------------------------------------------------------------

@triton.jit
def l2norm(x, AXIS: tl.constexpr):
    x = x.to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, axis=AXIS, keep_dims=True) + 1e-6)


# --- verify / decode kernel -------------------------------------------------------------------------------------

@triton.jit
def _gdn_verify_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr,
                       num_acc_ptr, o_ptr,
                       sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sa_b, sa_t, sb_b, sb_t,
                       so_b, so_t, so_h, ss_b, num_slots,
                       scale, T: tl.constexpr, TP: tl.constexpr, HV: tl.constexpr, KV_GROUP: tl.constexpr,
                       DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, DK_FASTEST: tl.constexpr,
                       PROJ_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, RELOAD_K: tl.constexpr,
                       PDL: tl.constexpr):
    # q, k [B, T, Hk, DK]; v, o [B, T, Hv, DV]; a, b [B, T, Hv]; state [slots, Hv, DK, DV] (DK_FASTEST: stored
    # as [slots, Hv, DV, DK]); slots [B, T]. Grid (B, Hv, DV / BV); S [DK, BV] fp32 in registers; TP >= max(T, 8)
    # a power of 2. The token loops are unrolled and per-token values are tuples.
    bi = tl.program_id(0)
    h = tl.program_id(1)
    kh = h // KV_GROUP
    offs_k = tl.arange(0, DK)
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)
    tile = state_tile(h, offs_k, offs_v, DK, DV, DK_FASTEST)
    A_log = tl.load(A_log_ptr + h).to(tl.float32)      # weights: read while the previous kernel finishes
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    pdl_wait(PDL)

    # Every load is issued up front: a load placed after a state store (a pointer that may alias) or after a layout
    # change (a shared-memory barrier) cannot be hoisted, and would cost each token a memory round trip.
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
    if PROJ_DOT:
        # the A operand of the projections: raw k_t in rows t < T, raw q_t in rows TP + t
        offs_r = tl.arange(0, 2 * TP)
        tok = offs_r % TP
        A = tl.load(tl.where(offs_r[:, None] >= TP, q_ptr + bi * sq_b + kh * sq_h + tok[:, None] * sq_t,
                             k_ptr + bi * sk_b + kh * sk_h + tok[:, None] * sk_t) + offs_k[None, :],
                    mask=tok[:, None] < T, other=0.0).to(tl.float32)

    # While the state is in flight: 1/|k_t|, scale/|q_t| (l2norm's eps), normalised k_t, q_t, decays e^g_t,
    # cumulative log decays G_t, beta_t
    rks, rqs, ks, qs, es, Gs, betas = (), (), (), (), (), (), ()
    G = 0.0
    for t in tl.static_range(T):
        rk = tl.rsqrt(tl.sum(kr[t] * kr[t], axis=0) + 1e-6)
        rq = tl.rsqrt(tl.sum(qr[t] * qr[t], axis=0) + 1e-6) * scale
        rks, rqs = rks + (rk,), rqs + (rq,)
        ks, qs = ks + (kr[t] * rk,), qs + (qr[t] * rq,)
        g, beta = gdn_gates(a_s[t], b_s[t], A_log, dt_bias)
        G = G + g
        es, Gs, betas = es + (tl.exp(g),), Gs + (G,), betas + (beta,)

    S = S0.to(tl.float32)
    if PROJ_DOT:
        # One chunk of the chunked form. With P = [k; q] S0 (one tensor-core product, 2T projections at once)
        #   delta_t = beta_t (v_t - e^G_t k_t.S0 - sum_{i<t} e^(G_t-G_i) (k_t.k_i) delta_i)
        #   o_t     = e^G_t q_t.S0 + sum_{i<=t} e^(G_t-G_i) (q_t.k_i) delta_i
        # the chain over tokens is [BV]-vector work; no reduction over DK follows the product.
        # The scalars e^(G_t-G_i) k_t.k_i (i < t) and e^(G_t-G_i) q_t.k_i (i <= t), index t * T + i, come first.
        kk, qk = (), ()
        for t in tl.static_range(T):
            for i in tl.static_range(T):
                if i <= t:
                    c = tl.exp(Gs[t] - Gs[i])
                    kk, qk = kk + (c * tl.sum(ks[t] * ks[i], axis=0),), qk + (c * tl.sum(qs[t] * ks[i], axis=0),)
                else:
                    kk, qk = kk + (0.0,), qk + (0.0,)
        # The product reads the state again (an L1 hit by now): fed from the first load, the shared-memory copy it
        # needs would be placed at that load and stall all of the above behind the state's arrival.
        S0_mma = tl.load(S0_ptrs, mask=first >= 0, other=0.0, cache_modifier=".ca").to(tl.float32)
        P = tl.dot(A, S0_mma, input_precision=DOT_PRECISION)      # [2 TP, BV]: raw k_t.S0 rows, raw q_t.S0 rows
        offs_r = tl.arange(0, 2 * TP)
        ds = ()
        for t in tl.static_range(T):
            eG = tl.exp(Gs[t])
            d = vs[t] - (eG * rks[t]) * tl.sum(tl.where(offs_r[:, None] == t, P, -0.0), axis=0)
            o = (eG * rqs[t]) * tl.sum(tl.where(offs_r[:, None] == TP + t, P, -0.0), axis=0)
            for i in tl.static_range(t):
                d -= kk[t * T + i] * ds[i]
                o += qk[t * T + i] * ds[i]
            d = d * betas[t]
            o += qk[t * T + t] * d
            ds = ds + (d,)
            if RELOAD_K:    # k_t again (an L1 hit): five [DK] vectors live through the chain cost registers
                k_t = tl.load(k_ptr + bi * sk_b + t * sk_t + kh * sk_h + offs_k).to(tl.float32) * rks[t]
            else:
                k_t = ks[t]
            S = S * es[t] + k_t[:, None] * d[None, :]
            tl.store(state_ptr + slots[t].to(tl.int64) * (HV * DK * DV) + tile, S.to(state_ptr.dtype.element_ty),
                     mask=slots[t] >= 0)
            tl.store(o_ptr + bi * so_b + t * so_t + h * so_h + offs_v, o.to(o_ptr.dtype.element_ty))
    else:
        # Token by token; k_t.S and q_t.S both from S_{t-1} (o_t = e^g_t q_t.S_{t-1} + (q_t.k_t) delta_t), so the
        # two reductions over DK run side by side
        for t in tl.static_range(T):
            u = tl.sum(S * ks[t][:, None], axis=0)
            w = tl.sum(S * qs[t][:, None], axis=0)
            d = (vs[t] - es[t] * u) * betas[t]
            S = S * es[t] + ks[t][:, None] * d[None, :]
            tl.store(state_ptr + slots[t].to(tl.int64) * (HV * DK * DV) + tile, S.to(state_ptr.dtype.element_ty),
                     mask=slots[t] >= 0)
            # the next token starts from the state as stored, like a decode step that reloads it: token t of a
            # verify is then bitwise token t decoded alone (same launch configuration)
            S = S.to(state_ptr.dtype.element_ty).to(tl.float32)
            o = es[t] * w + tl.sum(qs[t] * ks[t], axis=0) * d
            tl.store(o_ptr + bi * so_b + t * so_t + h * so_h + offs_v, o.to(o_ptr.dtype.element_ty))


def gdn_verify(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, out=None, block_v=None,
               num_warps=None, proj_dot=False, gluon=None, gluon_launch=None):
    """Gated DeltaNet update over T = 1..8 tokens per sequence with per-position state slots (module docstring).
    Returns o [B, T, Hv, dv]; `out` may be passed (CUDA graphs). block_v / num_warps override the Triton kernel's
    defaults, gluon_launch (BV, warps, lanes_dk, along_v, qk_smem) the Gluon kernel's (gdn_recurrent_gluon.pick);
    proj_dot=True takes the chunk form (projections of the initial state on a tensor core: faster, not bitwise
    equal to decoding the tokens one by one). gluon: None = the launch table below, True / False = the Gluon
    kernel (kernels/gdn_recurrent_gluon.py) / the Triton kernel whatever the width."""
    B, T, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    assert k.shape == q.shape and v.shape[:2] == (B, T) and a.shape == b.shape == (B, T, HV)
    assert state_slots.shape == (B, T)
    dk_major = dk_fastest(state, HV, DK, DV)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and a.stride(-1) == b.stride(-1) == 1
    assert state_slots.stride(-1) == 1 and HV % HK == 0
    gpu.check_dense("gdn_verify", num_accepted=num_accepted, A_log=A_log, dt_bias=dt_bias)
    o = torch.empty(B, T, HV, DV, dtype=v.dtype, device=v.device) if out is None else out
    assert o.shape == (B, T, HV, DV) and o.stride(-1) == 1, f"gdn_verify: out {tuple(o.shape)}, unit last stride"
    proj_dot = bool(proj_dot)
    # Launch table (H200, T = 5, bench/kernels_gdn.py --sweep). The token-by-token scheme runs as the Gluon kernel
    # (kernels/gdn_recurrent_gluon.py, its own launch table) wherever a GPU runs it: with its first layout it was
    # already as fast or faster than the Triton kernel at every width (fp16, B = 1 / 2 / 8 / 16 / 64: 6.2 / 8.7 /
    # 34.2 / 87.1 / 369 against 8.2 / 11.3 / 43.5 / 98.2 / 376; fp32, B = 1 / 8 / 64: 6.8 / 50.1 / 408 against 8.4 /
    # 53.7 / 425). The Triton kernel (the interpreter, gluon=False, the chunk form): 16 columns on one warp while
    # that is at most one warp per scheduler, then on an fp16 state 32 / 2 up to ~16 CTAs per SM (B = 8: 42.6
    # against 47.9 on 64 / 4), else 64 / 4 (B = 64: 373 against 440); the chunk form 64 / 4 (B = 8: 39.1 against
    # 43.5 on 32 / 2), reloading k_t in the chain (226 -> 201 registers, 8-13% faster at B = 8 / 64). Decode (T = 1)
    # and verify at one width take the same kernel and launch, so the bitwise width invariance holds.
    sms = gpu.num_sms(v.device)
    fp16 = state.element_size() == 2
    narrow = B * HV * triton.cdiv(DV, 16) <= 4 * sms
    launch = gluon_launch or gdn_gluon.pick(B, HV, DV, fp16, sms, dk_major)
    if gluon is None:
        gluon = (not proj_dot and block_v is None and num_warps is None and not gpu.INTERPRET and v.is_cuda
                 and gpu.capability(v.device) >= (8, 0) and gdn_gluon.fits(DK, DV, launch))
    if gluon:
        assert not proj_dot and gdn_gluon.fits(DK, DV, launch), (DK, DV, launch)
        gdn_gluon.launch(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o, launch, dk_major)
        return o
    mid = not narrow and not proj_dot and fp16 and B * HV * triton.cdiv(DV, 32) <= 16 * sms
    bv = block_v or min(16 if narrow else 32 if mid else 64, DV)
    num_warps = num_warps or (1 if narrow else 2 if mid else 4)
    assert DV % bv == 0
    # chunk form: 16-bit q, k and an fp16 state are exact in tf32: one tensor-core pass; otherwise three
    exact = q.dtype != torch.float32 and state.dtype == torch.float16
    assert not proj_dot or (bv >= 16 and DK >= 16)                    # tl.dot's smallest tile
    _gdn_verify_kernel[(B, HV, triton.cdiv(DV, bv))](
        q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        o.stride(0), o.stride(1), o.stride(2), state_slots.stride(0), state.shape[0],
        DK ** -0.5, T=T, TP=max(8, triton.next_power_of_2(T)), HV=HV, KV_GROUP=HV // HK, DK=DK, DV=DV, BV=bv,
        DK_FASTEST=dk_major, PROJ_DOT=proj_dot, DOT_PRECISION="tf32" if exact else "tf32x3", RELOAD_K=not narrow,
        num_warps=num_warps, **gpu.pdl_args(v.device))
    return o
