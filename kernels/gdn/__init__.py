"""Gated DeltaNet ops (MODEL.md §3.3, slots ENGINE.md §1.1): verify update (recurrent.py, recurrent_gluon.py),
chunked prefill (chunked.py), causal conv1d (conv1d.py); references in ref.py. cfg=None: the dispatch here picks
variant and launch; a variant's Config forces both.

Shapes: q, k [B, T, Hk, dk] and v [B, T, Hv, dv] (post-conv, last dim contiguous); a, b [B, T, Hv] (raw, or for
gdn_verify their int64 sums: kernels/fixed_sum.py, read, not cleared); A_log, dt_bias [Hv]; state [num_slots, Hv,
dk, dv] fp16 / fp32, dv or dk fastest (state_pool); o [B, T, Hv, dv] in v's dtype. A slot id < 0 or >= num_slots
is padding: nothing outside a pool is read or written."""
import torch

from kernels import device as gpu, fixed_sum
from kernels.gdn import chunked, conv1d, recurrent, recurrent_gluon
from kernels.gdn.common import dk_fastest, state_pool
from kernels.gdn.chunked import prefill_workspace

__all__ = ["gdn_verify", "gdn_prefill", "causal_conv1d", "state_pool", "prefill_workspace", "verify_config"]


def verify_config(q, v, state):
    """The Gluon kernel's launch on sm_80+, else the Triton kernel's; never by T (width invariance)."""
    cfg = recurrent_gluon.config(v, state)
    return cfg if recurrent_gluon.supports(q, v, cfg) else recurrent.config(v, state)


def gdn_verify(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, out=None, cfg=None):
    """The delta rule over T = 1..8 tokens, token by token (bitwise the same as T decode steps): the state starts
    at slot state_slots[:, clamp(num_accepted - 1, 0, T - 1)] (zeros if padding) and after token t goes to
    state_slots[:, t]; gates, l2norm and the q scale are applied here. Returns o (or fills `out`)."""
    B, T, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    assert k.shape == q.shape and v.shape[:2] == (B, T) and a.shape == b.shape == (B, T, HV)
    assert state_slots.shape == (B, T)
    dk_fastest(state, HV, DK, DV)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and a.stride(-1) == b.stride(-1) == 1
    assert state_slots.stride(-1) == 1 and HV % HK == 0
    gpu.check_dense("gdn_verify", num_accepted=num_accepted, A_log=A_log, dt_bias=dt_bias)
    o = torch.empty(B, T, HV, DV, dtype=v.dtype, device=v.device) if out is None else out
    assert o.shape == (B, T, HV, DV) and o.stride(-1) == 1, f"gdn_verify: out {tuple(o.shape)}, unit last stride"
    cfg = verify_config(q, v, state) if cfg is None else cfg
    variant = recurrent_gluon if isinstance(cfg, recurrent_gluon.Config) else recurrent
    assert variant.supports(q, v, cfg), (q.shape, v.shape, cfg)
    variant.launch(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o, cfg)
    return o


def gdn_prefill(q, k, v, a, b, A_log, dt_bias, state, initial_slots, final_slots, out=None, workspace=None,
                cfg=None):
    """The delta rule over L prompt tokens from slot initial_slots (padding: zeros) into final_slots (padding: no
    write; may be equal). Returns o (or fills `out`); `workspace`: prefill_workspace at cfg.chunk."""
    B, L, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    assert k.shape == q.shape and v.shape[:2] == (B, L) and a.shape == b.shape == (B, L, HV)
    assert HV % HK == 0
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1 and a.stride(-1) == b.stride(-1) == 1
    cfg = chunked.config(q, v) if cfg is None else cfg
    assert chunked.supports(q, v, cfg) and initial_slots.shape == final_slots.shape == (B,), cfg
    gpu.check_dense("gdn_prefill", initial_slots=initial_slots, final_slots=final_slots, A_log=A_log,
                    dt_bias=dt_bias)
    ws = workspace or prefill_workspace(B, L, HV, DK, DV, q.device, cfg.chunk)
    o = torch.empty(B, L, HV, DV, dtype=v.dtype, device=v.device) if out is None else out
    assert o.shape == (B, L, HV, DV) and o.stride(-1) == 1, f"gdn_prefill: out {tuple(o.shape)}, unit last stride"
    chunked.launch(q, k, v, a, b, A_log, dt_bias, state, initial_slots, final_slots, o, ws, cfg)
    return o


def causal_conv1d(x, weight, conv_state, conv_slots, num_accepted=None, out=None, cfg=None):
    """y = silu(causal depthwise conv1d) of L new columns, conv state updated in place. x [B, L, C] (or int64
    sums in one token tile: converted and cleared), weight [C, K], conv_state [num_slots, C, M = K - 1 + k drafts],
    conv_slots [B] (padding: zero history, no write). The history window starts at column off = clamp(
    num_accepted - 1, 0, M - K + 1), or M - K + 1 without num_accepted; the state becomes the last M columns of
    [state[:, :off + K - 1], x^T]. Returns y (or fills `out`)."""
    B, L, C = x.shape
    K, M = weight.shape[1], conv_state.shape[2]
    assert weight.shape[0] == C and conv_state.shape[1] == C and M >= K - 1 and conv_slots.shape == (B,)
    assert x.stride(-1) == 1 and conv_state.stride(2) == 1 and conv_state.stride(1) == M
    gpu.check_dense("causal_conv1d", conv_slots=conv_slots, num_accepted=num_accepted)
    y = torch.empty(x.shape, dtype=fixed_sum.activation_dtype(x), device=x.device) if out is None else out
    assert y.shape == x.shape and y.stride(-1) == 1, f"causal_conv1d: out {tuple(y.shape)} with unit channel stride"
    cfg = conv1d.config(x) if cfg is None else cfg
    assert conv1d.supports(x, cfg), "int64 sums: one token tile reads (and clears) them"
    conv1d.launch(x, weight, conv_state, conv_slots, num_accepted, y, cfg)
    return y
