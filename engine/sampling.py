"""Sampling and exact speculative acceptance in plain torch (ENGINE.md §2, §3).

Distributions are processed exactly like the normal sampler: temperature -> top-k -> top-p -> renormalise.
Speculative drafts are sampled from the same processed distribution of the draft logits (q), and verified against
the processed target distribution (p): accept with probability min(1, p/q), on rejection resample from
norm(max(p − q, 0)), and add a bonus token from the last target row when every draft was accepted. Greedy
(temperature 0) accepts a draft iff it equals the target's argmax. Either way the emitted tokens are distributed
exactly as without drafting."""
from dataclasses import dataclass

import torch


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
        return self


def probabilities(logits, params: SamplingParams):
    """logits [..., V] -> the sampling distribution [..., V] in fp32 (temperature > 0)."""
    logits = logits.float() / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, -1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))           # ties with the k-th value stay
    probs = logits.softmax(-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        above = sorted_probs.cumsum(-1) - sorted_probs                     # mass ranked strictly above each token
        drop = torch.zeros_like(above, dtype=torch.bool).scatter(-1, order, above >= params.top_p)  # rank 0 stays
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs, generator):
    """One token per row of probs [..., V] (exponential race: argmax p / E, E ~ Exp(1); no host sync)."""
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=torch.float32)
    return (probs / -torch.log1p(-u)).argmax(-1)


def next_token(logits, params: SamplingParams, generator):
    """logits [..., V] -> token ids [...]: argmax when greedy, else a draw from probabilities()."""
    if params.greedy:
        return logits.argmax(-1)
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
    B, k1, _ = target_logits.shape
    k = k1 - 1
    if params.greedy:
        best = target_logits.argmax(-1)                                   # [B, k+1]
        ok = drafts == best[:, :k]
        accepted = ok.int().cumprod(-1).sum(-1)
        return accepted, best.gather(1, accepted[:, None])[:, 0]
    p = probabilities(target_logits, params)                              # [B, k+1, V]
    p_d = p[:, :k].gather(-1, drafts[..., None])[..., 0]
    q_d = draft_probs.gather(-1, drafts[..., None])[..., 0]
    u = torch.rand(q_d.shape, generator=generator, device=q_d.device)
    ok = (q_d > 0) & (u * q_d <= p_d)
    accepted = ok.int().cumprod(-1).sum(-1)                               # [B]
    rows = torch.arange(B, device=p.device)
    p_next = p[rows, accepted]                                            # [B, V]
    q_next = torch.cat([draft_probs, torch.zeros_like(p[:, :1])], 1)[rows, accepted]   # zero at the bonus row
    return accepted, sample(residual(p_next, q_next), generator)
