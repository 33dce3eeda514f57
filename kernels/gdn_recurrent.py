"""Gated DeltaNet recurrent update for decode / speculative verify (MODEL.md §3.3, slot scheme ENGINE.md §1.1).

One program owns one (sequence, v-head, V-tile): it loads the state tile S[dk, BV] from the slot picked by
`num_accepted`, keeps it in fp32 registers for all T tokens and stores the state after token t into the slot of
column t. Gating (g, beta), the l2norm of q and k and the dk^-0.5 query scale are computed in the kernel.

Shapes (per layer):
    q, k          [B, T, Hk, dk]   post-conv activations, any float dtype, last dim contiguous
    v             [B, T, Hv, dv]
    a, b          [B, T, Hv]       raw projections (gating is applied here)
    A_log, dt_bias [Hv]
    state         [num_slots, Hv, dk, dv]  fp16 or fp32, HF layout (dk rows, dv contiguous)
    state_slots   [B, T] int32     slot id per draft position; a negative id = padding (see below)
    num_accepted  [B] int32        accepted drafts + 1 from the previous round; initial state = slot column
                                   clamp(num_accepted - 1, 0, T - 1), so 0 or garbage never indexes out of bounds
    o             [B, T, Hv, dv]   dtype of v
Padding: a sequence whose initial slot id is negative starts from a zero state; any negative slot id is not
written. T = 1 with one slot per sequence is the plain decode step (read and write the same slot).
"""
import torch
import triton
import triton.language as tl

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
def l2norm(x, AXIS: tl.constexpr):
    x = x.to(tl.float32)
    return x * tl.rsqrt(tl.sum(x * x, axis=AXIS, keep_dims=True) + 1e-6)


# --- verify / decode kernel -------------------------------------------------------------------------------------

@triton.jit
def _gdn_verify_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr,
                       num_acc_ptr, o_ptr,
                       sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sa_b, sa_t, sb_b, sb_t,
                       so_b, so_t, so_h, ss_b,
                       scale, T: tl.constexpr, HV: tl.constexpr, KV_GROUP: tl.constexpr,
                       DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    bi = tl.program_id(0)
    h = tl.program_id(1)
    kh = h // KV_GROUP
    offs_k = tl.arange(0, DK)
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)

    col = tl.minimum(tl.maximum(tl.load(num_acc_ptr + bi) - 1, 0), T - 1)
    first = tl.load(slots_ptr + bi * ss_b + col)
    tile = h * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    S = tl.load(state_ptr + first.to(tl.int64) * (HV * DK * DV) + tile, mask=first >= 0, other=0.0)
    S = S.to(tl.float32)

    A_log = tl.load(A_log_ptr + h).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    for t in tl.static_range(T):
        qt = l2norm(tl.load(q_ptr + bi * sq_b + t * sq_t + kh * sq_h + offs_k), 0) * scale
        kt = l2norm(tl.load(k_ptr + bi * sk_b + t * sk_t + kh * sk_h + offs_k), 0)
        vt = tl.load(v_ptr + bi * sv_b + t * sv_t + h * sv_h + offs_v).to(tl.float32)
        g, beta = gdn_gates(tl.load(a_ptr + bi * sa_b + t * sa_t + h), tl.load(b_ptr + bi * sb_b + t * sb_t + h),
                            A_log, dt_bias)
        S = S * tl.exp(g)
        delta = (vt - tl.sum(S * kt[:, None], axis=0)) * beta
        S = S + kt[:, None] * delta[None, :]
        ot = tl.sum(S * qt[:, None], axis=0)
        tl.store(o_ptr + bi * so_b + t * so_t + h * so_h + offs_v, ot.to(o_ptr.dtype.element_ty))
        slot = tl.load(slots_ptr + bi * ss_b + t)
        tl.store(state_ptr + slot.to(tl.int64) * (HV * DK * DV) + tile, S.to(state_ptr.dtype.element_ty),
                 mask=slot >= 0)


def gdn_verify(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, out=None, block_v=None,
               num_warps=None):
    """Gated DeltaNet update over T = 1..8 tokens per sequence with per-position state slots (module docstring).
    Returns o [B, T, Hv, dv]; `out` may be passed (CUDA graphs). block_v / num_warps override the tiling."""
    B, T, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    assert k.shape == q.shape and v.shape[:2] == (B, T) and a.shape == b.shape == (B, T, HV)
    assert state.shape[1:] == (HV, DK, DV) and state.is_contiguous() and state_slots.shape == (B, T)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and a.stride(-1) == b.stride(-1) == 1
    assert state_slots.stride(-1) == 1 and HV % HK == 0
    o = torch.empty(B, T, HV, DV, dtype=v.dtype, device=v.device) if out is None else out
    # V-tiles of 16 columns with one warp: 8 programs per head (dv = 128) for parallelism at B = 1; fastest on the
    # H200 sweep at B = 1 and 8 (bench/results/kernels-gdn-sweep-h200.md: 10.0 µs vs 13.1 for 32 columns, 4 warps)
    bv = block_v or min(16, DV)
    assert DV % bv == 0
    _gdn_verify_kernel[(B, HV, triton.cdiv(DV, bv))](
        q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        o.stride(0), o.stride(1), o.stride(2), state_slots.stride(0),
        DK ** -0.5, T=T, HV=HV, KV_GROUP=HV // HK, DK=DK, DV=DV, BV=bv, num_warps=num_warps or 1)
    return o
