"""Int8 weight-only linear with per-row scales, for the lm_head (248320 × 5120) and other int8 heads:
out[M, N] = (x[M, K] @ q[N, K]ᵀ) · s[N].

Shapes (kernel): x [M, K] bf16/fp16 (row stride stride_xm), q int8 [N, K] row-major (the nn.Linear / checkpoint
orientation, K contiguous), s [N] fp16/bf16, out [M, N] (row stride stride_om, any float dtype, e.g. fp32 logits).
Reference: layers.quant.dequantize_int8 (x @ dequantize_int8(w).T).

Design, and why:
* Tensor cores for every M (M padded to 16), for the reason given in kernels/int4_linear.py: at 1 byte per
  weight the H200 streams 4.8e12 weights/s, too many for M FMAs each on CUDA cores once M > 2–3.
* int8 → fp16 without I2F: byte b, flipped to u = b + 128 (xor 0x80), or'ed into 0x6400 is the fp16 1024 + u;
  subtracting 1152 gives b exactly. bf16 has too few mantissa bits for this, so the mma runs in fp16: the
  activations are converted to fp16 (exact for the normed hidden states an lm_head sees; |x| must stay < 65504).
* No split-K: N is large (1940 column tiles of 128 for the full vocabulary).
"""
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from layers.quant import Int8Weight


@triton.jit
def _int8_to_f16(w, DOT_F32: tl.constexpr):
    """int8 tensor → the same values in fp16 (fp32 under the interpreter), exactly."""
    u = w.to(tl.uint8, bitcast=True) ^ 0x80                    # b + 128 in 0..255
    f = (u.to(tl.int16) | 0x6400).to(tl.float16, bitcast=True)  # 1024 + u
    if DOT_F32:
        f = f.to(tl.float32)
    return f - 1152.0


@triton.jit(do_not_specialize=["M"])    # one compiled kernel for M = 1 and M > 1
def _int8_matmul_kernel(x_ptr, qw_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_om,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        WEIGHTS_A: tl.constexpr, DOT_F32: tl.constexpr):
    # x [M, K], qw int8 [N, K], s [N], out [M, N]; grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)), M-tiles fastest.
    # WEIGHTS_A (large M, Hopper): the weights are the mma's A operand, which wgmma takes from registers (as B
    # they would make a trip through shared memory with a barrier per tile); the accumulator is then [BN, BM].
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_tile = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
    w_tile = qw_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    if WEIGHTS_A:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = rk < K - k0
        # weights are streamed once: evict first; the activations are re-read by every column tile: keep them
        x = tl.load(x_tile + k0, mask=m_ok[:, None] & k_ok[None, :], other=0, eviction_policy="evict_last")
        w = tl.load(w_tile + k0, mask=n_ok[:, None] & k_ok[None, :], other=0, eviction_policy="evict_first")
        if DOT_F32:                                            # interpreter: no bf16/fp16 dot (ENGINE.md §7)
            x = x.to(tl.float32)
        else:
            x = x.to(tl.float16)
        w = _int8_to_f16(w, DOT_F32)
        if WEIGHTS_A:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if WEIGHTS_A:
        acc = tl.trans(acc)
    acc *= tl.load(s_ptr + rn, mask=n_ok, other=0).to(tl.float32)[None, :]
    out = out_ptr + rm[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    weights_a: bool = False          # large M: weights as the mma's A operand (see the kernel)


# Per M bucket (upper bound inclusive). M ≤ 16: best of a first H200 sweep; the WEIGHTS_A rows for larger M
# are not measured yet: retune with `python -m bench.kernels_int8 --sweep`.
M_BUCKETS = (
    (16, Config(16, 128, 256, 4, 3)),
    (64, Config(64, 128, 128, 4, 3, True)),
    (None, Config(128, 128, 128, 8, 3, True)),
)


def pick_config(m: int) -> Config:
    return next(c for bound, c in M_BUCKETS if bound is None or m <= bound)


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
    cfg = cfg or pick_config(m)
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n))
    _int8_matmul_kernel[grid](x2, w.qweight, w.scales, out2, m, n, k, x2.stride(0), out2.stride(0),
                              BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, WEIGHTS_A=cfg.weights_a,
                              DOT_F32=os.environ.get("TRITON_INTERPRET") == "1",
                              num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
