"""Plain-torch references for kernels/sampler.py (sorting is fine here).

Truncation semantics, shared with the kernels (ENGINE.md §2, §3; MODEL.md §8):
  x = logits.f32 * (1 / T) per row; T <= 0 means greedy (argmax, first index on ties).
  top-k, 0 < k < V: keep x >= v_k, v_k the k-th largest value counted with multiplicity (ties with v_k stay).
  top-p, p < 1, on the distribution renormalised after top-k: sort the kept values descending, take the first
  position whose inclusive cumulative probability reaches p, keep every x >= its value. A tie group is kept or
  dropped whole (so the result does not depend on how a sort orders ties); the top group is always kept.
engine/sampling.py breaks top-p ties by sort order instead; the two agree whenever no tie straddles the cut."""
import torch


def scaled_logits(logits, temperature):
    """logits [R, V], temperature [R] -> x [R, V] fp32 (greedy rows unscaled)."""
    t = temperature.float().to(logits.device)
    inv_t = 1.0 / torch.where(t > 0, t, torch.ones_like(t))
    return logits.float() * inv_t[:, None]


def support(logits, temperature, top_k, top_p):
    """Boolean mask [R, V] of the tokens each row may sample (greedy rows: the first argmax only)."""
    x = scaled_logits(logits, temperature)
    R, V = x.shape
    s = x.sort(-1, descending=True).values
    k = top_k.long().to(x.device)
    kth = s.gather(1, (k.clamp(1, V) - 1)[:, None])[:, 0]
    v_k = torch.where((k > 0) & (k < V), kth, torch.full_like(kth, float("-inf")))
    mass = torch.exp(s - s[:, :1]) * (s >= v_k[:, None])
    cum = (mass / mass.sum(-1, keepdim=True)).cumsum(-1)
    first = (cum < top_p.float().to(x.device)[:, None]).sum(-1).clamp(max=V - 1)
    v_p = torch.where(top_p.to(x.device) < 1, s.gather(1, first[:, None])[:, 0], torch.full_like(kth, float("-inf")))
    keep = x >= torch.maximum(v_k, v_p)[:, None]
    greedy = (temperature.to(x.device) <= 0)[:, None]
    onehot = torch.zeros_like(keep).scatter(1, x.argmax(-1, keepdim=True), True)
    return torch.where(greedy, onehot, keep)


def probabilities(logits, temperature, top_k, top_p):
    """The processed distribution [R, V] fp32: softmax of x over the support (one-hot for greedy rows)."""
    x = scaled_logits(logits, temperature)
    x = x.masked_fill(~support(logits, temperature, top_k, top_p), float("-inf"))
    return x.softmax(-1)


def sample(probs, generator=None):
    """One token per row of probs [R, V] by exponential race."""
    e = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / e).argmax(-1)


def rejection_sample(p, q, draft_ids, greedy, generator=None):
    """ENGINE.md §2 on explicit distributions.

    p [B, k+1, V] target, q [B, k, V] the draft distributions, draft_ids [B, k], greedy [B] bool.
    Returns out_ids [B, k+1] (accepted drafts, then the correction or bonus, then -1) and num_emitted [B]."""
    B, k1, V = p.shape
    k = k1 - 1
    rows = torch.arange(B, device=p.device)
    p_d = p[:, :k].gather(-1, draft_ids[..., None])[..., 0]
    q_d = q.gather(-1, draft_ids[..., None])[..., 0]
    u = torch.rand(B, k, generator=generator, device=p.device)
    ok = torch.where(greedy[:, None], draft_ids == p[:, :k].argmax(-1), (q_d > 0) & (u * q_d <= p_d))
    accepted = ok.int().cumprod(-1).sum(-1)                                   # [B] in 0..k
    p_a = p[rows, accepted]
    q_a = torch.cat([q, torch.zeros_like(p[:, :1])], 1)[rows, accepted]       # q is 0 at the bonus row
    r = (p_a - q_a).clamp_min(0.0)
    r = torch.where(r.sum(-1, keepdim=True) > 0, r, p_a)                      # r == 0 everywhere: fall back to p
    emitted = torch.where(greedy, p_a.argmax(-1), sample(r, generator))
    j = torch.arange(k + 1, device=p.device)[None]
    drafts = torch.cat([draft_ids, draft_ids[:, :1]], 1)
    out = torch.where(j < accepted[:, None], drafts, torch.where(j == accepted[:, None], emitted[:, None], -1))
    return out.int(), (accepted + 1).int()
