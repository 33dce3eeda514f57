"""Int8 weight-only linear with per-row scales, for the lm_head (248320 × 5120) and other int8 heads:
out[M, N] = (x[M, K] @ q[N, K]ᵀ) · s[N].

Shapes: x [M, K] bf16/fp16 (row stride any), q int8 [N, K] row-major (the nn.Linear / checkpoint orientation, K
contiguous), s [N] fp16/bf16, out [M, N] (row stride any, any float dtype, e.g. fp32 logits).
Reference: layers.quant.dequantize_int8 (x @ dequantize_int8(w).T).

Design, and why:
* Tensor cores for every M, for the reason given in kernels/int4_linear.py: at 1 byte per weight the H200 streams
  4.8e12 weights/s, too many for M FMAs each on CUDA cores once M > 2–3.
* Int8 × int8 mma, the weights straight from shared memory. Converting them to fp16 first (xor/or/subtract, ~5
  SASS instructions per weight byte) kept ~60 % of the issue slots busy at 4 TB/s and held the GEMV at 77–82 % of
  the copy bandwidth (M = 1: 386 µs); without it the main loop issues ~0.03 instructions per byte and the GEMV
  streams at the copy bandwidth (289 µs, H200). Int8 mma also runs at twice the fp16 rate (four times the
  fp16/fp32-accumulate rate of sm_86).
* Activations as int8 planes, per token: x = s_x·(a₀ + a₁/254 + a₂/254²), s_x = max|x[m]|/127, made by
  _split_act_kernel (a second launch, 3 µs). Three planes leave an error ≤ 6e-8·max|x[m]| (fp32 level, far below
  the bf16 rounding of x), two ≤ 1.6e-5·max|x[m]| (below bf16's rounding of every element larger than ~1/100 of
  the row's max; 250× below the error of the int8 weights themselves), one is plain W8A8 (~1 %). The planes of a
  token are rows of one M-tile (three planes take four rows), so while M fits a tile they cost no extra weight
  traffic; the int32 sums of the planes are combined in the epilogue, within each thread.
* Large M (WEIGHTS_A, Hopper): the weights are wgmma's A operand (≥ 64 rows per warpgroup), both operands from
  shared memory. Four mma rows per token make M ≥ 64 compute-bound with three planes, so the table uses two there.
* No split-K: N is large (1940 column tiles of 128 for the full vocabulary). A persistent grid splitting N evenly
  (no part-filled last wave) measured no faster than one tile per program.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import device as gpu
from kernels.device import pdl_args, pdl_wait
from layers.quant import Int8Weight

ROWS_PER_TOKEN = {1: 1, 2: 2, 3: 4}          # mma rows a token's planes take (a power of two, as Triton's tiles)


@triton.jit
def _round(v):
    """fp32 → nearest integer (halves away from zero), as fp32; the int conversion truncates."""
    return tl.where(v >= 0, v + 0.5, v - 0.5).to(tl.int32).to(tl.float32)


@triton.jit
def _split_act_kernel(x_ptr, xq_ptr, xs_ptr, K, stride_xm,
                      TM: tl.constexpr, BLOCK_M: tl.constexpr, PARTS: tl.constexpr, BLOCK: tl.constexpr,
                      PDL: tl.constexpr):
    # x [M, K] → xs [M] fp32 = max|x[t]|/127 and int8 planes: xq row (t // TM)·BLOCK_M + p·TM + t % TM holds
    # plane p of token t (the row layout of _int8_matmul_kernel's x tiles); grid (M,), BLOCK ≥ K
    pdl_wait(PDL)
    t = tl.program_id(0)
    rk = tl.arange(0, BLOCK)
    k_ok = rk < K
    x = tl.load(x_ptr + t.to(tl.int64) * stride_xm + rk, mask=k_ok, other=0).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), axis=0) / 127.0, 1e-30)
    v = x / s                                                   # |v| ≤ 127
    row = (t // TM) * BLOCK_M + t % TM
    for p in tl.static_range(PARTS):
        a = _round(v)
        tl.store(xq_ptr + (row + p * TM).to(tl.int64) * K + rk, a.to(tl.int8), mask=k_ok)
        v = (v - a) * 254.0                                     # residual in ±0.5 → next plane in ±127
    tl.store(xs_ptr + t, s)


@triton.jit
def _combine_planes(acc, SLOTS: tl.constexpr, TM: tl.constexpr, BN: tl.constexpr):
    """acc fp32 [BN, SLOTS·TM], column p·TM + j = plane p of token j → [BN, TM]: Σ_p acc[:, p·TM + j] / 254^p.
    In the mma accumulator the plane index is a register index, so the sum stays within each thread."""
    p = tl.arange(0, SLOTS)
    weight = tl.where(p == 0, 1.0, tl.where(p == 1, 1.0 / 254.0, 1.0 / 64516.0))   # slot 3 holds zeros
    return tl.sum(tl.reshape(acc, [BN, SLOTS, TM]) * weight[None, :, None], axis=1)


@triton.jit(do_not_specialize=["M"])    # one compiled kernel for M = 1 and M > 1
def _int8_matmul_kernel(x_ptr, xs_ptr, qw_ptr, s_ptr, out_ptr, M, N, K, stride_om,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PARTS: tl.constexpr,
                        WEIGHTS_A: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr):
    # x int8 planes [cdiv(M, TM)·BLOCK_M, K] and xs [M] fp32 (_split_act_kernel): an M-tile holds TM tokens in
    # SLOTS row blocks of TM rows, block p = plane p (block 3 of 3 planes: zeros, masked). qw int8 [N, K], s [N],
    # out [M, N]. grid (cdiv(M, TM), cdiv(N, BLOCK_N)), M-tiles fastest (they share the weight tile through L2).
    # WEIGHTS_A: the accumulator is [BN, BM] (weights as the mma's A operand, see the module docstring).
    pdl_wait(PDL)
    SLOTS: tl.constexpr = 4 if PARTS == 3 else PARTS
    TM: tl.constexpr = BLOCK_M // SLOTS
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    r = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    x_ok = (r // TM < PARTS) & (pid_m * TM + r % TM < M)
    x_tile = x_ptr + (pid_m * BLOCK_M + r)[:, None].to(tl.int64) * K + rk[None, :]
    w_tile = qw_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    ACC_DT: tl.constexpr = tl.float32 if DOT_F32 else tl.int32
    if WEIGHTS_A:
        acc = tl.zeros([BLOCK_N, BLOCK_M], ACC_DT)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], ACC_DT)
    for k0 in range(0, K, BLOCK_K):
        k_ok = rk < K - k0
        # weights are streamed once: evict first; the activations are re-read by every column tile: keep them
        x = tl.load(x_tile + k0, mask=x_ok[:, None] & k_ok[None, :], other=0, eviction_policy="evict_last")
        w = tl.load(w_tile + k0, mask=n_ok[:, None] & k_ok[None, :], other=0, eviction_policy="evict_first")
        if DOT_F32:                                            # the interpreter: fp32, exact for these sums
            w = w.to(tl.float32)
            x = x.to(tl.float32)
        if WEIGHTS_A:
            acc = tl.dot(w, tl.trans(x), acc, out_dtype=ACC_DT)
        else:
            acc = tl.dot(x, tl.trans(w), acc, out_dtype=ACC_DT)
    acc = acc.to(tl.float32)
    if not WEIGHTS_A:
        acc = tl.trans(acc)                                    # [BN, BM]
    if SLOTS > 1:
        acc = _combine_planes(acc, SLOTS, TM, BLOCK_N)         # [BN, TM]
    acc = tl.trans(acc)
    rm = pid_m * TM + tl.arange(0, TM)
    m_ok = rm < M
    acc *= tl.load(xs_ptr + rm, mask=m_ok, other=0)[:, None]
    acc *= tl.load(s_ptr + rn, mask=n_ok, other=0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]     # 8,649+ rows of 248,320 pass 2^31
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class Config:
    block_m: int                     # mma rows: tokens × ROWS_PER_TOKEN[parts]
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    weights_a: bool = False          # weights as the mma's A operand (see the kernel)
    parts: int = 3                   # activation planes (module docstring)

    @property
    def tokens(self) -> int:
        """Tokens per M-tile."""
        return self.block_m // ROWS_PER_TOKEN[self.parts]


# Per M bucket (upper bound inclusive), from an H200 sweep (`python -m bench.kernels_int8 --sweep`): M ≤ 8 run at
# 99–103 % of the copy bandwidth (read-only streaming beats a copy), M = 20 at 80 %, M = 64 at 76 %, M = 320 at 23 %.
M_BUCKETS = (
    (4, Config(16, 64, 512, 4, 3)),
    (8, Config(32, 64, 512, 4, 3)),
    (32, Config(128, 256, 128, 8, 3, True)),
    (None, Config(128, 256, 128, 8, 3, True, parts=2)),
)
# sm_8x (no wgmma, 99 KB of shared memory, mma.sync spills beyond 128 rows): compiled by tests.aot_compile, untimed
M_BUCKETS_SM80 = (
    (4, Config(16, 64, 512, 4, 3)),
    (8, Config(32, 64, 512, 4, 3)),
    (32, Config(128, 128, 128, 8, 3)),
    (None, Config(128, 128, 128, 8, 3, parts=2)),
)


def pick_config(m: int, device) -> Config:
    table = M_BUCKETS if gpu.capability(torch.device(device)) >= (9, 0) else M_BUCKETS_SM80
    return next(c for bound, c in table if bound is None or m <= bound)


def split_activations(x2: torch.Tensor, cfg: Config):
    """x [M, K] bf16/fp16 → (int8 planes [cdiv(M, tokens)·block_m, K] in the kernel's M-tile row layout, s_x [M]
    fp32): the first of int8_linear's two launches."""
    m, k = x2.shape
    planes = torch.empty(triton.cdiv(m, cfg.tokens) * cfg.block_m, k, dtype=torch.int8, device=x2.device)
    xs = torch.empty(m, dtype=torch.float32, device=x2.device)
    _split_act_kernel[(m,)](x2, planes, xs, k, x2.stride(0), TM=cfg.tokens, BLOCK_M=cfg.block_m, PARTS=cfg.parts,
                            BLOCK=triton.next_power_of_2(k), **pdl_args(x2.device))
    return planes, xs


def int8_linear(x: torch.Tensor, w: Int8Weight, out: torch.Tensor = None, cfg: Config = None) -> torch.Tensor:
    """x [..., K] bf16/fp16 → [..., N] in x's dtype, or written into `out` (e.g. fp32 logits)."""
    n, k = w.qweight.shape
    assert x.shape[-1] == k and x.stride(-1) == 1 and w.qweight.is_contiguous()
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if out is None:
        out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, n)
    assert out2.shape[0] == m and out2.stride(-1) == 1
    if m == 0:
        return out
    cfg = cfg or pick_config(m, x.device)
    planes, xs = split_activations(x2, cfg)
    _int8_matmul_kernel[(triton.cdiv(m, cfg.tokens), triton.cdiv(n, cfg.block_n))](
        planes, xs, w.qweight, w.scales, out2, m, n, k, out2.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PARTS=cfg.parts, WEIGHTS_A=cfg.weights_a,
        DOT_F32=gpu.INTERPRET, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_args(x.device))
    return out
