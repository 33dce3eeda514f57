"""Shared by the sampling and rejection passes: parameters, Philox draws, the exponential race, the offset."""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import device as gpu

RACE = tl.constexpr(0)          # Philox stream ids: keep the draws of different decisions independent
RESIDUAL = tl.constexpr(1)
ACCEPT = tl.constexpr(2)
FLT_MAX = tl.constexpr(3.4028234663852886e38)


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
class Config:
    """Launch parameters (they also size the workspaces)."""
    block: int = 1024           # vocabulary elements per program
    pivots: int = 32            # per level
    group: int = 8              # pivots compared per step (the [block, group] tile bounds registers)
    cap: int = 2048             # candidates resolved by one program
    levels: int = 3             # bracket-narrowing passes
    warps: int = 4              # stats, compact, verdict
    wide_warps: int = 8         # level, resolve


def config(rows, vocab, device) -> Config:
    """The same at every shape the engine runs."""
    return Config()


def programs(rows, nb, device):
    """Programs a row: two per SM over all rows (one wave), at most one per block."""
    return max(1, min(nb, 2 * gpu.num_sms(device) // rows))


@triton.jit
def scale(logit, inv_t):
    """logit · (1/T) in fp32, saturated at FLT_MAX, NaN (also 0 · inf) -> −inf: +inf logits tie at the top and
    share its mass, x − M is never inf − inf, and a NaN is never the argmax nor sampled."""
    x = logit.to(tl.float32) * inv_t
    return tl.where(x == x, tl.minimum(x, FLT_MAX), float("-inf"))


@triton.jit
def _bits(seed, idx, row, off, STREAM: tl.constexpr):
    z = idx * 0
    r0, r1, _, _ = tl.philox(seed, idx, z + row, z + off.to(tl.int32), z + STREAM)
    return r0, r1


@triton.jit
def uniform(seed, idx, row, off, STREAM: tl.constexpr):
    r0, _ = _bits(seed, idx, row, off, STREAM)
    return ((r0 >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _exponential(seed, idx, row, off, STREAM: tl.constexpr):
    """E ~ Exp(1), fine near 0 where the race is decided: −log1p(−v) by its series for v < 2^−8, −log(1 − v) with
    1 − v exact in integers above."""
    r0, r1 = _bits(seed, idx, row, off, STREAM)
    v = (r0.to(tl.float32) + r1.to(tl.float32) * 2.3283064365386963e-10) * 2.3283064365386963e-10
    series = v * (1.0 + v * (0.5 + v * 0.3333333333333333))
    w = (4294967295 - r0).to(tl.float32) + 1.0
    return tl.where(r0 < 16777216, series, -tl.log(w * 2.3283064365386963e-10))


@triton.jit
def exp_race(x, sel, M, idx, seed, row, off, STREAM: tl.constexpr):
    """Best (score, index) of the race over the selected elements; (−inf, idx[0]) if none."""
    score = tl.where(sel, (x - M) - tl.log(_exponential(seed, idx, row, off, STREAM)), float("-inf"))
    best = tl.max(score, 0)
    at = tl.argmax(score, 0)
    return best, tl.sum(tl.where(tl.arange(0, x.shape[0]) == at, idx, 0), 0)


@triton.jit
def merge_race(best, best_i, s, i):
    """The winner of (best, best_i) and one more block's (s, i); ties keep the first."""
    return tl.maximum(s, best), tl.where(s > best, i, best_i)


@triton.jit
def combine_blocks(val_ptr, NB, NBP: tl.constexpr):
    i = tl.arange(0, NBP)
    return tl.load(val_ptr + i, mask=i < NB, other=float("-inf")), i


@triton.jit
def program_races(best_ptr, best_idx_ptr, NPROG, NBP: tl.constexpr):
    """One row's NPROG race results (score, token; −inf: raced nothing) and their index vector."""
    bs, i = combine_blocks(best_ptr, NPROG, NBP)
    return bs, tl.load(best_idx_ptr + i, mask=i < NPROG, other=0), i


@triton.jit
def race_winner(bs, b_idx, i):
    """The token of the best race score (ties: the first program's)."""
    return tl.sum(tl.where(i == tl.argmax(bs, 0), b_idx, 0), 0)


@triton.jit
def advance(offset_ptr, off, ticket_ptr, n_programs):
    """The last program of the last kernel to read `offset` advances it."""
    tl.debug_barrier()
    if tl.atomic_add(ticket_ptr, 1) == n_programs - 1:
        tl.store(offset_ptr, off + 1)
        tl.store(ticket_ptr, 0)
