"""Sort-free, CUDA-graph-capturable sampling over a 248k vocabulary: temperature, top-k, top-p, and exact
speculative rejection sampling (ENGINE.md §2, §3, §6). Plain-torch reference: engine/sampling.py, whose
`support` docstring states the truncation semantics (value thresholds: a tie group is kept or dropped whole).

Per row, passes over its blocks of `block` elements (stats, `levels` level passes, compact) then one program per
row (resolve); no sort of the vocabulary and no host sync. stats has a program per block; level and compact
programs each take every NPROG-th block (one wave of programs over all rows; per-row decisions and atomics are
paid per program, and the next block is requested while one is processed):
  stats    per block: max, Σexp, argmax of x = logits / T.
  level l  P pivots inside the bracket [lo, hs) known to hold the threshold; each program counts (and, for
           top-p-only rows, sums exp of) its bracket elements >= each pivot; sums are atomics. The next pass
           narrows the bracket to one pivot gap. Level 0 spreads pivots over [M − 64, M], later ones evenly;
           for top-k rows it counts only elements at or above the first pivot that k block maxima reach (the
           threshold lies there or above, so the counts the search reads stay exact).
  compact  copies the <= CAP candidates out (the bracket; every element >= lo for top-k with top-p, whose cut
           needs the whole top-k set); races and sums the elements surely kept.
  resolve  one program per row sorts the candidates (a 64-, 256- or CAP-wide buffer), finds the exact threshold
           and races them. Rows whose bracket still overflows (a tie group larger than CAP at the cut) take an
           exact bisection over the row.
Level and compact passes skip a block whose maximum (from stats) lies below everything the pass needs; with top-k
rows most blocks do (H200, 5 rows + rejection: 43 -> 35 µs).
Sampling is an exponential race, argmax over the support of (x − M) − log E_v with E_v ~ Exp(1) drawn from
Philox(seed; v, row, offset, stream); seed and offset are device tensors and the last kernel advances offset.
Rejection sampling (rejection_sample) is one more pass: each sequence's first rejected draft position, the race
over the residual there, and the emitted tokens, by the sequence's last program to finish. Every kernel uses
programmatic dependent launch on sm_90+ (kernels/device.py).

Descriptors desc [rows, 4] = (1/T, M, tau, Zs) describe the processed distribution of a row:
p(v) = exp(x_v − M) / Zs for x_v >= tau, else 0 (1/T == 0 marks a greedy row), x as _scale reads the logits: +inf
saturates at FLT_MAX, NaN counts as −inf. Rejection sampling reads p and q through them. Padding rows should be
greedy: a row of equal logits under top-k and top-p takes the slow path, as does a top-k row with fewer +inf logits
than k (the level pivots collapse: FLT_MAX − 64 rounds to FLT_MAX)."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import device as gpu
from kernels.device import pdl_wait

RACE = tl.constexpr(0)          # Philox stream ids: keep the draws of different decisions independent
RESIDUAL = tl.constexpr(1)
ACCEPT = tl.constexpr(2)
FLT_MAX = tl.constexpr(3.4028234663852886e38)
DEPTH = tl.constexpr(64.0)      # nats below the max covered by the first level (exp(−64) is below fp32 relevance)
NSTATE = tl.constexpr(7)        # bracket state: lo, hs, count(x >= lo), count(x >= hs), mass(x >= hs), M, Z


@dataclass
class SamplingTensors:
    """Per-sequence sampling parameters as device tensors (they change per step inside a graph)."""
    temperature: torch.Tensor   # [B] f32, <= 0: greedy
    top_k: torch.Tensor         # [B] i32, 0 or >= V: off
    top_p: torch.Tensor         # [B] f32, >= 1: off

    @classmethod
    def of(cls, temperature, top_k, top_p, device):
        return cls(torch.tensor(temperature, dtype=torch.float32, device=device),
                   torch.tensor(top_k, dtype=torch.int32, device=device),
                   torch.tensor(top_p, dtype=torch.float32, device=device))


@dataclass(frozen=True)
class SamplerConfig:
    block: int = 1024           # vocabulary elements per program
    pivots: int = 32            # per level
    group: int = 8              # pivots compared per step (the [block, group] tile bounds registers)
    cap: int = 2048             # candidates resolved by one program
    levels: int = 3             # two leave 3.7k of a 151k-token top-p support (T 1.5, p .95) in the bracket


class SamplerWorkspace:
    """Every buffer the sampler touches, allocated once (before graph capture) for up to `rows` rows."""

    def __init__(self, rows, vocab, device, cfg: SamplerConfig = SamplerConfig()):
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


# ------------------------------------------------------------------------------------------- shared helpers
@triton.jit
def _params(r, ROW_DIV, temp_ptr, topk_ptr, topp_ptr, V):
    pr = r // ROW_DIV
    t = tl.load(temp_ptr + pr).to(tl.float32)
    k = tl.load(topk_ptr + pr).to(tl.int32)
    p = tl.load(topp_ptr + pr).to(tl.float32)
    sampled = t > 0.0
    # the correctly rounded reciprocal, as engine/sampling.scaled_logits (Triton's `/` is approximate on GPUs)
    inv_t = tl.math.div_rn(tl.full((), 1.0, tl.float32), tl.where(sampled, t, 1.0))
    return inv_t, k, p, sampled, sampled & (k > 0) & (k < V), sampled & (p < 1.0)


@triton.jit
def _scale(logit, inv_t):
    """logit · (1/T) in fp32, saturated at FLT_MAX, NaN (also 0 · inf from a subnormal T) -> −inf: +inf logits, and
    finite ones that overflow under 1/T, tie at the top and share its mass equally, and x − M is finite or −inf,
    never inf − inf; a NaN is never the argmax nor sampled (with NaN an argmax may land on a padding index past V)."""
    x = logit.to(tl.float32) * inv_t
    return tl.where(x == x, tl.minimum(x, FLT_MAX), float("-inf"))


@triton.jit
def _load_x(row_ptr, offs, V, inv_t):
    """Scaled logits as _scale reads them (engine/sampling.scaled_logits the same), −inf past V."""
    return _scale(tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")), inv_t)


@triton.jit
def _next_block(row_ptr, pmax_row, b, NB, V, inv_t, BLOCK: tl.constexpr):
    """Block b's scaled logits (−inf past V) and its stats maximum (block NB − 1's past the end): what the looping
    passes request one block ahead."""
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
def _bits(seed, idx, row, off, STREAM: tl.constexpr):
    z = idx * 0
    r0, r1, _, _ = tl.philox(seed, idx, z + row, z + off.to(tl.int32), z + STREAM)
    return r0, r1


@triton.jit
def _uniform(seed, idx, row, off, STREAM: tl.constexpr):
    r0, _ = _bits(seed, idx, row, off, STREAM)
    return ((r0 >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _exponential(seed, idx, row, off, STREAM: tl.constexpr):
    """E ~ Exp(1), resolved finely near 0 where the race is decided: −log1p(−v) by its series for v < 2^−8 (64 bits
    of v there), −log(1 − v) with 1 − v formed exactly in integers above."""
    r0, r1 = _bits(seed, idx, row, off, STREAM)
    v = (r0.to(tl.float32) + r1.to(tl.float32) * 2.3283064365386963e-10) * 2.3283064365386963e-10
    series = v * (1.0 + v * (0.5 + v * 0.3333333333333333))
    w = (4294967295 - r0).to(tl.float32) + 1.0
    return tl.where(r0 < 16777216, series, -tl.log(w * 2.3283064365386963e-10))


@triton.jit
def _race(x, sel, M, idx, seed, row, off, STREAM: tl.constexpr):
    """Best (score, index) of the exponential race over the selected elements; (−inf, idx[0]) if none."""
    score = tl.where(sel, (x - M) - tl.log(_exponential(seed, idx, row, off, STREAM)), float("-inf"))
    best = tl.max(score, 0)
    at = tl.argmax(score, 0)
    return best, tl.sum(tl.where(tl.arange(0, x.shape[0]) == at, idx, 0), 0)


@triton.jit
def _merge_race(best, best_i, s, i):
    """The race winner over what was raced so far (best, best_i) and one more block's (s, i); ties keep the first."""
    return tl.maximum(s, best), tl.where(s > best, i, best_i)


@triton.jit
def _combine_blocks(val_ptr, NB, NBP: tl.constexpr):
    i = tl.arange(0, NBP)
    return tl.load(val_ptr + i, mask=i < NB, other=float("-inf")), i


@triton.jit
def _program_races(best_ptr, best_idx_ptr, NPROG, NBP: tl.constexpr):
    """The NPROG programs' race results of one row (score, token; −inf where a program raced nothing) and their
    index vector."""
    bs, i = _combine_blocks(best_ptr, NPROG, NBP)
    return bs, tl.load(best_idx_ptr + i, mask=i < NPROG, other=0), i


@triton.jit
def _race_winner(bs, b_idx, i):
    """The token of the best race score (ties: the first program's)."""
    return tl.sum(tl.where(i == tl.argmax(bs, 0), b_idx, 0), 0)


@triton.jit
def _max_and_mass(pmax_ptr, psum_ptr, NB, NBP: tl.constexpr):
    pm, i = _combine_blocks(pmax_ptr, NB, NBP)
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
    """-> (resolved, fits, tie): tie when the bracket holds the single value lo; resolved when that value is the
    threshold (top-k and top-p together still need the kept elements to find the top-p cut); fits when the
    candidates fit the buffer: every element >= lo for top-k with top-p, the bracket [lo, hs) otherwise."""
    tie = (_key(hs) - _key(lo) <= 1) | (lo >= M)
    fits = clo - tl.where(kact & pact, 0.0, chs) <= CAP
    return tie & ~(kact & pact), fits, tie


@triton.jit
def _choose(lo, hs, clo, chs, mhs, t, cnt, mass, kact, k, target, P: tl.constexpr):
    """New bracket from one level's pivots t [P] and their counts and masses: the gap between the last pivot still
    above the threshold and the first one at or below it (fewer than k elements, or less than the target mass, lie
    above the threshold)."""
    i = tl.arange(0, P)
    c = chs + cnt.to(tl.float32)
    m = mhs + mass
    # first pivot failing the criterion; robust even if atomically summed masses are not monotone
    a = tl.min(tl.where(tl.where(kact, c < k, m < target), P, i), 0)
    up, dn = i == a - 1, i == a
    return (tl.where(a < P, tl.sum(tl.where(dn, t, 0.0), 0), lo), tl.where(a > 0, tl.sum(tl.where(up, t, 0.0), 0), hs),
            tl.where(a < P, tl.sum(tl.where(dn, c, 0.0), 0), clo), tl.where(a > 0, tl.sum(tl.where(up, c, 0.0), 0), chs),
            tl.where(a > 0, tl.sum(tl.where(up, m, 0.0), 0), mhs))


@triton.jit
def _pivot_sums(xb, M, t2, gi, cnt, mass, with_mass, PG: tl.constexpr):
    """cnt, mass [P // PG, PG] += count and Σ exp(x − M) of the elements of xb >= each pivot t2 (pivot g·PG + c at
    [g, c]; PG pivots per step bound the [len(xb), PG] compare tile)."""
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
    """The first pivot that at least k block maxima pm reach (−inf if none): k elements lie at or above it, so the
    top-k threshold does too, and the count of every pivot down to it is exact over the elements at or above it
    (the level's search stops at or before it)."""
    bc, _ = _pivot_sums(pm, 0.0, t2, gi, tl.zeros(t2.shape, tl.int32), tl.zeros(t2.shape, tl.float32), False, PG)
    P: tl.constexpr = t2.shape[0] * t2.shape[1]
    idx = gi * PG + tl.arange(0, PG)[None, :]
    a = tl.min(tl.min(tl.where(bc >= k, idx, P), 1), 0)
    return tl.where(a < P, tl.sum(tl.sum(tl.where(idx == a, t2, 0.0), 1), 0), float("-inf"))


@triton.jit
def _pivots(lo, hs, M, LEVEL: tl.constexpr, P: tl.constexpr):
    """P descending pivots: level 0 quadratic over [M − DEPTH, M] (t_0 = M isolates the top tie group); later
    levels even over [max(lo, hs − DEPTH), hs) with the last one just above lo (isolates a tie group at lo)."""
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
    # the level's pivots and sums come with the state, used or not: one memory round trip instead of two
    i = (r * NLEV + L - 1) * P + tl.arange(0, P)
    t, c, m = tl.load(piv_ptr + i), tl.load(cnt_ptr + i), tl.load(mass_ptr + i)
    resolved, fits, tie = _classify(lo, hs, clo, chs, M, kact, pact, CAP)
    if ~tie & ~fits:
        lo, hs, clo, chs, mhs = _choose(lo, hs, clo, chs, mhs, t, c, m, kact, k, p * Z, P)
    return lo, hs, clo, chs, mhs, M, Z


# ------------------------------------------------------------------------------------------- sampler passes
# logits [R, V] (bf16/fp16/fp32, row stride `stride`); per-row params at row // ROW_DIV. stats: grid (R, NB), one
# block each; level and compact: grid (R, NPROG), program j takes blocks j, j + NPROG, … (one wave of programs
# whose per-row decisions, memory round trips and atomics are paid once per program, not once per block).
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
    if b == 0:  # zero this row's accumulators for the passes that follow
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
            mass_rows = pact & ~kact   # masses only steer top-p-only rows
            t2 = tl.reshape(t, [P // PG, PG])
            gi = tl.arange(0, P // PG)[:, None]
            zero2 = tl.zeros([P // PG, PG], tl.int32)   # counts and masses of pivot g·PG + c at [g, c]
            floor = tl.zeros([], tl.float32) + float("-inf")
            if LEVEL == 0:
                if kact:   # top-k rows count only from the block maxima's bound up
                    floor = _block_floor(pm, t2, gi, k, PG)
            low = tl.maximum(lo, floor)
            cnt, mass = zero2, zero2.to(tl.float32)
            pm_next = tl.load(pmax_ptr + r * NBP + j)
            for b in range(j, NB, NPROG):
                x, pm_b = x_next, pm_next
                x_next, pm_next = _next_block(row_ptr, pmax_ptr + r * NBP, b + NPROG, NB, V, inv_t, BLOCK)
                if pm_b >= low:   # the block holds bracket elements (or only elements >= hs, counted as zeros)
                    xb = tl.where((x >= low) & (x < hs), x, float("-inf"))
                    cnt, mass = _pivot_sums(xb, M, t2, gi, cnt, mass, mass_rows, PG)
            if tl.sum(tl.sum(cnt, 1), 0) > 0:
                # relaxed: only the sums matter, and the next kernel reads them (acq_rel would fence each)
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
    pm, _ = _combine_blocks(pmax_ptr + r * NBP, NB, NBP)
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
            # top-k with top-p keeps every element >= lo as a candidate (the top-p cut needs the whole top-k set);
            # otherwise the elements above the bracket are surely kept: raced and summed here
            hi = tl.where(kact & pact, float("inf"), hs)
            t_race = tl.where(resolved, lo, tl.where(fits, hi, float("inf")))
            collect = fits & ~resolved
        kept = tl.zeros([], tl.float32)
        low = tl.minimum(t_race, tl.where(collect, lo, float("inf")))   # below it an element plays no part here
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
                    s_b, i_b = _race(x, sel, M, offs, seed, r, off, RACE)
                    best, best_i = _merge_race(best, best_i, s_b, i_b)
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
    """Exact threshold by bisection over the fp32 order (one program, streaming the row per step), then the race."""
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
        s, i = _race(x, (offs < V) & (x >= tau), M, offs, seed, r, off, RACE)
        best, best_i = _merge_race(best, best_i, s, i)
    return tau, zs, best, best_i


@triton.jit
def _candidates(cv, ci, n, kact, pact, rank, p, M, Z, above, seed, r, off):
    """Exact threshold from the n candidates cv (−inf padded; ids ci), sorted here; the kept mass and the race
    winner among them. `above` is the mass of the surely kept elements above the candidates and the k-th largest
    value is the rank-th candidate (top-k with top-p: every element >= lo is a candidate and above = 0)."""
    C: tl.constexpr = cv.shape[0]
    j = tl.arange(0, C)
    s = tl.sort(cv, descending=True)
    e = tl.exp(s - M)
    tk = tl.where(kact, tl.max(tl.where(j == rank - 1, s, float("-inf")), 0), float("-inf"))
    zk = tl.where(kact, above + tl.sum(tl.where(s >= tk, e, 0.0), 0), Z)
    cum = above + tl.cumsum(e, 0)
    # first sorted position whose inclusive mass reaches p: its value is the cut (min() is robust to a
    # parallel prefix sum that is not monotone)
    first = tl.minimum(tl.min(tl.where(cum >= p * zk, j, C), 0), n - 1)
    tp = tl.where(pact, tl.max(tl.where(j == first, s, float("-inf")), 0), float("-inf"))
    tau = tl.minimum(tl.maximum(tk, tp), M)
    best, tok = _race(cv, (j < n) & (cv >= tau), M, ci, seed, r, off, RACE)
    return tau, above + tl.sum(tl.where(s >= tau, e, 0.0), 0), best, tok


@triton.jit
def _resolve_kernel(logits_ptr, stride, V, temp_ptr, topk_ptr, topp_ptr, ROW_DIV, pmax_ptr, psum_ptr, parg_ptr, NB,
                    NPROG, st_ptr, cand_n_ptr, cand_val_ptr, cand_idx_ptr, zs_ptr, best_ptr, best_idx_ptr,
                    seed_ptr, offset_ptr, ticket_ptr, n_rows, d2t_ptr, ids_ptr, ids_stride, desc_ptr, desc_stride,
                    NLEV: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr, TINY: tl.constexpr,
                    BLOCK: tl.constexpr, NBP: tl.constexpr, HAS_D2T: tl.constexpr, ADVANCE: tl.constexpr,
                    PDL: tl.constexpr):
    """grid (R,): the token and descriptor of each row (the race winners of the NPROG compact programs)."""
    r = tl.program_id(0)
    inv_t, k, p, sampled, kact, pact = _params(r, ROW_DIV, temp_ptr, topk_ptr, topp_ptr, V)
    pdl_wait(PDL)
    seed, off = tl.load(seed_ptr), tl.load(offset_ptr)
    # every load that does not depend on another first, so their latencies overlap (inside the branches below
    # they would be serialised); rows that do not use them ignore the values
    lo, hs, clo, chs, mhs, M_st, Z_st = _load_state(st_ptr + (r * (NLEV + 1) + NLEV) * NSTATE)
    n = tl.load(cand_n_ptr + r)
    above = tl.load(zs_ptr + r)
    j = tl.arange(0, SMALL)
    cv, ci = tl.load(cand_val_ptr + r * CAP + j), tl.load(cand_idx_ptr + r * CAP + j)
    jt = tl.arange(0, TINY)
    cvt, cit = tl.load(cand_val_ptr + r * CAP + jt), tl.load(cand_idx_ptr + r * CAP + jt)
    bs, b_idx, i = _program_races(best_ptr + r * NBP, best_idx_ptr + r * NBP, NPROG, NBP)
    M, Z, pm = _max_and_mass(pmax_ptr + r * NBP, psum_ptr + r * NBP, NB, NBP)
    pa = tl.load(parg_ptr + r * NBP + i, mask=i < NB, other=0)
    tok = tl.sum(tl.where(i == tl.min(tl.where(pm == M, i, NBP), 0), pa, 0), 0)   # greedy: first argmax
    tau, zs = M, tl.zeros([], tl.float32) + 1.0
    if sampled:
        best = tl.max(bs, 0)
        tok = _race_winner(bs, b_idx, i)
        tau, zs = tl.zeros([], tl.float32) + float("-inf"), Z
        if kact | pact:
            M, Z = M_st, Z_st
            resolved, fits, tie = _classify(lo, hs, clo, chs, M, kact, pact, CAP)
            row_ptr = logits_ptr + r.to(tl.int64) * stride
            if resolved:
                tau, zs = lo, above
            elif fits:
                rank = k - tl.where(pact, 0.0, chs).to(tl.int32)   # top-k only: the bracket holds ranks > chs
                if n <= TINY:   # the usual case (top-k 20: tens of candidates) sorts a short buffer
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
    # a row of no logit above −inf (all −inf or NaN) names token 0, its first argmax, and keeps nothing (tau = +inf
    # lies above every x: p ≡ 0); any other row's winner is a token of the vocabulary — clamped all the same, as
    # d2t is read at it
    empty = M == float("-inf")
    tok = tl.where(empty, 0, tl.minimum(tl.maximum(tok, 0), V - 1))
    if HAS_D2T:   # reduced draft vocabulary: target id = draft id + d2t[draft id]
        tok += tl.load(d2t_ptr + tok)
    tl.store(ids_ptr + r * ids_stride, tok)
    tl.store(desc_ptr + r * desc_stride + 0, tl.where(sampled, inv_t, 0.0))
    tl.store(desc_ptr + r * desc_stride + 1, M)
    tl.store(desc_ptr + r * desc_stride + 2, tl.where(empty, float("inf"), tau))
    tl.store(desc_ptr + r * desc_stride + 3, zs)
    if ADVANCE:
        _advance(offset_ptr, off, ticket_ptr, n_rows)


@triton.jit
def _advance(offset_ptr, off, ticket_ptr, n_programs):
    """The last program of the last kernel to read `offset` advances it (graph replays draw fresh numbers)."""
    tl.debug_barrier()
    if tl.atomic_add(ticket_ptr, 1) == n_programs - 1:
        tl.store(offset_ptr, off + 1)
        tl.store(ticket_ptr, 0)


# ------------------------------------------------------------------------------------------- rejection passes
@triton.jit
def _prob(logit, desc_ptr, mask):
    """p(v) of a processed distribution from its descriptor (1/T, M, tau, Zs) and the raw logit."""
    x = _scale(logit, tl.load(desc_ptr + 0, mask=mask, other=1.0))   # as the sampler read it
    keep = mask & (x >= tl.load(desc_ptr + 2, mask=mask, other=0.0))
    return tl.where(keep, tl.exp(x - tl.load(desc_ptr + 1, mask=mask, other=0.0))
                    / tl.load(desc_ptr + 3, mask=mask, other=1.0), 0.0)


@triton.jit
def _first_rejected(tlog_ptr, t_stride, V, dlog_ptr, d_stride, Vd, t2d_ptr, draft_ids_ptr, K, tdesc_ptr,
                    ddesc_ptr, tids_ptr, b, sampled, seed, off, HAS_T2D: tl.constexpr, KP: tl.constexpr):
    """Sequence b's verdict (ENGINE.md §2): the first rejected draft position a (K: all accepted), the positions
    j [KP], the drafts and each target row's own sample (argmax when greedy) at j. A draft id outside [0, V) is
    rejected without being read at (it would index past its logits row)."""
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
    u = _uniform(seed, j, b, off, ACCEPT)
    ok = dv & tl.where(sampled, (qv > 0.0) & (u * qv <= pv), dt == tid)
    return tl.min(tl.where(jd & ~ok, j, K), 0), j, dt, tid


@triton.jit
def _verdict_kernel(tlog_ptr, t_stride, V, dlog_ptr, d_stride, Vd, t2d_ptr, draft_ids_ptr, temp_ptr, K,
                    tdesc_ptr, ddesc_ptr, tids_ptr, seed_ptr, offset_ptr, best_ptr, best_idx_ptr, NB, NPROG,
                    seq_ticket_ptr, ticket_ptr, B, out_ptr, n_emit_ptr,
                    HAS_T2D: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, NBP: tl.constexpr,
                    PDL: tl.constexpr):
    """grid (B, NPROG): every program finds sequence b's first rejected position a and races its blocks j,
    j + NPROG, … of r = max(p − q, 0) there; the sequence's last program to finish emits the accepted drafts, then
    the race's winner (the correction) or, with every draft accepted, the last target row's sample (the bonus)."""
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
            if tl.max(res, 0) > 0.0:   # (r is 0 outside the target's support: most blocks skip the draws)
                # log r − log E; the race picks argmax r / E
                s_b, i_b = _race(tl.log(tl.where(res > 0, res, 1.0)), res > 0, 0.0, offs, seed, rr, off, RESIDUAL)
                best, best_i = _merge_race(best, best_i, s_b, i_b)
    tl.store(best_ptr + bq * NBP + j, best)
    tl.store(best_idx_ptr + bq * NBP + j, best_i)
    # the acq_rel ticket orders every program's stores above before the last one's reads below
    tl.debug_barrier()
    if tl.atomic_add(seq_ticket_ptr + bq, 1, sem="acq_rel") == NPROG - 1:
        tl.store(seq_ticket_ptr + bq, 0)
        emitted = tl.sum(tl.where(jk == a, tid, 0), 0)
        if race:   # r == 0 everywhere falls back to p (its own sample)
            bs, b_idx, i = _program_races(best_ptr + bq * NBP, best_idx_ptr + bq * NBP, NPROG, NBP)
            if tl.max(bs, 0) > float("-inf"):
                emitted = _race_winner(bs, b_idx, i)
        tl.store(out_ptr + bq * (K + 1) + jk, tl.where(jk < a, dt, tl.where(jk == a, emitted, -1)), mask=jk <= K)
        tl.store(n_emit_ptr + bq, a + 1)
    _advance(offset_ptr, off, ticket_ptr, B * NPROG)


# ------------------------------------------------------------------------------------------- host side
def _programs(rows, nb, device):
    """Programs per row of the looping passes: two per SM over all rows (one wave), at most one per block."""
    return max(1, min(nb, 2 * gpu.num_sms(device) // rows))


def sample(logits, params: SamplingTensors, seed, offset, ws: SamplerWorkspace = None, *, rows_per_param=1,
           d2t=None, advance=True, out=None):
    """logits [R, V] -> (ids [R] int32, desc [R, 4]). seed, offset: int64 [1] device tensors; offset += 1 on
    device when `advance`. d2t (reduced draft vocabulary): ids are mapped to target ids, desc stays in draft
    space. Graph-safe when `ws` is passed (views of its buffers are returned). out: (ids [R] int32, desc [R, 4]
    fp32, its last dim contiguous) written instead, any row strides — e.g. step i's column of [B, k] drafts and
    [B, k, 4] descriptors, with no copy after."""
    R, V = logits.shape
    assert logits.stride(1) == 1
    gpu.check_dense("sample", temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, d2t=d2t)
    ws = ws or SamplerWorkspace(R, V, logits.device)
    assert R <= ws.rows and V == ws.vocab
    ids, desc = out or (ws.ids[:R], ws.desc[:R])
    assert ids.shape == (R,) and ids.dtype == torch.int32 and desc.shape == (R, 4) and desc.stride(1) == 1
    assert desc.dtype == torch.float32
    c, nb, nbp = ws.cfg, ws.nb, ws.nbp
    rows = (logits, logits.stride(0), V, params.temperature, params.top_k, params.top_p, rows_per_param)
    wide = 1 if gpu.INTERPRET else 8
    nprog, pdl = _programs(R, nb, logits.device), gpu.pdl_args(logits.device)
    _stats_kernel[(R, nb)](*rows, ws.pmax, ws.psum, ws.parg, ws.cnt, ws.mass, ws.cand_n, ws.zs,
                           LP=c.levels * c.pivots, LPP=triton.next_power_of_2(c.levels * c.pivots), BLOCK=c.block,
                           NBP=nbp, num_warps=4, **pdl)
    for level in range(c.levels):
        _level_kernel[(R, nprog)](*rows, ws.pmax, ws.psum, nb, nprog, ws.state, ws.piv, ws.cnt, ws.mass,
                                  LEVEL=level, NLEV=c.levels, P=c.pivots, PG=c.group, CAP=c.cap, BLOCK=c.block,
                                  NBP=nbp, num_warps=wide, **pdl)
    _compact_kernel[(R, nprog)](*rows, ws.pmax, nb, nprog, ws.state, ws.piv, ws.cnt, ws.mass, ws.cand_n,
                                ws.cand_val, ws.cand_idx, ws.zs, ws.best, ws.best_idx, seed, offset,
                                NLEV=c.levels, P=c.pivots, CAP=c.cap, BLOCK=c.block, NBP=nbp, num_warps=4, **pdl)
    _resolve_kernel[(R,)](*rows, ws.pmax, ws.psum, ws.parg, nb, nprog, ws.state, ws.cand_n, ws.cand_val,
                          ws.cand_idx, ws.zs, ws.best, ws.best_idx, seed, offset, ws.ticket, R,
                          ids if d2t is None else d2t, ids, ids.stride(0), desc, desc.stride(0),
                          NLEV=c.levels, CAP=c.cap, SMALL=max(c.cap // 8, 2), TINY=max(c.cap // 32, 2), BLOCK=c.block,
                          NBP=nbp, HAS_D2T=d2t is not None, ADVANCE=advance, num_warps=wide, **pdl)
    return ids, desc


def sample_drafts(draft_logits, params: SamplingTensors, seed, offset, ws: SamplerWorkspace = None, d2t=None,
                  out=None):
    """Drafts from the request's truncated distribution (ENGINE.md §2): (target-space ids [R], q descriptors [R, 4]).
    Keep the descriptors of the k steps as [B, k, 4] for rejection_sample (out: write them there, as `sample`)."""
    return sample(draft_logits, params, seed, offset, ws, d2t=d2t, out=out)


def target_to_draft(d2t, vocab):
    """Inverse of a reduced draft vocabulary's d2t: t2d [vocab] int32, −1 where the target id has no draft id."""
    draft = torch.arange(d2t.shape[0], device=d2t.device)
    t2d = torch.full((vocab,), -1, dtype=torch.int32, device=d2t.device)
    t2d[draft + d2t.long()] = draft.int()
    return t2d


class RejectionWorkspace:
    """Buffers of rejection_sample for B sequences with k drafts, allocated once before graph capture."""

    def __init__(self, batch, k, vocab, draft_vocab, device, cfg: SamplerConfig = SamplerConfig()):
        self.batch, self.k = batch, k
        self.target = SamplerWorkspace(batch * (k + 1), vocab, device, cfg)
        self.draft = SamplerWorkspace(batch * k, draft_vocab, device, cfg)
        self.best = torch.empty(batch, self.target.nbp, dtype=torch.float32, device=device)     # residual race
        self.best_idx = torch.empty(batch, self.target.nbp, dtype=torch.int32, device=device)
        self.out = torch.empty(batch, k + 1, dtype=torch.int32, device=device)
        self.num_emitted = torch.empty(batch, dtype=torch.int32, device=device)
        self.ticket = torch.zeros(1, dtype=torch.int32, device=device)           # programs done (offset advance)
        self.seq_ticket = torch.zeros(batch, dtype=torch.int32, device=device)   # programs done per sequence


def rejection_sample(target_logits, draft_logits, draft_ids, params: SamplingTensors, seed, offset,
                     ws: RejectionWorkspace = None, draft_desc=None, t2d=None):
    """Exact speculative verification (ENGINE.md §2).

    target_logits [B, k+1, V]; draft_logits [B, k, Vd]; draft_ids [B, k] target-space ids; params per sequence;
    draft_desc [B, k, 4] from sample_drafts (recomputed from draft_logits when None); t2d from target_to_draft when
    the draft vocabulary is reduced. Returns (out_ids [B, k+1] int32: accepted drafts, the correction or bonus,
    then −1; num_emitted [B] int32 = accepted + 1). Advances offset by one."""
    B, K1, V = target_logits.shape
    K, Vd = K1 - 1, draft_logits.shape[-1]
    assert draft_logits.stride(-1) == 1, "rejection_sample: draft_logits with a unit last stride"
    gpu.check_dense("rejection_sample", draft_ids=draft_ids, draft_desc=draft_desc, t2d=t2d)
    ws = ws or RejectionWorkspace(B, K, V, Vd, target_logits.device)
    t_rows, d_rows = target_logits.view(B * K1, V), draft_logits.view(B * K, Vd)
    t_ids, t_desc = sample(t_rows, params, seed, offset, ws.target, rows_per_param=K1, advance=False)
    if draft_desc is None:
        draft_desc = sample(d_rows, params, seed, offset, ws.draft, rows_per_param=K, advance=False)[1]
    d_desc = draft_desc.view(B * K, 4)
    nb, nbp, block = ws.target.nb, ws.target.nbp, ws.target.cfg.block
    nprog, pdl = _programs(B, nb, target_logits.device), gpu.pdl_args(target_logits.device)
    _verdict_kernel[(B, nprog)](t_rows, t_rows.stride(0), V, d_rows, d_rows.stride(0), Vd,
                                t2d if t2d is not None else t_ids, draft_ids, params.temperature, K, t_desc, d_desc,
                                t_ids, seed, offset, ws.best, ws.best_idx, nb, nprog, ws.seq_ticket, ws.ticket, B,
                                ws.out, ws.num_emitted, HAS_T2D=t2d is not None, KP=triton.next_power_of_2(K + 1),
                                BLOCK=block, NBP=nbp, num_warps=4, **pdl)
    return ws.out[:B], ws.num_emitted[:B]
