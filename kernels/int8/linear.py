"""Int8 weight-only linear, per-row scales (the lm_head): out[M, N] = (x[M, K] @ q[N, K]ᵀ) · s[N]; x bf16/fp16, out
any float dtype (row strides any), q int8 [N, K] row-major, s [N]. Int8 × int8 mma: x as int8 planes per token,
x = s_x·(a₀ + a₁/254 + a₂/254²) (_split_act_kernel), combined in the epilogue. H200: M ≤ 8 at copy bandwidth."""
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
    # x [M, K] → xs [M] = max|x[t]|/127, xq row (t // TM)·BLOCK_M + p·TM + t % TM = plane p of token t; grid (M,)
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
    """acc [BN, SLOTS·TM] (column p·TM + j: plane p of token j) → [BN, TM]: Σ_p acc[:, p·TM + j] / 254^p."""
    p = tl.arange(0, SLOTS)
    weight = tl.where(p == 0, 1.0, tl.where(p == 1, 1.0 / 254.0, 1.0 / 64516.0))   # slot 3 holds zeros
    return tl.sum(tl.reshape(acc, [BN, SLOTS, TM]) * weight[None, :, None], axis=1)


@triton.jit(do_not_specialize=["M"])    # one compiled kernel for M = 1 and M > 1
def _int8_matmul_kernel(x_ptr, xs_ptr, qw_ptr, s_ptr, out_ptr, M, N, K, stride_om,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PARTS: tl.constexpr,
                        WEIGHTS_A: tl.constexpr, DOT_F32: tl.constexpr, PDL: tl.constexpr):
    # an M-tile: TM tokens in SLOTS row blocks, block p = plane p (of 3 planes the 4th masked). grid (cdiv(M, TM),
    # cdiv(N, BLOCK_N)), M-tiles fastest (sharing the weight tile in L2). WEIGHTS_A: the acc is [BN, BM].
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
        # weights streamed once, activations re-read by every column tile
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
    weights_a: bool = False          # weights as the mma's A operand
    parts: int = 3                   # activation planes

    @property
    def tokens(self) -> int:
        """Tokens per M-tile."""
        return self.block_m // ROWS_PER_TOKEN[self.parts]


# Per M bucket (upper bound inclusive), from an H200 sweep.
SM90_CONFIGS = (
    (4, Config(16, 64, 512, 4, 3)),
    (8, Config(32, 64, 512, 4, 3)),
    (32, Config(128, 256, 128, 8, 3, True)),
    (None, Config(128, 256, 128, 8, 3, True, parts=2)),
)
# sm_8x (no wgmma, 99 KB of shared memory): compiled, untimed
SM80_CONFIGS = (
    (4, Config(16, 64, 512, 4, 3)),
    (8, Config(32, 64, 512, 4, 3)),
    (32, Config(128, 128, 128, 8, 3)),
    (None, Config(128, 128, 128, 8, 3, parts=2)),
)


# What `python -m bench.kernels_int8 --sweep` times: the tables' choices and their runners-up.
GEMV_SWEEP = [Config(*c) for c in (
    (16, 64, 512, 4, 3), (16, 128, 256, 4, 3), (16, 128, 256, 4, 3, True), (16, 128, 128, 4, 4, True),
    (32, 64, 512, 4, 3), (32, 128, 256, 4, 3), (32, 128, 128, 4, 4, True), (16, 128, 256, 4, 3, True, 2))]
GEMM_SWEEP = [Config(*c) for c in (
    (128, 256, 128, 8, 3, True), (128, 128, 128, 4, 4, True), (256, 128, 128, 8, 3, True),
    (128, 256, 128, 8, 3, True, 2), (256, 128, 128, 8, 3, True, 2), (128, 256, 128, 8, 3, True, 1))]


def config(m: int, device) -> Config:
    table = SM90_CONFIGS if gpu.capability(torch.device(device)) >= (9, 0) else SM80_CONFIGS
    return next(c for bound, c in table if bound is None or m <= bound)


def split_activations(x2: torch.Tensor, cfg: Config):
    """x [M, K] → (int8 planes [cdiv(M, tokens)·block_m, K], s_x [M] fp32)."""
    m, k = x2.shape
    planes = torch.empty(triton.cdiv(m, cfg.tokens) * cfg.block_m, k, dtype=torch.int8, device=x2.device)
    xs = torch.empty(m, dtype=torch.float32, device=x2.device)
    _split_act_kernel[(m,)](x2, planes, xs, k, x2.stride(0), TM=cfg.tokens, BLOCK_M=cfg.block_m, PARTS=cfg.parts,
                            BLOCK=triton.next_power_of_2(k), **pdl_args(x2.device))
    return planes, xs


def launch(x2: torch.Tensor, w: Int8Weight, out2: torch.Tensor, cfg: Config) -> None:
    """x2 [M, K], out2 [M, N] (M > 0): the split, then the matmul."""
    (m, k), n = x2.shape, w.qweight.shape[0]
    planes, xs = split_activations(x2, cfg)
    _int8_matmul_kernel[(triton.cdiv(m, cfg.tokens), triton.cdiv(n, cfg.block_n))](
        planes, xs, w.qweight, w.scales, out2, m, n, k, out2.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, PARTS=cfg.parts, WEIGHTS_A=cfg.weights_a,
        DOT_F32=gpu.INTERPRET, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_args(x2.device))
