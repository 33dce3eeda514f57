"""Int4-weight linears: out[M, N] = x[M, K] @ W[N, K]ᵀ with W in the mma int4 layout (layers/quant.py).

  int4_linear(x, w)          W4A16: x bf16/fp16, fp32 accumulation, output in x's dtype (or a given buffer)
  w4a8_linear(x_q, s_a, w)   W4A8: x_q int8 [M, K] with per-token scales s_a [M] (layers/quant.quantize_act_int8)

Shapes (kernel): x [M, K] (row stride stride_xm, unit column stride), qweight int32 [K/128, N, 16], scales/zs
[K/128, N], out [M, N] (row stride stride_om); K a multiple of 128 (= the group), N a multiple of 8. Fused
projections (gate+up, q/k/v(+gate), GDN qkv+z) are one call on the weights concatenated along N by the loader.
Reference: layers.quant.dequantize_int4 (tests compare against x @ dequantize_int4(w).T).
On a GPU (sm_80+), int4_linear hands calls of ≤ 24 rows with symmetric weights to kernels/int4_gemv.py, which
streams the weights straight into the mma's registers (~2x faster there; a token's row bitwise the same at any of
those row counts), and on sm_90 larger ones mostly to kernels/int4_wgmma_ws.py (weights as the wgmma's register
operand, a TMA loader and two consumer warpgroups: 1.3-2.2x cuBLAS bf16 at 32-64 rows, 0.93-1.22x at 320; W4A8 from
65 rows, its activations permuted to the operand's k order first), the rest to kernels/int4_wgmma.py —
their sums are not the GEMV's bits (bf16-rounded scaled weights, fp32 across groups), nor the same across their own
cuts (H200: 64 against 65 rows differ at out_proj, gate_up and down); this kernel covers the rest (W4A8 below 65
rows, asymmetric weights, sm_8x), and every row count in the CPU interpreter (Gluon has none).
Passing a Config forces it.

Design, and why:
* Tensor cores for every M, M padded to BLOCK_M ≥ 16. The cost of an int4 GEMV is unpacking, not multiplying:
  on CUDA cores each weight would also need M FMAs, more than the H200 can issue at 4.8 TB/s beyond M ≈ 2, while
  an mma costs the same for M = 1 and M = 16. mma.sync bf16/fp16/int8 also runs on sm_80/86.
* Unpacking without int→float conversions: t = (word >> 4j) & 0x000F000F | 0x43004300 is a pair of bf16 numbers
  128 + q (codes j and j+4 of the word), so one shift and two logic ops give two weights; subtracting 136 (or 128
  with zero points) is exact. fp16 activations use 0x6400 (1024 + q). Int8 (W4A8): t = (word >> 4j) & 0x0F0F0F0F
  is four int8 codes j, j+2, j+4, j+6, made signed (q − 8) by one add and one xor per four codes.
* The weights unpack in the layout's slot order (slot 8i + j = nibble j of word i; layers/quant.py), so the
  activations are gathered into that order before the launch (one small copy: permuting each tile in registers
  made the kernel 1.1-2.4x slower on the H200), and each register pair/quad becomes one pair/quad of the mma
  operand (see _codes_16/_codes_i8), the tile split into the same order in registers.
* Small M (GEMV form): the mma sees exact codes, and the group's fp32 partial sums are scaled once per group.
  Large M (WEIGHTS_A form, Hopper wgmma): the weights are the mma's A operand, which wgmma reads from registers
  (as B they would go through shared memory with a barrier per dot); W4A16 there scales the weights before the
  mma (rounded to x's dtype, as a bf16 dequantised checkpoint would be) so the mma accumulates across groups.
* Large M (NATURAL form, Hopper): the codes are unpacked in k order into the B operand, so the activation tile
  feeds wgmma from shared memory as it was loaded (the WEIGHTS_A form permutes it in registers and writes it back,
  and waits for every mma). W4A8 there sums each group exactly in int32 (int8 codes − 8) and scales it in fp32;
  int8 tensor cores run at twice the bf16 rate (the H200 measured 0.5-0.7x a bf16 cuBLAS GEMM at 320 rows).
* Group scales are loaded one group ahead by hand (see the kernel): Triton's pipeliner prefetches codes and
  activations (they feed a dot) but not the scales.
* Split-K over groups, reduced in one launch by kernels/splitk.store_tile (graph-safe, no memset).
"""
import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels import device as gpu, fixed_sum
from kernels.splitk import split_count, store_tile, workspace
from layers.quant import Int4Weight, a8_permute, mma_k

try:                            # Gluon is experimental in Triton: without it, this kernel serves every call
    from kernels.int4_gemv import int4_gemv, supports as gemv_supports
    from kernels.int4_wgmma import int4_wgmma, supports as wgmma_supports
    from kernels.int4_wgmma_ws import int4_wgmma_ws, pick as ws_pick
except ImportError:
    def gemv_supports(x, w):
        return False

    def wgmma_supports(x, w):
        return False

GROUP = 128


@triton.jit
def _as_dot_operand(t, DOT_F32: tl.constexpr):
    # The Triton interpreter multiplies bf16 operands wrongly (ENGINE.md §7): fp32 there, exact for these values.
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
    """Codes w [Kd, BN] (code − 8, or code with zero points) → weights w·s (+ zs) in DT, rounded as a bf16/fp16
    dequantised checkpoint holds them (fp32 in the interpreter); s, zs [BN] fp32."""
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
    """acc (fp32) += x [BM, 128] (bf16/fp16, slot order) @ W over one group: codes q int32 [16, BN], s/zs [BN]
    fp32."""
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
    """acc (fp32) += (x int8 [BM, 128], slot order, @ codes) · s (+ Σx · zs), the int8 dot exact in int32.
    Symmetric codes enter the mma as q − 8; with zero points as q (0..15), and zs·Σx adds the offset."""
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
    """acc [BM, BN] (fp32) += x [BM, 128] @ W over one group, x and the codes in slot order:
    A8: the int8 codes (− 8 when symmetric) summed exactly in int32, scaled in fp32 (+ Σx·zs);
    16-bit: weights (q − 8)·s (or q·s + zs) rounded to x's dtype, the mma accumulating across groups."""
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
    """Group g's scales and zs over columns rn where `cols` (raw dtype, [BN]); without zero points zs is s."""
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
    # x [M, K] (bf16/fp16, or int8 with xs [M] fp32 when A8; slot order), qw int32 [K/128, N, 16], s/zs [K/128, N],
    # out [M, N]
    # grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), split-K count): M-tiles vary fastest, so CTAs sharing weights run
    # together. The split count is a grid dimension, not a constexpr: one compiled kernel serves every count.
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
    # The scales feed no dot, so Triton's pipeliner leaves their loads in place, and one waited for in every
    # group costs a full memory latency per group: they are loaded a group ahead by hand instead (one ahead at
    # most: the pipeliner gives up on loops carrying values further).
    s_next, zs_next = _load_scales(s_ptr, zs_ptr, g_lo, N, rn, n_ok, HAS_ZS)
    for g in range(g_lo, g_hi):
        s = s_next.to(tl.float32)
        zs = zs_next.to(tl.float32)
        s_next, zs_next = _load_scales(s_ptr, zs_ptr, g + 1, N, rn, n_ok & (g + 1 < g_hi), HAS_ZS)
        # weights are streamed once: evict first; the activations are re-read by every column tile: keep them
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


# The forms of the module docstring: exact codes as the B operand, group sums scaled in fp32 (small M); scaled
# weights as the A operand (WEIGHTS_A); codes in k order as the B operand (NATURAL)
CODES, WEIGHTS_A, NATURAL = "codes", "weights_a", "natural"
FORMS = (CODES, WEIGHTS_A, NATURAL)


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4
    form: str = CODES                # how the weights enter the mma (FORMS; module docstring)


# Per M bucket (upper bound inclusive): tile sizes, and how many CTAs per SM split-K should aim for. From a first
# H200 sweep at the 27B shapes, made before the scale prefetch and the WEIGHTS_A form existed; the large-M bucket's
# NATURAL form from a second (W4A16 at M = 320: 2.0-2.5x faster than WEIGHTS_A; still ~0.3x cuBLAS bf16). Retune
# with `python -m bench.kernels_int4 --sweep`.
M_BUCKETS = (
    (16, dict(block_m=16, block_n=128, num_warps=4, num_stages=3, form=CODES, ctas_per_sm=3)),
    (64, dict(block_m=64, block_n=128, num_warps=4, num_stages=3, form=WEIGHTS_A, ctas_per_sm=2)),
    (None, dict(block_m=128, block_n=128, num_warps=8, num_stages=3, form=NATURAL, ctas_per_sm=1)),
)


def pick_config(m: int, n: int, k: int, device, a8: bool = False, **override) -> Config:
    """Tile table by M bucket (entries can be overridden, e.g. by the benchmark's sweep); split-K only where the
    output tiles alone leave the GPU under-filled, and never with an empty split. W4A8 (a8) keeps the WEIGHTS_A
    form where the table says NATURAL (H200, M = 320: 138 against 195 µs on 16384x5120; its int8 group sums wait
    for every mma in both forms). Without wgmma (sm_8x) the large-M tiles keep the weights as the B operand
    (mma.sync takes both from registers anyway), at most 64 rows and 8 warps: larger tiles spill there (checked
    with ptxas for sm_86)."""
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
    gpu.check_not_capturing("int4_linear.slot_index", device)
    return (torch.arange(0, k, 128, device=device)[:, None] + mma_k(device).flatten()).flatten()


def _launch(x, x_scale, w: Int4Weight, out, cfg: Config):
    assert w.group == GROUP, "kernel supports group size 128"
    k, n = w.k, w.n
    assert x.shape[-1] == k and x.stride(-1) == 1, (x.shape, k)
    assert n % 8 == 0
    x2 = x.reshape(-1, k).index_select(1, slot_index(k, x.device))           # [M, K] in slot order
    m = x2.shape[0]
    out2 = out.view(-1, n)
    assert out2.shape[0] == m and out2.stride(-1) == 1
    cfg = cfg or pick_config(m, n, k, x.device, a8=x_scale is not None)
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


def int4_linear(x: torch.Tensor, w: Int4Weight, out: torch.Tensor = None, cfg: Config = None) -> torch.Tensor:
    """x [..., K] bf16/fp16 → [..., N] (x's dtype, or written into `out`, any float dtype; or int64 zeros that
    receive the fixed-point sums, for the GEMV's rows: kernels/fixed_sum.py)."""
    assert x.dtype in (torch.bfloat16, torch.float16)
    if out is None:
        out = torch.empty(*x.shape[:-1], w.n, dtype=x.dtype, device=x.device)
    if cfg is None and gemv_supports(x, w):
        return int4_gemv(x, w, out)
    assert not fixed_sum.deferred(out), "int64 sums (kernels/fixed_sum.py) come from the GEMV's rows only"
    if cfg is None and wgmma_supports(x, w):
        ws_cfg = ws_pick(x, w)
        return int4_wgmma_ws(x, w, out, ws_cfg) if ws_cfg else int4_wgmma(x, w, out)
    return _launch(x, None, w, out, cfg)


def w4a8_linear(x_q: torch.Tensor, s_a: torch.Tensor, w: Int4Weight, out: torch.Tensor = None,
                out_dtype: torch.dtype = torch.bfloat16, cfg: Config = None, a8_order: bool = False) -> torch.Tensor:
    """x_q int8 [..., K] with per-token fp32 scales s_a [...] → [..., N] in out_dtype (or into `out`). From 65 rows
    on sm_90 the warp-specialised kernel takes the call, x_q in its operand's k order: as given with a8_order (the
    norms write it so: kernels/norms.py), else after one permuting copy; the other kernels take natural order (an
    a8_order x_q is copied back to it)."""
    assert x_q.dtype == torch.int8 and s_a.dtype == torch.float32 and s_a.is_contiguous()
    if out is None:
        out = torch.empty(*x_q.shape[:-1], w.n, dtype=out_dtype, device=x_q.device)
    ws_cfg = ws_pick(x_q, w) if cfg is None and wgmma_supports(x_q, w) else None
    if ws_cfg:
        x_k = x_q.reshape(-1, w.k)
        return int4_wgmma_ws(x_k if a8_order else a8_permute(x_k), w, out, ws_cfg, x_scale=s_a)
    return _launch(a8_permute(x_q, inverse=True) if a8_order else x_q, s_a, w, out, cfg)
