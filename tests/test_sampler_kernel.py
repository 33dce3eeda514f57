"""kernels/sampler against the plain-torch reference in engine/sampling.py: exact supports (ties included) on every
resolution path, greedy == first argmax, descriptors == reference probabilities, χ² tests of the sampled and of the
speculatively emitted token distributions, device-side RNG offset, reduced draft vocabulary, +inf / NaN /
overflowing logits. CPU runs use the interpreter with small shapes; the @gpu tests use the 27B model's vocabulary
and many more rows."""
import math

import pytest
import torch

from engine import sampling as ref
from kernels import sampler as S
from layers.config import qwen38_27b

DEV = "cuda" if torch.cuda.is_available() else "cpu"
VOCAB = qwen38_27b().vocab_size
SMALL = S.Config(block=64, pivots=8, group=4, cap=32, levels=3)
TINY = S.Config(block=8, pivots=4, group=4, cap=8, levels=1)       # one block of the tiny vocabularies


def rng(seed=0, offset=0):
    return (torch.tensor([seed], dtype=torch.int64, device=DEV), torch.tensor([offset], dtype=torch.int64, device=DEV))


def chi2_ok(counts, probs, alpha_z=3.09):
    """χ² goodness of fit over the bins with positive probability; no sample may fall outside them.
    Threshold: the Wilson–Hilferty approximation of the (1 − 1e-3) quantile."""
    counts, probs = counts.double().cpu(), probs.double().cpu()
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token outside the support"
    n = counts.sum()
    exp = probs[support] / probs[support].sum() * n
    stat = ((counts[support] - exp) ** 2 / exp).sum().item()
    df = int(support.sum()) - 1
    if df == 0:
        return True
    limit = df * (1 - 2 / (9 * df) + alpha_z * math.sqrt(2 / (9 * df))) ** 3
    assert stat < limit, f"chi2 {stat:.1f} >= {limit:.1f} (df {df})"
    return True


def modes(ws, R, params, V):
    """How each row was resolved: 'greedy', 'all', 'tie', 'cand' or 'fallback' (from the final bracket state)."""
    st = ws.state[:R, ws.cfg.levels].cpu()
    out = []
    for r in range(R):
        t, k, p = params.temperature[r].item(), params.top_k[r].item(), params.top_p[r].item()
        kact, pact = t > 0 and 0 < k < V, t > 0 and p < 1
        if t <= 0:
            out.append("greedy")
            continue
        if not (kact or pact):
            out.append("all")
            continue
        lo, hs, clo, chs, M = st[r, 0].item(), st[r, 1].item(), st[r, 2].item(), st[r, 3].item(), st[r, 5].item()
        key = lambda v: (lambda b: b ^ 0x7FFFFFFF if b < 0 else b)(torch.tensor([v + 0.0]).view(torch.int32).item())
        tie = key(hs) - key(lo) <= 1 or lo >= M
        fits = clo - (0 if kact and pact else chs) <= ws.cfg.cap
        out.append("tie" if tie and not (kact and pact) else "cand" if fits else "fallback")
    return out


def check_rows(logits, params, cfg):
    R, V = logits.shape
    ws = S.SamplerWorkspace(R, V, DEV, cfg)
    seed, offset = rng(7)
    ids, desc = S.sample(logits, params, seed, offset, ws)
    want = ref.support(logits, params.temperature, params.top_k, params.top_p)
    x = ref.scaled_logits(logits, params.temperature)
    greedy = params.temperature <= 0
    got = torch.where(greedy[:, None], torch.zeros_like(want).scatter(1, ids.long()[:, None], True),
                      x >= desc[:, 2:3])
    bad = (got != want).any(1).nonzero().flatten().tolist()
    assert not bad, f"support differs in rows {bad}"
    kept = want.gather(1, ids.long()[:, None])[:, 0]
    assert (kept | ~want.any(1) & (ids == 0)).all(), "sampled outside the support (a row keeping nothing: 0)"
    # the descriptor reproduces the processed distribution
    p = torch.where(got, torch.exp(x - desc[:, 1:2]) / desc[:, 3:4], torch.zeros_like(x))
    p_ref = ref.row_probabilities(logits, params.temperature, params.top_k, params.top_p)
    sampled = ~greedy
    err = (p - p_ref)[sampled].abs().max() / p_ref[sampled].abs().max()
    assert err < 1e-5, err
    assert offset.item() == 1
    return modes(ws, R, params, V)


def tie_heavy_logits(R, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randint(-12, 13, (R, V), generator=g) * 0.5                 # many exact ties
    fine = torch.randn(R, V, generator=g) * 3
    mix = torch.where(torch.rand(R, 1, generator=g) < 0.5, coarse, fine)
    return mix.to(dtype).to(DEV)


PARAMS = [  # (temperature, top_k, top_p): greedy, untruncated, each filter alone, both, extremes
    (0.0, 0, 1.0), (1.0, 0, 1.0), (1.0, 20, 1.0), (0.5, 0, 0.9), (1.0, 20, 0.95), (2.0, 5, 0.5), (1.0, 1, 1.0),
    (0.5, 0, 0.3), (2.0, 150, 0.99), (1.0, 37, 0.0), (0.25, 3, 0.8), (1.0, 0, 0.999),
    (0.7, 20, 0.95), (1.3, 0, 0.9),     # 1/T inexact: kernels and reference must round the same way
]


@pytest.mark.parametrize("cfg, dtype", [
    (S.Config(block=64, pivots=8, group=4, cap=128, levels=1), torch.float32),   # fits without levels
    (SMALL, torch.bfloat16),                                                     # levels narrow, then sort
    (S.Config(block=64, pivots=8, group=4, cap=4, levels=1), torch.bfloat16),    # overflow -> bisection
])
@pytest.mark.slow
def test_support_descriptor_and_paths(cfg, dtype):
    R, V = len(PARAMS), 120
    t, k, p = zip(*PARAMS)
    params = S.SamplingTensors.of(list(t), list(k), list(p), DEV)
    seen = check_rows(tie_heavy_logits(R, V, dtype, seed=cfg.cap), params, cfg)
    if cfg.cap == 4:
        assert "fallback" in seen and "tie" in seen, seen
    if cfg is SMALL:
        assert "cand" in seen, seen


@pytest.mark.slow
def test_top_k_bound_from_block_maxima():
    """Level 0 counts top-k rows only from the first pivot that k block maxima reach: exact whether the top values
    are spread over many blocks or packed into one (its maxima bound nothing then), and with k above the blocks."""
    R, V = len(PARAMS), 320
    t, k, p = zip(*PARAMS)
    params = S.SamplingTensors.of(list(t), list(k), list(p), DEV)
    cfg = S.Config(block=16, pivots=8, group=4, cap=32, levels=3)
    spread = tie_heavy_logits(R, V, torch.float32, seed=3)
    packed = spread.clone()
    packed[:, 96:128] += 40.0                           # 32 top values in two neighbouring blocks
    for logits in (spread, packed):
        check_rows(logits, params, cfg)


def test_cfg_forces_the_launch_parameters():
    """cfg sizes the workspace sample allocates (the same tokens as a workspace of that cfg) and must match a given
    one's."""
    R, V = 4, 120
    logits = tie_heavy_logits(R, V, torch.float32, seed=2)
    params = S.SamplingTensors.of([1.0, 0.7, 0.0, 1.0], [20, 0, 0, 5], [0.9, 0.95, 1.0, 1.0], DEV)
    ws = S.SamplerWorkspace(R, V, DEV, SMALL)
    want = [t.clone() for t in S.sample(logits, params, *rng(4), ws)]
    got = S.sample(logits, params, *rng(4), cfg=SMALL)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert S.SamplerWorkspace(R, V, DEV).cfg == S.config(R, V, DEV)
    with pytest.raises(AssertionError):
        S.sample(logits, params, *rng(4), ws, cfg=S.Config())


def test_temperature_rounds_like_the_reference():
    # two adjacent fp32 logits that tie after x / 1.3 but not after x · RN(1/1.3): the top-k = 1 tie group (and so the
    # support) depends on how the temperature is applied, and kernels and reference must apply it the same way
    x1 = 3.9827160835266113
    row = torch.full((1, 120), -5.0)
    row[0, 7], row[0, 50] = x1, torch.nextafter(torch.tensor(x1), torch.tensor(9.0)).item()
    check_rows(row.to(DEV), S.SamplingTensors.of([1.3], [1], [1.0], DEV), SMALL)


INF, NAN = float("inf"), float("nan")


def extreme_rows(V, dtype):
    """(logits [R, V], SamplingTensors): +inf logits few and many (a tie group larger than SMALL's CAP), finite ones
    that overflow under 1/T, NaN, +inf among −inf, and rows of no logit above −inf, under each kind of truncation."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(V, generator=g) * 2
    few, many, over, nan, mixed = (base.clone() for _ in range(5))
    few[[10, V // 2, V - 1]] = INF                      # in different blocks, the last before padding
    many[100:160] = INF
    over[[7, 9, 11]] = torch.tensor([3e38, 2e38, -3e38])   # at T 0.5: FLT_MAX, FLT_MAX, −inf
    nan[[3, 5, 8]] = torch.tensor([NAN, NAN, 50.0])        # the argmax, after NaNs (torch.argmax takes a NaN)
    mixed[:] = -INF
    mixed[[3, V - 40]] = INF
    mixed[[4, 60]] = torch.tensor([NAN, 1.0])
    empty = torch.full((V,), -INF)
    empty[::3] = NAN
    both, k20, p9 = (1.0, 20, 0.9), (1.0, 20, 1.0), (1.0, 0, 0.9)
    rows = [(few, t) for t in ((1.0, 0, 1.0), k20, p9, both, (0.0, 0, 1.0), (1.0, 2, 0.5))] + \
           [(many, t) for t in (k20, p9, both, (0.0, 0, 1.0))] + \
           [(over, t) for t in ((0.5, 0, 1.0), (0.5, 20, 0.9), (0.0, 0, 1.0))] + \
           [(nan, t) for t in ((0.0, 0, 1.0), (1.0, 5, 0.9))] + \
           [(mixed, t) for t in ((1.0, 0, 1.0), both, (0.0, 0, 1.0))] + \
           [(empty, t) for t in ((1.0, 0, 1.0), both, (0.0, 0, 1.0))]
    logits, params = zip(*rows)
    t, k, p = zip(*params)
    return torch.stack(logits).to(dtype).to(DEV), S.SamplingTensors.of(list(t), list(k), list(p), DEV)


@pytest.mark.slow
def test_inf_nan_and_overflowing_logits():
    """Kernel and reference read a logit alike: +inf (and a finite x overflowing under 1/T) saturates at FLT_MAX and
    ties at the top with its like (no inf − inf), NaN counts as −inf, and a row of no logit above −inf keeps nothing
    (tau = +inf) and names token 0: supports, descriptors and tokens as check_rows, on every resolution path."""
    logits, params = extreme_rows(500, torch.bfloat16)
    assert {"tie", "cand", "fallback"} <= set(check_rows(logits, params, SMALL))
    greedy = params.temperature.cpu() == 0
    assert ref.next_token(logits.cpu()[greedy], ref.SamplingParams(0.0), None).tolist() == [10, 100, 7, 8, 3, 0]


@pytest.mark.slow
def test_inf_logits_share_the_mass_chi2():
    """The +inf logits of a row, and at T 0.5 the finite one that overflows, are drawn uniformly; the rest never."""
    V, R = 8, 96
    row = torch.randn(1, V, generator=torch.Generator().manual_seed(3))
    row[0, [1, 4, 5]], row[0, 7] = INF, 3e38
    row = row.to(DEV)
    for t, k, p, top in [(1.0, 0, 1.0, [1, 4, 5]), (0.5, 3, 0.9, [1, 4, 5, 7])]:   # a tie group stays whole
        params = S.SamplingTensors.of([t] * R, [k] * R, [p] * R, DEV)
        ws = S.SamplerWorkspace(R, V, DEV, TINY)
        ids, _ = S.sample(row.repeat(R, 1), params, *rng(11), ws)
        probs = ref.row_probabilities(row, params.temperature[:1], params.top_k[:1], params.top_p[:1])[0]
        assert torch.equal(probs.cpu(), torch.zeros(V).index_fill(0, torch.tensor(top), 1 / len(top)))
        chi2_ok(torch.bincount(ids.long(), minlength=V), probs)


def test_greedy_first_argmax_and_equal_logits():
    V = 200
    logits = torch.zeros(4, V, device=DEV)
    logits[1, [7, 90, 150]] = 3.0                       # tied maxima in different blocks: first index wins
    logits[2, 150] = 1.0
    logits[3, V - 1] = 5.0                              # the rest all tie: top-k keeps them, top-p drops them
    params = S.SamplingTensors.of([0.0, 0.0, 0.0, 1.0], [0, 0, 0, 4], [1.0, 1.0, 1.0, 0.3], DEV)
    ids, desc = S.sample(logits, params, *rng(), S.SamplerWorkspace(4, V, DEV, SMALL))
    assert ids.tolist()[:3] == [0, 7, 150] and ids[3].item() == V - 1


@pytest.mark.slow
def test_race_distribution_chi2():
    """Identical rows, independent draws: the empirical distribution matches the processed one."""
    V, R = 8, 96
    g = torch.Generator().manual_seed(3)
    base = (torch.randn(1, V, generator=g) * 1.5).to(DEV)
    for t, k, p in [(1.0, 0, 1.0), (0.8, 5, 0.9)]:
        params = S.SamplingTensors.of([t] * R, [k] * R, [p] * R, DEV)
        ws = S.SamplerWorkspace(R, V, DEV, TINY)
        ids, _ = S.sample(base.repeat(R, 1), params, *rng(11), ws)
        probs = ref.row_probabilities(base, params.temperature[:1], params.top_k[:1], params.top_p[:1])[0]
        chi2_ok(torch.bincount(ids.long(), minlength=V), probs)


def test_offset_advances_on_device():
    V, R = 64, 16
    logits = torch.randn(R, V, device=DEV)
    params = S.SamplingTensors.of([1.0] * R, [0] * R, [1.0] * R, DEV)
    ws = S.SamplerWorkspace(R, V, DEV, SMALL)
    seed, offset = rng(5, 41)
    a = S.sample(logits, params, seed, offset, ws)[0].clone()
    assert offset.item() == 42
    b = S.sample(logits, params, seed, offset, ws)[0].clone()
    offset.fill_(41)
    c = S.sample(logits, params, seed, offset, ws)[0].clone()
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_sample_drafts_maps_reduced_vocabulary():
    Vd, V, R = 40, 100, 6
    g = torch.Generator().manual_seed(1)
    draft_to_target = torch.randperm(V, generator=g)[:Vd].sort().values
    d2t = (draft_to_target - torch.arange(Vd)).int().to(DEV)
    logits = torch.randn(R, Vd, generator=g).to(DEV)
    params = S.SamplingTensors.of([0.0, 1.0, 1.0, 0.7, 0.0, 1.0], [0, 5, 0, 3, 0, 1], [1.0, 0.9, 1.0, 1.0, 1.0, 1.0],
                                  DEV)
    ids, desc = S.sample_drafts(logits, params, *rng(), S.SamplerWorkspace(R, Vd, DEV, SMALL), d2t=d2t)
    local = (ids.cpu().long()[:, None] == draft_to_target[None]).int().argmax(1)
    assert torch.equal(draft_to_target[local], ids.cpu().long())
    assert ref.support(logits, params.temperature, params.top_k, params.top_p).cpu().gather(1, local[:, None]).all()
    assert local[0] == logits[0].argmax().cpu() and local[5] == logits[5].argmax().cpu()
    t2d = S.target_to_draft(d2t, V)
    assert torch.equal(t2d[draft_to_target.to(DEV)].cpu(), torch.arange(Vd, dtype=torch.int32))
    assert (t2d >= 0).sum() == Vd


def test_sample_drafts_into_given_slices():
    """out: step i's column of [R, k] drafts and [R, k, 4] descriptors written in place — the workspace's outputs
    bit for bit, the other columns (poisoned) untouched."""
    R, V, K = 6, 64, 3
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(R, V, generator=g).to(DEV)
    params = S.SamplingTensors.of([0.0, 1.0, 0.7, 1.0, 0.0, 1.3], [0, 5, 0, 3, 0, 0], [1.0, 0.9, 1.0, 1.0, 1.0, 0.8],
                                  DEV)
    ids, desc = (t.clone() for t in S.sample_drafts(logits, params, *rng(), S.SamplerWorkspace(R, V, DEV, SMALL)))
    drafts = torch.full((R, K), -7, dtype=torch.int32, device=DEV)
    descs = torch.full((R, K, 4), float("nan"), device=DEV)
    got = S.sample_drafts(logits, params, *rng(), S.SamplerWorkspace(R, V, DEV, SMALL), out=(drafts[:, 1], descs[:, 1]))
    assert got[0].data_ptr() == drafts[:, 1].data_ptr() and got[1].data_ptr() == descs[:, 1].data_ptr()
    assert torch.equal(drafts[:, 1], ids) and torch.equal(descs[:, 1], desc)
    assert (drafts[:, [0, 2]] == -7).all() and descs[:, [0, 2]].isnan().all()


def speculate(target_logits, draft_logits, params, cfg, seed=0, d2t=None):
    """Draft k tokens per sequence with sample_drafts, then verify them with rejection_sample."""
    B, K1, V = target_logits.shape
    K, Vd = K1 - 1, draft_logits.shape[-1]
    ws = S.RejectionWorkspace(B, K, V, Vd, DEV, cfg)
    seed_t, offset = rng(seed)
    dws = S.SamplerWorkspace(B, Vd, DEV, cfg)
    drafts, descs = [], []
    for i in range(K):
        ids, desc = S.sample_drafts(draft_logits[:, i].contiguous(), params, seed_t, offset, dws, d2t=d2t)
        drafts.append(ids.clone())
        descs.append(desc.clone())
    drafts, descs = torch.stack(drafts, 1), torch.stack(descs, 1)
    t2d = S.target_to_draft(d2t, V) if d2t is not None else None
    out, n = S.rejection_sample(target_logits, draft_logits, drafts, params, seed_t, offset, ws, descs, t2d)
    assert offset.item() == K + 1
    return drafts, out.clone(), n.clone()


def test_rejection_greedy_matches_reference():
    B, K, V = 5, 3, 50
    g = torch.Generator().manual_seed(2)
    target = torch.randn(B, K + 1, V, generator=g)
    draft = target[:, :K] + 0.8 * torch.randn(B, K, V, generator=g)         # drafts agree often, not always
    params = S.SamplingTensors.of([0.0] * B, [0] * B, [1.0] * B, DEV)
    drafts, out, n = speculate(target.to(DEV), draft.to(DEV), params, SMALL)
    assert torch.equal(drafts.cpu(), draft.argmax(-1).int())
    accepted, nxt = ref.accept_drafts(target, drafts.cpu().long(), None, ref.SamplingParams(0), None)
    j = torch.arange(K + 1)[None]
    out_ref = torch.where(j < accepted[:, None], torch.cat([drafts.cpu(), drafts.cpu()[:, :1]], 1),
                          torch.where(j == accepted[:, None], nxt[:, None].int(), -1))
    assert torch.equal(out.cpu(), out_ref.int()) and torch.equal(n.cpu(), (accepted + 1).int())
    assert 1 < n.float().mean() < K + 1


def emitted_match_target(target, out, n, params, tol_rows=10):
    """Token j of the emitted sequence, where emitted, follows the target distribution of row j."""
    K1 = target.shape[1]
    for j in range(K1):
        rows = n > j
        if rows.sum() < tol_rows:
            continue
        probs = ref.row_probabilities(target[0, j:j + 1], params.temperature[:1], params.top_k[:1], params.top_p[:1])[0]
        chi2_ok(torch.bincount(out[rows, j].long(), minlength=target.shape[-1]), probs)


@pytest.mark.slow
def test_rejection_emits_target_distribution():
    """Identical sequences: each emitted position is distributed as the target row, whatever the drafts were.
    The draft head knows tokens 1..4 only (reduced vocabulary): the others come from the residual alone."""
    B, K, V, Vd = 48, 2, 6, 4
    g = torch.Generator().manual_seed(4)
    target = torch.randn(1, K + 1, V, generator=g).repeat(B, 1, 1).to(DEV)
    draft = torch.randn(1, K, Vd, generator=g).repeat(B, 1, 1).to(DEV)
    d2t = torch.ones(Vd, dtype=torch.int32, device=DEV)
    params = S.SamplingTensors.of([1.0] * B, [0] * B, [1.0] * B, DEV)
    cfg = TINY
    drafts, out, n = speculate(target, draft, params, cfg, seed=9, d2t=d2t)
    assert ((out >= 0).sum(1) == n).all() and (out[:, :K] == drafts).logical_or(out[:, :K] < 0).logical_or(
        torch.arange(K, device=DEV)[None] >= n[:, None] - 1).all()
    emitted_match_target(target.cpu(), out.cpu(), n.cpu(), params)


# ------------------------------------------------------------------------------------------------ GPU
def llm_like_logits(R, V, seed):
    """A bulk of random logits plus a few dozen strongly preferred tokens, in bf16 (realistic ties)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(R, V, device="cuda", generator=g) * 2.0
    top = torch.randint(0, V, (R, 64), device="cuda", generator=g)
    x.scatter_add_(1, top, torch.rand(R, 64, device="cuda", generator=g) * 12)
    return x.to(torch.bfloat16)


@pytest.mark.gpu
def test_gpu_support_full_vocab():
    V = VOCAB
    t, k, p = zip(*(PARAMS + [(1.0, 1024, 1.0), (1.0, 1024, 0.95), (1.5, 0, 0.95), (0.6, 20, 0.95)]))
    params = S.SamplingTensors.of(list(t), list(k), list(p), DEV)
    check_rows(llm_like_logits(len(t), V, 0), params, S.Config())
    check_rows(tie_heavy_logits(len(t), V, torch.bfloat16, 1), params, S.Config())


@pytest.mark.gpu
def test_gpu_chi2_many_rows():
    V, R = 64, 1 << 16
    base = torch.randn(1, V, device=DEV) * 2
    for t, k, p in [(1.0, 0, 1.0), (0.7, 20, 0.9), (1.0, 0, 0.8)]:
        params = S.SamplingTensors.of([t] * R, [k] * R, [p] * R, DEV)
        ids, _ = S.sample(base.repeat(R, 1), params, *rng(3))
        probs = ref.row_probabilities(base, params.temperature[:1], params.top_k[:1], params.top_p[:1])[0]
        chi2_ok(torch.bincount(ids.long(), minlength=V), probs)


@pytest.mark.gpu
def test_gpu_rejection_chi2_many_sequences():
    B, K, V = 1 << 15, 3, 16
    target = torch.randn(1, K + 1, V, device=DEV).repeat(B, 1, 1)
    draft = torch.randn(1, K, V, device=DEV).repeat(B, 1, 1)
    params = S.SamplingTensors.of([0.9] * B, [10] * B, [0.95] * B, DEV)
    drafts, out, n = speculate(target, draft, params, S.Config(), seed=5)
    emitted_match_target(target.cpu(), out.cpu(), n.cpu(), params, tol_rows=1000)
    # acceptance rate of the first draft = Σ min(p, q)
    p = ref.row_probabilities(target[0, :1], params.temperature[:1], params.top_k[:1], params.top_p[:1])[0]
    q = ref.row_probabilities(draft[0, :1], params.temperature[:1], params.top_k[:1], params.top_p[:1])[0]
    rate, want = (n > 1).float().mean().item(), torch.minimum(p, q).sum().item()
    assert abs(rate - want) < 4 * math.sqrt(want * (1 - want) / B) + 1e-3, (rate, want)


@pytest.mark.gpu
def test_gpu_graph_replay_draws_fresh_tokens():
    V, R = VOCAB, 5
    logits = llm_like_logits(R, V, 2)
    params = S.SamplingTensors.of([1.0] * R, [0] * R, [1.0] * R, DEV)   # untruncated: draws vary most
    ws = S.SamplerWorkspace(R, V, DEV)
    seed, offset = rng(1)
    S.sample(logits, params, seed, offset, ws)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, _ = S.sample(logits, params, seed, offset, ws)
    start = offset.item()
    draws = []
    for _ in range(3):
        graph.replay()
        draws.append(ids.clone())
    torch.cuda.synchronize()
    assert offset.item() == start + 3
    assert not torch.equal(draws[0], draws[1])
    offset.fill_(start)
    assert torch.equal(S.sample(logits, params, seed, offset, ws)[0], draws[0])


def test_rejection_with_parameters_differing_per_sequence():
    """Each target row takes its own sequence's parameters (row r: sequence r // (k + 1)): sampled, greedy and top-k 1
    sequences in one call — the greedy ones give the greedy verdict — and draft_desc=None (recomputed from the
    draft logits) gives the same verdict."""
    B, K, V = 3, 2, 150
    cfg = SMALL
    g = torch.Generator().manual_seed(2)
    target = torch.randn(B, K + 1, V, generator=g).to(DEV)
    draft = target[:, :K] + 0.8 * torch.randn(B, K, V, generator=g).to(DEV)
    params = S.SamplingTensors.of([1.0, 0.0, 1.0], [0, 0, 1], [1.0, 1.0, 1.0], DEV)
    seed, offset = torch.tensor([3], device=DEV), torch.tensor([0], device=DEV)
    dws = S.SamplerWorkspace(B, V, DEV, cfg)
    drafts, descs = torch.empty(B, K, dtype=torch.int32, device=DEV), torch.empty(B, K, 4, device=DEV)
    for i in range(K):
        S.sample_drafts(draft[:, i].contiguous(), params, seed, offset, dws, out=(drafts[:, i], descs[:, i]))
    ws = S.RejectionWorkspace(B, K, V, V, DEV, cfg)
    start = offset.clone()
    out, n = (t.clone() for t in S.rejection_sample(target, draft, drafts, params, seed, offset, ws, descs))
    assert torch.equal(ws.target.desc[:B * (K + 1), 0].cpu(), torch.tensor([1.0] * 3 + [0.0] * 3 + [1.0] * 3))
    accepted, nxt = ref.accept_drafts(target.cpu(), drafts.long().cpu(), None, ref.SamplingParams(0), None)
    j = torch.arange(K + 1)[None]
    greedy = torch.where(j < accepted[:, None], torch.cat([drafts.cpu(), drafts[:, :1].cpu()], 1),
                         torch.where(j == accepted[:, None], nxt[:, None].int(), -1)).int()
    for b in (1, 2):
        assert torch.equal(drafts[b].cpu(), draft[b].argmax(-1).int().cpu())
        assert torch.equal(out[b].cpu(), greedy[b]) and n[b] == accepted[b] + 1
    assert (out[0] >= 0).sum() == n[0] and 1 <= n[0] <= K + 1
    offset.copy_(start)
    out2, n2 = S.rejection_sample(target, draft, drafts, params, seed, offset,
                                  S.RejectionWorkspace(B, K, V, V, DEV, cfg))
    assert torch.equal(out2, out) and torch.equal(n2, n)


def test_rejection_reads_inf_and_empty_rows():
    """p and q as the sampler read the logits: saturated +inf (p = 1 where it is alone), p ≡ 0 for a row of no logit
    above −inf. Each sequence's verdict is certain, and the reference's is the same."""
    B, K, V = 5, 2, 100
    g = torch.Generator().manual_seed(6)
    target, draft = torch.randn(B, K + 1, V, generator=g), torch.randn(B, K, V, generator=g)
    target[0, :, 7], draft[0, :, 7] = INF, INF    # p = q = δ_7: every draft accepted, and the bonus
    target[1, :, 9], draft[1, :, 7] = INF, INF    # (top-k 20, top-p 0.9) p(7) = 0: rejected, corrected from r = δ_9
    target[2, 0, 9], draft[2] = INF, -INF         # q ≡ 0 (the draft names 0): rejected, corrected from p = δ_9
    target[3, 0], draft[3, :, 7] = NAN, INF       # p ≡ 0: rejected, r ≡ 0: the target row's own token, 0
    target[4, :, 7], draft[4, :, 7] = 3e38, 3e38  # T 0.5: both overflow to FLT_MAX, p = q = δ_7
    temp, top_k, top_p = [1.0, 1.0, 1.0, 1.0, 0.5], [0, 20, 0, 0, 0], [1.0, 0.9, 1.0, 1.0, 1.0]
    drafts, out, n = speculate(target.to(DEV), draft.to(DEV), S.SamplingTensors.of(temp, top_k, top_p, DEV), SMALL)
    assert out.tolist() == [[7, 7, 7], [9, -1, -1], [9, -1, -1], [0, -1, -1], [7, 7, 7]], out
    per_seq = [torch.tensor(v) for v in (temp, top_k, top_p)]
    p, q = (ref.row_probabilities(x.flatten(0, 1), *(v.repeat_interleave(x.shape[1]) for v in per_seq)).view(x.shape)
            for x in (target, draft))
    accepted, nxt = ref.accept_sampled(p, q, drafts.cpu().long(), torch.Generator().manual_seed(0))
    assert torch.equal(accepted + 1, n.cpu().long()) and torch.equal(nxt, out.cpu().long()[torch.arange(B), accepted])


@pytest.mark.slow
def test_rejection_with_inf_logits_emits_target_distribution():
    """Target rows tie two +inf tokens, the draft row has one of them: the draft is accepted with Σ min(p, q) = 1/2,
    and every emitted position follows its target row."""
    B, K, V = 64, 1, 8
    g = torch.Generator().manual_seed(8)
    target, draft = torch.randn(1, K + 1, V, generator=g), torch.randn(1, K, V, generator=g)
    target[0, :, [2, 6]], draft[0, :, 2] = INF, INF
    target, draft = target.repeat(B, 1, 1), draft.repeat(B, 1, 1)
    params = S.SamplingTensors.of([1.0] * B, [0] * B, [1.0] * B, DEV)
    cfg = TINY
    drafts, out, n = speculate(target.to(DEV), draft.to(DEV), params, cfg, seed=4)
    assert (drafts == 2).all()
    emitted_match_target(target, out.cpu(), n.cpu(), params)
    rate = (n > 1).float().mean().item()
    assert abs(rate - 0.5) < 4 * math.sqrt(0.25 / B), rate
