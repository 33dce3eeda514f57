"""Gated DeltaNet in plain torch: the model's maths (layers/model.py) and the kernels' references. q, k [B, T, Hv,
dk] (prepare_qk_ref), v [B, T, Hv, dv], g, beta [B, T, Hv] (gates_ref), states [B, Hv, dk, dv]."""
import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6


def l2norm_ref(x, eps=L2NORM_EPS):
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gates_ref(a, b, A_log, dt_bias):
    """g = -exp(A_log) * softplus(a + dt_bias) (log decay, <= 0) and beta = sigmoid(b), both fp32."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def prepare_qk_ref(q, k, hv):
    """l2norm + dk^-0.5 scale on q, l2norm on k, k-head j // (Hv/Hk) for v-head j: [B, T, Hv, dk] fp32."""
    r = hv // q.shape[2]
    q = l2norm_ref(q).repeat_interleave(r, 2) * q.shape[-1] ** -0.5
    return q, l2norm_ref(k).repeat_interleave(r, 2)


def delta_rule_recurrent_ref(q, k, v, g, beta, state):
    """Token by token -> o [B, T, Hv, dv], states after each token [T, B, Hv, dk, dv]."""
    outs, states = [], []
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], state)) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
        states.append(state)
    return torch.stack(outs, 1), torch.stack(states)


def delta_rule_chunked_ref(q, k, v, g, beta, state, chunk=64):
    """The same recurrence chunk by chunk -> o, final state. With G_t = Σ_{s<=t} g_s and S0 at a chunk's start,
    (I + A) U = β·V − β·e^G·K·S0, A_ts = β_t e^{G_t−G_s} k_t·k_s (s < t); o_t = e^{G_t} q_t·S0 + Σ_{s<=t}
    e^{G_t−G_s} (q_t·k_s) u_s; S_end = e^{G_C} S0 + Σ_s e^{G_C−G_s} k_s u_sᵀ."""
    B, T, Hv, dk = k.shape
    pad = (-T) % chunk                   # padded tokens have k = 0, β = 0, g = 0: they leave the state alone
    q, k, v = (F.pad(t.transpose(1, 2), (0, 0, 0, pad)) for t in (q, k, v))        # [B, Hv, T+pad, d]
    g, beta = (F.pad(t.transpose(1, 2), (0, pad)) for t in (g, beta))                # [B, Hv, T+pad]
    n = (T + pad) // chunk
    q, k, v = (t.reshape(B, Hv, n, chunk, t.shape[-1]) for t in (q, k, v))
    g, beta = g.reshape(B, Hv, n, chunk), beta.reshape(B, Hv, n, chunk)
    G = g.cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()      # e^{G_t − G_s}, s <= t
    A = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    M = A + torch.eye(chunk, device=q.device)
    Wv = torch.linalg.solve_triangular(M, beta[..., None] * v, upper=False, unitriangular=True)
    Wk = torch.linalg.solve_triangular(M, (beta * G.exp())[..., None] * k, upper=False, unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * decay
    outs = []
    for i in range(n):
        u = Wv[:, :, i] - Wk[:, :, i] @ state                             # [B, Hv, C, dv]
        outs.append((q[:, :, i] * G[:, :, i, :, None].exp()) @ state + qk[:, :, i] @ u)
        tail = (G[:, :, i, -1:] - G[:, :, i]).exp()[..., None]              # e^{G_C − G_s}
        state = G[:, :, i, -1, None, None].exp() * state + (k[:, :, i] * tail).transpose(-1, -2) @ u
    o = torch.stack(outs, 2).reshape(B, Hv, n * chunk, -1)[:, :, :T]
    return o.transpose(1, 2), state


def gdn_verify_ref(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted):
    """gdn_verify's contract (updates `state` in place, returns o) on the raw layer inputs."""
    B, T = state_slots.shape
    hv = v.shape[2]
    col = (num_accepted.long() - 1).clamp(0, T - 1)
    first = state_slots.long().gather(1, col[:, None])[:, 0]
    init = torch.where((first >= 0)[:, None, None, None], state[first.clamp(min=0)].float(), 0.0)
    qn, kn = prepare_qk_ref(q, k, hv)
    g, beta = gates_ref(a, b, A_log, dt_bias)
    o, states = delta_rule_recurrent_ref(qn, kn, v.float(), g, beta, init)
    for bi in range(B):
        for t in range(T):
            slot = int(state_slots[bi, t])
            if slot >= 0:
                state[slot] = states[t, bi].to(state.dtype)
    return o.to(v.dtype)


def causal_conv1d_ref(x, weight, conv_state, conv_slots, num_accepted=None):
    """causal_conv1d's contract (updates conv_state in place, returns y)."""
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
