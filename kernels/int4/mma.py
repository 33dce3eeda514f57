"""Int4 linears in Triton — the sm_8x path beyond the GEMV's rows, W4A8 below 65 rows, asymmetric weights, and the
CPU interpreter's: out = x @ Wᵀ, W in the mma layout (layers/quant.py), K a multiple of 128, N of 8. Activations
are gathered into slot order (slot_index) so unpacked codes meet them in registers. Forms: CODES — exact codes as
B, each group's partial scaled once; WEIGHTS_A — weights scaled to x's dtype as wgmma's register A operand;
NATURAL — codes in k order as B. W4A8 sums groups exactly in int32. Split-K reduced in the launch.
Notes: docs/notes/int4.md."""
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import device as gpu
from kernels.int4.common import GROUP
from kernels.int4.splitk import split_count, store_tile, workspace
from layers.quant import Int4Weight, mma_k


@triton.jit
def _as_dot_operand(t, DOT_F32: tl.constexpr):
    # the interpreter multiplies bf16 wrongly (ENGINE.md §7): fp32 there, exact for these values
    if DOT_F32:
        return t.to(tl.float32)
    else:
        return t


@triton.jit
def _codes_16(q, jj: tl.constexpr, OFFSET: tl.constexpr, DT: tl.constexpr, BN: tl.constexpr, DOT_F32: tl.constexpr):
    """q int32 [16, BN] → [32, BN] in DT (bf16/fp16): code − OFFSET for slot 8r + jj + 4e at row 2r + e."""
    if DT == tl.float16:
        t = ((q >> (4 * jj)) & 0x000F000F) | 0x64006400        # two fp16 1024 + q
        base: tl.constexpr = 1024.0
    else:
        t = ((q >> (4 * jj)) & 0x000F000F) | 0x43004300        # two bf16 128 + q
        base: tl.constexpr = 128.0
    pair = tl.join(t.to(tl.int16), (t >> 16).to(tl.int16)).to(DT, bitcast=True)
    if DOT_F32:                                                # the interpreter has no bf16 scalars
        pair = pair.to(tl.float32)
    pair = pair - (base + OFFSET)
    return tl.reshape(tl.permute(pair, (0, 2, 1)), [32, BN])


@triton.jit
def _codes_i8(q, jj: tl.constexpr, SIGNED: tl.constexpr, BN: tl.constexpr):
    """q int32 [16, BN] → int8 [64, BN]: code − 8 (SIGNED) or code, for slot 8r + 2b + jj at row 4r + b."""
    t = (q >> (4 * jj)) & 0x0F0F0F0F
    if SIGNED:
        # per byte (q + 120) ^ 0x80 = q − 8 in two's complement; q + 120 < 256, so no carry between bytes
        t = (t + 0x78787878) ^ -0x7F7F7F80                     # -0x7F7F7F80 is 0x80808080 as int32
    b0, b1, b2, b3 = t.to(tl.int8), (t >> 8).to(tl.int8), (t >> 16).to(tl.int8), (t >> 24).to(tl.int8)
    quad = tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), [16, BN, 4])
    return tl.reshape(tl.permute(quad, (0, 2, 1)), [64, BN])


@triton.jit
def _scaled(w, s, zs, HAS_ZS: tl.constexpr, DT: tl.constexpr, DOT_F32: tl.constexpr):
    """Codes w [Kd, BN] → weights w·s (+ zs) rounded to DT, as a dequantised 16-bit checkpoint holds them."""
    s_w = s[None, :]
    zs_w = zs[None, :]
    if not DOT_F32:
        s_w = s_w.to(DT)
        zs_w = zs_w.to(DT)
    w = w * s_w
    if HAS_ZS:
        w = w + zs_w
    return w


@triton.jit
def _mma(w, x, acc, WEIGHTS_A: tl.constexpr, DOT_F32: tl.constexpr):
    """acc += x [BM, Kd] @ w [Kd, BN]; acc is [BN, BM] when WEIGHTS_A (weights as the A operand), else [BM, BN]."""
    if DOT_F32:                                                # interpreter: exact here in fp32 (see _as_dot_operand)
        w = w.to(tl.float32)
        x = x.to(tl.float32)
    if WEIGHTS_A:
        return tl.dot(tl.trans(w), tl.trans(x), acc, out_dtype=acc.dtype)
    else:
        return tl.dot(x, w, acc, out_dtype=acc.dtype)


@triton.jit
def _per_col(v, WEIGHTS_A: tl.constexpr):
    """A [BN] vector (per output column) broadcast against the accumulator."""
    if WEIGHTS_A:
        return v[:, None]
    else:
        return v[None, :]


@triton.jit
def _per_row(v, WEIGHTS_A: tl.constexpr):
    """A [BM] vector (per token) broadcast against the accumulator."""
    if WEIGHTS_A:
        return v[None, :]
    else:
        return v[:, None]


@triton.jit
def _group_dot_16(x, q, acc, s, zs, HAS_ZS: tl.constexpr, WEIGHTS_A: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, DOT_F32: tl.constexpr):
    """acc += x [BM, 128] (slot order) @ W over one group (words q [16, BN], s/zs [BN])."""
    DT = x.dtype
    lo, hi = tl.split(tl.reshape(x, [BM, 16, 2, 2, 2]))       # slot 8r + 4e + 2·j1 + j0: lo/hi = j0
    x0, x2 = tl.split(lo)
    x1, x3 = tl.split(hi)
    xs = (tl.reshape(x0, [BM, 32]), tl.reshape(x1, [BM, 32]), tl.reshape(x2, [BM, 32]), tl.reshape(x3, [BM, 32]))
    OFFSET: tl.constexpr = 0 if HAS_ZS else 8
    if WEIGHTS_A:                                              # W = (q − 8)·s or q·s + zs in DT, mma accumulates
        for jj in tl.static_range(4):
            acc = _mma(_scaled(_codes_16(q, jj, OFFSET, DT, BN, DOT_F32), s, zs, HAS_ZS, DT, DOT_F32), xs[jj], acc,
                       True, DOT_F32)
    else:                                                      # exact codes, the group's sum scaled in fp32
        part = tl.zeros([BM, BN], tl.float32)
        for jj in tl.static_range(4):
            part = _mma(_codes_16(q, jj, OFFSET, DT, BN, DOT_F32), xs[jj], part, False, DOT_F32)
        acc += part * s[None, :]
        if HAS_ZS:
            acc += tl.sum(x.to(tl.float32), axis=1)[:, None] * zs[None, :]
    return acc


@triton.jit
def _exact_f32(d):
    """int32 → fp32 for |d| < 2^22 without the (quarter-rate) I2F: bits of 2^23 + 2^22 + d, minus that constant."""
    return (d + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _group_dot_i8(x, q, acc, s, zs, HAS_ZS: tl.constexpr, WEIGHTS_A: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, DOT_F32: tl.constexpr):
    """acc += (x int8 [BM, 128] @ codes) · s (+ Σx · zs), the dot exact in int32 (codes q − 8, or q with zs)."""
    x0, x1 = tl.split(tl.reshape(x, [BM, 16, 4, 2]))           # slot 8r + 2b + jj: x0/x1 = jj
    x0 = tl.reshape(x0, [BM, 64])
    x1 = tl.reshape(x1, [BM, 64])
    if WEIGHTS_A:
        d = tl.zeros([BN, BM], tl.float32 if DOT_F32 else tl.int32)
    else:
        d = tl.zeros([BM, BN], tl.float32 if DOT_F32 else tl.int32)
    d = _mma(_codes_i8(q, 0, not HAS_ZS, BN), x0, d, WEIGHTS_A, DOT_F32)
    d = _mma(_codes_i8(q, 1, not HAS_ZS, BN), x1, d, WEIGHTS_A, DOT_F32)
    acc += _exact_f32(d.to(tl.int32)) * _per_col(s, WEIGHTS_A)    # |d| ≤ 128·15·128 < 2^22
    if HAS_ZS:
        acc += _per_row(tl.sum(x.to(tl.int32), axis=1).to(tl.float32), WEIGHTS_A) * _per_col(zs, WEIGHTS_A)
    return acc


@triton.jit
def _codes_k(q, BN: tl.constexpr):
    """q int32 [16, BN] → int32 [128, BN]: the group's codes 0..15 in slot order (slot 8r + j: nibble j of word r)."""
    c = (q[:, None, :] >> (4 * tl.arange(0, 8))[None, :, None]) & 0xF
    return tl.reshape(c, [128, BN])


@triton.jit
def _group_dot_natural(x, q, acc, s, zs, A8: tl.constexpr, HAS_ZS: tl.constexpr, BN: tl.constexpr,
                       DOT_F32: tl.constexpr):
    """acc [BM, BN] += x [BM, 128] @ W over one group, codes as B in slot order: A8 summed in int32 and scaled;
    16-bit as weights rounded to x's dtype, the mma accumulating across groups."""
    c = _codes_k(q, BN)
    OFFSET: tl.constexpr = 0 if HAS_ZS else 8
    if A8:
        d = _mma((c - OFFSET).to(tl.int8), x, tl.zeros(acc.shape, tl.float32 if DOT_F32 else tl.int32), False,
                 DOT_F32)
        acc += _exact_f32(d.to(tl.int32)) * s[None, :]             # |d| ≤ 128·15·128 < 2^22
        if HAS_ZS:
            acc += tl.sum(x.to(tl.int32), axis=1).to(tl.float32)[:, None] * zs[None, :]
    else:
        DT = x.dtype
        if DT == tl.float16:
            w = (c | 0x6400).to(tl.int16).to(DT, bitcast=True)    # 1024 + q, exactly (as in _codes_16)
            base: tl.constexpr = 1024.0
        else:
            w = (c | 0x4300).to(tl.int16).to(DT, bitcast=True)    # 128 + q
            base: tl.constexpr = 128.0
        if DOT_F32:                                                # the interpreter has no bf16 arithmetic
            w = w.to(tl.float32)
        acc = _mma(_scaled(w - (base + OFFSET), s, zs, HAS_ZS, DT, DOT_F32), x, acc, False, DOT_F32)
    return acc


@triton.jit
def _load_scales(s_ptr, zs_ptr, g, N, rn, cols, HAS_ZS: tl.constexpr):
    """Group g's scales and zs [BN] (without zero points zs is s)."""
    s = tl.load(s_ptr + g * N + rn, mask=cols, other=0)
    if HAS_ZS:
        zs = tl.load(zs_ptr + g * N + rn, mask=cols, other=0)
    else:
        zs = s
    return s, zs


@triton.jit(do_not_specialize=["M"])    # one compiled kernel for M = 1 and M > 1
def _int4_matmul_kernel(
        x_ptr, xs_ptr, qw_ptr, s_ptr, zs_ptr, out_ptr, ws_ptr, cnt_ptr,
        M, N, K, stride_xm, stride_om,
        A8: tl.constexpr, HAS_ZS: tl.constexpr, WEIGHTS_A: tl.constexpr, NATURAL: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, DOT_F32: tl.constexpr):
    # grid (M tiles, N tiles, splits): M tiles fastest, so CTAs sharing weights run together
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    n_groups = K // 128
    per_split = tl.cdiv(n_groups, tl.num_programs(2))
    g_lo = pid_k * per_split
    g_hi = tl.minimum(g_lo + per_split, n_groups)
    x_tile = x_ptr + rm[:, None].to(tl.int64) * stride_xm + tl.arange(0, 128)[None, :]
    w_tile = qw_ptr + tl.arange(0, 16)[:, None] + rn[None, :] * 16             # [16 words, BN columns]
    if WEIGHTS_A:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # Scales feed no dot, so the pipeliner leaves their loads in place: loaded a group ahead by hand instead.
    s_next, zs_next = _load_scales(s_ptr, zs_ptr, g_lo, N, rn, n_ok, HAS_ZS)
    for g in range(g_lo, g_hi):
        s = s_next.to(tl.float32)
        zs = zs_next.to(tl.float32)
        s_next, zs_next = _load_scales(s_ptr, zs_ptr, g + 1, N, rn, n_ok & (g + 1 < g_hi), HAS_ZS)
        # weights streamed once, activations re-read by every column tile
        q = tl.load(w_tile + g * 16 * N, mask=n_ok[None, :], other=0, eviction_policy="evict_first")
        x = tl.load(x_tile + g * 128, mask=m_ok[:, None], other=0, eviction_policy="evict_last")
        if NATURAL:
            acc = _group_dot_natural(x, q, acc, s, zs, A8, HAS_ZS, BLOCK_N, DOT_F32)
        elif A8:
            acc = _group_dot_i8(x, q, acc, s, zs, HAS_ZS, WEIGHTS_A, BLOCK_M, BLOCK_N, DOT_F32)
        else:
            acc = _group_dot_16(x, q, acc, s, zs, HAS_ZS, WEIGHTS_A, BLOCK_M, BLOCK_N, DOT_F32)
    if WEIGHTS_A:
        acc = tl.trans(acc)
    if A8:
        acc *= tl.load(xs_ptr + rm, mask=m_ok, other=0).to(tl.float32)[:, None]
    store_tile(acc, out_ptr, ws_ptr, cnt_ptr, rm, rn, M, N, stride_om, pid_m * tl.num_programs(1) + pid_n, SPLIT)


CODES, WEIGHTS_A, NATURAL = "codes", "weights_a", "natural"
FORMS = (CODES, WEIGHTS_A, NATURAL)


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4
    form: str = CODES


# Per M bucket (upper bound inclusive): tiles, form, CTAs per SM split-K aims for (H200; bench.kernels_int4 --sweep)
M_BUCKETS = (
    (16, dict(block_m=16, block_n=128, num_warps=4, num_stages=3, form=CODES, ctas_per_sm=3)),
    (64, dict(block_m=64, block_n=128, num_warps=4, num_stages=3, form=WEIGHTS_A, ctas_per_sm=2)),
    (None, dict(block_m=128, block_n=128, num_warps=8, num_stages=3, form=NATURAL, ctas_per_sm=1)),
)


def supports(x: torch.Tensor, w: Int4Weight) -> bool:
    """Whether this kernel takes the call: group 128, x bf16/fp16 (or int8 codes: W4A8) with unit column stride."""
    return (w.group == GROUP and x.dtype in (torch.bfloat16, torch.float16, torch.int8) and x.stride(-1) == 1
            and x.shape[-1] == w.k)


def config(m: int, n: int, k: int, device, a8: bool = False, **override) -> Config:
    """The M bucket's tiles (override: the benchmark's sweep), split-K only to fill the GPU. W4A8 keeps WEIGHTS_A
    for NATURAL; sm_8x (no wgmma) takes CODES beyond 16 rows, at most 64 rows and 8 warps (larger tiles spill)."""
    p = dict(next(p for bound, p in M_BUCKETS if bound is None or m <= bound), **override)
    if a8 and p["form"] == NATURAL:
        p.update(form=WEIGHTS_A)
    if gpu.capability(device) < (9, 0) and p["block_m"] > 16:          # no wgmma
        p.update(form=CODES, block_m=64, num_warps=8)
    tiles = triton.cdiv(m, p["block_m"]) * triton.cdiv(n, p["block_n"])
    split = split_count(tiles, k // GROUP, p["ctas_per_sm"], gpu.num_sms(device))
    return Config(p["block_m"], p["block_n"], split, p["num_warps"], p["num_stages"], p["form"])


@functools.lru_cache(maxsize=None)
def slot_index(k: int, device) -> torch.Tensor:
    """Gather index [K]: slot-ordered activations hold at 128·b + 8i + j the k = 128·b + mma_k[i, j]."""
    gpu.check_not_capturing("int4 slot_index", device)
    return (torch.arange(0, k, 128, device=device)[:, None] + mma_k(device).flatten()).flatten()


def launch(x: torch.Tensor, w: Int4Weight, out: torch.Tensor, cfg: Config, x_scale: torch.Tensor = None):
    """x [..., K] bf16/fp16, or int8 with per-token scales x_scale [...] (W4A8) → out [..., N] (any float)."""
    assert w.group == GROUP, "kernel supports group size 128"
    k, n = w.k, w.n
    assert x.shape[-1] == k and x.stride(-1) == 1, (x.shape, k)
    assert n % 8 == 0
    x2 = x.reshape(-1, k).index_select(1, slot_index(k, x.device))           # [M, K] in slot order
    m = x2.shape[0]
    out2 = out.view(-1, n)
    assert out2.shape[0] == m and out2.stride(-1) == 1
    assert cfg.form in FORMS, cfg.form
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
    ws, cnt = workspace(x.device, m * n if cfg.split_k > 1 else 1, grid[0] * grid[1])
    zs = w.zs if w.zs is not None else w.scales
    _int4_matmul_kernel[grid](
        x2, x_scale if x_scale is not None else x2, w.qweight, w.scales, zs, out2, ws, cnt,
        m, n, k, x2.stride(0), out2.stride(0),
        A8=x_scale is not None, HAS_ZS=w.zs is not None, WEIGHTS_A=cfg.form == WEIGHTS_A,
        NATURAL=cfg.form == NATURAL, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        SPLIT=cfg.split_k > 1, DOT_F32=gpu.INTERPRET,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
