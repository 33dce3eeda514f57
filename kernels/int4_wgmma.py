"""Int4-weight GEMM on Hopper's warpgroup tensor cores (wgmma) for verify and batch steps (25+ rows):
out[M, N] = x[M, K] @ W[N, K]ᵀ, W in the mma int4 layout (layers/quant.py), x bf16/fp16. int4_linear hands the 27B
shapes' calls to its warp-specialised form, kernels/int4_wgmma_ws.py (which reuses the unpacking below: 1.2-1.6x
this kernel at 32-64 rows); this one takes the rest (TMA-misaligned rows, shapes too small to fill half the SMs).

Why a third int4 kernel: on the H200 the Triton kernel (int4_linear.py) ran at 0.33-0.44x cuBLAS bf16 at 320
rows. Here, per CTA of BN = 16·warps output columns (the wgmma's M side, 64 per warpgroup) and BM tokens (its N
side), and per group of 128 k:
* The group's words (BN columns · 64 contiguous bytes), scales [BN] and activation tile [BM, 128] are copied
  (cp.async) into a ring of STAGES shared-memory stages, STAGES − 1 groups ahead; the activations in the wgmma's
  swizzled layout, read there by the tensor cores as the B operand.
* The weights are the A operand, from registers: the mma layout is the A fragment's order, so each thread reads
  its words with two 16-byte loads, and each pair of weights is one shift, one lop3 (codes as 128 + q in bf16 or
  1024 + q in fp16), then (· − 136)·s or (· − 1032)·s in x's dtype: the weights exactly as a dequantised 16-bit
  checkpoint holds them (as int4_linear's large-M forms compute them), so the mma accumulates across groups in
  fp32 with no per-group epilogue. (The GPTQ layout needed a byte permute and 4x the shared-memory reads per pair:
  ~300 instructions per group and warp against ~230, and 320 rows ran 15-20% slower.)
* An asynchronous wgmma reads its A registers after issue, but ptxas frees them at the issue (the wait's deps
  reach LLVM only: ptxas sees them in a comment) and puts the next group's weights there (wrong sums on the
  H200). So LAUNCH and WIDE wait for each group's wgmma at once, and four CTAs of one warpgroup per SM overlap
  one's unpacking with the others' mma. OVERLAPPED keeps a group's wgmma in flight while the next group is
  unpacked, within the CTA: two A register sets, groups in pairs so each has fixed registers, each set held by
  a never-executed store after the wait that retires its wgmma (`_hold`); one more ring stage, since the stage
  the mma reads stays busy a group longer. It wins where one wave of 2 CTAs per SM holds the tiles without
  split-K (the table below). (A through shared memory allowed overlap too but was slower: the tile's stores
  and reads cost more shared-memory bandwidth than the overlap won.)
* Split-K where the output tiles alone leave SMs idle, summed in fp64 in the split-K workspace (flush_tile:
  deterministic).
  The launch caps the registers (maxnreg) so that the CTAs fit an SM with the split's fp64 epilogue too (it
  spills a few registers there, after the loop): at 159 registers one CTA per SM ran 256 CTAs in two waves.
  On sm_90 the launch is a programmatic dependent launch whose first weights stream before the previous kernel
  finishes.
Measured on the H200 (bench/results/kernels-h200.md). ncu at 320 rows (GPTQ layout): the SMs issued ~2
instructions per cycle, mostly unpacking, the tensor cores half idle; with the mma layout (128 x 64 tiles, qkvz):
tensor pipe active 51% of the SMs' active cycles, the CTA barrier the first stall, and 640 CTAs made 2.42 waves.
Session 12, qkvz at 320 rows (LAUNCH, 64 x 64 tiles): L2 throughput 72% of its peak, SM 49%, 2.0 instructions
per cycle — every 64-column tile reads all the activations from L2 again (839 MB a launch, against 42 MB of
weights); 128-token tiles at 3 per SM: L2 66%, SM 62%. Wider column tiles per CTA (fewer activation passes)
need more warps on one tile without the CTA barrier's lockstep (WIDE, 2 warpgroups, is slower here).
Tried and not kept (H200, same harness): stream-K ranges over (tile, group) units, alone or after whole waves of
one tile per CTA — a tile's flush inside the range costs more than the balance wins (qkvz 320 rows 128 -> 154 us,
40 rows 34 -> 57).
Gluon has no interpreter: checked against the dequantising reference in the GPU tests, compiled for sm_90 by
tests/aot_compile.py. sm_90+ only; other GPUs and asymmetric weights take int4_linear.
Reference: layers.quant.dequantize_int4."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, warpgroup_mma,
                                                              warpgroup_mma_wait)

from kernels import device as gpu
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait
from kernels.int4_gemv import MAX_ROWS, exact_log2, flush_tile
from kernels.splitk import split_count, split_share, workspace
from layers.quant import Int4Weight

MIN_ROWS = MAX_ROWS + 1         # up to MAX_ROWS rows kernels/int4_gemv.py streams the weights faster


def layouts(bn: int, bm: int, warps: int, bits: int = 16):
    """(accumulator [BN, BM], the A operand [BN, 128], a ring stage's words [BN/16, 2 (h), 8 (l), 4 (t), 4 (w)])
    layouts for `bits`-wide operands (16, or 8: W4A8): warp b holds columns 16b … 16b + 15 (the wgmma's 16 rows of
    a warp), lane 4l + t the words 4t … 4t+3 of columns 16b + l and 16b + 8 + l (one 16-byte load each;
    layers/quant.py's mma layout)."""
    assert bn == 16 * warps
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, bm, 256 // bits])
    a_op = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=32 // bits)
    words = gl.DistributedLinearLayout(
        reg_bases=[[0, 1, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2]],
        lane_bases=[[0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 0, 4, 0, 0]],
        warp_bases=[[1 << i, 0, 0, 0, 0] for i in range(exact_log2(warps))], block_bases=[],
        shape=[bn // 16, 2, 8, 4, 4])
    return mma, a_op, words


def copy_layouts(bn: int, warps: int):
    """(words copy [BN, 16], scales copy [BN], the words' and scales' ring layout, activations copy [BM, 128], the
    activations' ring layout): 16 bytes per thread and copy; words and scales unswizzled, the activations in the
    wgmma's 128-byte swizzle."""
    w_copy = gl.BlockedLayout([1, 4], [8, 4], [warps, 1], [1, 0])
    s_copy = gl.SliceLayout(0, gl.BlockedLayout([1, 8], [1, 32], [1, warps], [1, 0]))
    flat = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])       # of a [STAGES, ...] ring
    x_copy = gl.BlockedLayout([1, 8], [2, 16], [warps, 1], [1, 0])
    x_swizzled = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    return w_copy, s_copy, flat, x_copy, x_swizzled


@gluon.jit
def _scaled_pair(t, s2, DT: gl.constexpr):
    """Nibbles 0 and 4 of t as (q − 8)·s, a pair of DT in an int32: (t & 0x000F000F) | MAGIC is 128 + q (bf16) or
    1024 + q (fp16) in each half, less 136 (1032) exactly, times the scale pair s2 (s in DT, both halves)."""
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
    """A ring stage's words [BN, 16] and scales [1, BN] → the A operand [BN, 128] in DT: the weights exactly as a
    dequantised 16-bit checkpoint holds them. Word 4t + w of column n, pair p = 2·p1 + p0 (nibbles p and p + 4)
    is k = 32w + 16·p1 + 8·p0 + 2t + (0, 1): the fragment's registers, so the operand is built in place."""
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
    """A ring stage's words [BN, 16] → the int8 A operand [BN, 128] of codes − 8, in the operand's k order (the
    activations come permuted to match: layers.quant.a8_k). Of word 4t + w, the bytes of (word >> 4r) & 0x0F0F0F0F
    are the fragment's register r of chunk w (k' = 32w + 16r + 4t + q): one and, add and xor make four codes
    signed, (q + 120) ^ 128 = q − 8 in each byte (no carries)."""
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


# _hold's instruction: 32 registers stored by a store that never runs (predicated on a warp count of 0)
HOLD_ASM = gl.constexpr("{ .reg .pred p; .reg .u32 n; .reg .u64 a; mov.u32 n, %nwarpid; setp.eq.u32 p, n, 0; "
                        "mov.u64 a, 0; " + "".join(f"@p st.global.v4.b32 [a], {{${i}, ${i + 1}, ${i + 2}, ${i + 3}}}; "
                                                   for i in range(32, 64, 4)) + "}")
HOLD_REGS = gl.constexpr(",".join(["=r"] * 32 + ["r"] * 32))


@gluon.jit
def _hold(p):
    """A use of all 32 of a thread's A registers (p from _a_operand) that never runs: ptxas frees a wgmma's A
    registers when the wgmma issues, although the tensor cores read them until its wait, so an operand still in
    flight must be used after the wait that retires it."""
    gl.inline_asm_elementwise(HOLD_ASM, HOLD_REGS, [p], dtype=gl.int32, is_pure=False, pack=32)


@gluon.jit
def _copy_group(w_stage, s_stage, x_stage, w_ptrs, w_ok, s_ptrs, s_ok, x_ptrs, x_ok, g, g_hi, N, WORDS: gl.constexpr,
                ACTS: gl.constexpr):
    """Group g's words [BN, 16] and scales [BN] (WORDS) and/or activations [BM, 128] (ACTS) into a ring stage;
    nothing is read past g_hi. The scales ride in the ring: loaded into registers a group ahead, their memory
    latency stalled every group."""
    live = g < g_hi
    if WORDS:
        async_copy.async_copy_global_to_shared(w_stage, w_ptrs + g * 16 * N, mask=w_ok & live)
        async_copy.async_copy_global_to_shared(s_stage, s_ptrs + g * N, mask=s_ok & live)
    if ACTS:
        async_copy.async_copy_global_to_shared(x_stage, x_ptrs + g * 128, mask=x_ok & live)


@gluon.jit
def _group(g, g_lo, g_hi, N, acc, rings, copies, BN: gl.constexpr, DT: gl.constexpr, words: gl.constexpr,
           a_op: gl.constexpr, AHEAD: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr):
    """Group g: wait for its ring stage, refill the stage AHEAD groups on, unpack the weights and issue the mma.
    Returns acc and the A operand's registers (_pairs); with OVERLAP the mma is still in flight (the previous
    group's has retired: its A registers may be reused once held), else it has retired."""
    words_ring, scales_ring, acts_ring = rings
    w_ptrs, w_ok, s_ptrs, s_ok, x_ptrs, x_ok = copies
    step = g - g_lo
    async_copy.wait_group(AHEAD - 1)           # this thread's copies of group g have landed,
    fence_async_shared()                       # are visible to the tensor cores' (async proxy) reads,
    gl.thread_barrier()                        # and everyone's are; the mma that read the stage refilled next
    nxt = (step + AHEAD) % STAGES              # retired (group g − 1's, or g − 2's with OVERLAP)
    _copy_group(words_ring.index(nxt), scales_ring.index(nxt), acts_ring.index(nxt), w_ptrs, w_ok, s_ptrs, s_ok,
                x_ptrs, x_ok, g + AHEAD, g_hi, N, True, True)
    async_copy.commit_group()
    cur = step % STAGES
    a, p = _a_operand(words_ring.index(cur), scales_ring.index(cur), BN, DT, words, a_op)
    acc = warpgroup_mma(a, acts_ring.index(cur).permute((1, 0)), acc, is_async=True)
    return warpgroup_mma_wait(1 if OVERLAP else 0, deps=[acc]), p


@gluon.jit
def _int4_wgmma_kernel(x_ptr, qw_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr, M, N8, K, stride_xm, stride_om, m_tiles,
                       splits, mma: gl.constexpr, a_op: gl.constexpr, words: gl.constexpr, w_copy: gl.constexpr,
                       s_copy: gl.constexpr, flat: gl.constexpr, x_copy: gl.constexpr, x_swizzled: gl.constexpr,
                       BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr,
                       PDL: gl.constexpr, OVERLAP: gl.constexpr):
    # x [M, K] bf16/fp16 (unit column stride), qw int32 [K/128, N, 16], s [K/128, N], out [M, N] (any float dtype);
    # ws fp32 [2·M·N] (as fp64 [M, N]) and cnt int32 [m_tiles · n_tiles] zeroed (kernels/splitk.py).
    # Grid (n_tiles · splits · m_tiles,): the m tiles of one column tile and K range run side by side (the weights
    # come from HBM once); program = ((n_tile · splits) + split) · m_tiles + m_tile.
    DT: gl.constexpr = x_ptr.dtype.element_ty
    N = N8 * 8                  # (passed as N / 8: rows of words and scales are then known 16-byte aligned)
    pid = gl.program_id(0)
    m_tile = pid % m_tiles
    split = (pid // m_tiles) % splits
    n_tile = pid // (m_tiles * splits)
    n0 = n_tile * BN
    m0 = m_tile * BM
    n_groups = K // 128
    per_split = gl.cdiv(n_groups, splits)
    if OVERLAP:     # groups go in pairs: an even count per split (the host checks K / 128 is even and cuts pairs)
        per_split = 2 * gl.cdiv(n_groups // 2, splits)
    g_lo = split * per_split
    g_hi = gl.minimum(g_lo + per_split, n_groups)
    gl.assume(g_hi > g_lo)      # splits are never empty (a zero-trip path once made ptxas serialise the mma)

    wn = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, w_copy))
    wi = gl.arange(0, 16, layout=gl.SliceLayout(0, w_copy))
    w_ptrs = qw_ptr + gl.expand_dims(wn, 1) * 16 + gl.expand_dims(wi, 0)          # a group: BN·64 contiguous bytes
    w_ok = gl.expand_dims(wn < N, 1) & gl.expand_dims(wi < 16, 0)
    xm = gl.arange(0, BM, layout=gl.SliceLayout(1, x_copy))
    xk = gl.arange(0, 128, layout=gl.SliceLayout(0, x_copy))
    x_ptrs = x_ptr + gl.expand_dims(m0 + xm, 1).to(gl.int64) * stride_xm + gl.expand_dims(xk, 0)
    x_ok = gl.expand_dims(m0 + xm < M, 1) & gl.expand_dims(xk < 128, 0)
    sn = n0 + gl.arange(0, BN, layout=s_copy)
    s_ptrs = gl.expand_dims(s_ptr + sn, 0)                                              # [1, BN]
    s_ok = gl.expand_dims(sn < N, 0)

    words_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 16], flat)
    scales_ring = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES, 1, BN], flat)
    acts_ring = gl.allocate_shared_memory(DT, [STAGES, BM, 128], x_swizzled)
    # Ring: AHEAD groups ahead are in flight; a stage is refilled once every warpgroup's mma of it retired. The
    # prologue's words and scales (constants) are requested before waiting for the previous kernel, which writes x.
    AHEAD: gl.constexpr = STAGES - 2 if OVERLAP else STAGES - 1
    for i in gl.static_range(AHEAD):
        _copy_group(words_ring.index(i), scales_ring.index(i), acts_ring.index(i), w_ptrs, w_ok, s_ptrs, s_ok, x_ptrs,
                    x_ok, g_lo + i, g_hi, N, True, False)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    for i in gl.static_range(AHEAD):
        _copy_group(words_ring.index(i), scales_ring.index(i), acts_ring.index(i), w_ptrs, w_ok, s_ptrs, s_ok, x_ptrs,
                    x_ok, g_lo + i, g_hi, N, False, True)
        async_copy.commit_group()

    acc = gl.zeros([BN, BM], gl.float32, mma)
    rings = (words_ring, scales_ring, acts_ring)
    copies = (w_ptrs, w_ok, s_ptrs, s_ok, x_ptrs, x_ok)
    if OVERLAP:
        # Group g's mma runs while group g + 1 is unpacked: two A register sets, each held until the wait that
        # retires its mma; the loop goes by pairs so that each set has fixed registers.
        zeros = gl.zeros([BN // 16, 2, 8, 4, 4], gl.int32, words)
        held = _pairs(zeros, zeros, DT)
        for g in range(g_lo, g_hi, 2):
            acc, p0 = _group(g, g_lo, g_hi, N, acc, rings, copies, BN, DT, words, a_op, AHEAD, STAGES, True)
            _hold(held)
            acc, held = _group(g + 1, g_lo, g_hi, N, acc, rings, copies, BN, DT, words, a_op, AHEAD, STAGES, True)
            _hold(p0)
        acc = warpgroup_mma_wait(0, deps=[acc])
        _hold(held)
    else:
        for g in range(g_lo, g_hi):
            acc, _ = _group(g, g_lo, g_hi, N, acc, rings, copies, BN, DT, words, a_op, AHEAD, STAGES, False)
    async_copy.wait_group(0)
    if SPLIT:       # a constexpr: the fp64 adds' registers would otherwise count against every launch
        flush_tile(acc, n_tile, g_hi - g_lo, n_groups, out_ptr + m0 * stride_om, ws_ptr + 2 * m0 * N,
                   cnt_ptr + m_tile * gl.cdiv(N, BN), M - m0, N, stride_om, BN, BM, mma)
    else:
        cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
        tok = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        gl.store(out_ptr + gl.expand_dims(tok, 0) * stride_om + gl.expand_dims(cols, 1),
                 acc.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(cols < N, 1) & gl.expand_dims(tok < M, 0))


# Token tile, warps (BN = 16·warps columns), ring stages, and CTAs per SM (split-K fills them; registers are
# capped to fit them): OVERLAPPED where one wave of its 2 CTAs per SM holds every tile without split-K (the 27B
# shapes: qkvz and attn up to 64 rows); NARROW (below); else LAUNCH, one warpgroup per CTA, unless more than 64
# rows make fewer of its tiles than two waves of CTAs (out_proj and down at 320 rows), which take WIDE, two
# warpgroups per CTA.
# H200, each timed beside cuBLAS bf16 in one run (us, qkvz / out_proj / attn / gate_up / down), LAUNCH against WIDE:
# 40 rows 34.3 / 18.8 / 33.3 / 61.0 / 37.1 against 33.6 / 19.4 / 32.3 / 73.6 / 35.3; 64 rows 39.5 / 22.8 / 36.9 /
# 61.8 / 39.5 against 40.2 / 24.7 / 37.7 / 76.2 / 40.7; 320 rows 115.0 / 54.3 / 109.6 / 244.2 / 146.1 against
# 128.2 / 51.5 / 120.0 / 270.4 / 138.6 (in the layer step down at 320 rows: 171 against 144). 128-token tiles of
# one warpgroup at 3 per SM: 320 rows qkvz 110.6, out_proj 65.4, down 175.8; at 2 per SM (3 stages) and
# 256-token tiles slower throughout. Before: 64-token tiles at 2 CTAs per SM beat 128-token ones at 1 (gate_up at
# 320 rows: 287 against 369 µs); 2 stages beat 3 and 4 at 320 rows (qkvz 138 / 148 / 160 µs) and tie at 40.
# OVERLAPPED against LAUNCH at 20 / 40 / 64 rows: qkvz 28.6 / 29.7 / 27.5 against 31.0 / 34.1 / 39.0, attn 28.5 /
# 29.2 / 27.3 against 30.6 / 33.1 / 36.8; where the tiles need split-K or waves it loses or ties: out_proj (3
# splits) 16.0 / 17.5 / 19.4 against 15.5 / 18.5 / 22.6, down 35.9 / 37.8 / 37.8 against 34.3 / 36.6 / 38.9,
# gate_up (2 waves) 74.3 / 76.0 / 72.2 against 60.3 / 61.1 / 62.3; 5 stages, 2 warpgroups, 32-token tiles no
# better (but 32-token tiles of LAUNCH: gate_up at 20 rows 48.6); at 320 rows no faster (qkvz 124-143 against
# 116 at 2-3 CTAs per SM and 3-4 stages).
# NARROW: up to 32 rows where LAUNCH's tiles need a second wave (gate_up: 544 tiles on 528 slots), 32-token tiles
# overlapped at 3 CTAs per SM: gate_up at 20 rows 48.6 against 60.3 (at 40 rows, two token tiles: 81.7 against 61.1).
LAUNCH = dict(block_m=64, warps=4, stages=2, ctas_per_sm=4)
WIDE = dict(block_m=64, warps=8, stages=2, ctas_per_sm=2)
OVERLAPPED = dict(block_m=64, warps=4, stages=4, ctas_per_sm=2, overlap=True)
NARROW = dict(block_m=32, warps=4, stages=4, ctas_per_sm=3, overlap=True)


def supports(x: torch.Tensor, w: Int4Weight) -> bool:
    """Whether this kernel (or, for int8 activations, its warp-specialised form alone) takes the call: CUDA sm_90+,
    ≥ MIN_ROWS rows, symmetric weights, group 128."""
    return (x.is_cuda and gpu.capability(x.device) >= (9, 0) and x.numel() // x.shape[-1] >= MIN_ROWS
            and w.zs is None and w.group == 128 and x.dtype in (torch.bfloat16, torch.float16, torch.int8)
            and x.stride(-1) == 1)


def pick(m: int, n: int, k: int, device, **override) -> dict:
    """Launch parameters for m rows: OVERLAPPED, NARROW, LAUNCH or WIDE (entries can be overridden), and the
    split-K count that fills the GPU (in pairs of groups with overlap)."""
    sms = gpu.num_sms(device)

    def tiles(p):
        return triton.cdiv(m, p["block_m"]) * triton.cdiv(n, 16 * p["warps"])

    slots = OVERLAPPED["ctas_per_sm"] * sms
    pairs_fit = k % 256 == 0                                          # the overlapped loop takes groups in pairs
    if pairs_fit and slots < 2 * tiles(OVERLAPPED) <= 2 * slots:
        p = dict(OVERLAPPED, **override)
    elif pairs_fit and m <= NARROW["block_m"] and tiles(LAUNCH) > LAUNCH["ctas_per_sm"] * sms:
        p = dict(NARROW, **override)
    else:
        p = dict(WIDE if m > 64 and tiles(LAUNCH) < 2 * LAUNCH["ctas_per_sm"] * sms else LAUNCH, **override)
    if "splits" not in p:
        pairs = 2 if p.get("overlap") else 1
        p["splits"] = split_count(tiles(p), k // 128 // pairs, p["ctas_per_sm"], sms)
    return p


def int4_wgmma(x: torch.Tensor, w: Int4Weight, out: torch.Tensor, block_m: int = None, warps: int = None,
               stages: int = None, splits: int = None, ctas_per_sm: int = None, overlap: bool = None) -> torch.Tensor:
    """x [..., K] (bf16/fp16) → out [..., N] (any float dtype); launch parameters default to pick() (overlap: the
    OVERLAPPED loop, which needs 3+ stages and an even number of groups)."""
    k, n = w.k, w.n
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    out2 = out.view(-1, n)
    assert x2.stride(-1) == 1 and out2.stride(-1) == 1 and n % 8 == 0 and k % 128 == 0
    given = {key: v for key, v in dict(block_m=block_m, warps=warps, stages=stages, splits=splits,
                                       ctas_per_sm=ctas_per_sm, overlap=overlap).items() if v is not None}
    p = pick(m, n, k, x.device, **given)
    bm, warps, stages = p["block_m"], p["warps"], p["stages"]
    assert not p.get("overlap") or (stages >= 3 and k % 256 == 0), "overlap: 3+ stages, groups in pairs"
    assert split_share(k // 128, p["splits"], 2 if p.get("overlap") else 1), p    # no split may be empty
    bn = 16 * warps
    m_tiles, n_tiles = triton.cdiv(m, bm), triton.cdiv(n, bn)
    pdl = gpu.pdl(x.device)
    ws, cnt = workspace(x.device, 2 * m * n, m_tiles * n_tiles)                  # fp64 [M, N]
    mma, a_op, words = layouts(bn, bm, warps)
    w_copy, s_copy, flat, x_copy, x_swizzled = copy_layouts(bn, warps)
    _int4_wgmma_kernel[(n_tiles * p["splits"] * m_tiles,)](
        x2, w.qweight, w.scales, out2, ws, cnt, m, n // 8, k, x2.stride(0), out2.stride(0), m_tiles, p["splits"],
        mma, a_op, words, w_copy, s_copy, flat, x_copy, x_swizzled, bn, bm, stages, p["splits"] > 1, pdl,
        p.get("overlap", False),
        num_warps=warps, launch_pdl=pdl, maxnreg=min(255, 65536 // (p["ctas_per_sm"] * warps * 32)))
    return out
