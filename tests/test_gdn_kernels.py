"""Gated DeltaNet kernels (kernels/gdn/) against their plain-torch references (kernels/gdn/ref.py), the references
against transformers, and the slot scheme over whole speculative rounds."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule

from kernels.gdn import causal_conv1d, chunked, gdn_prefill, gdn_verify, recurrent, recurrent_gluon, state_pool
from kernels.gdn.ref import (causal_conv1d_ref, delta_rule_chunked_ref, delta_rule_recurrent_ref, gates_ref,
                             gdn_verify_ref, prepare_qk_ref)
from layers.config import qwen38_27b
from tests.fixtures import rel_err

DEV = "cuda" if torch.cuda.is_available() else "cpu"
M27 = qwen38_27b()
HV27, HK27, D27 = M27.linear_num_value_heads, M27.linear_num_key_heads, M27.linear_key_head_dim


def gdn_inputs(B, T, HV, HK, DK, DV, dtype=torch.float32, seed=0):
    """Random layer inputs as the conv would hand them over, plus A_log / dt_bias in their real ranges."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    q, k, v, a, b = r(B, T, HK, DK), r(B, T, HK, DK), r(B, T, HV, DV), r(B, T, HV), r(B, T, HV)
    A_log = torch.empty(HV).uniform_(0.0, 2.5, generator=gen)
    dt_bias = r(HV)
    return [x.to(DEV, dtype) for x in (q, k, v, a, b)] + [A_log.to(DEV), dt_bias.to(DEV)]


def in_layout(pool, dk_fastest):
    """A state pool [slots, Hv, dk, dv] as given (dv fastest) or with the same values in state_pool's layout."""
    if not dk_fastest:
        return pool
    return state_pool(*pool.shape, pool.dtype, pool.device).copy_(pool)


def seq_ref(q, k, v, a, b, A_log, dt_bias, state=None):
    """Recurrent reference over whole sequences in fp32: o [B, L, Hv, dv] and the state after the last token."""
    qn, kn = prepare_qk_ref(q, k, v.shape[2])
    g, beta = gates_ref(a, b, A_log, dt_bias)
    if state is None:
        state = torch.zeros(q.shape[0], v.shape[2], q.shape[3], v.shape[3], device=q.device)
    o, states = delta_rule_recurrent_ref(qn, kn, v.float(), g, beta, state.float())
    return o, states[-1]


def chunks(q, v, n):
    """gdn_prefill's default launch at n tokens a chunk."""
    return replace(chunked.config(q, v), chunk=n)


# --- references against transformers ---------------------------------------------------------------------------

def test_references_match_transformers():
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(2, 77, 4, 2, 16, 32, torch.float64, seed=1)
    g, beta = gates_ref(a, b, A_log, dt_bias)
    init = torch.randn(2, 4, 16, 32, dtype=torch.float64, device=DEV)
    rep = lambda x: x.repeat_interleave(2, dim=2)
    hf_o, hf_s = torch_recurrent_gated_delta_rule(rep(q), rep(k), v, g, beta, initial_state=init,
                                                  output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, s = seq_ref(q, k, v, a, b, A_log, dt_bias, init)
    assert rel_err(o, hf_o) < 1e-6 and rel_err(s, hf_s) < 1e-6
    qn, kn = prepare_qk_ref(q, k, 4)
    co, cs = delta_rule_chunked_ref(qn, kn, v.float(), g, beta, init.float(), chunk=16)
    hc_o, hc_s = torch_chunk_gated_delta_rule(rep(q), rep(k), v, g, beta, chunk_size=16, initial_state=init,
                                              output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert rel_err(co, hf_o) < 1e-5 and rel_err(cs, hf_s) < 1e-5
    assert rel_err(hc_o, co) < 1e-5


def test_conv_reference_matches_full_conv():
    x = torch.randn(2, 9, 24, device=DEV)
    w = torch.randn(24, 4, device=DEV)
    state = torch.zeros(2, 24, 3 + 2, device=DEV)
    y = causal_conv1d_ref(x, w, state, torch.tensor([1, 0]))
    full = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), w[:, None, :], groups=24)).transpose(1, 2)
    assert rel_err(y, full) < 1e-6
    assert torch.equal(state[1], x[0, -5:].T) and torch.equal(state[0], x[1, -5:].T)


# --- verify kernel ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dk_fastest", [False, True])
@pytest.mark.parametrize("cfg", [None, recurrent.Config(32, 2)], ids=["default", "forced"])
@pytest.mark.parametrize("B,T,dk,state_dtype,in_dtype", [
    (1, 1, 16, torch.float32, torch.float32),
    (3, 5, 32, torch.float16, torch.bfloat16),
    (2, 4, 16, torch.float32, torch.float16),
    (3, 2, 32, torch.float32, torch.float32),
])
def test_verify_matches_reference(B, T, dk, state_dtype, in_dtype, cfg, dk_fastest):
    HV, HK, DV = 4, 2, 32
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(B, T, HV, HK, dk, DV, in_dtype, seed=B * 10 + T)
    n_slots = B * T + 3
    pool = in_layout(torch.randn(n_slots, HV, dk, DV, device=DEV).to(state_dtype), dk_fastest)
    slots = torch.randperm(n_slots)[:B * T].view(B, T).to(DEV, torch.int32)
    # num_accepted 0, > T and in range; in-range garbage must never index outside the T slot columns
    num_acc = torch.tensor([0, T + 3, max(T - 1, 1)][:B], dtype=torch.int32, device=DEV)
    if B == 3:
        slots[1, :] = -1                                   # a padding sequence: zero state, nothing written
        slots[2, -1] = -1                                  # a padded draft position: state not written
    ref_pool = pool.clone()
    ref = gdn_verify_ref(q, k, v, a, b, A_log, dt_bias, ref_pool, slots, num_acc)
    out = torch.full((B, T, HV, DV), float("nan"), dtype=in_dtype, device=DEV)
    o = gdn_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, num_acc, out=out, cfg=cfg)
    tol = 1e-5 if in_dtype == torch.float32 else 1e-2
    assert rel_err(o, ref) < tol
    written = slots[slots >= 0].long()
    assert rel_err(pool[written], ref_pool[written]) < (1e-5 if state_dtype == torch.float32 else 1e-3)
    untouched = torch.ones(n_slots, dtype=torch.bool)
    untouched[written.cpu()] = False
    assert torch.equal(pool[untouched.to(DEV)], ref_pool[untouched.to(DEV)])


def assert_width_invariant(HV, HK, D, state_dtype, seed, B=1, dk_fastest=False):
    """T = 5 in one gdn_verify launch gives bitwise the outputs and states of five T = 1 steps (each step reloads
    the state it stored), for each of B sequences."""
    T = 5
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(B, T, HV, HK, D, D, torch.bfloat16, seed=seed)
    init = in_layout(torch.randn(B, HV, D, D, device=DEV).to(state_dtype), dk_fastest)
    pool = in_layout(torch.zeros(B * T, HV, D, D, device=DEV, dtype=state_dtype), dk_fastest)
    slots = torch.arange(B * T, dtype=torch.int32, device=DEV).view(B, T)
    pool[slots[:, 0].long()] = init                     # first slot: the initial state, then the state after token 0
    one = torch.ones(B, dtype=torch.int32, device=DEV)
    o5 = gdn_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, one)
    step_pool = init.clone()
    own_slot = torch.arange(B, dtype=torch.int32, device=DEV)[:, None]
    for t in range(T):
        o1 = gdn_verify(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], a[:, t:t + 1], b[:, t:t + 1], A_log, dt_bias,
                        step_pool, own_slot, one)
        assert torch.equal(o1[:, 0], o5[:, t]) and torch.equal(step_pool, pool[slots[:, t].long()])


@pytest.mark.parametrize("dk_fastest", [False, True])
@pytest.mark.parametrize("state_dtype", [torch.float16, torch.float32])
def test_verify_token_by_token_is_width_invariant(state_dtype, dk_fastest):
    """The update is width-invariant (assert_width_invariant), so greedy decoding with drafting can equal decoding
    without."""
    assert_width_invariant(4, 2, 16, state_dtype, seed=5, dk_fastest=dk_fastest)


def test_verify_strided_inputs_and_decode_steps():
    """q, k, v as views into one conv output row (the layer's layout); T = 1 decode steps in one slot == the
    whole-sequence recurrence."""
    HV, HK, D, L = 4, 2, 16, 6
    B = 2
    qkv = torch.randn(B, L, 2 * HK * D + HV * D, device=DEV)
    q, k, v = (t.unflatten(-1, (-1, D)) for t in qkv.split([HK * D, HK * D, HV * D], -1))
    _, _, _, a, b, A_log, dt_bias = gdn_inputs(B, L, HV, HK, D, D, seed=3)
    init = torch.randn(B, HV, D, D, device=DEV)
    ref_o, ref_s = seq_ref(q, k, v, a, b, A_log, dt_bias, init)
    pool = init.clone()
    slots = torch.arange(B, dtype=torch.int32, device=DEV)[:, None]
    ones = torch.ones(B, dtype=torch.int32, device=DEV)
    o = torch.cat([gdn_verify(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], a[:, t:t + 1], b[:, t:t + 1], A_log,
                              dt_bias, pool, slots, ones) for t in range(L)], 1)
    assert rel_err(o, ref_o) < 1e-5 and rel_err(pool, ref_s) < 1e-5


# --- chunked prefill kernel ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("L,chunk,dk,state_dtype,dk_fastest", [
    (37, 64, 16, torch.float32, False),
    (50, 16, 32, torch.float32, True),
    (70, 32, 16, torch.float16, False),
    (70, 32, 16, torch.float16, True),
])
@pytest.mark.slow
def test_prefill_matches_recurrence(L, chunk, dk, state_dtype, dk_fastest):
    B, HV, HK, DV = 2, 4, 2, 32
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(B, L, HV, HK, dk, DV, seed=L)
    pool = in_layout(torch.randn(4, HV, dk, DV, device=DEV).to(state_dtype), dk_fastest)
    init_slots = torch.tensor([2, -1], dtype=torch.int32, device=DEV)     # sequence 1 starts from zeros
    final_slots = torch.tensor([2, 0], dtype=torch.int32, device=DEV)     # sequence 0 in place
    init = torch.stack([pool[2].float(), torch.zeros_like(pool[2], dtype=torch.float32)])
    ref_o, ref_s = seq_ref(q, k, v, a, b, A_log, dt_bias, init)
    before = pool.clone()
    out = torch.full((B, L, HV, DV), float("nan"), device=DEV)
    o = gdn_prefill(q, k, v, a, b, A_log, dt_bias, pool, init_slots, final_slots, out=out, cfg=chunks(q, v, chunk))
    tol = 2e-3                                                      # fp16 dot operands (10-bit mantissa)
    assert rel_err(o, ref_o) < tol
    assert rel_err(pool[2], ref_s[0]) < tol and rel_err(pool[0], ref_s[1]) < tol
    assert torch.equal(pool[1], before[1]) and torch.equal(pool[3], before[3])


# --- conv kernel --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("L,k_drafts,use_na,x_dtype,state_dtype", [
    (1, 4, True, torch.float32, torch.float32),       # one token through a widened state
    (5, 4, True, torch.bfloat16, torch.bfloat16),     # the verify shape at k = 4
    (2, 1, True, torch.float32, torch.float32),
    (70, 4, True, torch.float32, torch.float32),      # prefill after a verify round: two token tiles
    (130, 0, False, torch.bfloat16, torch.float32),   # plain prefill, three token tiles
    (3, 4, False, torch.float32, torch.float32),      # short chunk: part of the old state stays
])
def test_conv_matches_reference(L, k_drafts, use_na, x_dtype, state_dtype):
    B, C, K = 4, 200, 4
    M = K - 1 + k_drafts
    x = torch.randn(B, L, C, device=DEV).to(x_dtype)
    w = torch.randn(C, K, device=DEV)
    state = torch.randn(5, C, M, device=DEV).to(state_dtype)
    slots = torch.tensor([3, -1, 0, 4], dtype=torch.int32, device=DEV)
    na = torch.tensor([0, 1, k_drafts + 7, 2], dtype=torch.int32, device=DEV) if use_na else None
    ref_state = state.clone()
    ref = causal_conv1d_ref(x, w, ref_state, slots, na)
    out = torch.full_like(x, float("nan"))
    y = causal_conv1d(x, w, state, slots, na, out=out)
    assert rel_err(y, ref) < (1e-5 if x_dtype == torch.float32 else 1e-2)
    assert torch.equal(state, ref_state)


# --- whole speculative rounds: prefill, then verify rounds with random acceptance ---------------------------------

@pytest.mark.slow
def test_spec_rounds_match_full_sequence():
    """Conv + GDN of the committed stream over prefill + verify rounds (rejected drafts are garbage) equal the
    conv + recurrence over the committed stream in one go: slot columns, conv window offsets and the
    prefill -> verify hand-off (final state into slot column k, num_accepted = k + 1) fit together."""
    HV, HK, D, K, kd = 4, 2, 16, 4, 3
    T, C, P, rounds = kd + 1, 2 * HK * D + HV * D, 9, 4
    gen = torch.Generator().manual_seed(7)
    N = P + rounds * T
    x_true = torch.randn(1, N, C, generator=gen).to(DEV)
    ab_true = torch.randn(1, N, 2, HV, generator=gen).to(DEV)
    w = torch.randn(C, K, generator=gen).to(DEV)
    A_log, dt_bias = torch.rand(HV, generator=gen).to(DEV), torch.randn(HV, generator=gen).to(DEV)

    def mixer_inputs(y, ab):
        q, k, v = (t.unflatten(-1, (-1, D)) for t in y.split([HK * D, HK * D, HV * D], -1))
        return q, k, v, ab[:, :, 0], ab[:, :, 1]

    conv_state = torch.zeros(1, C, K - 1 + kd, device=DEV)
    pool = torch.zeros(T, HV, D, D, device=DEV)
    slots = torch.arange(T, dtype=torch.int32, device=DEV)[None]
    y = causal_conv1d(x_true[:, :P], w, conv_state, slots[:, 0])
    q, k, v, a, b = mixer_inputs(y, ab_true[:, :P])
    outs = [gdn_prefill(q, k, v, a, b, A_log, dt_bias, pool, slots[:, 0], slots[:, kd], cfg=chunks(q, v, 16))]
    num_acc = torch.tensor([T], dtype=torch.int32, device=DEV)
    pos = P
    while pos + T <= N:
        acc = int(torch.randint(0, T, (1,), generator=gen))       # accepted drafts
        x, ab = x_true[:, pos:pos + T].clone(), ab_true[:, pos:pos + T].clone()
        x[:, acc + 1:] = torch.randn_like(x[:, acc + 1:])          # rejected drafts differ from the stream
        ab[:, acc + 1:] = torch.randn_like(ab[:, acc + 1:])
        y = causal_conv1d(x, w, conv_state, slots[:, 0], num_acc)
        o = gdn_verify(*mixer_inputs(y, ab), A_log, dt_bias, pool, slots, num_acc)
        outs.append(o[:, :acc + 1])
        num_acc.fill_(acc + 1)
        pos += acc + 1
    full_y = causal_conv1d_ref(x_true[:, :pos], w, torch.zeros(1, C, K - 1, device=DEV),
                                     torch.zeros(1, dtype=torch.int32))
    ref_o, _ = seq_ref(*mixer_inputs(full_y, ab_true[:, :pos]), A_log, dt_bias)
    assert rel_err(torch.cat(outs, 1), ref_o) < 2e-3                 # the prefill's fp16 dot operands


# --- GPU, 27B shapes ----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dk_fastest", [False, True])
@pytest.mark.parametrize("state_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("B,tile",                                      # the defaults at B 1, 3, 12 and 42 (each
                         [(B, None) for B in (1, 3, 12, 42)]              # its own Gluon launch), and the sweeps
                         + [(3, c) for c in recurrent.SWEEP + recurrent_gluon.SWEEP])
def test_gpu_verify_27b(B, tile, state_dtype, dk_fastest):
    """Against the reference, with the slot scheme's edge cases: slots in reverse order, an accepted count of 0
    and one past T (clamped), a padded sequence (negative slots: zero state, nothing written)."""
    if state_dtype == torch.float32 and tile not in (None, recurrent.Config(16, 1), (16, 2, 4, False, False)):
        pytest.skip("fp32 state: the default launch and both kernels at 16 columns")
    T, HV, HK, D = 5, HV27, HK27, D27
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(B, T, HV, HK, D, D, torch.bfloat16, seed=B)
    pool = in_layout(torch.randn(B * T + 1, HV, D, D, device=DEV).to(state_dtype), dk_fastest)
    slots = torch.arange(B * T, dtype=torch.int32, device=DEV).view(B, T).flip(1).contiguous()
    num_acc = torch.tensor([0, 3, 9] * (B // 3) or [0], dtype=torch.int32, device=DEV)
    if B > 1:
        slots[2] = -1
    ref_pool = pool.clone()
    ref = gdn_verify_ref(q, k, v, a, b, A_log, dt_bias, ref_pool, slots, num_acc)
    out = torch.full((B, T, HV, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    cfg = recurrent_gluon.config(v, pool, tile) if isinstance(tile, tuple) else tile
    gdn_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, num_acc, out=out, cfg=cfg)
    assert rel_err(out, ref) < 1e-2 and rel_err(pool, ref_pool) < (1e-3 if state_dtype == torch.float16 else 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("past", ["slots", 2**30])
@pytest.mark.parametrize("B", [1, 12])
def test_gpu_verify_slot_past_pool_27b(B, past):
    """A slot id >= the pool's slots is padding, as -1 is (the Gluon kernel at two of its launches; the Triton
    kernels' cases: tests/test_kernel_bounds.py): outputs and pool bitwise as with -1 there, the slots of 1.0
    around the pool neither read nor written. Row 0 starts from such a slot, the last row skips its last write."""
    T, HV, HK, D = 5, HV27, HK27, D27
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(B, T, HV, HK, D, D, torch.bfloat16, seed=B)
    n = B * T
    big = state_pool(n + 2, HV, D, D, torch.float16, DEV).fill_(1.0)
    big[1:-1] = torch.randn(n, HV, D, D, device=DEV)
    slots = torch.arange(n, dtype=torch.int32, device=DEV).view(B, T)
    slots[0, 0] = slots[-1, -1] = -1
    runs = []
    for fill in (-1, n if past == "slots" else past):
        pool = big.clone()
        o = gdn_verify(q, k, v, a, b, A_log, dt_bias, pool[1:-1], torch.where(slots < 0, fill, slots),
                       torch.ones(B, dtype=torch.int32, device=DEV))
        runs.append((o, pool))
    (want_o, want_pool), (o, pool) = runs
    assert torch.equal(o, want_o) and torch.equal(pool, want_pool) and (pool[[0, -1]] == 1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dk_fastest", [False, True])
@pytest.mark.parametrize("B", [1, 3, 12, 42])
def test_gpu_verify_width_invariant_27b(B, dk_fastest):
    """As test_verify_token_by_token_is_width_invariant at the 27B shape, at widths that take each of the Gluon
    kernel's launches (the verify and the decode steps alike)."""
    assert_width_invariant(HV27, HK27, D27, torch.float16, seed=9, B=B, dk_fastest=dk_fastest)


@pytest.mark.gpu
@pytest.mark.parametrize("capability", [(9, 0), (8, 6)])
def test_gpu_prefill_27b(capability):
    """The launch of each architecture (chunked.config: sm_86's run here on the H200)."""
    B, L, HV, HK, D = 1, 300, HV27, HK27, D27
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(B, L, HV, HK, D, D, torch.bfloat16)
    pool = in_layout(0.1 * torch.randn(2, HV, D, D, device=DEV), dk_fastest=True)
    ref_o, ref_s = seq_ref(q, k, v, a, b, A_log, dt_bias, pool[:1].clone())
    slot = torch.zeros(1, dtype=torch.int32, device=DEV)
    o = gdn_prefill(q, k, v, a, b, A_log, dt_bias, pool, slot, slot + 1, cfg=chunked.config(q, v, capability))
    # tf32 dots along the state chain; bf16 output
    assert rel_err(o, ref_o) < 1e-2 and rel_err(pool[1], ref_s[0]) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dk,dv", [(16, 32), (32, 32), (16, 64), (32, 64), (128, 32), (32, 128), (64, 64)])
def test_gpu_prefill_small_heads_chunk64(dk, dv):
    # head dims below 64 at 64-token chunks (the prepare kernel pads them to 64; unpadded they came out wrong on the
    # H200, rel. error ~1); fp32 inputs at dk 128 need the state walk's smaller pipeline (shared memory)
    B, L, HV, HK = 2, 100, 4, 2
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(B, L, HV, HK, dk, dv, seed=L)
    pool = torch.randn(3, HV, dk, dv, device=DEV)
    ref_o, ref_s = seq_ref(q, k, v, a, b, A_log, dt_bias, pool[:1].repeat(2, 1, 1, 1))
    o = gdn_prefill(q, k, v, a, b, A_log, dt_bias, pool, torch.zeros(B, dtype=torch.int32, device=DEV),
                    torch.tensor([1, 2], dtype=torch.int32, device=DEV), cfg=chunks(q, v, 64))
    assert rel_err(o, ref_o) < 2e-3 and rel_err(pool[1:], ref_s) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("L,use_na", [(5, True), (1000, False)])
def test_gpu_conv_27b(L, use_na):
    B, C, K, kd = 2, M27.linear_conv_dim, M27.linear_conv_kernel_dim, 4
    x = torch.randn(B, L, C, device=DEV).bfloat16()
    w = torch.randn(C, K, device=DEV).bfloat16()
    state = torch.randn(B, C, K - 1 + kd, device=DEV).bfloat16()
    slots = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    na = torch.tensor([2, 5], dtype=torch.int32, device=DEV) if use_na else None
    ref_state = state.clone()
    ref = causal_conv1d_ref(x, w, ref_state, slots, na)
    y = causal_conv1d(x, w, state, slots, na)
    assert rel_err(y, ref) < 1e-2 and torch.equal(state, ref_state)


@pytest.mark.slow
def test_prefill_negative_final_slot_writes_no_state():
    """final_slots < 0: the sequence's output as ever, its final state written nowhere (only initial < 0 is tested
    above)."""
    B, L, HV, HK, dk, dv = 2, 37, 4, 2, 16, 32
    q, k, v, a, b, A_log, dt_bias = gdn_inputs(B, L, HV, HK, dk, dv, seed=5)
    pool = torch.randn(4, HV, dk, dv, device=DEV)
    before = pool.clone()
    want_o, want_s = seq_ref(q, k, v, a, b, A_log, dt_bias, pool[[1, 3]].clone())
    out = torch.full((B, L, HV, dv), float("nan"), device=DEV)
    o = gdn_prefill(q, k, v, a, b, A_log, dt_bias, pool, torch.tensor([1, 3], dtype=torch.int32, device=DEV),
                    torch.tensor([-1, 0], dtype=torch.int32, device=DEV), out=out, cfg=chunks(q, v, 16))
    assert rel_err(o, want_o) < 2e-3 and rel_err(pool[0], want_s[1]) < 2e-3
    assert torch.equal(pool[1:], before[1:])
