"""Deferred linear outputs (kernels/fixed_sum.py): int64 fixed-point sums converted by the kernels that read
them. Every consumer, given sums, writes bitwise what it writes given the bf16 activations the GEMV would have
stored (to_bf16_ref), and leaves the sums it read zero. The GEMV side: tests/test_int4_gemv.py."""
import pytest
import torch

from kernels import norms as N
from kernels.attention import kv_cache
from kernels.fixed_sum import FRAC, to_bf16_ref
from kernels.gdn import causal_conv1d
from kernels.norms.ref import rope_tables
from kernels.norms.silu import Config as SiluConfig

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16
# On a GPU every reader runs this often on fresh sums: a clear racing another thread's read shows as a wrong bit
# only sometimes (the 27B's [8192] int64 rows: loads and the clear's store mapped to threads differently)
TRIES = 20 if DEV == "cuda" else 1


def random_sums(*shape, scale=3.0, seed=0):
    """int64 sums of magnitude ~scale, with exact ties of the bf16 rounding mixed in (round half to even)."""
    g = torch.Generator().manual_seed(seed)
    sums = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale * 2.0 ** FRAC).round().long()
    ties = torch.tensor([1 << FRAC | 1 << (FRAC - 8), (1 << FRAC) + (3 << (FRAC - 8)), -(5 << (FRAC - 9)), 0, 1])
    flat = sums.view(-1)
    flat[:len(ties)] = ties[:flat.numel()]
    return sums.to(DEV)


def test_to_bf16_ref_rounds_once_to_nearest_even():
    sums = random_sums(4000).cpu()
    exact = sums.double() * 2.0 ** -FRAC
    got = to_bf16_ref(sums)
    bits = got.view(torch.int16).int()
    for step in (-1, 1):                                   # neither bf16 neighbour is nearer
        nb = (bits + step).short().view(BF16).double()
        d_got, d_nb = (got.double() - exact).abs(), (nb - exact).abs().nan_to_num(float("inf"))  # 0 - 1: NaN
        assert (d_got <= d_nb).all()
        tie = d_got == d_nb
        assert (bits[tie] % 2 == 0).all()
    assert torch.equal(got[:3], torch.tensor([1.0, 1.0 + 2 ** -6, -5 * 2 ** -9]).to(BF16))


def assert_cleared(sums):
    assert not sums.any(), "sums the consumer read must be zero again for the GEMV's next launch"


@pytest.mark.parametrize("T, H", [(3, 200), (5, 5120)])
@pytest.mark.parametrize("quant", [False, True])
def test_add_rmsnorm_takes_sums(quant, T, H):
    sums, res, w = random_sums(T, H), torch.randn(T, H, device=DEV).to(BF16), torch.randn(H, device=DEV).to(BF16)
    want = N.add_rmsnorm(to_bf16_ref(sums.cpu()).to(DEV), res, w, 1e-6, quant=quant)
    for _ in range(TRIES):
        read, h = sums.clone(), res.clone()
        got = N.add_rmsnorm(read, h, w, 1e-6, h=h, quant=quant)                 # in place, as the runner calls it
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert_cleared(read)
    zero = torch.zeros(T, H, device=DEV, dtype=BF16)                # h = x + 0: the conversion alone
    sums = random_sums(T, H, seed=1)
    assert torch.equal(N.add_rmsnorm(sums.clone(), zero, w, 1e-6)[0], to_bf16_ref(sums.cpu()).to(DEV))


@pytest.mark.parametrize("T, I, cfg", [(3, 1000, SiluConfig(256)), (5, 17408, None)])
@pytest.mark.parametrize("quant, write_y", [(False, True), (True, True), (True, False)])
def test_silu_mul_takes_sums(quant, write_y, T, I, cfg):
    sums = random_sums(T, 2 * I, seed=2)
    acts = to_bf16_ref(sums.cpu()).to(DEV)
    want = N.silu_mul(acts[:, :I], acts[:, I:], quant=quant, write_y=write_y, cfg=cfg)
    want = want if quant else (want,)
    for _ in range(TRIES):
        read = sums.clone()
        got = N.silu_mul(read[:, :I], read[:, I:], quant=quant, write_y=write_y, cfg=cfg)
        assert all(torch.equal(a, b) for a, b in zip(got if quant else (got,), want))
        assert_cleared(read)


@pytest.mark.parametrize("B, n_new, HQ, HKV, D, RD", [(2, 2, 3, 2, 32, 16), (1, 5, 24, 4, 256, 64)])
def test_qk_norm_rope_takes_sums(B, n_new, HQ, HKV, D, RD):
    T = B * n_new
    sums = random_sums(T, HQ * 2 * D + 2 * HKV * D, seed=3)      # one fused projection's rows: [qg | k | v]
    acts = to_bf16_ref(sums.cpu()).to(DEV)
    qw, kw = torch.randn(D, device=DEV).to(BF16) * 0.3, torch.randn(D, device=DEV).to(BF16) * 0.3
    cos, sin = rope_tables(torch.arange(10, 10 + T, device=DEV), RD, 1e7, BF16)
    for _ in range(TRIES):
        read = sums.clone()
        assert all(torch.equal(a, b) for a, b in zip(*qk_norm_rope_both(acts, read, B, HQ, HKV, D, qw, kw, cos, sin)))
        assert_cleared(read)


def qk_norm_rope_both(acts, sums, B, HQ, HKV, D, qw, kw, cos, sin):
    """qk_norm_rope's outputs and KV caches from the bf16 rows, then from the sums."""
    outs = []
    for src in (acts, sums):
        qg, k, v = src[:, :HQ * 2 * D], src[:, HQ * 2 * D:-HKV * D], src[:, -HKV * D:]
        kc, vc = kv_cache(B, HKV, 16, D, torch.uint8, DEV)
        kc.zero_()
        vc.zero_()
        scales = torch.full((HKV,), 0.05, device=DEV), torch.full((HKV,), 0.07, device=DEV)
        rows = torch.arange(B, dtype=torch.int32, device=DEV)
        lens = torch.full((B,), 9, dtype=torch.int32, device=DEV)
        got = N.qk_norm_rope(qg, k, qw, kw, cos, sin, HQ, HKV, 1e-6, True, v=v, kv=(kc, vc, *scales, rows, lens))
        outs.append((*got, kc, vc))
    return outs


@pytest.mark.parametrize("T, HV, D", [(3, 4, 32), (5, 48, 128)])
def test_gated_rmsnorm_takes_sums(T, HV, D):
    """z as sums (and the b / a columns it clears): y bitwise as from the bf16 z, every sum zero afterwards."""
    sums = random_sums(T, HV * D + 2 * HV, scale=1.0, seed=5)
    x, w = torch.randn(T, HV, D, device=DEV).to(BF16), torch.randn(D, device=DEV)
    want = N.gated_rmsnorm(x, to_bf16_ref(sums[:, :HV * D].cpu()).to(DEV).view(T, HV, D), w, 1e-6)
    for _ in range(TRIES):
        read = sums.clone()
        got = N.gated_rmsnorm(x, read[:, :HV * D].view(T, HV, D), w, 1e-6, clear=read[:, HV * D:])
        assert torch.equal(got, want)
        assert_cleared(read)


def test_gdn_layer_takes_in_proj_sums():
    """The GDN layer's in_proj row [qkv | z | b | a] as sums: conv1d (qkv), gdn_verify (b, a: read by every
    program of a head, not cleared), gated_rmsnorm (z, and clears b and a) write what they write from the bf16
    row, and the whole row is zero afterwards."""
    from kernels.gdn import gdn_verify, state_pool
    B, T, HK, HV, DK, K = 2, 3, 2, 4, 32, 4
    conv_dim, z_end = 2 * HK * DK + HV * DK, 2 * HK * DK + 2 * HV * DK
    sums = random_sums(B * T, z_end + 2 * HV, scale=1.0, seed=4)
    w = torch.randn(conv_dim, K, device=DEV).to(BF16)
    A_log, dt_bias = torch.rand(HV, device=DEV) * 2, torch.randn(HV, device=DEV)
    gnorm_w = torch.randn(DK, device=DEV)
    rows, num_acc = torch.arange(B, dtype=torch.int32, device=DEV), torch.tensor([1, 3], dtype=torch.int32,
                                                                                   device=DEV)
    results = []
    for src in (to_bf16_ref(sums.cpu()).to(DEV), sums):
        conv_state = torch.linspace(-1, 1, B * conv_dim * (K - 1 + T - 1), device=DEV).view(B, conv_dim, -1)
        pool = state_pool(B * T, HV, DK, DK, torch.float16, DEV)
        pool.copy_(torch.linspace(-0.5, 0.5, pool.numel(), device=DEV).view(pool.shape))
        slots = torch.arange(B * T, dtype=torch.int32, device=DEV).view(B, T)
        mixed = causal_conv1d(src[:, :conv_dim].view(B, T, conv_dim), w, conv_state, rows, num_accepted=num_acc)
        q, k, v = (t.unflatten(-1, (-1, DK)) for t in mixed.split([HK * DK, HK * DK, HV * DK], -1))
        b, a = (t.view(B, T, HV) for t in src[:, z_end:].split(HV, -1))
        o = gdn_verify(q, k, v, a, b, A_log, dt_bias, pool, slots, num_acc)
        z = src[:, conv_dim:z_end].view(B * T, HV, DK)
        y = N.gated_rmsnorm(o.view(B * T, HV, DK), z, gnorm_w, 1e-6,
                            clear=src[:, z_end:] if src.dtype == torch.int64 else None)
        results.append((mixed, conv_state, o, pool, y))
    assert all(torch.equal(x, y) for x, y in zip(*results))
    assert_cleared(sums)


def test_conv1d_sums_with_padding_row_and_ragged_channels():
    """conv1d from int64 sums with a padding row (slot < 0) and channels no multiple of the block: the same y and
    state as from the bf16 activations, the padding row's state slot untouched, every sum cleared (its too)."""
    B, L, C, K, kd = 3, 5, 200, 4, 4
    sums = random_sums(B, L, C, scale=1.0, seed=6)
    w = torch.randn(C, K).bfloat16().to(DEV)
    slots = torch.tensor([2, -1, 0], dtype=torch.int32, device=DEV)
    num_acc = torch.tensor([3, 1, 5], dtype=torch.int32, device=DEV)
    state0 = torch.randn(4, C, K - 1 + kd).bfloat16().to(DEV)
    results = []
    for src in (to_bf16_ref(sums), sums):
        state = state0.clone()
        out = torch.full((B, L, C), float("nan"), device=DEV).bfloat16()
        results.append((causal_conv1d(src, w, state, slots, num_acc, out=out), state))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    assert torch.equal(results[1][1][[1, 3]], state0[[1, 3]])
    assert not sums.any()
