"""Warp-specialised int4-weight GEMM on Hopper for verify and batch steps (25+ rows; W4A8 65+): out[M, N] =
x[M, K] @ W[N, K]ᵀ, W in the mma int4 layout (layers/quant.py), x bf16/fp16. The weights are unpacked exactly as in
kernels/int4_wgmma.py (its `_a_operand`: the wgmma's register operand, scaled to x's dtype); what differs is who
waits for whom.

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
BM2 exists because Gluon tensors have power-of-2 shapes: 320 rows are two 160-token tiles (128 + 32), 200 one of
256 (128 + 128). 25-64 rows take one tile of 32 or 64 tokens (SMALL_TILES), without the overlap: H200, us, against
int4_wgmma.py's launches (which took these rows before) and cuBLAS bf16 in the same run: 32 rows qkvz 19.5 / 27.2 /
42.3, out_proj 11.8 / 17.0 / 18.5, attn 19.1 / 27.3 / 38.7, gate_up 43.6 / 48.7 / 90.3, down 24.8 / 34.9 / 50.0; 64
rows qkvz 22.8 / 27.5 / 43.0, out_proj 14.6 / 22.8 / 18.8, attn 22.8 / 27.9 / 40.7, gate_up 51.7 / 62.2 / 95.4, down
29.3 / 39.0 / 52.3 (the best cut of each; launch's cost model picks the same ones). The overlap is 3-7% slower on
32-token tiles, even on 64; 5-8 ring stages 0-4% faster than 4; two CTAs a SM (maxnreg 80, setmaxnreg 96 / 24:
twice the consumers, tiles cut in twice the pieces or ranges) only helped gate_up at 32 rows (36.4 against 40.5 µs;
qkvz 19.2 / 18.8, down 24.4 / 24.7, out_proj 13.9 / 11.5, at 64 rows 4-17% slower but gate_up). (At 17-24 rows
these tiles beat the GEMV too — qkvz 19.3 against 28.8 µs at 20 rows, stored — but int4_gemv.py keeps those rows for
its bits: a token's row the same at any width up to 24.)
How the work is cut: the work units (tile, group — or pair of groups with OVERLAP), tile-major, are cut into one
equal range per program; the loader streams its range's groups through the ring without a break, the consumers sum
each tile segment of it and store a whole tile, or finish a partial one (`_finish`): where the tile's counter shows
its other pieces all in (the end of a range: the tile's tail was the next range's first work, long done), the
program adds them to its own and stores the sum; else it leaves its piece in the workspace (fp32; slot 2·program for
the first tile of its range, + 1 for its last) and bumps the counter, and the last to arrive adds the pieces. Pieces
are added in program order, one's own from registers (the same bits whichever sums them; fp64 atomics were measured
at ~1 TB/s). `launch` picks among three cuts: one tile a program (waves of one a SM), each tile in 2-4 pieces while
those fit one wave (out_proj and down up to ~160 rows), and stream-K, one program a SM with ranges across tile
boundaries — charged STREAM_K_COST group·tokens more; each program's groups cost their tokens + TILE_COST, and the
192- and 256-token tiles are only taken whole (see launch). What a crossing costs (H200, session 19; 132 programs, us:
nothing of a partial tile kept (wrong sums) / pieces stored, no counter / with the counter, the last arrival adding
nothing / the fix-up before this one, which stored every piece and reloaded all of them): attn at 320 rows 67.0 /
73.6 / 74.0 / 82.1 (whole tiles 74.6), down 79.6 / 85.3 / 86.4 / 94.7, out_proj 30.0 / 32.8 / 36.8 / 45.4 — the
pieces' stores and the reload loop, more than the crossing itself (qkvz at 80 rows, where 132 ranges hold as many
groups as 128 tiles, 41.5 against 34.1 even with nothing kept). The fix-up above against that one (same run): attn
85.9 -> 81.6, down 99.4 -> 93.5 (whole tiles 98.7, cuBLAS 96.3), out_proj 45.6 -> 41.3, gate_up 198.8 -> 187.7; 128
rows gate_up 83.2 -> 78.6, down 50.2 -> 47.1; 200 rows down 76.5 -> 73.1; qkvz at 80 rows 48.2 -> 44.7 (the counter
read only at a range's end, not at its first tile: the same). Earlier: ranges rotated to start at their first tile
boundary (programs in step through K) were no faster, nor pieces stored tokens-fastest (8-byte stores, half the
instructions); ncu of the old fix-up, 132 programs against 128 whole tiles: instructions 10.2M against 8.4M, L2
reads 164 against 101 MB. And loads are not what bounds 320 rows: with the weights and activations streamed only
into the ring's first fill, qkvz took 73.6 against 76.4, attn 73.4 against 75.5, down 93.6 against 96.2 (cuBLAS
73.8, 70.0, 94.1): the consumers' unpack and mma are the time.
H200 (us; cuBLAS bf16 / this kernel's previous form, one tile or fp64-summed splits a CTA / this, one run): 80 rows
out_proj 19.2 / 23.8 / 22.9, gate_up 94.6 / 95.8 / 90.5, down 54.0 / 49.8 / 47.8; 128 rows out_proj 20.5 / 28.0 /
23.6, gate_up 91.7 / 96.2 / 79.8, down 55.7 / 49.8 / 45.3; 200 rows gate_up 112.6 / 169.3 / 149.8, down 61.6 / 92.8
/ 76.8; 320 rows qkvz 72.9 / 78.1 / 77.0, out_proj 35.9 / 35.9 / 36.5, attn 68.8 / 75.8 / 75.0, gate_up 218.2 /
210.5 / 184.5, down 93.6 / 97.7 / 98.8 (stream-K with the old fix-up; with this one 90.2 against cuBLAS 92.4 in the
full run of bench/results/kernels-h200.md). One tile a program compiled as such (ONE_TILE) 0.3-2.6 us faster than
through the general loop. Before this kernel (int4_wgmma.py) 320 rows took qkvz 121, out_proj 52, attn 111, gate_up
263, down 141. Without the overlap (4 / 3 stages) 320 rows took 5-25% longer; 160-token tiles where they make fewer,
fuller waves (qkvz 76.5 against 92.5 on 128), 128 where out_proj's 80 tiles of 160 would leave 52 SMs idle (35.7
against 43.5). 64-token tiles (320 rows in 5, stream-K over 132 programs, nothing padded) were slower: out_proj
44.5, down 116.5, attn 98.0, qkvz 115.9 against 36.7, 90.3, 75.1, 82.1 (6 stages no better). The time of a tile
does not shrink with its tokens (out_proj, 120 tiles of 64 / 64 + 32 / 128 tokens: 27.1 / 33.9 / 36.4 us; a group's
unpack and issue, ~0.37 us at 64 tokens, stay), so 320 rows as three tiles of 112 (64 + 32 + 16) would not beat
three of 128, the last half padding. Session 20 (H200, 320 rows, us): stream-K's costs by piece — nothing of partial
tiles kept / every piece stored / only the ranges' first (tail) pieces / only their last (head) pieces / the fix-up
above: qkvz 78.8 / 82.5 / 81.5 / 80.0 / 87.6, attn 68.9 / 73.1 / 71.7 / 69.6 / 78.3, out_proj 30.9 / 32.6 / 31.9 /
30.8 / 40.9, down 81.0 / 84.8 / 84.2 / 81.3 / 90.7 (cuBLAS 72.7, 68.9, 35.9, 92.7): the counter and the reloads at
the ranges' ends, the kernel's tail where nothing overlaps them, cost 5-8 us, more than storing the pieces, and attn
even with nothing kept only ties cuBLAS. Whole tiles on one wave of programs, program p taking tiles p, p + P, …
(the ring running on across its tiles: no second launch wave, no refill): slower where the tiles make two waves
(qkvz 78.6 against 76.9, attn 78.1 against 74.1), faster only on three waves of 128-token tiles (qkvz 89.2 against
94.1), which the 160-token tiles beat anyway.
W4A8 (int8 activations with per-token scales, kernels/int4_linear.w4a8_linear): the same ring and cuts, the
activations int8 (half the stage), the weights unpacked as codes − 8 into the int8 wgmma's register operand
(int4_wgmma._a_operand_i8: 3 instructions per 4 codes; the activations come with their k permuted to match,
layers.quant.a8_permute), each group's products summed exactly in int32 by the tensor cores at twice the bf16 rate
and added to fp32 accumulators at the group's column scales (_scaled; no overlapped loop), the token scales applied
at the store. H200, 320 rows, us (bench/results/kernels-h200.md; the activations already in operand order, as
kernels/norms.py writes them with a8_order / cuBLAS bf16 / W4A16 here): qkvz 65.4 / 73.6 / 75.6, out_proj 33.3 /
35.8 / 35.9, attn 65.9 / 69.4 / 74.5, gate_up 144.0 / 215.8 / 176.7, down 74.8 / 93.1 / 89.6 (1.05-1.50x cuBLAS;
gate_up and down, stream-K, with A8_RANGE_STAGES); w4a8_linear's permuting copy, where x_q comes in natural order,
adds 8-18 us. Where its time goes (probes, same shapes): without the scaling (IADD, FADD, FFMA per int32 sum, 240
of the loop's ~354 instructions a thread and group) qkvz took 53.8 against 70; without the unpack's and / add /
xor, no less. Tried and not kept: the 128-token part as two 64-token mma whose
sums are scaled while the later ones are still on the tensor cores: qkvz 69.5-70.6 against 65.7, attn 69.7-71.0
against 66.6 — ptxas hoists the second wait above the first part's scaling (SASS: DEPBAR.LE 2 and 1 adjacent) even
with the scaled sums passed through that wait, and 64-token mma are less efficient.
Gluon has no interpreter: checked against the dequantising reference in the GPU tests, compiled for sm_90 by
tests/aot_compile.py. Reference: layers.quant.dequantize_int4."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels import device as gpu
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait
from kernels.int4_gemv import MAX_ROWS, _prog_of, _range_start
from kernels.int4_wgmma import _a_operand, _a_operand_i8, _hold, _pairs, layouts
from kernels.splitk import workspace
from layers.quant import Int4Weight

WG_COLS = gl.constexpr(64)              # output columns per consumer warpgroup (the wgmma's M)
CONSUMERS = gl.constexpr(2)
TOKEN_TILES = ((128, 0), (128, 32), (128, 64), (128, 128))    # (BM, BM2) candidates from 65 rows: 128-256 tokens
SMALL_TILES = ((32, 0), (64, 0))        # and up to SMALL_ROWS rows (W4A16): 32 or 64 tokens
SMALL_ROWS = 64
WHOLE_ONLY = 64                         # BM2 from which a tile is only ever taken whole (see launch)
TILE_COST = 20                          # tokens: a group's cost to a tile beyond its tokens (unpack, issue)
STAGES = 4                              # ring stages, fewer where a tile's stages outgrow the shared memory
A8_RANGE_STAGES = 5                     # W4A8 programs whose ranges cross tiles (see stages_for)
SMEM = 232448                           # bytes of shared memory a CTA may hold on sm_90
MAX_SPLITS = 4                          # programs a tile is cut into (the last one sums their pieces in turn)
STREAM_K_COST = 3000                    # group·tokens (~17 us on the H200): ranges across tiles, see above
SMALL_STREAM_K_COST = 1000              # the same for the small tiles, whose pieces are 2-8x smaller (see launch)
MIN_ROWS = MAX_ROWS + 1                 # below, kernels/int4_gemv.py (a token's bits the same at every width)
A8_MIN_ROWS = 65                        # W4A8: below, int4_linear's Triton kernel
PIECES = "stream-K pieces"               # this kernel's workspace: partial tiles (any contents) and their counters
MAXNREG = 168                           # 12 warps at one CTA per SM; setmaxnreg gives consumers 232, the loader 40


@triton.constexpr_function
def stage_bytes(bm, bm2, a8=False):
    """Bytes of a ring stage for a token tile: words and scales of the consumers' columns, activations [bm + bm2,
    128] (16-bit, or int8 with a8): the loader's expected transaction count and stages_for's budget."""
    return CONSUMERS.value * WG_COLS.value * (16 * 4 + 2) + (bm + bm2) * 128 * (1 if a8 else 2)


@gluon.jit
def _release(i, empty, STAGES: gl.constexpr, pred):
    """Stage of group i free for the loader. No proxy fence: the stage's words and scales are in registers (their
    shared-memory reads complete) and its activations' wgmma has retired, so nothing of ours still reads it when the
    arrival lets the next TMA write it (a write after reads, ordered by the mbarrier; H200, same bits: 0-3% faster
    without the fence, e.g. qkvz 320 rows 77.3 -> 76.4 us, gate_up 128 rows 78.7 -> 76.5)."""
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
def _scaled(acc, sums, scale):
    """acc + sums · scale: int32 sums (|s| ≤ 128·8·127 < 2^22) made floats without a conversion instruction (I2F
    issues at an eighth of the FMA rate): the bits of s + 0x4B400000 are the float 1.5·2^23 + s, and subtracting
    1.5·2^23 leaves s exactly."""
    return acc + ((sums + 0x4B400000).to(gl.float32, bitcast=True) - 12582912.0) * scale


@gluon.jit
def _group_a8(i, c: gl.constexpr, rings, full, acc, acc2, a_op: gl.constexpr, a_op2: gl.constexpr,
              words: gl.constexpr, flat: gl.constexpr, mma: gl.constexpr, mma2: gl.constexpr, BM: gl.constexpr,
              BM2: gl.constexpr, STAGES: gl.constexpr):
    """W4A8: consumer c's group i summed exactly in int32 (codes − 8 times int8 activations) and added to the fp32
    accumulators at its column scales."""
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
    """Pointers of a [64 columns, BM tokens] block (mma layout) from column r0 and token t0, tokens `stride` apart,
    columns 1 apart: (pointers, columns, tokens)."""
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
    """Consumer c's part of a partial-tile slot in the workspace: pointers of its [64, BM] and [64, BM2] blocks
    (fp32, laid out as the output: columns fastest; the BM block's pointers stand in for the second without BM2)."""
    base = ws_ptr + (slot * CONSUMERS + c) * (WG_COLS * (BM + BM2))
    ptrs, _, _ = _block_ptrs(base, WG_COLS, 0, 0, BM, mma)
    ptrs2 = ptrs
    if BM2 > 0:
        ptrs2, _, _ = _block_ptrs(base + WG_COLS * BM, WG_COLS, 0, 0, BM2, mma2)
    return ptrs, ptrs2


@gluon.jit
def _slot(q, t_lo, P, units):
    """Program q's workspace slot for its piece of the tile whose first unit is t_lo: 2·q where q's range starts in
    that tile (the first tile of its range), 2·q + 1 where it starts before it (the tile is its range's last)."""
    slot = 2 * q + 1
    if _range_start(q, P, units) >= t_lo:
        slot = 2 * q
    return slot


@gluon.jit
def _sum_pieces(acc, acc2, pid, first, last, t_lo, ws_ptr, P, units, c: gl.constexpr, BM: gl.constexpr,
                BM2: gl.constexpr, mma: gl.constexpr, mma2: gl.constexpr):
    """The pieces of programs first … last added in that order, this program's own (acc, acc2) from registers and
    the others from their slots (_slot): the same bits whichever program sums them."""
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
    """Consumer c's 64 columns of tile t, summed over the work units seg_lo … seg_hi − 1: stored when those are
    all of the tile's. Else, when the tile's other pieces have all arrived (its counter says so) this program adds
    them to its own and stores the sum — the usual end of a range: the tile's tail was the next range's first
    work, long done. If not, it leaves its piece in the workspace (_slot) and bumps the counter; whichever
    program arrives last adds the pieces."""
    out_ptr, sa_ptr, M, N, stride_om, ws_ptr, cnt_ptr, m_tiles, per_tile, units = args
    n0, m0 = _tile_origin(t, m_tiles, BM, BM2)
    c0 = n0 + c * WG_COLS
    if WHOLE:
        _store(acc, acc2, out_ptr, sa_ptr, M, N, stride_om, c0, m0, BM, BM2, mma, mma2, A8)
    else:
        P = gl.num_programs(0)
        pid = gl.program_id(0)
        t_lo = t * per_tile
        first = _prog_of(t_lo, P, units)
        others = _prog_of(t_lo + per_tile - 1, P, units) - first
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
    """Consumer c's 64 columns of tile t over the work units seg_lo … seg_hi − 1 of the program's range, which
    starts at u_lo: group i of the range is ring stage i % STAGES."""
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
    """Consumer c's 64 columns of every tile the program's range of work units touches, one after another (with
    ONE_TILE, programs = tiles: program i's range is tile i, whole)."""
    out_ptr, sa_ptr, M, N, stride_om, ws_ptr, cnt_ptr, m_tiles, per_tile, units = args
    pid = gl.program_id(0)
    if ONE_TILE:
        u_lo = pid * per_tile
        _segment(c, pid, u_lo, u_lo + per_tile, u_lo, rings, bars, args, mma, mma2, a_op, a_op2, words, flat, BM,
                 BM2, STAGES, DT, OVERLAP, True)
    else:
        P = gl.num_programs(0)
        u_lo = _range_start(pid, P, units)
        u_hi = _range_start(pid + 1, P, units)
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
        q_lo = _range_start(pid, P, units) * UNIT
        for q in range(q_lo, _range_start(pid + 1, P, units) * UNIT):     # the range's groups, tile-major
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
    # Descriptors (host TMA): words = qweight [K/128 · N, 16] int32, block [BN, 16]; scales [K/128, N], block
    # [1, BN]; x [M, K] bf16/fp16, or int8 (W4A8: k permuted as layers.quant.a8_k says, token scales sa fp32 [M]),
    # blocks [BM, 128] and [BM2, 128] (rows past M read as zeros); out [M, N] any float dtype (row stride
    # stride_om); ws fp32 [2 · programs · BN · (BM + BM2)] (partial-tile pieces, any contents), cnt int32
    # [tiles · 2] zeroed (kernels/splitk.py). Tiles: tile = n_tile · m_tiles + m_tile, [BN, BM + BM2]
    # each. Grid (programs,): the work units (tile, group or pair of groups), tile-major, cut into one equal range
    # per program.
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


def launch(m: int, n: int, k: int, sms: int, a8: bool = False):
    """(BM, BM2, programs) for m rows, or None where another kernel keeps the call (below MIN_ROWS, A8_MIN_ROWS with
    a8; int4_wgmma.py where programs would fill less than half the SMs): the token tile (SMALL_TILES up to SMALL_ROWS
    rows, TOKEN_TILES above) and cut of the work whose busiest program costs least, its groups times (tokens +
    TILE_COST) — one tile a program (in waves of one a SM), each tile cut in 2 to
    MAX_SPLITS programs while they fit one wave, or stream-K (one program a SM, ranges across tiles: charged
    STREAM_K_COST more). Tiles of 192 and 256 tokens only whole: one wave of them where smaller tiles take two
    (H200, us, against the 128-token tiles' two waves and cuBLAS: qkvz 192 rows 43.1 / 65.2 / 51.9, 176 rows 42.9 /
    - / 49.0, 240 rows 57.2 / 62.2 / 57.8, attn 192 rows 42.1 / 66.6 / 46.1, 200 rows 56.5 / 62.0 / 46.5, gate_up
    192 rows 130 / 155 / 128); cut in pieces or ranges they lost to the smaller tiles (out_proj 200 rows 51.8-70
    against 35.9, down 200 rows 90-106 against 72.6), each piece a 64 x 256 fp32 block per consumer to store and
    add. Ring stages count: 192-token tiles with 3 stages took 11-13% longer than with 4 (qkvz 192 rows 48.3).
    Prefill-sized calls take them too (us, against the launch before them): 512 rows qkvz 115.7 / 125.4, out_proj
    51.7 / 54.4; 1024 rows qkvz 225 / 246, gate_up 507 / 539; 4096 rows qkvz 934 / 1069, out_proj 353 / 391,
    gate_up 1976 / 2541, down 1051 / 1126. Not taken (session 21): 320-token tiles (256 + 64: 2 ring stages, no
    overlap), whole, at 320 rows — qkvz 73.8 against 75.2 (cuBLAS 73.0), attn 73.3 against 73.5; in stream-K
    ranges, and at the other shapes, slower. W4A8 (a8) holds int32 sums beside the fp32 accumulators: the
    256-token tile spills there (296 bytes of stack, sm_90), so it takes the others only. The small tiles' stream-K
    is charged SMALL_STREAM_K_COST, which makes the cuts measured fastest at 25-64 rows the model's (H200, whole
    tiles, pieces of 2-4 and stream-K tried for each): stream-K for gate_up (whole tiles would take three waves),
    one wave of whole tiles for qkvz and attn, tiles in three pieces for out_proj and down."""
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
    """Ring stages for a token tile: STAGES, or as many as SMEM holds; W4A8 ranges that cross tiles (not one tile a
    program) A8_RANGE_STAGES — the deeper ring carries the loader on while the consumers finish a tile (H200, us, 4 /
    5 / 6 / 7 stages: stream-K at 320 rows gate_up 149.0 / 144.4 / 144.8 / 145.9, down 80.4 / 75.4 / 75.5 / 76.0;
    at 200 rows gate_up 119.7 / 120.1 / 120.3 / 122.6; one tile a program, qkvz 320 rows 66.0 / 68.3 / 67.3 / 66.7,
    out_proj 33.7 / 33.7 / 34.2 / 34.1)."""
    return min(A8_RANGE_STAGES if a8 and ranges else STAGES, (SMEM - 1024) // stage_bytes(bm, bm2, a8))


def pick(x: torch.Tensor, w: Int4Weight):
    """The (BM, BM2, programs) launch for this call, or None where int4_wgmma.py keeps it: `launch`'s choice, when
    x's rows meet TMA's alignment (16-byte base and row stride). For calls int4_wgmma.supports takes."""
    x2 = x.reshape(-1, x.shape[-1])
    aligned = x2.data_ptr() % 16 == 0 and (x2.stride(0) * x2.element_size()) % 16 == 0
    return launch(x2.shape[0], w.n, w.k, gpu.num_sms(x.device), x.dtype == torch.int8) if aligned else None


def int4_wgmma_ws(x: torch.Tensor, w: Int4Weight, out: torch.Tensor, cfg: tuple, overlap: bool = None,
                  stages: int = None, x_scale: torch.Tensor = None) -> torch.Tensor:
    """x [..., K] bf16/fp16 (rows TMA-aligned: pick), w symmetric with group 128, out [..., N] any float dtype:
    out = x @ Wᵀ. cfg = (BM, BM2, programs) as `pick` chooses (programs: at most one per work unit); stages
    default to stages_for; overlap needs an even number of groups, and by default is taken wherever they pair up,
    the tile has 128 tokens or more (SMALL_TILES: see the module's notes) and the ring has 4 stages: the overlapped
    loop holds two, so 3 would leave the loader one (H200, the 3-stage 256-token tiles, us without / with it: qkvz
    240 rows 57.3 / 59.9, attn 200 rows 54.7 / 57.1, 1024 rows the same, out_proj 4096 rows 351.6 / 355.1; bitwise
    the same output).
    W4A8: x int8 with its k permuted in blocks of 32 as layers.quant.a8_k says, x_scale fp32 [...] per token;
    out = (x · x_scale) @ Wᵀ, each group summed exactly in int32 (no overlap)."""
    k, n = w.k, w.n
    x2 = x.reshape(-1, k)
    out2 = out.view(-1, n)
    m = x2.shape[0]
    a8 = x.dtype == torch.int8
    assert a8 == (x_scale is not None), "int8 activations come with their per-token scales"
    gpu.check_dense("int4_wgmma_ws", x_scale=x_scale)
    bm, bm2, programs = cfg
    bn = CONSUMERS.value * WG_COLS.value
    m_tiles = triton.cdiv(m, bm + bm2)
    tiles = triton.cdiv(n, bn) * m_tiles
    stages = stages or stages_for(bm, bm2, a8, programs != tiles)
    overlap = k % 256 == 0 and stages >= 4 and not a8 and bm >= 128 if overlap is None else overlap
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
