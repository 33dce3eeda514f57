"""Warp-specialised int4 GEMM on Hopper (Gluon wgmma), 25+ rows (W4A8 65+): out = x @ Wᵀ, W in the mma layout.
A TMA loader warp fills a ring of stages (words, scales, activations [BM + BM2, 128]); two consumer warpgroups
(64 columns each) unpack the weights into the wgmma's register operand ((q − 8)·s in x's dtype), issue the mma
and release the stage; with OVERLAP while unpacking the next group. One range of (tile, group) units a program;
split tiles summed in program order. W4A8: codes − 8 times int8 activations, summed in int32, scaled in fp32.
H200, 320 rows: 0.94-1.22x cuBLAS bf16 (W4A8 1.05-1.50x). Notes: docs/notes/int4.md."""
import functools
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels import device as gpu
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait
from kernels.int4.common import GROUP, MAX_ROWS, exact_log2, prog_of, range_start
from kernels.int4.splitk import workspace
from layers.quant import Int4Weight

WG_COLS = gl.constexpr(64)              # output columns per consumer warpgroup (the wgmma's M)
CONSUMERS = gl.constexpr(2)
TOKEN_TILES = ((128, 0), (128, 32), (128, 64), (128, 128))    # (BM, BM2) from 65 rows
SMALL_TILES = ((32, 0), (64, 0))        # up to SMALL_ROWS rows
SMALL_ROWS = 64
WHOLE_ONLY = 64                         # BM2 from which tiles are only taken whole
TILE_COST = 20                          # tokens: a group's cost beyond its tokens
STAGES = 4
A8_RANGE_STAGES = 5
SMEM = 232448                           # bytes a CTA may hold on sm_90
MAX_SPLITS = 4                          # pieces a tile is cut into
STREAM_K_COST = 3000                    # group·tokens (~17 µs on the H200)
SMALL_STREAM_K_COST = 1000
MIN_ROWS = MAX_ROWS + 1
A8_MIN_ROWS = 65
PIECES = "stream-K pieces"               # this kernel's workspace (any contents) and counters
MAXNREG = 168


def layouts(bn: int, bm: int, warps: int, bits: int = 16):
    """(accumulator [BN, BM], A operand [BN, 128], a stage's words [BN/16, 2, 8, 4, 4]) for `bits`-wide operands:
    lane 4l + t of warp b reads words 4t … 4t+3 of columns 16b + l and 16b + 8 + l, 16 bytes each."""
    assert bn == 16 * warps
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, bm, 256 // bits])
    a_op = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=32 // bits)
    words = gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2]],
        lane_bases=[[0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 0, 4, 0, 0]],
        warp_bases=[[1 << i, 0, 0, 0, 0] for i in range(exact_log2(warps))], block_bases=[],
        shape=[bn // 16, 2, 8, 4, 4])
    return mma, a_op, words


@gluon.jit
def _scaled_pair(t, s2, DT: gl.constexpr):
    """Nibbles 0 and 4 of t as (q − 8)·s, a DT pair: (t & 0x000F000F) | MAGIC is 128 + q (bf16) or 1024 + q."""
    if DT == gl.float16:
        return gl.inline_asm_elementwise(
            "{ .reg .b32 t, c; lop3.b32 t, $1, 0x000F000F, 0x64006400, 0xEA;"
            " mov.b32 c, 0x64086408; sub.rn.f16x2 t, t, c; mul.rn.f16x2 $0, t, $2; }",
            "=r,r,r", [t, s2], dtype=gl.int32, is_pure=True, pack=1)
    else:
        return gl.inline_asm_elementwise(
            "{ .reg .b32 t, c; lop3.b32 t, $1, 0x000F000F, 0x43004300, 0xEA;"
            " mov.b32 c, 0x43084308; sub.rn.bf16x2 t, t, c; mul.rn.bf16x2 $0, t, $2; }",
            "=r,r,r", [t, s2], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _a_operand(w_stage, s_stage, BN: gl.constexpr, DT: gl.constexpr, words_layout: gl.constexpr,
               a_op: gl.constexpr):
    """A stage's words [BN, 16] and scales [1, BN] → the A operand [BN, 128] in DT, built in place: pair p = 2·p1 + p0
    of word 4t + w is k = 32w + 16·p1 + 8·p0 + 2t + (0, 1)."""
    NB: gl.constexpr = BN // 16
    words = w_stage.reshape([NB, 2, 8, 4, 4]).load(words_layout)                    # [b, h, l, t, w]
    s = s_stage.reshape([NB, 2, 8]).load(gl.SliceLayout(3, gl.SliceLayout(4, words_layout)))
    u = s.to(DT).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    s2 = gl.expand_dims(gl.expand_dims(u | (u << 16), 3), 4) + gl.zeros([NB, 2, 8, 4, 4], gl.int32, words_layout)
    p = _pairs(words, s2, DT)
    w = gl.join(p.to(gl.int16), (p >> 16).to(gl.int16)).to(DT, bitcast=True)       # [b, h, l, t, w, p0, p1, e]
    w = gl.permute(w, [0, 1, 2, 4, 6, 5, 3, 7])                                     # [b, h, l, w, p1, p0, t, e]
    return gl.convert_layout(gl.reshape(w, [BN, 128]), a_op, assert_trivial=True), p


@gluon.jit
def _a_operand_i8(w_stage, BN: gl.constexpr, words_layout: gl.constexpr, a_op: gl.constexpr):
    """A stage's words [BN, 16] → the int8 A operand [BN, 128] of codes − 8 in the operand's k order
    (layers.quant.a8_k): bytes of (word >> 4r) & 0x0F0F0F0F, then (q + 120) ^ 128 = q − 8 per byte."""
    NB: gl.constexpr = BN // 16
    words = w_stage.reshape([NB, 2, 8, 4, 4]).load(words_layout).to(gl.uint32, bitcast=True)
    lo = ((words & 0x0F0F0F0F) + 0x78787878) ^ 0x80808080
    hi = (((words >> 4) & 0x0F0F0F0F) + 0x78787878) ^ 0x80808080
    r = gl.join(lo, hi).to(gl.int32, bitcast=True)                                 # [b, h, l, t, w, r]
    q = gl.join(gl.join(r.to(gl.int8), (r >> 8).to(gl.int8)),
                gl.join((r >> 16).to(gl.int8), (r >> 24).to(gl.int8)))           # [b, h, l, t, w, r, q0, q1]
    q = gl.permute(q, [0, 1, 2, 4, 5, 3, 7, 6])                                     # [b, h, l, w, r, t, q1, q0]
    return gl.convert_layout(gl.reshape(q, [BN, 128]), a_op, assert_trivial=True)


@gluon.jit
def _pairs(words, s2, DT: gl.constexpr):
    """The four scaled pairs of every word: int32 [..., p0, p1], the registers the A operand is made of."""
    return gl.join(gl.join(_scaled_pair(words, s2, DT), _scaled_pair(words >> 4, s2, DT)),
                   gl.join(_scaled_pair(words >> 8, s2, DT), _scaled_pair(words >> 12, s2, DT)))


HOLD_ASM = gl.constexpr("{ .reg .pred p; .reg .u32 n; .reg .u64 a; mov.u32 n, %nwarpid; setp.eq.u32 p, n, 0; "
                        "mov.u64 a, 0; " + "".join(f"@p st.global.v4.b32 [a], {{${i}, ${i + 1}, ${i + 2}, ${i + 3}}}; "
                                                   for i in range(32, 64, 4)) + "}")
HOLD_REGS = gl.constexpr(",".join(["=r"] * 32 + ["r"] * 32))


@gluon.jit
def _hold(p):
    """A never-executed use of the 32 A registers: ptxas frees them at the wgmma's issue, not at its wait."""
    gl.inline_asm_elementwise(HOLD_ASM, HOLD_REGS, [p], dtype=gl.int32, is_pure=False, pack=32)


@triton.constexpr_function
def stage_bytes(bm, bm2, a8=False):
    """Bytes of a ring stage: words, scales, activations [bm + bm2, 128] (int8 with a8)."""
    return CONSUMERS.value * WG_COLS.value * (16 * 4 + 2) + (bm + bm2) * 128 * (1 if a8 else 2)


@gluon.jit
def _release(i, empty, STAGES: gl.constexpr, pred):
    """Stage of group i free for the loader. No proxy fence: its reads have completed and its wgmma retired."""
    mbarrier.arrive(empty.index(i % STAGES), pred=pred)


@gluon.jit
def _group(i, c: gl.constexpr, rings, full, acc, acc2, a_op: gl.constexpr, a_op2: gl.constexpr, words: gl.constexpr,
           flat: gl.constexpr, BM2: gl.constexpr, STAGES: gl.constexpr, DT: gl.constexpr, PENDING: gl.constexpr):
    """Consumer c's group i: wait, unpack, issue the mma(s), leave PENDING in flight; → (acc, acc2, A registers)."""
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
def _scaled(acc, sums, scale):
    """acc + sums · scale, int32 sums (|s| < 2^22) made floats without I2F: bits of s + 0x4B400000 = 1.5·2^23 + s."""
    return acc + ((sums + 0x4B400000).to(gl.float32, bitcast=True) - 12582912.0) * scale


@gluon.jit
def _group_a8(i, c: gl.constexpr, rings, full, acc, acc2, a_op: gl.constexpr, a_op2: gl.constexpr,
              words: gl.constexpr, flat: gl.constexpr, mma: gl.constexpr, mma2: gl.constexpr, BM: gl.constexpr,
              BM2: gl.constexpr, STAGES: gl.constexpr):
    """W4A8: consumer c's group i summed in int32, added to the fp32 accumulators at its column scales."""
    words_ring, scales_ring, acts_ring, acts2_ring = rings
    s = i % STAGES
    mbarrier.wait(full.index(s), (i // STAGES) & 1)
    w_stage = words_ring.index(s)._reinterpret(gl.int32, [CONSUMERS, WG_COLS, 16], flat).index(c)
    s_stage = scales_ring.index(s)._reinterpret(scales_ring.dtype, [CONSUMERS, 1, WG_COLS], flat).index(c)
    a = _a_operand_i8(w_stage, WG_COLS, words, a_op)
    scale = s_stage.reshape([WG_COLS]).load(gl.SliceLayout(1, mma)).to(gl.float32)
    sums = warpgroup_mma(a, acts_ring.index(s).permute((1, 0)), gl.zeros([WG_COLS, BM], gl.int32, mma),
                         use_acc=False, is_async=True)
    if BM2 > 0:
        sums2 = warpgroup_mma(gl.convert_layout(a, a_op2, assert_trivial=True), acts2_ring.index(s).permute((1, 0)),
                              gl.zeros([WG_COLS, BM2], gl.int32, mma2), use_acc=False, is_async=True)
        sums, sums2 = warpgroup_mma_wait(0, deps=[sums, sums2])
        acc2 = _scaled(acc2, sums2, gl.expand_dims(gl.convert_layout(scale, gl.SliceLayout(1, mma2)), 1))
    else:
        sums = warpgroup_mma_wait(0, deps=[sums])
    return _scaled(acc, sums, gl.expand_dims(scale, 1)), acc2


@gluon.jit
def _tile_origin(t, m_tiles, BM: gl.constexpr, BM2: gl.constexpr):
    """Tile t's first column and first token (tile = n_tile · m_tiles + m_tile)."""
    return t // m_tiles * (CONSUMERS * WG_COLS), t % m_tiles * (BM + BM2)


@gluon.jit
def _block_ptrs(base, stride, r0, t0, BM: gl.constexpr, mma: gl.constexpr):
    """A [64 columns, BM tokens] block from column r0, token t0, tokens `stride` apart: (pointers, cols, tokens)."""
    cols = r0 + gl.arange(0, WG_COLS, layout=gl.SliceLayout(1, mma))
    tok = t0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    return base + gl.expand_dims(tok, 0) * stride + gl.expand_dims(cols, 1), cols, tok


@gluon.jit
def _store_block(acc, out_ptr, sa_ptr, M, N, stride_om, c0, m0, BM: gl.constexpr, mma: gl.constexpr,
                 A8: gl.constexpr):
    """[64, BM] of the output from column c0 and token m0 (W4A8: times the tokens' activation scales)."""
    ptrs, cols, tok = _block_ptrs(out_ptr, stride_om, c0, m0, BM, mma)
    if A8:
        acc = acc * gl.expand_dims(gl.load(sa_ptr + tok, mask=tok < M, other=0.0), 0)
    gl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(cols < N, 1) & gl.expand_dims(tok < M, 0))


@gluon.jit
def _store(acc, acc2, out_ptr, sa_ptr, M, N, stride_om, c0, m0, BM: gl.constexpr, BM2: gl.constexpr,
           mma: gl.constexpr, mma2: gl.constexpr, A8: gl.constexpr):
    """A consumer's [64, BM (+ BM2)] block of the output from column c0 and token m0."""
    _store_block(acc, out_ptr, sa_ptr, M, N, stride_om, c0, m0, BM, mma, A8)
    if BM2 > 0:
        _store_block(acc2, out_ptr, sa_ptr, M, N, stride_om, c0, m0 + BM, BM2, mma2, A8)


@gluon.jit
def _piece(ws_ptr, slot, c: gl.constexpr, BM: gl.constexpr, BM2: gl.constexpr, mma: gl.constexpr,
           mma2: gl.constexpr):
    """Pointers of consumer c's [64, BM] and [64, BM2] fp32 blocks in a workspace slot."""
    base = ws_ptr + (slot * CONSUMERS + c) * (WG_COLS * (BM + BM2))
    ptrs, _, _ = _block_ptrs(base, WG_COLS, 0, 0, BM, mma)
    ptrs2 = ptrs
    if BM2 > 0:
        ptrs2, _, _ = _block_ptrs(base + WG_COLS * BM, WG_COLS, 0, 0, BM2, mma2)
    return ptrs, ptrs2


@gluon.jit
def _slot(q, t_lo, P, units):
    """Program q's slot for its piece of the tile starting at unit t_lo: 2·q if its range starts there, else 2·q + 1."""
    slot = 2 * q + 1
    if range_start(q, P, units) >= t_lo:
        slot = 2 * q
    return slot


@gluon.jit
def _sum_pieces(acc, acc2, pid, first, last, t_lo, ws_ptr, P, units, c: gl.constexpr, BM: gl.constexpr,
                BM2: gl.constexpr, mma: gl.constexpr, mma2: gl.constexpr):
    """The pieces of programs first … last added in that order (its own from registers): the same bits anywhere."""
    tot = gl.zeros_like(acc)
    tot2 = gl.zeros_like(acc2)
    for q in range(first, last + 1):
        if q == pid:
            tot += acc
            tot2 += acc2
        else:
            ptrs, ptrs2 = _piece(ws_ptr, _slot(q, t_lo, P, units), c, BM, BM2, mma, mma2)
            tot += gl.load(ptrs, cache_modifier=".cg")              # at L2: other SMs wrote it
            if BM2 > 0:
                tot2 += gl.load(ptrs2, cache_modifier=".cg")
    return tot, tot2


@gluon.jit
def _finish(acc, acc2, c: gl.constexpr, t, seg_lo, seg_hi, args, mma: gl.constexpr, mma2: gl.constexpr,
            BM: gl.constexpr, BM2: gl.constexpr, WHOLE: gl.constexpr, A8: gl.constexpr):
    """Consumer c's 64 columns of tile t over units seg_lo … seg_hi − 1: stored if whole; else summed with the other
    pieces if all arrived (the tile's counter), or left in the workspace for the last to arrive."""
    out_ptr, sa_ptr, M, N, stride_om, ws_ptr, cnt_ptr, m_tiles, per_tile, units = args
    n0, m0 = _tile_origin(t, m_tiles, BM, BM2)
    c0 = n0 + c * WG_COLS
    if WHOLE:
        _store(acc, acc2, out_ptr, sa_ptr, M, N, stride_om, c0, m0, BM, BM2, mma, mma2, A8)
    else:
        P = gl.num_programs(0)
        pid = gl.program_id(0)
        t_lo = t * per_tile
        first = prog_of(t_lo, P, units)
        others = prog_of(t_lo + per_tile - 1, P, units) - first
        arrived = others                        # (none to wait for when the range holds the whole tile)
        if (seg_lo != t_lo) | (seg_hi != t_lo + per_tile):
            counter = cnt_ptr + t * CONSUMERS + c
            arrived = gl.atomic_add(counter, 0, sem="acquire")
            if arrived != others:
                ptrs, ptrs2 = _piece(ws_ptr, _slot(pid, t_lo, P, units), c, BM, BM2, mma, mma2)
                gl.store(ptrs, acc)
                if BM2 > 0:
                    gl.store(ptrs2, acc2)
                gl.thread_barrier()             # every thread's piece precedes the release below
                arrived = gl.atomic_add(counter, 1, sem="acq_rel")
            if arrived == others:
                acc, acc2 = _sum_pieces(acc, acc2, pid, first, first + others, t_lo, ws_ptr, P, units, c, BM,
                                        BM2, mma, mma2)
                gl.atomic_xchg(counter, 0, sem="relaxed")               # zero again for the next launch
        if arrived == others:
            _store(acc, acc2, out_ptr, sa_ptr, M, N, stride_om, c0, m0, BM, BM2, mma, mma2, A8)


@gluon.jit
def _segment(c: gl.constexpr, t, seg_lo, seg_hi, u_lo, rings, bars, args, mma: gl.constexpr, mma2: gl.constexpr,
             a_op: gl.constexpr, a_op2: gl.constexpr, words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr,
             BM2: gl.constexpr, STAGES: gl.constexpr, DT: gl.constexpr, OVERLAP: gl.constexpr,
             WHOLE: gl.constexpr):
    """Consumer c's 64 columns of tile t over units seg_lo … seg_hi − 1 of a range starting at u_lo."""
    full, empty = bars
    A8: gl.constexpr = DT == gl.int8
    UNIT: gl.constexpr = 2 if OVERLAP else 1
    i0 = (seg_lo - u_lo) * UNIT
    i1 = (seg_hi - u_lo) * UNIT
    acc = gl.zeros([WG_COLS, BM], gl.float32, mma)
    acc2 = gl.zeros([WG_COLS, BM2 if BM2 > 0 else BM], gl.float32, mma2)      # unused without BM2
    if A8:
        for i in range(i0, i1):
            acc, acc2 = _group_a8(i, c, rings, full, acc, acc2, a_op, a_op2, words, flat, mma, mma2, BM, BM2, STAGES)
            _release(i, empty, STAGES, True)
    elif OVERLAP:
        zeros = gl.zeros([WG_COLS // 16, 2, 8, 4, 4], gl.int32, words)
        held = _pairs(zeros, zeros, DT)
        for i in range(i0, i1, 2):          # pairs, so that each A register set is fixed
            acc, acc2, p0 = _group(i, c, rings, full, acc, acc2, a_op, a_op2, words, flat, BM2, STAGES, DT, 1)
            _hold(held)
            _release(i - 1, empty, STAGES, i > i0)
            acc, acc2, held = _group(i + 1, c, rings, full, acc, acc2, a_op, a_op2, words, flat, BM2, STAGES, DT, 1)
            _hold(p0)
            _release(i, empty, STAGES, True)
        if BM2 > 0:
            acc, acc2 = warpgroup_mma_wait(0, deps=[acc, acc2])
        else:
            acc = warpgroup_mma_wait(0, deps=[acc])
        _hold(held)
        _release(i1 - 1, empty, STAGES, True)
    else:
        for i in range(i0, i1):
            acc, acc2, _ = _group(i, c, rings, full, acc, acc2, a_op, a_op2, words, flat, BM2, STAGES, DT, 0)
            _release(i, empty, STAGES, True)
    _finish(acc, acc2, c, t, seg_lo, seg_hi, args, mma, mma2, BM, BM2, WHOLE, A8)


@gluon.jit
def _consumer(c: gl.constexpr, rings, bars, args, mma: gl.constexpr, mma2: gl.constexpr, a_op: gl.constexpr,
              a_op2: gl.constexpr, words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr, BM2: gl.constexpr,
              STAGES: gl.constexpr, DT: gl.constexpr, OVERLAP: gl.constexpr, ONE_TILE: gl.constexpr):
    """Consumer c's 64 columns of every tile the program's range touches (ONE_TILE: program i, tile i)."""
    out_ptr, sa_ptr, M, N, stride_om, ws_ptr, cnt_ptr, m_tiles, per_tile, units = args
    pid = gl.program_id(0)
    if ONE_TILE:
        u_lo = pid * per_tile
        _segment(c, pid, u_lo, u_lo + per_tile, u_lo, rings, bars, args, mma, mma2, a_op, a_op2, words, flat, BM,
                 BM2, STAGES, DT, OVERLAP, True)
    else:
        P = gl.num_programs(0)
        u_lo = range_start(pid, P, units)
        u_hi = range_start(pid + 1, P, units)
        for t in range(u_lo // per_tile, (u_hi - 1) // per_tile + 1):
            _segment(c, t, gl.maximum(u_lo, t * per_tile), gl.minimum(u_hi, (t + 1) * per_tile), u_lo, rings, bars,
                     args, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT, OVERLAP, False)


@gluon.jit
def _first_consumer(rings, bars, args, mma: gl.constexpr, mma2: gl.constexpr, a_op: gl.constexpr,
                    a_op2: gl.constexpr, words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr,
                    BM2: gl.constexpr, STAGES: gl.constexpr, DT: gl.constexpr, OVERLAP: gl.constexpr,
                    ONE_TILE: gl.constexpr):
    _consumer(0, rings, bars, args, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT, OVERLAP, ONE_TILE)


@gluon.jit
def _worker(rings, bars, args, descs, mma: gl.constexpr, mma2: gl.constexpr, a_op: gl.constexpr,
            a_op2: gl.constexpr, words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr, BM2: gl.constexpr,
            STAGES: gl.constexpr, DT: gl.constexpr, OVERLAP: gl.constexpr, ONE_TILE: gl.constexpr,
            LOADER: gl.constexpr, PDL: gl.constexpr):
    """The worker partitions share one signature: the second consumer, or the loader."""
    if LOADER:
        words_ring, scales_ring, acts_ring, acts2_ring = rings
        full, empty = bars
        out_ptr, sa_ptr, M, N, stride_om, ws_ptr, cnt_ptr, m_tiles, per_tile, units = args
        w_desc, s_desc, x_desc, x2_desc = descs
        UNIT: gl.constexpr = 2 if OVERLAP else 1
        nbytes: gl.constexpr = stage_bytes(BM, BM2, DT == gl.int8)
        k_groups = per_tile * UNIT
        P = gl.num_programs(0)
        pid = gl.program_id(0)
        q_lo = range_start(pid, P, units) * UNIT
        for q in range(q_lo, range_start(pid + 1, P, units) * UNIT):     # the range's groups, tile-major
            i = q - q_lo
            s = i % STAGES
            t = q // k_groups
            g = q % k_groups
            n0, m0 = _tile_origin(t, m_tiles, BM, BM2)
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
        _consumer(1, rings, bars, args, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT, OVERLAP, ONE_TILE)


@gluon.jit
def _int4_ws_kernel(w_desc, s_desc, x_desc, x2_desc, out_ptr, sa_ptr, ws_ptr, cnt_ptr, M, N, K, stride_om, m_tiles,
                    mma: gl.constexpr, mma2: gl.constexpr, a_op: gl.constexpr, a_op2: gl.constexpr,
                    words: gl.constexpr, flat: gl.constexpr, BM: gl.constexpr, BM2: gl.constexpr,
                    STAGES: gl.constexpr, OVERLAP: gl.constexpr, ONE_TILE: gl.constexpr, PDL: gl.constexpr):
    # TMA descriptors: qweight as [K/128 · N, 16] (blocks [BN, 16]), scales [K/128, N] ([1, BN]), x [M, K] ([BM, 128],
    # [BM2, 128]; W4A8 int8 with token scales sa [M]); ws: partial-tile pieces, cnt [tiles · 2] zeroed.
    # tile = n_tile · m_tiles + m_tile; grid (programs,), one range of units each.
    DT: gl.constexpr = x_desc.dtype
    BN: gl.constexpr = CONSUMERS * WG_COLS
    per_tile = K // 128 // (2 if OVERLAP else 1)
    units = gl.cdiv(N, BN) * m_tiles * per_tile
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
    args = (out_ptr, sa_ptr, M, N, stride_om, ws_ptr, cnt_ptr, m_tiles, per_tile, units)
    descs = (w_desc, s_desc, x_desc, x2_desc)
    gl.warp_specialize([
        (_first_consumer, (rings, bars, args, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT, OVERLAP,
                           ONE_TILE)),
        (_worker, (rings, bars, args, descs, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT, OVERLAP,
                   ONE_TILE, False, PDL)),
        (_worker, (rings, bars, args, descs, mma, mma2, a_op, a_op2, words, flat, BM, BM2, STAGES, DT, OVERLAP,
                   ONE_TILE, True, PDL)),
    ], [4, 1], [232, 40])


@functools.lru_cache(maxsize=None)
def plan(m: int, n: int, k: int, sms: int, a8: bool = False):
    """Cost model: (BM, BM2, programs), or None (too few rows, or under half the SMs busy): of the token tiles and
    cuts (whole tiles, 2-MAX_SPLITS pieces in one wave, stream-K + STREAM_K_COST) the one whose busiest program's
    groups × (tokens + TILE_COST) is least. W4A8 never takes the 256-token tile (it spills)."""
    if m < (A8_MIN_ROWS if a8 else MIN_ROWS):
        return None
    small = m <= SMALL_ROWS
    groups = k // 128
    unit = 2 if groups % 2 == 0 else 1                  # the overlapped loop's pairs
    best = None
    for tile in SMALL_TILES if small else TOKEN_TILES[:-1] if a8 else TOKEN_TILES:
        tokens = sum(tile)
        tiles = triton.cdiv(n, CONSUMERS.value * WG_COLS.value) * triton.cdiv(m, tokens)
        cuts = [(triton.cdiv(tiles, sms) * groups, tiles, 0)]
        if tile[1] < WHOLE_ONLY:
            cuts += [(triton.cdiv(groups // unit, s) * unit, tiles * s, 0) for s in range(2, MAX_SPLITS + 1)
                     if tiles * s <= sms and s <= groups // unit]
            if tiles % sms:
                cuts.append((tiles * groups / sms, sms, SMALL_STREAM_K_COST if small else STREAM_K_COST))
        for held, programs, extra in cuts:
            cost = held * (tokens + TILE_COST) + extra
            if best is None or cost < best[0]:
                best = (cost, tile + (programs,))
    return best[1] if 2 * best[1][2] >= sms else None


def stages_for(bm: int, bm2: int, a8: bool = False, ranges: bool = False) -> int:
    """Ring stages: STAGES (A8_RANGE_STAGES for W4A8 ranges across tiles), or as many as SMEM holds."""
    return min(A8_RANGE_STAGES if a8 and ranges else STAGES, (SMEM - 1024) // stage_bytes(bm, bm2, a8))


@dataclass(frozen=True)
class Config:
    """A launch: token tile BM (+ BM2), programs (= tiles: one tile each), ring stages, the overlapped loop."""
    bm: int
    bm2: int
    programs: int
    stages: int
    overlap: bool


def supports(x: torch.Tensor, w: Int4Weight) -> bool:
    """CUDA (or meta) sm_90+, symmetric weights, group 128, TMA-aligned rows, a plan (MIN_ROWS+; int8 A8_MIN_ROWS+)."""
    if not ((x.is_cuda or x.is_meta) and gpu.capability(x.device) >= (9, 0) and w.zs is None and w.group == GROUP
            and x.dtype in (torch.bfloat16, torch.float16, torch.int8) and x.stride(-1) == 1):
        return False
    x2 = x.reshape(-1, x.shape[-1])
    aligned = x2.data_ptr() % 16 == 0 and (x2.stride(0) * x2.element_size()) % 16 == 0
    return aligned and plan(x2.shape[0], w.n, w.k, gpu.num_sms(x.device), x.dtype == torch.int8) is not None


def config(m: int, n: int, k: int, device, a8: bool = False, **override) -> Config:
    """plan's tile and programs (or override's), stages_for's ring, the overlap where groups pair up, tiles have
    128+ tokens and the ring 4 stages."""
    p = dict(override)
    if not {"bm", "bm2", "programs"} <= p.keys():
        bm, bm2, programs = plan(m, n, k, gpu.num_sms(device), a8)
        p = dict(bm=bm, bm2=bm2, programs=programs, **p)
    tiles = triton.cdiv(n, CONSUMERS.value * WG_COLS.value) * triton.cdiv(m, p["bm"] + p["bm2"])
    p.setdefault("stages", stages_for(p["bm"], p["bm2"], a8, p["programs"] != tiles))
    p.setdefault("overlap", k % 256 == 0 and p["stages"] >= 4 and not a8 and p["bm"] >= 128)
    return Config(**p)


def launch(x: torch.Tensor, w: Int4Weight, out: torch.Tensor, cfg: Config, x_scale: torch.Tensor = None):
    """out [..., N] (any float dtype) = x [..., K] @ Wᵀ; W4A8: x int8 in the operand's k order (layers.quant.a8_k)
    with per-token fp32 x_scale [...], out = (x · x_scale) @ Wᵀ."""
    k, n = w.k, w.n
    x2 = x.reshape(-1, k)
    out2 = out.view(-1, n)
    m = x2.shape[0]
    a8 = x.dtype == torch.int8
    assert a8 == (x_scale is not None), "int8 activations come with their per-token scales"
    gpu.check_dense("int4 wgmma_ws", x_scale=x_scale)
    bm, bm2, programs, stages, overlap = cfg.bm, cfg.bm2, cfg.programs, cfg.stages, cfg.overlap
    bn = CONSUMERS.value * WG_COLS.value
    m_tiles = triton.cdiv(m, bm + bm2)
    tiles = triton.cdiv(n, bn) * m_tiles
    assert x2.stride(-1) == 1 and out2.stride(-1) == 1 and n % 8 == 0 and k % 128 == 0
    assert not overlap or (k % 256 == 0 and not a8), "overlap: groups in pairs, 16-bit activations"
    assert 0 < programs <= tiles * (k // 128 // (2 if overlap else 1)), "a program without work"
    plain = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    w_desc = TensorDescriptor.from_tensor(w.qweight.view(-1, 16), [bn, 16], plain)
    s_desc = TensorDescriptor.from_tensor(w.scales, [1, bn],
                                          gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2))
    bits = 8 if a8 else 16
    x_layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=bits, rank=2)  # as the wgmma reads it
    x_desc = TensorDescriptor.from_tensor(x2, [bm, 128], x_layout)
    mma, a_op, words = layouts(WG_COLS.value, bm, 4, bits)
    x2_desc, mma2, a_op2 = x_desc, mma, a_op                        # stand-ins the kernel never uses without BM2
    if bm2:
        x2_desc = TensorDescriptor.from_tensor(x2, [bm2, 128], x_layout)
        mma2, a_op2, _ = layouts(WG_COLS.value, bm2, 4, bits)
    flat = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    ws, cnt = workspace(x.device, 2 * programs * bn * (bm + bm2), tiles * CONSUMERS.value, PIECES)
    pdl = gpu.pdl(x.device)
    _int4_ws_kernel[(programs,)](
        w_desc, s_desc, x_desc, x2_desc, out2, x_scale if a8 else out2, ws, cnt, m, n, k, out2.stride(0), m_tiles,
        mma, mma2, a_op, a_op2, words, flat, bm, bm2, stages, overlap, programs == tiles, pdl, num_warps=4,
        maxnreg=MAXNREG, launch_pdl=pdl)
    return out
