"""Sampling and exact speculative acceptance in plain torch (ENGINE.md §2, §3).

Distributions are processed exactly like the normal sampler: temperature -> top-k -> top-p -> renormalise.
Speculative drafts are sampled from the same processed distribution of the draft logits (q), and verified against
the processed target distribution (p): accept with probability min(1, p/q), on rejection resample from
norm(max(p − q, 0)), and add a bonus token from the last target row when every draft was accepted. Greedy
(temperature 0) accepts a draft iff it equals the target's argmax. Either way the emitted tokens are distributed
exactly as without drafting."""
from dataclasses import dataclass

import torch

SEED_RANGE = "[-2^63, 2^64)"            # the seeds torch.Generator.manual_seed takes


def seed_in_range(seed: int) -> bool:
    return -2**63 <= seed < 2**64


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0   # 0 -> greedy
    top_k: int = 0             # 0 -> off
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def validate(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not seed_in_range(self.seed):
            raise ValueError(f"seed must be in {SEED_RANGE}, got {self.seed}")
        return self


def saturate(x):
    """fp32 x with +inf -> the largest finite fp32 and NaN -> −inf, as the kernels read logits
    (kernels/sampler/common.scale)."""
    return x.float().nan_to_num(float("-inf"), torch.finfo(torch.float32).max, float("-inf"))


def scaled_logits(logits, temperature):
    """logits [R, V], temperature [R] -> logits · (1/T) in fp32 (greedy rows, T <= 0, unscaled), saturated (saturate).
    A product with the correctly rounded reciprocal, as the kernels compute it, so kernels and reference see the same
    values."""
    t = temperature.float().to(logits.device)
    return saturate(logits.float() * (1.0 / torch.where(t > 0, t, torch.ones_like(t)))[:, None])


def support(logits, temperature, top_k, top_p):
    """Boolean mask [R, V] of the tokens each row may sample; per-row parameters [R] (the kernels' semantics).

    top-k (0 < k < V): keep x >= v_k, the k-th largest value counted with multiplicity (ties with it stay).
    top-p (p < 1), on the distribution renormalised after top-k: sort descending, take the first position whose
    inclusive cumulative probability reaches p, keep every x >= its value. A tie group is kept or dropped whole,
    so the support does not depend on how a sort orders ties; the top group always stays. Greedy rows: the first
    argmax only.

    Values are scaled_logits: +inf logits, and finite ones that overflow under 1/T, saturate at the largest finite
    fp32, so they tie at the top and share its mass equally (every finite value below gets exp(−huge) = 0); NaN
    counts as −inf. A row of no value above −inf keeps nothing (its probabilities are 0; greedy, and the kernels,
    still name token 0, its first argmax)."""
    x = scaled_logits(logits, temperature)
    V = x.shape[-1]
    s = x.sort(-1, descending=True).values
    k = top_k.long().to(x.device)
    kth = s.gather(1, (k.clamp(1, V) - 1)[:, None])[:, 0]
    v_k = torch.where((k > 0) & (k < V), kth, torch.full_like(kth, float("-inf")))
    mass = torch.exp(s - s[:, :1]) * (s >= v_k[:, None])
    cum = (mass / mass.sum(-1, keepdim=True)).cumsum(-1)
    p = top_p.float().to(x.device)
    first = (cum < p[:, None]).sum(-1).clamp(max=V - 1)
    v_p = torch.where(p < 1, s.gather(1, first[:, None])[:, 0], torch.full_like(kth, float("-inf")))
    keep = (x >= torch.maximum(v_k, v_p)[:, None]) & (s[:, :1] > float("-inf"))
    onehot = torch.zeros_like(keep).scatter(1, x.argmax(-1, keepdim=True), True)
    return torch.where((temperature.to(x.device) <= 0)[:, None], onehot, keep)


def row_probabilities(logits, temperature, top_k, top_p):
    """The processed distribution [R, V] fp32: softmax of logits / T over the support (one-hot when greedy; all 0
    for a row of no value above −inf)."""
    x = scaled_logits(logits, temperature)
    return x.masked_fill(~support(logits, temperature, top_k, top_p), float("-inf")).softmax(-1).nan_to_num(0.0)


def probabilities(logits, params: SamplingParams):
    """logits [..., V] -> the sampling distribution [..., V] in fp32, one set of parameters for every row."""
    rows = logits.reshape(-1, logits.shape[-1])
    full = lambda value: torch.full((rows.shape[0],), value, device=logits.device)  # noqa: E731
    probs = row_probabilities(rows, full(float(params.temperature)), full(params.top_k), full(float(params.top_p)))
    return probs.view(logits.shape)


def sample(probs, generator=None):
    """One token per row of probs [..., V] (exponential race: argmax p / E, E ~ Exp(1); no host sync)."""
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=torch.float32)
    return (probs / -torch.log1p(-u)).argmax(-1)


def next_token(logits, params: SamplingParams, generator):
    """logits [..., V] -> token ids [...]: argmax when greedy, else a draw from probabilities()."""
    if params.greedy:
        return saturate(logits).argmax(-1)
    return sample(probabilities(logits, params), generator)


def residual(p, q):
    """The distribution a rejected position is resampled from: norm(max(p − q, 0)); p itself if that is all zero."""
    r = (p - q).clamp_min(0.0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-30), p)


def accept_drafts(target_logits, drafts, draft_probs, params: SamplingParams, generator):
    """Verify k drafts per sequence.

    target_logits [B, k+1, V]: row i judges drafts[:, i] (row k gives the bonus); drafts [B, k];
    draft_probs [B, k, V]: the distribution each draft was sampled from (unused when greedy).
    Returns (accepted [B] in 0…k, next_token [B]): the first `accepted` drafts are kept, then next_token
    (the correction at the first rejection, or the bonus)."""
    if params.greedy:
        best = saturate(target_logits).argmax(-1)                        # [B, k+1]
        accepted = (drafts == best[:, :-1]).int().cumprod(-1).sum(-1)
        return accepted, best.gather(1, accepted[:, None])[:, 0]
    return accept_sampled(probabilities(target_logits, params), draft_probs, drafts, generator)


def accept_sampled(p, q, drafts, generator):
    """ENGINE.md §2 on explicit distributions: p [B, k+1, V] target, q [B, k, V] draft, drafts [B, k].
    Accept draft i with probability min(1, p/q); at the first rejection resample from residual(p, q); after k
    acceptances draw the bonus from p's last row. Returns (accepted [B], next_token [B])."""
    B, k = drafts.shape
    p_d = p[:, :k].gather(-1, drafts[..., None])[..., 0]
    q_d = q.gather(-1, drafts[..., None])[..., 0]
    u = torch.rand(q_d.shape, generator=generator, device=q_d.device)
    accepted = ((q_d > 0) & (u * q_d <= p_d)).int().cumprod(-1).sum(-1)  # [B]
    rows = torch.arange(B, device=p.device)
    q_next = torch.cat([q, torch.zeros_like(p[:, :1])], 1)[rows, accepted]   # zero at the bonus row
    return accepted, sample(residual(p[rows, accepted], q_next), generator)
