"""The sampling passes over logits [R, V] (row r's parameters at r // ROW_DIV): stats, grid (R, NB): per block
max, Σexp, argmax of x; level l, grid (R, NPROG), program j taking blocks j, j + NPROG, …: counts (top-p-only
rows: masses) at P pivots in the bracket [lo, hs) that holds the threshold, narrowed to one pivot gap by the next
pass; compact, grid (R, NPROG): copies the <= CAP candidates out, races and sums the elements surely kept;
resolve, grid (R,): sorts the candidates, takes the exact threshold and races them (a tie group over CAP at the
cut: bisection over the row)."""
import torch
import triton
import triton.language as tl

from kernels import device as gpu
from kernels.device import pdl_wait
from kernels.sampler.common import (RACE, Config, advance, combine_blocks, config, exp_race, merge_race,
                                    program_races, programs, race_winner, scale)

DEPTH = tl.constexpr(64.0)      # nats below the max covered by the first level (exp(−64) is below fp32 relevance)
NSTATE = tl.constexpr(7)        # bracket state: lo, hs, count(x >= lo), count(x >= hs), mass(x >= hs), M, Z


class SamplerWorkspace:
    """Every buffer the passes touch, for up to `rows` rows; allocated before graph capture."""

    def __init__(self, rows, vocab, device, cfg: Config = None):
        cfg = cfg or config(rows, vocab, device)
        self.cfg, self.rows, self.vocab = cfg, rows, vocab
        self.nb = triton.cdiv(vocab, cfg.block)
        self.nbp = triton.next_power_of_2(self.nb)
        f32, i32 = dict(dtype=torch.float32, device=device), dict(dtype=torch.int32, device=device)
        self.pmax, self.psum, self.parg = torch.empty(rows, self.nbp, **f32), torch.empty(rows, self.nbp, **f32), \
            torch.empty(rows, self.nbp, **i32)
        self.piv = torch.empty(rows, cfg.levels, cfg.pivots, **f32)
        self.cnt = torch.zeros(rows, cfg.levels, cfg.pivots, **i32)
        self.mass = torch.zeros(rows, cfg.levels, cfg.pivots, **f32)
        self.state = torch.empty(rows, cfg.levels + 1, NSTATE.value, **f32)
        self.cand_n, self.zs = torch.zeros(rows, **i32), torch.zeros(rows, **f32)
        self.cand_val, self.cand_idx = torch.empty(rows, cfg.cap, **f32), torch.empty(rows, cfg.cap, **i32)
        self.best, self.best_idx = torch.empty(rows, self.nbp, **f32), torch.empty(rows, self.nbp, **i32)
        self.ticket = torch.zeros(1, **i32)
        self.ids, self.desc = torch.empty(rows, **i32), torch.empty(rows, 4, **f32)


@triton.jit
def _params(r, ROW_DIV, temp_ptr, topk_ptr, topp_ptr, V):
    pr = r // ROW_DIV
    t = tl.load(temp_ptr + pr).to(tl.float32)
    k = tl.load(topk_ptr + pr).to(tl.int32)
    p = tl.load(topp_ptr + pr).to(tl.float32)
    sampled = t > 0.0
    # correctly rounded, as engine/sampling.scaled_logits (Triton's `/` is approximate on GPUs)
    inv_t = tl.math.div_rn(tl.full((), 1.0, tl.float32), tl.where(sampled, t, 1.0))
    return inv_t, k, p, sampled, sampled & (k > 0) & (k < V), sampled & (p < 1.0)


@triton.jit
def _load_x(row_ptr, offs, V, inv_t):
    """Scaled logits, −inf past V."""
    return scale(tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")), inv_t)


@triton.jit
def _next_block(row_ptr, pmax_row, b, NB, V, inv_t, BLOCK: tl.constexpr):
    """Block b's scaled logits and stats maximum (block NB − 1's past the end), requested one block ahead."""
    return _load_x(row_ptr, b * BLOCK + tl.arange(0, BLOCK), V, inv_t), tl.load(pmax_row + tl.minimum(b, NB - 1))


@triton.jit
def _key(x):
    """fp32 -> int64 with the same order (−0.0 folded into +0.0)."""
    b = (x + 0.0).to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b).to(tl.int64)


@triton.jit
def _unkey(k):
    b = k.to(tl.int32)
    return tl.where(b < 0, b ^ 0x7FFFFFFF, b).to(tl.float32, bitcast=True)


@triton.jit
def _max_and_mass(pmax_ptr, psum_ptr, NB, NBP: tl.constexpr):
    pm, i = combine_blocks(pmax_ptr, NB, NBP)
    M = tl.max(pm, 0)
    return M, tl.sum(tl.load(psum_ptr + i, mask=i < NB, other=0.0) * tl.exp(pm - M), 0), pm


@triton.jit
def _load_state(st):
    return (tl.load(st + 0), tl.load(st + 1), tl.load(st + 2), tl.load(st + 3),
            tl.load(st + 4), tl.load(st + 5), tl.load(st + 6))


@triton.jit
def _store_state(st, lo, hs, clo, chs, mhs, M, Z):
    tl.store(st + 0, lo)
    tl.store(st + 1, hs)
    tl.store(st + 2, clo)
    tl.store(st + 3, chs)
    tl.store(st + 4, mhs)
    tl.store(st + 5, M)
    tl.store(st + 6, Z)


@triton.jit
def _classify(lo, hs, clo, chs, M, kact, pact, CAP: tl.constexpr):
    """-> (resolved: lo is the threshold, fits: the candidates fit CAP, tie: the bracket holds lo alone)."""
    tie = (_key(hs) - _key(lo) <= 1) | (lo >= M)
    fits = clo - tl.where(kact & pact, 0.0, chs) <= CAP
    return tie & ~(kact & pact), fits, tie


@triton.jit
def _choose(lo, hs, clo, chs, mhs, t, cnt, mass, kact, k, target, P: tl.constexpr):
    """The new bracket: the gap between the last of the pivots t [P] above the threshold and the next."""
    i = tl.arange(0, P)
    c = chs + cnt.to(tl.float32)
    m = mhs + mass
    # first pivot failing the criterion (robust to atomically summed masses that are not monotone)
    a = tl.min(tl.where(tl.where(kact, c < k, m < target), P, i), 0)
    up, dn = i == a - 1, i == a
    return (tl.where(a < P, tl.sum(tl.where(dn, t, 0.0), 0), lo), tl.where(a > 0, tl.sum(tl.where(up, t, 0.0), 0), hs),
            tl.where(a < P, tl.sum(tl.where(dn, c, 0.0), 0), clo), tl.where(a > 0, tl.sum(tl.where(up, c, 0.0), 0), chs),
            tl.where(a > 0, tl.sum(tl.where(up, m, 0.0), 0), mhs))


@triton.jit
def _pivot_sums(xb, M, t2, gi, cnt, mass, with_mass, PG: tl.constexpr):
    """cnt, mass [P // PG, PG] += count and Σ exp(x − M) of xb >= each pivot t2 (pivot g·PG + c at [g, c])."""
    if with_mass:
        e = tl.exp(xb - M)
    else:
        e = tl.zeros(xb.shape, tl.float32)
    for g in tl.static_range(t2.shape[0]):
        tg = tl.sum(tl.where(gi == g, t2, 0.0), 0)
        ge = xb[:, None] >= tg[None, :]
        cnt += tl.where(gi == g, tl.sum(ge.to(tl.int32), 0)[None, :], 0)
        if with_mass:
            mass += tl.where(gi == g, tl.sum(tl.where(ge, e[:, None], 0.0), 0)[None, :], 0.0)
    return cnt, mass


@triton.jit
def _block_floor(pm, t2, gi, k, PG: tl.constexpr):
    """The first pivot that k block maxima pm reach (−inf if none): the top-k threshold lies at or above it, so
    counts over the elements from it up are exact for every pivot the search reads."""
    bc, _ = _pivot_sums(pm, 0.0, t2, gi, tl.zeros(t2.shape, tl.int32), tl.zeros(t2.shape, tl.float32), False, PG)
    P: tl.constexpr = t2.shape[0] * t2.shape[1]
    idx = gi * PG + tl.arange(0, PG)[None, :]
    a = tl.min(tl.min(tl.where(bc >= k, idx, P), 1), 0)
    return tl.where(a < P, tl.sum(tl.sum(tl.where(idx == a, t2, 0.0), 1), 0), float("-inf"))


@triton.jit
def _pivots(lo, hs, M, LEVEL: tl.constexpr, P: tl.constexpr):
    """P descending pivots: level 0 quadratic over [M − DEPTH, M] (t_0 = M isolates the top tie group); later
    levels even over [max(lo, hs − DEPTH), hs), the last just above lo (isolates a tie group at lo)."""
    i = tl.arange(0, P).to(tl.float32)
    if LEVEL == 0:
        u = i / (P - 1)
        t = M - DEPTH * (u * u)
    else:
        base = tl.maximum(lo, hs - DEPTH)
        t = base + (hs - base) * ((P - 1 - i) / P)
        above_lo = _unkey(_key(lo) + 1)
        t = tl.where(i == P - 1, above_lo, tl.maximum(t, above_lo))
    return t


@triton.jit
def _prev_state(r, st_ptr, piv_ptr, cnt_ptr, mass_ptr, L, kact, pact, k, p, NLEV: tl.constexpr,
                P: tl.constexpr, CAP: tl.constexpr):
    """The bracket after level L − 1: the stored state before it, narrowed by its pivots if it ran."""
    lo, hs, clo, chs, mhs, M, Z = _load_state(st_ptr + (r * (NLEV + 1) + L - 1) * NSTATE)
    # loaded with the state, used or not: one memory round trip instead of two
    i = (r * NLEV + L - 1) * P + tl.arange(0, P)
    t, c, m = tl.load(piv_ptr + i), tl.load(cnt_ptr + i), tl.load(mass_ptr + i)
    resolved, fits, tie = _classify(lo, hs, clo, chs, M, kact, pact, CAP)
    if ~tie & ~fits:
        lo, hs, clo, chs, mhs = _choose(lo, hs, clo, chs, mhs, t, c, m, kact, k, p * Z, P)
    return lo, hs, clo, chs, mhs, M, Z


@triton.jit
def _stats_kernel(logits_ptr, stride, V, temp_ptr, topk_ptr, topp_ptr, ROW_DIV,
                  pmax_ptr, psum_ptr, parg_ptr, cnt_ptr, mass_ptr, cand_n_ptr, zs_ptr,
                  LP: tl.constexpr, LPP: tl.constexpr, BLOCK: tl.constexpr, NBP: tl.constexpr, PDL: tl.constexpr):
    r, b = tl.program_id(0), tl.program_id(1)
    inv_t, k, p, sampled, kact, pact = _params(r, ROW_DIV, temp_ptr, topk_ptr, topp_ptr, V)
    pdl_wait(PDL)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    x = _load_x(logits_ptr + r.to(tl.int64) * stride, offs, V, inv_t)
    m = tl.max(x, 0)
    tl.store(pmax_ptr + r * NBP + b, m)
    tl.store(psum_ptr + r * NBP + b, tl.sum(tl.exp(x - tl.where(m == float("-inf"), 0.0, m)), 0))
    tl.store(parg_ptr + r * NBP + b, b * BLOCK + tl.argmax(x, 0))
    if b == 0:  # zero the row's accumulators
        i = tl.arange(0, LPP)
        tl.store(cnt_ptr + r * LP + i, 0, mask=i < LP)
        tl.store(mass_ptr + r * LP + i, 0.0, mask=i < LP)
        tl.store(cand_n_ptr + r, 0)
        tl.store(zs_ptr + r, 0.0)


@triton.jit
def _level_kernel(logits_ptr, stride, V, temp_ptr, topk_ptr, topp_ptr, ROW_DIV, pmax_ptr, psum_ptr, NB, NPROG,
                  st_ptr, piv_ptr, cnt_ptr, mass_ptr,
                  LEVEL: tl.constexpr, NLEV: tl.constexpr, P: tl.constexpr, PG: tl.constexpr,
                  CAP: tl.constexpr, BLOCK: tl.constexpr, NBP: tl.constexpr, PDL: tl.constexpr):
    r, j = tl.program_id(0), tl.program_id(1)
    inv_t, k, p, sampled, kact, pact = _params(r, ROW_DIV, temp_ptr, topk_ptr, topp_ptr, V)
    pdl_wait(PDL)
    row_ptr = logits_ptr + r.to(tl.int64) * stride
    x_next = _load_x(row_ptr, j * BLOCK + tl.arange(0, BLOCK), V, inv_t)   # requested before the bracket is known
    if kact | pact:
        if LEVEL == 0:
            M, Z, pm = _max_and_mass(pmax_ptr + r * NBP, psum_ptr + r * NBP, NB, NBP)
            zero = tl.zeros([], tl.float32)
            lo, hs, clo, chs, mhs = zero + float("-inf"), zero + float("inf"), zero + V, zero, zero
        else:
            lo, hs, clo, chs, mhs, M, Z = _prev_state(r, st_ptr, piv_ptr, cnt_ptr, mass_ptr, LEVEL, kact, pact,
                                                      k, p, NLEV, P, CAP)
        if j == 0:
            _store_state(st_ptr + (r * (NLEV + 1) + LEVEL) * NSTATE, lo, hs, clo, chs, mhs, M, Z)
        resolved, fits, tie = _classify(lo, hs, clo, chs, M, kact, pact, CAP)
        if ~tie & ~fits:
            t = _pivots(lo, hs, M, LEVEL, P)
            data = (r * NLEV + LEVEL) * P
            if j == 0:
                tl.store(piv_ptr + data + tl.arange(0, P), t)
            mass_rows = pact & ~kact
            t2 = tl.reshape(t, [P // PG, PG])
            gi = tl.arange(0, P // PG)[:, None]
            zero2 = tl.zeros([P // PG, PG], tl.int32)   # counts and masses of pivot g·PG + c at [g, c]
            floor = tl.zeros([], tl.float32) + float("-inf")
            if LEVEL == 0:
                if kact:
                    floor = _block_floor(pm, t2, gi, k, PG)
            low = tl.maximum(lo, floor)
            cnt, mass = zero2, zero2.to(tl.float32)
            pm_next = tl.load(pmax_ptr + r * NBP + j)
            for b in range(j, NB, NPROG):
                x, pm_b = x_next, pm_next
                x_next, pm_next = _next_block(row_ptr, pmax_ptr + r * NBP, b + NPROG, NB, V, inv_t, BLOCK)
                if pm_b >= low:   # (a block of only elements >= hs counts zeros)
                    xb = tl.where((x >= low) & (x < hs), x, float("-inf"))
                    cnt, mass = _pivot_sums(xb, M, t2, gi, cnt, mass, mass_rows, PG)
            if tl.sum(tl.sum(cnt, 1), 0) > 0:
                # relaxed: only the sums matter, read by the next kernel
                at = data + gi * PG + tl.arange(0, PG)[None, :]
                tl.atomic_add(cnt_ptr + at, cnt, sem="relaxed")
                if mass_rows:
                    tl.atomic_add(mass_ptr + at, mass, sem="relaxed")


@triton.jit
def _compact_kernel(logits_ptr, stride, V, temp_ptr, topk_ptr, topp_ptr, ROW_DIV, pmax_ptr, NB, NPROG,
                    st_ptr, piv_ptr, cnt_ptr, mass_ptr, cand_n_ptr, cand_val_ptr, cand_idx_ptr, zs_ptr,
                    best_ptr, best_idx_ptr, seed_ptr, offset_ptr,
                    NLEV: tl.constexpr, P: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, NBP: tl.constexpr,
                    PDL: tl.constexpr):
    r, j = tl.program_id(0), tl.program_id(1)
    inv_t, k, p, sampled, kact, pact = _params(r, ROW_DIV, temp_ptr, topk_ptr, topp_ptr, V)
    pdl_wait(PDL)
    row_ptr = logits_ptr + r.to(tl.int64) * stride
    x_next = _load_x(row_ptr, j * BLOCK + tl.arange(0, BLOCK), V, inv_t)   # requested before the bracket is known
    seed, off = tl.load(seed_ptr), tl.load(offset_ptr)
    pm, _ = combine_blocks(pmax_ptr + r * NBP, NB, NBP)
    M = tl.max(pm, 0)
    best, best_i = tl.zeros([], tl.float32) + float("-inf"), tl.zeros([], tl.int32)
    if sampled:
        t_race = tl.zeros([], tl.float32) + float("-inf")   # untruncated rows race everything here
        lo, hi, collect = t_race, t_race, kact & ~kact
        if kact | pact:
            lo, hs, clo, chs, mhs, M, Z = _prev_state(r, st_ptr, piv_ptr, cnt_ptr, mass_ptr, NLEV, kact, pact,
                                                      k, p, NLEV, P, CAP)
            if j == 0:
                _store_state(st_ptr + (r * (NLEV + 1) + NLEV) * NSTATE, lo, hs, clo, chs, mhs, M, Z)
            resolved, fits, tie = _classify(lo, hs, clo, chs, M, kact, pact, CAP)
            # top-k with top-p: every element >= lo is a candidate (the top-p cut needs the whole top-k set);
            # otherwise the elements above the bracket are surely kept, raced and summed here
            hi = tl.where(kact & pact, float("inf"), hs)
            t_race = tl.where(resolved, lo, tl.where(fits, hi, float("inf")))
            collect = fits & ~resolved
        kept = tl.zeros([], tl.float32)
        low = tl.minimum(t_race, tl.where(collect, lo, float("inf")))   # below it an element plays no part
        pm_next = tl.load(pmax_ptr + r * NBP + j)
        for b in range(j, NB, NPROG):
            offs = b * BLOCK + tl.arange(0, BLOCK)
            x, pm_b = x_next, pm_next
            x_next, pm_next = _next_block(row_ptr, pmax_ptr + r * NBP, b + NPROG, NB, V, inv_t, BLOCK)
            if pm_b >= low:
                kept += tl.sum(tl.where(x >= t_race, tl.exp(x - M), 0.0), 0)
                if collect:
                    w = (x >= lo) & (x < hi)
                    n_here = tl.sum(w.to(tl.int32), 0)
                    if n_here > 0:
                        base = tl.atomic_add(cand_n_ptr + r, n_here, sem="relaxed")
                        pos = base + tl.cumsum(w.to(tl.int32), 0) - 1
                        tl.store(cand_val_ptr + r * CAP + pos, x, mask=w & (pos < CAP))
                        tl.store(cand_idx_ptr + r * CAP + pos, offs, mask=w & (pos < CAP))
                sel = (offs < V) & (x >= t_race)
                if tl.max(sel.to(tl.int32), 0) > 0:
                    s_b, i_b = exp_race(x, sel, M, offs, seed, r, off, RACE)
                    best, best_i = merge_race(best, best_i, s_b, i_b)
        if (kact | pact) & (kept > 0.0):
            tl.atomic_add(zs_ptr + r, kept, sem="relaxed")
    tl.store(best_ptr + r * NBP + j, best)
    tl.store(best_idx_ptr + r * NBP + j, best_i)


@triton.jit
def _stream(row_ptr, V, inv_t, M, t, BLOCK: tl.constexpr):
    """(count, mass) of x >= t over a whole row, by one program (the exact fallback)."""
    c = tl.zeros([], tl.int32)
    m = tl.zeros([], tl.float32)
    for start in range(0, V, BLOCK):
        x = _load_x(row_ptr, start + tl.arange(0, BLOCK), V, inv_t)
        c += tl.sum((x >= t).to(tl.int32), 0)
        m += tl.sum(tl.where(x >= t, tl.exp(x - M), 0.0), 0)
    return c, m


@triton.jit
def _fallback(row_ptr, V, inv_t, M, Z, lo, hs, kact, pact, k, p, seed, r, off, BLOCK: tl.constexpr):
    """Exact threshold by bisection over the fp32 order (streaming the row per step), then the race."""
    lo_k, hi_k = _key(lo), _key(hs)
    tk = tl.zeros([], tl.float32) + float("-inf")
    zk = Z
    if kact:   # largest value with >= k elements at or above it
        while hi_k - lo_k > 1:
            mid = lo_k + (hi_k - lo_k) // 2
            c, m = _stream(row_ptr, V, inv_t, M, _unkey(mid), BLOCK)
            lo_k, hi_k = tl.where(c >= k, mid, lo_k), tl.where(c >= k, hi_k, mid)
        tk = _unkey(lo_k)
        c, zk = _stream(row_ptr, V, inv_t, M, tk, BLOCK)
        lo_k, hi_k = _key(tk), _key(tl.zeros([], tl.float32) + float("inf"))
    tp = tl.zeros([], tl.float32) + float("-inf")
    if pact:   # largest value whose mass at or above it reaches p of the top-k mass
        while hi_k - lo_k > 1:
            mid = lo_k + (hi_k - lo_k) // 2
            c, m = _stream(row_ptr, V, inv_t, M, _unkey(mid), BLOCK)
            lo_k, hi_k = tl.where(m >= p * zk, mid, lo_k), tl.where(m >= p * zk, hi_k, mid)
        tp = _unkey(lo_k)
    tau = tl.minimum(tl.maximum(tk, tp), M)
    c, zs = _stream(row_ptr, V, inv_t, M, tau, BLOCK)
    best, best_i = tl.zeros([], tl.float32) + float("-inf"), tl.zeros([], tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = _load_x(row_ptr, offs, V, inv_t)
        s, i = exp_race(x, (offs < V) & (x >= tau), M, offs, seed, r, off, RACE)
        best, best_i = merge_race(best, best_i, s, i)
    return tau, zs, best, best_i


@triton.jit
def _candidates(cv, ci, n, kact, pact, rank, p, M, Z, above, seed, r, off):
    """Threshold, kept mass and race winner from the n candidates cv (ids ci); `above`: the mass above them."""
    C: tl.constexpr = cv.shape[0]
    j = tl.arange(0, C)
    s = tl.sort(cv, descending=True)
    e = tl.exp(s - M)
    tk = tl.where(kact, tl.max(tl.where(j == rank - 1, s, float("-inf")), 0), float("-inf"))
    zk = tl.where(kact, above + tl.sum(tl.where(s >= tk, e, 0.0), 0), Z)
    cum = above + tl.cumsum(e, 0)
    # first sorted position whose inclusive mass reaches p (min(): robust to a non-monotone parallel cumsum)
    first = tl.minimum(tl.min(tl.where(cum >= p * zk, j, C), 0), n - 1)
    tp = tl.where(pact, tl.max(tl.where(j == first, s, float("-inf")), 0), float("-inf"))
    tau = tl.minimum(tl.maximum(tk, tp), M)
    best, tok = exp_race(cv, (j < n) & (cv >= tau), M, ci, seed, r, off, RACE)
    return tau, above + tl.sum(tl.where(s >= tau, e, 0.0), 0), best, tok


@triton.jit
def _resolve_kernel(logits_ptr, stride, V, temp_ptr, topk_ptr, topp_ptr, ROW_DIV, pmax_ptr, psum_ptr, parg_ptr, NB,
                    NPROG, st_ptr, cand_n_ptr, cand_val_ptr, cand_idx_ptr, zs_ptr, best_ptr, best_idx_ptr,
                    seed_ptr, offset_ptr, ticket_ptr, n_rows, d2t_ptr, ids_ptr, ids_stride, desc_ptr, desc_stride,
                    NLEV: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr, TINY: tl.constexpr,
                    BLOCK: tl.constexpr, NBP: tl.constexpr, HAS_D2T: tl.constexpr, ADVANCE: tl.constexpr,
                    PDL: tl.constexpr):
    """Each row's token and descriptor."""
    r = tl.program_id(0)
    inv_t, k, p, sampled, kact, pact = _params(r, ROW_DIV, temp_ptr, topk_ptr, topp_ptr, V)
    pdl_wait(PDL)
    seed, off = tl.load(seed_ptr), tl.load(offset_ptr)
    # every independent load first: their latencies overlap
    lo, hs, clo, chs, mhs, M_st, Z_st = _load_state(st_ptr + (r * (NLEV + 1) + NLEV) * NSTATE)
    n = tl.load(cand_n_ptr + r)
    above = tl.load(zs_ptr + r)
    j = tl.arange(0, SMALL)
    cv, ci = tl.load(cand_val_ptr + r * CAP + j), tl.load(cand_idx_ptr + r * CAP + j)
    jt = tl.arange(0, TINY)
    cvt, cit = tl.load(cand_val_ptr + r * CAP + jt), tl.load(cand_idx_ptr + r * CAP + jt)
    bs, b_idx, i = program_races(best_ptr + r * NBP, best_idx_ptr + r * NBP, NPROG, NBP)
    M, Z, pm = _max_and_mass(pmax_ptr + r * NBP, psum_ptr + r * NBP, NB, NBP)
    pa = tl.load(parg_ptr + r * NBP + i, mask=i < NB, other=0)
    tok = tl.sum(tl.where(i == tl.min(tl.where(pm == M, i, NBP), 0), pa, 0), 0)   # greedy: first argmax
    tau, zs = M, tl.zeros([], tl.float32) + 1.0
    if sampled:
        best = tl.max(bs, 0)
        tok = race_winner(bs, b_idx, i)
        tau, zs = tl.zeros([], tl.float32) + float("-inf"), Z
        if kact | pact:
            M, Z = M_st, Z_st
            resolved, fits, tie = _classify(lo, hs, clo, chs, M, kact, pact, CAP)
            row_ptr = logits_ptr + r.to(tl.int64) * stride
            if resolved:
                tau, zs = lo, above
            elif fits:
                rank = k - tl.where(pact, 0.0, chs).to(tl.int32)   # top-k only: the bracket holds ranks > chs
                if n <= TINY:   # the usual case (top-k 20)
                    tau, zs, cbest, ctok = _candidates(tl.where(jt < n, cvt, float("-inf")), cit, n, kact, pact,
                                                       rank, p, M, Z, above, seed, r, off)
                elif n <= SMALL:
                    tau, zs, cbest, ctok = _candidates(tl.where(j < n, cv, float("-inf")), ci, n, kact, pact, rank,
                                                       p, M, Z, above, seed, r, off)
                else:
                    jc = tl.arange(0, CAP)
                    tau, zs, cbest, ctok = _candidates(
                        tl.load(cand_val_ptr + r * CAP + jc, mask=jc < n, other=float("-inf")),
                        tl.load(cand_idx_ptr + r * CAP + jc, mask=jc < n, other=0), n, kact, pact, rank, p, M, Z,
                        above, seed, r, off)
                tok = tl.where(cbest > best, ctok, tok)
            else:
                tau, zs, fbest, tok = _fallback(row_ptr, V, inv_t, M, Z, lo, hs, kact, pact, k, p, seed, r, off,
                                                BLOCK)
    # a row of no logit above −inf names token 0 and keeps nothing (tau = +inf: p ≡ 0); the clamp guards d2t
    empty = M == float("-inf")
    tok = tl.where(empty, 0, tl.minimum(tl.maximum(tok, 0), V - 1))
    if HAS_D2T:   # target id = draft id + d2t[draft id]
        tok += tl.load(d2t_ptr + tok)
    tl.store(ids_ptr + r * ids_stride, tok)
    tl.store(desc_ptr + r * desc_stride + 0, tl.where(sampled, inv_t, 0.0))
    tl.store(desc_ptr + r * desc_stride + 1, M)
    tl.store(desc_ptr + r * desc_stride + 2, tl.where(empty, float("inf"), tau))
    tl.store(desc_ptr + r * desc_stride + 3, zs)
    if ADVANCE:
        advance(offset_ptr, off, ticket_ptr, n_rows)


def launch(logits, params, seed, offset, ws, ids, desc, rows_per_param, d2t, advance_offset, cfg: Config):
    """sample's passes over logits [R, V] into ids [R], desc [R, 4], with cfg's launch parameters."""
    R, V = logits.shape
    c, nb, nbp = cfg, ws.nb, ws.nbp
    rows = (logits, logits.stride(0), V, params.temperature, params.top_k, params.top_p, rows_per_param)
    nprog, pdl = programs(R, nb, logits.device), gpu.pdl_args(logits.device)
    _stats_kernel[(R, nb)](*rows, ws.pmax, ws.psum, ws.parg, ws.cnt, ws.mass, ws.cand_n, ws.zs,
                           LP=c.levels * c.pivots, LPP=triton.next_power_of_2(c.levels * c.pivots), BLOCK=c.block,
                           NBP=nbp, num_warps=c.warps, **pdl)
    for level in range(c.levels):
        _level_kernel[(R, nprog)](*rows, ws.pmax, ws.psum, nb, nprog, ws.state, ws.piv, ws.cnt, ws.mass,
                                  LEVEL=level, NLEV=c.levels, P=c.pivots, PG=c.group, CAP=c.cap, BLOCK=c.block,
                                  NBP=nbp, num_warps=c.wide_warps, **pdl)
    _compact_kernel[(R, nprog)](*rows, ws.pmax, nb, nprog, ws.state, ws.piv, ws.cnt, ws.mass, ws.cand_n,
                                ws.cand_val, ws.cand_idx, ws.zs, ws.best, ws.best_idx, seed, offset,
                                NLEV=c.levels, P=c.pivots, CAP=c.cap, BLOCK=c.block, NBP=nbp, num_warps=c.warps, **pdl)
    _resolve_kernel[(R,)](*rows, ws.pmax, ws.psum, ws.parg, nb, nprog, ws.state, ws.cand_n, ws.cand_val,
                          ws.cand_idx, ws.zs, ws.best, ws.best_idx, seed, offset, ws.ticket, R,
                          ids if d2t is None else d2t, ids, ids.stride(0), desc, desc.stride(0),
                          NLEV=c.levels, CAP=c.cap, SMALL=max(c.cap // 8, 2), TINY=max(c.cap // 32, 2), BLOCK=c.block,
                          NBP=nbp, HAS_D2T=d2t is not None, ADVANCE=advance_offset, num_warps=c.wide_warps, **pdl)
