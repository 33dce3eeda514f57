"""Warp-specialised int4-weight GEMM on Hopper for large batches (65+ rows): out[M, N] = x[M, K] @ W[N, K]ᵀ, W in the
mma int4 layout (layers/quant.py), x bf16/fp16. The weights are unpacked exactly as in kernels/int4_wgmma.py (its
`_a_operand`: the wgmma's register operand, scaled to x's dtype); what differs is who waits for whom.

Why: int4_wgmma.py's CTAs copy their own ring (cp.async) and meet at a CTA barrier every group, so its warps move in
lockstep and a second warpgroup per CTA (fewer activation re-reads) was slower; at 320 rows it ran at 0.62-0.86x
cuBLAS bf16 (H200). Here a CTA is three partitions that meet only at mbarriers:
* a loader warp: per group of 128 k, one TMA copy each of the words [BN, 16] int32, the scales [1, BN] and the
  activations [BM, 128] (+ [BM2, 128]) into a ring stage (`full` barrier: the bytes arrived), after waiting for
  the stage's `empty` barrier; with programmatic dependent launch its first activations wait for the previous
  kernel, the weights before it do not;
* two consumer warpgroups, 64 output columns each (the wgmma's M side), sharing the activation tile (its N side,
  BM + BM2 tokens): wait `full`, unpack the group's weights into registers, issue the wgmma (a second one over the
  BM2 tokens, same A registers), and arrive on `empty` once the mma that read the stage has retired. With OVERLAP
  (an even number of groups) group i's mma runs while group i + 1 is unpacked: two A register sets, each held past
  its mma (int4_wgmma._hold: ptxas frees wgmma A registers at issue).
BM2 exists because Gluon tensors have power-of-2 shapes: 320 rows are two 160-token tiles (128 + 32).
Split-K (where the tiles alone leave SMs idle: out_proj and down below ~160 rows) as int4_wgmma.py: each split's
tile added in fp64 into the workspace, the last arrival stores it (int4_gemv.flush_tile; the same bits in any
order). `launch` picks tile and split; calls whose CTAs would fill less than half the SMs stay with int4_wgmma.py.
H200 (us; cuBLAS bf16 / int4_wgmma.py / this, one run): 320 rows qkvz 71.3 / 121.2 / 79.9, out_proj 35.3 / 52.1 /
36.0, attn 67.6 / 110.7 / 75.8, gate_up 209.0 / 262.5 / 217.0 (193-217 over four runs), down 92.5 / 140.6 / 92.4;
80 rows qkvz 42.2 / 44.2 / 33.4, out_proj 19.2 / 32.7 / 23.6 (3 splits; 33.9 unsplit), down 53.3 / 91.3 / 44.8 (3
splits; 91.9 unsplit); 200 rows qkvz 49.1 / 87.9 / 60.6, gate_up 110.1 / 195.7 / 157.7. Without the overlap (4 /
3 stages) 320 rows took 5-25% longer; 160-token tiles where they make fewer, fuller waves (qkvz 76.5 against 92.5
on 128), 128 where out_proj's 80 tiles of 160 would leave 52 SMs idle (35.7 against 43.5); split-K beyond one wave
pays for its fp64 atomics (attn at 320 rows in 4 splits 216 against 78 unsplit).
Gluon has no interpreter: checked against the dequantising reference in the GPU tests, compiled for sm_90 by
tests/aot_compile.py. Reference: layers.quant.dequantize_int4."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels import device as gpu
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait
from kernels.int4_gemv import flush_tile
from kernels.int4_wgmma import _a_operand, _hold, _pairs, layouts
from kernels.splitk import split_share, workspace
from layers.quant import Int4Weight

WG_COLS = gl.constexpr(64)              # output columns per consumer warpgroup (the wgmma's M)
CONSUMERS = gl.constexpr(2)
TOKEN_TILES = ((128, 0), (128, 32))     # (BM, BM2) candidates: 128 or 160 tokens a CTA
STAGES = 4
MAX_SPLITS = 4
MIN_ROWS = 65                           # up to 64 rows int4_wgmma.py's launches are as fast or faster
MAXNREG = 168                           # 12 warps at one CTA per SM; setmaxnreg gives consumers 232, the loader 40


@gluon.jit
def _release(i, empty, STAGES: gl.constexpr, pred):
    """Stage of group i free for the loader: this warpgroup's reads of it ordered before the next TMA writes."""
    fence_async_shared()
    mbarrier.arrive(empty.index(i % STAGES), pred=pred)


@gluon.jit
def _group(i, c: gl.constexpr, rings, full, acc, acc2, a_op: gl.constexpr, a_op2: gl.constexpr, words: gl.constexpr,
           flat: gl.constexpr, BM2: gl.constexpr, STAGES: gl.constexpr, DT: gl.constexpr, PENDING: gl.constexpr):
    """Consumer c's group i: wait for its stage, unpack its 64 columns' weights, issue the mma(s); afterwards at
    most PENDING groups' mma are in flight. Returns the accumulators and the A registers (_pairs)."""
    words_ring, scales_ring, acts_ring, acts2_ring = rings
    s = i % STAGES
    mbarrier.wait(full.index(s), (i // STAGES) & 1)
    w_stage = words_ring.index(s)._reinterpret(gl.int32, [CONSUMERS, WG_COLS, 16], flat).index(c)
    s_stage = scales_ring.index(s)._reinterpret(scales_ring.dtype, [CONSUMERS, 1, WG_COLS], flat).index(c)
    a, p = _a_operand(w_stage, s_stage, WG_COLS, DT, words, a_op)
    acc = warpgroup_mma(a, acts_ring.index(s).permute((1, 0)), acc, is_async=True)
    if BM2 > 0:
        a2 = gl.convert_layout(a, a_op2, assert_trivial=True)
        acc2 = warpgroup_mma(a2, acts2_ring.index(s).permute((1, 0)), acc2, is_async=True)
        acc, acc2 = warpgroup_mma_wait(2 * PENDING, deps=[acc, acc2])
    else:
        acc = warpgroup_mma_wait(PENDING, deps=[acc])
    return acc, acc2, p


@gluon.jit
def _store(acc, out_ptr, M, N, stride_om, c0, m0, BM: gl.constexpr, mma: gl.constexpr):
    cols = c0 + gl.arange(0, WG_COLS, layout=gl.SliceLayout(1, mma))
    tok = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    gl.store(out_ptr + gl.expand_dims(tok, 0) * stride_om + gl.expand_dims(cols, 1),
             acc.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(cols < N, 1) & gl.expand_dims(tok < M, 0))


@gluon.jit
def _consumer(c: gl.constexpr, rings, bars, args, split_args, mma: gl.constexpr, mma2: gl.constexpr, a_op: gl.constexpr,
              a_op2: gl.constexpr, words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr, BM2: gl.constexpr,
              STAGES: gl.constexpr, DT: gl.constexpr, OVERLAP: gl.constexpr, SPLIT: gl.constexpr):
    full, empty = bars
    out_ptr, M, N, stride_om, n0, m0, n_groups, g_lo = args      # groups g_lo … g_lo + n_groups − 1 of K
    acc = gl.zeros([WG_COLS, BM], gl.float32, mma)
    acc2 = gl.zeros([WG_COLS, BM2 if BM2 > 0 else BM], gl.float32, mma2)      # unused without BM2
    if OVERLAP:
        zeros = gl.zeros([WG_COLS // 16, 2, 8, 4, 4], gl.int32, words)
        held = _pairs(zeros, zeros, DT)
        for i in range(0, n_groups, 2):         # pairs, so that each A register set is fixed
            acc, acc2, p0 = _group(i, c, rings, full, acc, acc2, a_op, a_op2, words, flat, BM2, STAGES, DT, 1)
            _hold(held)
            _release(i - 1, empty, STAGES, i > 0)
            acc, acc2, held = _group(i + 1, c, rings, full, acc, acc2, a_op, a_op2, words, flat, BM2, STAGES, DT, 1)
            _hold(p0)
            _release(i, empty, STAGES, True)
        if BM2 > 0:
            acc, acc2 = warpgroup_mma_wait(0, deps=[acc, acc2])
        else:
            acc = warpgroup_mma_wait(0, deps=[acc])
        _hold(held)
        _release(n_groups - 1, empty, STAGES, True)
    else:
        for i in range(n_groups):
            acc, acc2, _ = _group(i, c, rings, full, acc, acc2, a_op, a_op2, words, flat, BM2, STAGES, DT, 0)
            _release(i, empty, STAGES, True)
    if SPLIT:       # the K ranges of a tile meet in the workspace (fp64: the same bits in any order of arrival)
        ws_ptr, cnt_ptr, k_groups, m_tile = split_args
        tile = n0 // WG_COLS + c                                    # in 64-column tiles
        tiles = gl.cdiv(N, CONSUMERS * WG_COLS) * CONSUMERS
        flush_tile(acc, tile, n_groups, k_groups, out_ptr + m0 * stride_om, ws_ptr + 2 * m0 * N,
                   cnt_ptr + 2 * m_tile * tiles, M - m0, N, stride_om, WG_COLS, BM, mma)
        if BM2 > 0:
            flush_tile(acc2, tile, n_groups, k_groups, out_ptr + (m0 + BM) * stride_om, ws_ptr + 2 * (m0 + BM) * N,
                       cnt_ptr + (2 * m_tile + 1) * tiles, M - m0 - BM, N, stride_om, WG_COLS, BM2, mma2)
    else:
        c0 = n0 + c * WG_COLS
        _store(acc, out_ptr, M, N, stride_om, c0, m0, BM, mma)
        if BM2 > 0:
            _store(acc2, out_ptr, M, N, stride_om, c0, m0 + BM, BM2, mma2)


@gluon.jit
def _first_consumer(rings, bars, args, split_args, mma: gl.constexpr, mma2: gl.constexpr, a_op: gl.constexpr,
                    a_op2: gl.constexpr, words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr,
                    BM2: gl.constexpr, STAGES: gl.constexpr, DT: gl.constexpr, OVERLAP: gl.constexpr,
                    SPLIT: gl.constexpr):
    _consumer(0, rings, bars, args, split_args, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT, OVERLAP,
              SPLIT)


@gluon.jit
def _worker(rings, bars, args, split_args, descs, mma: gl.constexpr, mma2: gl.constexpr, a_op: gl.constexpr,
            a_op2: gl.constexpr, words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr, BM2: gl.constexpr,
            STAGES: gl.constexpr, DT: gl.constexpr, OVERLAP: gl.constexpr, SPLIT: gl.constexpr, LOADER: gl.constexpr,
            PDL: gl.constexpr):
    """The worker partitions share one signature: the second consumer, or the loader."""
    if LOADER:
        words_ring, scales_ring, acts_ring, acts2_ring = rings
        full, empty = bars
        out_ptr, M, N, stride_om, n0, m0, n_groups, g_lo = args
        w_desc, s_desc, x_desc, x2_desc = descs
        BN: gl.constexpr = CONSUMERS * WG_COLS
        nbytes: gl.constexpr = BN * 64 + BN * 2 + (BM + BM2) * 256
        for i in range(n_groups):
            s = i % STAGES
            g = g_lo + i
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(full.index(s), nbytes)
            tma.async_copy_global_to_shared(w_desc, [g * N + n0, 0], full.index(s), words_ring.index(s))
            tma.async_copy_global_to_shared(s_desc, [g, n0], full.index(s), scales_ring.index(s))
            if PDL:                             # the activations are the previous kernel's output
                if i == 0:
                    gdc_wait()
                    gdc_launch_dependents()
            tma.async_copy_global_to_shared(x_desc, [m0, g * 128], full.index(s), acts_ring.index(s))
            if BM2 > 0:
                tma.async_copy_global_to_shared(x2_desc, [m0 + BM, g * 128], full.index(s), acts2_ring.index(s))
    else:
        _consumer(1, rings, bars, args, split_args, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT,
                  OVERLAP, SPLIT)


@gluon.jit
def _int4_ws_kernel(w_desc, s_desc, x_desc, x2_desc, out_ptr, ws_ptr, cnt_ptr, M, N, K, stride_om, m_tiles, splits,
                    mma: gl.constexpr, mma2: gl.constexpr, a_op: gl.constexpr, a_op2: gl.constexpr,
                    words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr, BM2: gl.constexpr,
                    STAGES: gl.constexpr, OVERLAP: gl.constexpr, SPLIT: gl.constexpr, PDL: gl.constexpr):
    # Descriptors (host TMA): words = qweight [K/128 · N, 16] int32, block [BN, 16]; scales [K/128, N], block
    # [1, BN]; x [M, K] bf16/fp16, blocks [BM, 128] and [BM2, 128] (rows past M read as zeros); out [M, N] any float
    # dtype (row stride stride_om); ws fp32 [2·M·N] (as fp64 [M, N]) and cnt int32 [2 · m_tiles · N / 64] zeroed
    # (kernels/splitk.py). Grid (n_tiles · splits · m_tiles,): program = (n_tile · splits + split) · m_tiles + m_tile;
    # a split holds an equal share of the groups (in pairs with OVERLAP: the host checks none is empty).
    DT: gl.constexpr = x_desc.dtype
    BN: gl.constexpr = CONSUMERS * WG_COLS
    pid = gl.program_id(0)
    m_tile = pid % m_tiles
    split = (pid // m_tiles) % splits
    m0 = m_tile * (BM + BM2)
    n0 = pid // (m_tiles * splits) * BN
    k_groups = K // 128
    per_split = 2 * gl.cdiv(k_groups // 2, splits) if OVERLAP else gl.cdiv(k_groups, splits)
    g_lo = split * per_split
    n_local = gl.minimum(g_lo + per_split, k_groups) - g_lo
    words_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 16], w_desc.layout)
    scales_ring = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, BN], s_desc.layout)
    acts_ring = gl.allocate_shared_memory(DT, [STAGES, BM, 128], x_desc.layout)
    acts2_ring = gl.allocate_shared_memory(DT, [STAGES, BM2, 128], x2_desc.layout) if BM2 > 0 else acts_ring
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)               # the loader's expected bytes
        mbarrier.init(empty.index(i), count=CONSUMERS)      # one arrival per consumer warpgroup
    rings = (words_ring, scales_ring, acts_ring, acts2_ring)
    bars = (full, empty)
    args = (out_ptr, M, N, stride_om, n0, m0, n_local, g_lo)
    split_args = (ws_ptr, cnt_ptr, k_groups, m_tile)
    descs = (w_desc, s_desc, x_desc, x2_desc)
    gl.warp_specialize([
        (_first_consumer, (rings, bars, args, split_args, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT,
                           OVERLAP, SPLIT)),
        (_worker, (rings, bars, args, split_args, descs, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT,
                   OVERLAP, SPLIT, False, PDL)),
        (_worker, (rings, bars, args, split_args, descs, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT,
                   OVERLAP, SPLIT, True, PDL)),
    ], [4, 1], [232, 40])


def launch(m: int, n: int, k: int, sms: int):
    """(BM, BM2, splits) for m rows, or None where this kernel does not take the call: the token tile and K split
    whose waves take the least time (waves of one CTA per SM times the tokens and groups a CTA holds), if its CTAs
    fill at least half the SMs. K is split (an equal share of the groups each, in pairs where they pair up) only
    while the CTAs still fit one wave: the split tiles' fp64 flush is paid in atomics (H200, attn at 320 rows in
    4 splits: 216 against 78 us unsplit; down at 80 rows in 3: 44 against 91)."""
    if m < MIN_ROWS:
        return None
    n_tiles = triton.cdiv(n, CONSUMERS.value * WG_COLS.value)
    groups = k // 128
    unit = 2 if groups % 2 == 0 else 1                  # the overlapped loop's pairs
    best = None
    for tile in TOKEN_TILES:
        tiles = n_tiles * triton.cdiv(m, sum(tile))
        for splits in range(1, max(1, min(MAX_SPLITS, sms // tiles)) + 1):
            per = split_share(groups, splits, unit)
            if not per:                                 # an empty split
                continue
            cost = triton.cdiv(tiles * splits, sms) * sum(tile) * per
            if best is None or cost < best[0]:
                best = (cost, tiles * splits, tile + (splits,))
    return best[2] if 2 * best[1] >= sms else None


def pick(x: torch.Tensor, w: Int4Weight):
    """The (BM, BM2, splits) launch for this call, or None where int4_wgmma.py keeps it: `launch`'s choice, when
    x's rows meet TMA's alignment (16-byte base and row stride). For calls int4_wgmma.supports takes."""
    x2 = x.reshape(-1, x.shape[-1])
    aligned = x2.data_ptr() % 16 == 0 and (x2.stride(0) * x2.element_size()) % 16 == 0
    return launch(x2.shape[0], w.n, w.k, gpu.num_sms(x.device)) if aligned else None


def int4_wgmma_ws(x: torch.Tensor, w: Int4Weight, out: torch.Tensor, cfg: tuple, overlap: bool = None,
                  stages: int = STAGES) -> torch.Tensor:
    """x [..., K] bf16/fp16 (rows TMA-aligned: pick), w symmetric with group 128, out [..., N] any float dtype:
    out = x @ Wᵀ. cfg = (BM, BM2, splits) as `pick` chooses; overlap (default: wherever the groups pair up) needs
    an even number of groups."""
    k, n = w.k, w.n
    x2 = x.reshape(-1, k)
    out2 = out.view(-1, n)
    m = x2.shape[0]
    bm, bm2, splits = cfg
    overlap = k % 256 == 0 if overlap is None else overlap
    assert x2.stride(-1) == 1 and out2.stride(-1) == 1 and n % 8 == 0 and k % 128 == 0
    assert not overlap or k % 256 == 0, "overlap: groups in pairs"
    assert split_share(k // 128, splits, 2 if overlap else 1), "an empty split"
    bn = CONSUMERS.value * WG_COLS.value
    plain = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    w_desc = TensorDescriptor.from_tensor(w.qweight.view(-1, 16), [bn, 16], plain)
    s_desc = TensorDescriptor.from_tensor(w.scales, [1, bn],
                                          gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2))
    x_layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)   # as the wgmma reads it
    x_desc = TensorDescriptor.from_tensor(x2, [bm, 128], x_layout)
    mma, a_op, words = layouts(WG_COLS.value, bm, 4)
    x2_desc, mma2, a_op2 = x_desc, mma, a_op                        # stand-ins the kernel never uses without BM2
    if bm2:
        x2_desc = TensorDescriptor.from_tensor(x2, [bm2, 128], x_layout)
        mma2, a_op2, _ = layouts(WG_COLS.value, bm2, 4)
    flat = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    m_tiles = triton.cdiv(m, bm + bm2)
    ws, cnt = workspace(x.device, 2 * m * n, 2 * m_tiles * triton.cdiv(n, bn) * CONSUMERS.value)   # fp64 [M, N]
    pdl = gpu.pdl(x.device)
    _int4_ws_kernel[(triton.cdiv(n, bn) * splits * m_tiles,)](
        w_desc, s_desc, x_desc, x2_desc, out2, ws, cnt, m, n, k, out2.stride(0), m_tiles, splits, mma, mma2, a_op,
        a_op2, words, flat, bm, bm2, stages, overlap, splits > 1, pdl, num_warps=4, maxnreg=MAXNREG, launch_pdl=pdl)
    return out
