"""Exact speculative verification (ENGINE.md §2)."""
import torch
import triton
import triton.language as tl

from kernels import device as gpu
from kernels.device import pdl_wait
from kernels.sampler.common import (ACCEPT, RESIDUAL, Config, advance, exp_race, merge_race, program_races, programs,
                                    race_winner, scale, uniform)
from kernels.sampler.passes import SamplerWorkspace


def target_to_draft(d2t, vocab):
    """Inverse of a reduced draft vocabulary's d2t: t2d [vocab] int32, −1 where the target id has no draft id."""
    draft = torch.arange(d2t.shape[0], device=d2t.device)
    t2d = torch.full((vocab,), -1, dtype=torch.int32, device=d2t.device)
    t2d[draft + d2t.long()] = draft.int()
    return t2d


class RejectionWorkspace:
    """rejection_sample's buffers for B sequences with k drafts; allocated before graph capture."""

    def __init__(self, batch, k, vocab, draft_vocab, device, cfg: Config = None):
        self.batch, self.k = batch, k
        self.target = SamplerWorkspace(batch * (k + 1), vocab, device, cfg)
        self.draft = SamplerWorkspace(batch * k, draft_vocab, device, cfg)
        self.best = torch.empty(batch, self.target.nbp, dtype=torch.float32, device=device)     # residual race
        self.best_idx = torch.empty(batch, self.target.nbp, dtype=torch.int32, device=device)
        self.out = torch.empty(batch, k + 1, dtype=torch.int32, device=device)
        self.num_emitted = torch.empty(batch, dtype=torch.int32, device=device)
        self.ticket = torch.zeros(1, dtype=torch.int32, device=device)           # programs done (offset advance)
        self.seq_ticket = torch.zeros(batch, dtype=torch.int32, device=device)   # programs done per sequence


@triton.jit
def _prob(logit, desc_ptr, mask):
    """p(v) from the raw logit and the row's descriptor (1/T, M, tau, Zs)."""
    x = scale(logit, tl.load(desc_ptr + 0, mask=mask, other=1.0))   # as the sampler read it
    keep = mask & (x >= tl.load(desc_ptr + 2, mask=mask, other=0.0))
    return tl.where(keep, tl.exp(x - tl.load(desc_ptr + 1, mask=mask, other=0.0))
                    / tl.load(desc_ptr + 3, mask=mask, other=1.0), 0.0)


@triton.jit
def _first_rejected(tlog_ptr, t_stride, V, dlog_ptr, d_stride, Vd, t2d_ptr, draft_ids_ptr, K, tdesc_ptr,
                    ddesc_ptr, tids_ptr, b, sampled, seed, off, HAS_T2D: tl.constexpr, KP: tl.constexpr):
    """Sequence b's first rejected draft position a (K: none), the positions j [KP], the drafts and the target
    rows' own samples at j. A draft id outside [0, V) is rejected unread."""
    j = tl.arange(0, KP)
    jd = j < K
    dt = tl.load(draft_ids_ptr + b * K + j, mask=jd, other=0).to(tl.int32)
    dv = jd & (dt >= 0) & (dt < V)
    dd = dt
    if HAS_T2D:
        dd = tl.load(t2d_ptr + dt, mask=dv, other=-1)
    rt, rd = b * (K + 1) + j, b * K + j
    dm = dv & (dd >= 0) & (dd < Vd)
    pv = _prob(tl.load(tlog_ptr + rt.to(tl.int64) * t_stride + dt, mask=dv, other=0.0), tdesc_ptr + rt * 4, dv)
    qv = _prob(tl.load(dlog_ptr + rd.to(tl.int64) * d_stride + dd, mask=dm, other=0.0), ddesc_ptr + rd * 4, dm)
    tid = tl.load(tids_ptr + rt, mask=j <= K, other=-1)
    u = uniform(seed, j, b, off, ACCEPT)
    ok = dv & tl.where(sampled, (qv > 0.0) & (u * qv <= pv), dt == tid)
    return tl.min(tl.where(jd & ~ok, j, K), 0), j, dt, tid


@triton.jit
def _verdict_kernel(tlog_ptr, t_stride, V, dlog_ptr, d_stride, Vd, t2d_ptr, draft_ids_ptr, temp_ptr, K,
                    tdesc_ptr, ddesc_ptr, tids_ptr, seed_ptr, offset_ptr, best_ptr, best_idx_ptr, NB, NPROG,
                    seq_ticket_ptr, ticket_ptr, B, out_ptr, n_emit_ptr,
                    HAS_T2D: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, NBP: tl.constexpr,
                    PDL: tl.constexpr):
    """grid (B, NPROG): every program finds sequence b's first rejected position a and races its blocks j,
    j + NPROG, … of r = max(p − q, 0) there; the sequence's last program emits the accepted drafts, then the
    correction (the race's winner) or the bonus (the last target row's sample)."""
    bq, j = tl.program_id(0), tl.program_id(1)
    sampled = tl.load(temp_ptr + bq) > 0.0
    pdl_wait(PDL)
    seed, off = tl.load(seed_ptr), tl.load(offset_ptr)
    a, jk, dt, tid = _first_rejected(tlog_ptr, t_stride, V, dlog_ptr, d_stride, Vd, t2d_ptr, draft_ids_ptr, K,
                                     tdesc_ptr, ddesc_ptr, tids_ptr, bq, sampled, seed, off, HAS_T2D, KP)
    race = sampled & (a < K)
    best, best_i = tl.zeros([], tl.float32) + float("-inf"), tl.zeros([], tl.int32)
    if race:
        rr = bq * K + a            # the draft row, and the race's Philox row
        rt = bq * (K + 1) + a
        for blk in range(j, NB, NPROG):
            offs = blk * BLOCK + tl.arange(0, BLOCK)
            valid = offs < V
            pv = _prob(tl.load(tlog_ptr + rt.to(tl.int64) * t_stride + offs, mask=valid, other=0.0),
                       tdesc_ptr + rt * 4 + offs * 0, valid)
            d = offs
            if HAS_T2D:
                d = tl.load(t2d_ptr + offs, mask=valid, other=-1)
            dm = valid & (d >= 0) & (d < Vd)
            qv = _prob(tl.load(dlog_ptr + rr.to(tl.int64) * d_stride + d, mask=dm, other=0.0),
                       ddesc_ptr + rr * 4 + offs * 0, dm)
            res = pv - qv
            if tl.max(res, 0) > 0.0:   # most blocks lie outside the target's support
                # log r − log E: argmax r / E
                s_b, i_b = exp_race(tl.log(tl.where(res > 0, res, 1.0)), res > 0, 0.0, offs, seed, rr, off, RESIDUAL)
                best, best_i = merge_race(best, best_i, s_b, i_b)
    tl.store(best_ptr + bq * NBP + j, best)
    tl.store(best_idx_ptr + bq * NBP + j, best_i)
    # the acq_rel ticket orders every program's stores before the last one's reads
    tl.debug_barrier()
    if tl.atomic_add(seq_ticket_ptr + bq, 1, sem="acq_rel") == NPROG - 1:
        tl.store(seq_ticket_ptr + bq, 0)
        emitted = tl.sum(tl.where(jk == a, tid, 0), 0)
        if race:   # r == 0 everywhere falls back to p (its own sample)
            bs, b_idx, i = program_races(best_ptr + bq * NBP, best_idx_ptr + bq * NBP, NPROG, NBP)
            if tl.max(bs, 0) > float("-inf"):
                emitted = race_winner(bs, b_idx, i)
        tl.store(out_ptr + bq * (K + 1) + jk, tl.where(jk < a, dt, tl.where(jk == a, emitted, -1)), mask=jk <= K)
        tl.store(n_emit_ptr + bq, a + 1)
    advance(offset_ptr, off, ticket_ptr, B * NPROG)



def launch(t_rows, d_rows, B, K, draft_ids, params, seed, offset, ws, t_ids, t_desc, d_desc, t2d, cfg: Config):
    """rejection_sample's verdict into ws.out, ws.num_emitted."""
    V, Vd = t_rows.shape[1], d_rows.shape[1]
    nb, nbp = ws.target.nb, ws.target.nbp
    nprog, pdl = programs(B, nb, t_rows.device), gpu.pdl_args(t_rows.device)
    _verdict_kernel[(B, nprog)](t_rows, t_rows.stride(0), V, d_rows, d_rows.stride(0), Vd,
                                t2d if t2d is not None else t_ids, draft_ids, params.temperature, K, t_desc, d_desc,
                                t_ids, seed, offset, ws.best, ws.best_idx, nb, nprog, ws.seq_ticket, ws.ticket, B,
                                ws.out, ws.num_emitted, HAS_T2D=t2d is not None, KP=triton.next_power_of_2(K + 1),
                                BLOCK=cfg.block, NBP=nbp, num_warps=cfg.warps, **pdl)
