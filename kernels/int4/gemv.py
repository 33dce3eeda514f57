"""Int4 GEMV on tensor cores (Gluon), ≤ MAX_ROWS rows, symmetric weights, sm_80+: out = x @ Wᵀ, W in the mma
layout (layers/quant.py), x bf16/fp16. The weights are the mma's A operand, streamed with scales and activations
through a shared-memory ring (cp.async); each group's fp32 partial is added in int64 fixed point, so a token's
output is bitwise the same at every row count up to MAX_ROWS. Stream-K: one range of (tile, group) units per
resident CTA; shared tiles summed by integer atomics, or posted into an int64 output (kernels/fixed_sum.py).
H200 into int64 sums: 0.52-0.90 of the copy bandwidth at 1-8 rows. Notes: docs/notes/int4.md."""
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from kernels import device as gpu
from kernels.fixed_sum import FRAC, deferred
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait
from kernels.int4.common import GROUP, MAX_ROWS, exact_log2, prog_of, range_start
from kernels.int4.splitk import workspace
from layers.quant import Int4Weight

# Sums in int64 fixed point (units of 2^-FRAC): order-independent. A shared tile's sums must stay below 2^24 (the
# arrival count sits above them): every row given, padding included, must be finite and in range, or
# flush_marked's workspace element is never cleared (padding rows of a batch bucket: zeros).
ONE = gl.constexpr(2.0 ** FRAC)
UNIT = gl.constexpr(2.0 ** -FRAC)
COUNT = gl.constexpr(57)
ARRIVAL = gl.constexpr(1 << COUNT.value)
MAX_SHARING = 31            # programs per tile: the workspace's arrival count (2^57 each) stays below 2^62


def token_tile(m: int) -> tuple:
    """The mma's token widths (its n side) for m rows: (BT, BT2), a second tile of BT2 tokens after the first."""
    return (8, 0) if m <= 8 else (16, 0) if m <= 16 else (16, 8)


def x_rows(m: int) -> int:
    """Activation rows in a ring stage for m rows: the token tiles rounded up to a power of 2."""
    bt, bt2 = token_tile(m)
    return 2 * bt if bt2 else bt


def layouts(bn: int, warps: int):
    """Words [BN, 4 (t), 4 (w)] as the A fragments need them: lane 4l + t reads words 4t … 4t+3 of its rows."""
    warp_rows = [[16 << i, 0, 0] for i in range(exact_log2(warps))]
    rep_rows = [[16 * warps << i, 0, 0] for i in range(exact_log2(bn // (16 * warps)))]
    return gl.DistributedLinearLayout(                              # word 4t + w of the block, column `row`
        reg_bases=[[8, 0, 0], [0, 0, 1], [0, 0, 2]] + rep_rows,
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=warp_rows, block_bases=[], shape=[bn, 4, 4])


def ring_layouts(warps: int):
    """(words copy, words ring, activations copy, activations ring XOR-swizzled by token for ldmatrix)."""
    copy = gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[8, 4, 1], warps_per_cta=[warps, 1, 1],
                            order=[2, 1, 0])
    ring = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])    # of one stage
    x_copy = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[warps, 1],
                              order=[1, 0])
    x_ring = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    return copy, ring, x_copy, x_ring


@gluon.jit
def _pair(w, j: gl.constexpr, DT: gl.constexpr):
    """Codes j and j + 4 of each word as two DT numbers 128 + q (bf16) or 1024 + q (fp16): [...] → [..., 2]."""
    w = w >> (4 * j)
    if DT == gl.float16:        # (w & 0x000F000F) | MAGIC in one lop3 (the compiler emits two)
        t = gl.inline_asm_elementwise("lop3.b32 $0, $1, 0x000F000F, 0x64006400, 0xEA;", "=r,r", [w],
                                      dtype=gl.int32, is_pure=True, pack=1)
    else:
        t = gl.inline_asm_elementwise("lop3.b32 $0, $1, 0x000F000F, 0x43004300, 0xEA;", "=r,r", [w],
                                      dtype=gl.int32, is_pure=True, pack=1)
    return gl.join(t.to(gl.int16), (t >> 16).to(gl.int16)).to(DT, bitcast=True)


@gluon.jit
def _chunk_weights(q, b: gl.constexpr, BN: gl.constexpr, DT: gl.constexpr, a_op: gl.constexpr):
    """Words [BN, 4 (t), 4 (w)] → chunk b (k = 32b … 32b + 31) as the A operand [BN, 32] (offset codes)."""
    w = gl.reshape(q, [BN, 4, 2, 2])                                # [row, t, b1, b0]
    lo, hi = gl.split(w)
    w = hi if b % 2 == 1 else lo
    lo, hi = gl.split(w)
    w = hi if b // 2 == 1 else lo                                   # [row, t]
    u = gl.join(gl.join(_pair(w, 0, DT), _pair(w, 1, DT)), gl.join(_pair(w, 2, DT), _pair(w, 3, DT)))
    u = gl.reshape(gl.permute(u, [0, 4, 3, 1, 2]), [BN, 32])       # [row, t, e, p0, p1] → k 16p1 + 8p0 + 2t + e
    return gl.convert_layout(u, a_op, assert_trivial=True)


@gluon.jit
def _arange3(n: gl.constexpr, dim: gl.constexpr, layout: gl.constexpr):
    """arange(n) along `dim` of a rank-3 tensor in `layout`, size 1 along the other two."""
    if dim == 0:
        r = gl.arange(0, n, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
        return gl.expand_dims(gl.expand_dims(r, 1), 2)
    elif dim == 1:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
        return gl.expand_dims(gl.expand_dims(r, 0), 2)
    else:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
        return gl.expand_dims(gl.expand_dims(r, 0), 1)


@gluon.jit
def _unit(u, n_groups, BN: gl.constexpr):
    """Work unit u = tile · n_groups + g → (first column of the tile, g)."""
    tile = u // n_groups
    return tile * BN, u - tile * n_groups


@gluon.jit
def _copy_unit(w_stage, s_stage, x_stage, c_ptrs, cr, ct, cb, s_ptrs, sp, x_ptrs, x_ok, u, n_groups, N,
               BN: gl.constexpr, EVEN_N: gl.constexpr, WORDS: gl.constexpr, ACTS: gl.constexpr):
    """Unit u's words and scales (WORDS) and/or activations (ACTS) into a ring stage."""
    n0, g = _unit(u, n_groups, BN)
    if WORDS:
        s_ok = n0 + 2 * sp < N
        if EVEN_N:
            async_copy.async_copy_global_to_shared(w_stage, c_ptrs + (g * N + n0) * 16)
        else:
            async_copy.async_copy_global_to_shared(w_stage, c_ptrs + (g * N + n0) * 16,
                                                   mask=(n0 + cr < N) & (ct < 4) & (cb < 4))
        async_copy.async_copy_global_to_shared(s_stage, s_ptrs + (g * N + n0) // 2, mask=s_ok)
    if ACTS:
        async_copy.async_copy_global_to_shared(x_stage, x_ptrs + g * 128, mask=x_ok)


@gluon.jit
def _tokens(x_chunk, t0: gl.constexpr, BT: gl.constexpr, b_op: gl.constexpr):
    """Tokens t0 … t0 + BT - 1 of an activation chunk [tokens, 32] as the B operand [32, BT] (ldmatrix)."""
    return x_chunk.slice(t0, BT, dim=0).permute((1, 0)).load(b_op)


@gluon.jit
def _scaled_sum(acc, part, xsum, scale, BASE: gl.constexpr):
    """acc + (part − BASE·Σx)·scale in int64 fixed point; scale = s·2^FRAC."""
    return acc + ((part - BASE * xsum) * scale).to(gl.int64)


@gluon.jit
def _twice(x):
    """[rows, T] → [2·rows, T], the copy below (a register bit: no data moves)."""
    return gl.reshape(gl.permute(gl.join(x, x), [2, 0, 1]), [2 * x.shape[0], x.shape[1]])


@gluon.jit
def _every_row(xs, BN: gl.constexpr, mma: gl.constexpr):
    """Σx [rows, T] as the [BN, T] accumulator (past 16·W rows the mma layout repeats in registers)."""
    R: gl.constexpr = BN // xs.shape[0]
    if R >= 2:
        xs = _twice(xs)
    if R >= 4:
        xs = _twice(xs)
    if R >= 8:
        xs = _twice(xs)
    return gl.convert_layout(xs, mma, assert_trivial=True)


@gluon.jit
def _group_product(q, x_stage, s, acc, acc2, BN: gl.constexpr, BT: gl.constexpr, BT2: gl.constexpr,
                   DT: gl.constexpr, BASE: gl.constexpr, mma: gl.constexpr, a_op: gl.constexpr, b_op: gl.constexpr,
                   SUM_ONCE: gl.constexpr):
    """acc, acc2 (tokens BT …) in int64 fixed point += one group: Σ (BASE + code − 8)·x − BASE·Σx (ones mma)."""
    XR: gl.constexpr = 16 * mma.warps_per_cta[0] if SUM_ONCE else BN           # Σx rows
    part = gl.zeros([BN, BT], gl.float32, mma)
    xsum = gl.zeros([XR, BT], gl.float32, mma)
    ones = gl.full([XR, 32], 1.0, DT, a_op)
    if BT2 > 0:
        part2 = gl.zeros([BN, BT2], gl.float32, mma)
        xsum2 = gl.zeros([XR, BT2], gl.float32, mma)
    for b in gl.static_range(4):
        chunk = x_stage.slice(32 * b, 32, dim=1)
        codes = _chunk_weights(q, b, BN, DT, a_op)
        xb = _tokens(chunk, 0, BT, b_op)
        part = mma_v2(codes, xb, part)
        xsum = mma_v2(ones, xb, xsum)
        if BT2 > 0:
            xb2 = _tokens(chunk, BT, BT2, b_op)
            part2 = mma_v2(codes, xb2, part2)
            xsum2 = mma_v2(ones, xb2, xsum2)
    scale = gl.expand_dims(s.to(gl.float32) * ONE, 1)
    acc = _scaled_sum(acc, part, _every_row(xsum, BN, mma), scale, BASE)
    if BT2 > 0:
        acc2 = _scaled_sum(acc2, part2, _every_row(xsum2, BN, mma), scale, BASE)
    return acc, acc2


@gluon.jit
def _to_out(v, out_ptr):
    """A sum (fp32 or fp64, or int64 fixed point) in the output's dtype."""
    if v.dtype == gl.int64:
        return (v.to(gl.float64) * UNIT).to(out_ptr.dtype.element_ty)
    else:
        return v.to(out_ptr.dtype.element_ty)


@gluon.jit
def _token_of(c, M, T0: gl.constexpr, SPREAD: gl.constexpr):
    """Token column (or stage row) c → (token T0 + c, or with SPREAD T0 + c / 2 in even columns only; valid)."""
    tok = T0 + (c // 2 if SPREAD else c)
    return tok, (tok < M) & (c % 2 == 0) if SPREAD else tok < M


@gluon.jit
def _tile_ptrs(tile, out_ptr, M, N, stride_om, BN: gl.constexpr, BT: gl.constexpr, mma: gl.constexpr,
               T0: gl.constexpr = 0, SPREAD: gl.constexpr = False):
    """A column tile's [BN, BT] elements of tokens T0 …: (mask, output pointers, columns, tokens)."""
    cols = tile * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    tok, ok = _token_of(gl.arange(0, BT, layout=gl.SliceLayout(0, mma)), M, T0, SPREAD)
    mask = gl.expand_dims(cols < N, 1) & gl.expand_dims(ok, 0)
    return mask, out_ptr + gl.expand_dims(tok, 0) * stride_om + gl.expand_dims(cols, 1), cols, tok


@gluon.jit
def _ws_ptrs(ws_ptr, dtype: gl.constexpr, cols, tok, N):
    """The tile's elements in the workspace, viewed as dtype [M, N]."""
    return ws_ptr.to(gl.pointer_type(dtype), bitcast=True) + gl.expand_dims(tok, 0) * N + gl.expand_dims(cols, 1)


@gluon.jit
def flush_tile(acc, tile, groups, n_groups, out_ptr, ws_ptr, cnt_ptr, M, N, stride_om, BN: gl.constexpr,
               BT: gl.constexpr, mma: gl.constexpr, SPREAD: gl.constexpr = False):
    """The tile's sum over `groups` of its n_groups: stored, or added into the workspace (order-independent) and
    stored by the program completing the tile's count."""
    mask, out, cols, tok = _tile_ptrs(tile, out_ptr, M, N, stride_om, BN, BT, mma, 0, SPREAD)
    if groups == n_groups:
        gl.store(out, _to_out(acc, out_ptr), mask=mask)
    else:
        total_ty: gl.constexpr = gl.int64 if acc.dtype == gl.int64 else gl.float64
        ws = _ws_ptrs(ws_ptr, total_ty, cols, tok, N)
        gl.atomic_add(ws, acc.to(total_ty), mask=mask, sem="relaxed")
        gl.thread_barrier()
        arrived = gl.atomic_add(cnt_ptr + tile, groups, sem="acq_rel")
        if arrived + groups == n_groups:
            ws_bits = ws.to(gl.pointer_type(gl.int64), bitcast=True)
            total = gl.atomic_xchg(ws_bits, gl.zeros([BN, BT], gl.int64, mma), mask=mask, sem="relaxed")
            gl.store(out, _to_out(total.to(total_ty, bitcast=True), out_ptr), mask=mask)
            gl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")


@gluon.jit
def _programs_of(tile, n_groups, P, units):
    """How many programs' ranges hold groups of this tile."""
    return prog_of((tile + 1) * n_groups - 1, P, units) - prog_of(tile * n_groups, P, units) + 1


@gluon.jit
def flush_marked(acc, tile, n_groups, P, units, out_ptr, ws_ptr, M, N, stride_om, BN: gl.constexpr,
                 BT: gl.constexpr, mma: gl.constexpr, T0: gl.constexpr = 0, SPREAD: gl.constexpr = False):
    """As flush_tile for int64 sums, without a counter: each program's add carries an arrival mark (2^COUNT); the
    add that completes an element's count stores its total and zeroes the element."""
    mask, out, cols, tok = _tile_ptrs(tile, out_ptr, M, N, stride_om, BN, BT, mma, T0, SPREAD)
    programs = _programs_of(tile, n_groups, P, units)
    if programs == 1:
        gl.store(out, _to_out(acc, out_ptr), mask=mask)
    else:
        ws = _ws_ptrs(ws_ptr, gl.int64, cols, tok, N)
        mine = acc + ARRIVAL
        total = gl.atomic_add(ws, mine, mask=mask, sem="relaxed") + mine
        arrived = programs.to(gl.int64)
        last = mask & ((total + ARRIVAL // 2) >> COUNT == arrived)      # |sum| < 2^(COUNT - 1) in fixed point
        gl.store(out, _to_out(total - arrived * ARRIVAL, out_ptr), mask=last)
        gl.store(ws, gl.zeros([BN, BT], gl.int64, mma), mask=last)


@gluon.jit
def post_tile(acc, tile, n_groups, P, units, out_ptr, M, N, stride_om, BN: gl.constexpr, BT: gl.constexpr,
              mma: gl.constexpr, T0: gl.constexpr = 0, SPREAD: gl.constexpr = False):
    """Into the int64 output (zero on entry; kernels/fixed_sum.py): stored, or added by posted atomics when shared."""
    mask, out, cols, tok = _tile_ptrs(tile, out_ptr, M, N, stride_om, BN, BT, mma, T0, SPREAD)
    if _programs_of(tile, n_groups, P, units) == 1:
        gl.store(out, acc, mask=mask)
    else:
        gl.atomic_add(out, acc, mask=mask, sem="relaxed")


@gluon.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_om,
                      w_layout: gl.constexpr, c_layout: gl.constexpr, ring_layout: gl.constexpr,
                      x_copy: gl.constexpr, x_ring_layout: gl.constexpr, BN: gl.constexpr, BT: gl.constexpr,
                      BT2: gl.constexpr, W: gl.constexpr, STAGES: gl.constexpr, SP: gl.constexpr, MARKS: gl.constexpr,
                      EVEN_N: gl.constexpr, PDL: gl.constexpr, SUM_ONCE: gl.constexpr, SPREAD: gl.constexpr):
    # x [M, K] bf16/fp16, qw int32 [K/128, N, 16], s [K/128, N], out [M, N] (float, or int64 sums), ws [2·M·N]
    # (as int64 [M, N]) and cnt [tiles] zeroed. Grid (P,): the (tile, group) units cut into P equal ranges.
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    DT: gl.constexpr = x_ptr.dtype.element_ty
    BASE: gl.constexpr = 1032.0 if DT == gl.float16 else 136.0      # 1024 + 8 or 128 + 8
    n_groups = K // 128
    units = gl.cdiv(N, BN) * n_groups
    pid = gl.program_id(0)
    u_lo = range_start(pid, gl.num_programs(0), units)
    u_hi = range_start(pid + 1, gl.num_programs(0), units)

    cr = _arange3(BN, 0, c_layout)
    ct = _arange3(4, 1, c_layout)
    cb = _arange3(4, 2, c_layout)
    c_ptrs = qw_ptr + cr * 16 + 4 * ct + cb
    XT: gl.constexpr = 2 * BT if BT2 > 0 else BT                   # the activations' rows in a stage (x_rows)
    xt = gl.arange(0, XT, layout=gl.SliceLayout(1, x_copy))
    xk = gl.arange(0, 128, layout=gl.SliceLayout(0, x_copy))
    x_tok, x_row_ok = _token_of(xt, M, 0, SPREAD)                   # SPREAD: token t in stage row 2t
    x_ok = gl.expand_dims(x_row_ok, 1) & gl.expand_dims(xk < 128, 0)
    x_ptrs = x_ptr + gl.expand_dims(x_tok, 1).to(gl.int64) * stride_xm + gl.expand_dims(xk, 0)
    # the scales as SP = BN/2 int32 pairs
    s_copy: gl.constexpr = gl.BlockedLayout([max(1, SP // (32 * W))], [32], [W], [0])
    sp = gl.arange(0, SP, layout=s_copy)
    s_ptrs = s_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + sp

    # the prefetch past the range's end reloads its last unit
    ring = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 4, 4], ring_layout)
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])   # of one stage
    s_ring = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES, 2 * SP], flat)
    s_ring32 = s_ring._reinterpret(gl.int32, [STAGES, SP], flat)
    x_ring = gl.allocate_shared_memory(DT, [STAGES, XT, 128], x_ring_layout)
    if PDL:
        # weights (constants) before the wait; x (the previous kernel's output) after it
        gdc_launch_dependents()
    for j in gl.static_range(STAGES - 1):
        _copy_unit(ring.index(j), s_ring32.index(j), x_ring.index(j), c_ptrs, cr, ct, cb, s_ptrs, sp, x_ptrs, x_ok,
                   gl.minimum(u_lo + j, u_hi - 1), n_groups, N, BN, EVEN_N, True, False)
    if PDL:
        gdc_wait()
    for j in gl.static_range(STAGES - 1):
        _copy_unit(ring.index(j), s_ring32.index(j), x_ring.index(j), c_ptrs, cr, ct, cb, s_ptrs, sp, x_ptrs, x_ok,
                   gl.minimum(u_lo + j, u_hi - 1), n_groups, N, BN, EVEN_N, False, True)
        async_copy.commit_group()
    acc = gl.zeros([BN, BT], gl.int64, mma)
    A2: gl.constexpr = BT2 if BT2 > 0 else 8
    acc2 = gl.zeros([BN, A2], gl.int64, mma)                        # tokens BT …, where BT2 > 0
    for u in range(u_lo, u_hi):
        i = u - u_lo
        async_copy.wait_group(STAGES - 2)          # this thread's copies of unit u have landed
        gl.thread_barrier()                         # everyone's have; everyone has read unit u - 1's stage
        nxt = (i + STAGES - 1) % STAGES
        _copy_unit(ring.index(nxt), s_ring32.index(nxt), x_ring.index(nxt), c_ptrs, cr, ct, cb, s_ptrs, sp, x_ptrs,
                   x_ok, gl.minimum(u + STAGES - 1, u_hi - 1), n_groups, N, BN, EVEN_N, True, True)
        async_copy.commit_group()
        q = ring.index(i % STAGES).load(w_layout)
        s = s_ring.index(i % STAGES).slice(0, BN).load(gl.SliceLayout(1, mma))
        acc, acc2 = _group_product(q, x_ring.index(i % STAGES), s, acc, acc2, BN, BT, BT2, DT, BASE, mma, a_op,
                                   b_op, SUM_ONCE)
        if (u + 1 == u_hi) | ((u + 1) % n_groups == 0):            # the tile's last group, or the range's
            tile = u // n_groups
            P = gl.num_programs(0)
            if out_ptr.dtype.element_ty == gl.int64:
                post_tile(acc, tile, n_groups, P, units, out_ptr, M, N, stride_om, BN, BT, mma, 0, SPREAD)
                if BT2 > 0:
                    post_tile(acc2, tile, n_groups, P, units, out_ptr, M, N, stride_om, BN, BT2, mma, BT)
            elif MARKS:
                flush_marked(acc, tile, n_groups, P, units, out_ptr, ws_ptr, M, N, stride_om, BN, BT, mma, 0,
                             SPREAD)
                if BT2 > 0:
                    flush_marked(acc2, tile, n_groups, P, units, out_ptr, ws_ptr, M, N, stride_om, BN, BT2, mma, BT)
            else:
                flush_tile(acc, tile, u + 1 - gl.maximum(u_lo, tile * n_groups), n_groups, out_ptr, ws_ptr, cnt_ptr,
                           M, N, stride_om, BN, BT, mma, SPREAD)
            acc = gl.zeros([BN, BT], gl.int64, mma)
            if BT2 > 0:
                acc2 = gl.zeros([BN, A2], gl.int64, mma)
    async_copy.wait_group(0)


# Per row bucket (upper bound inclusive; H200 sweeps, bench.kernels_int4 --sweep): Config's fields, and a `short`
# launch below SHORT_UNITS work units a program
SHORT_UNITS = 6
ROW_BUCKETS = ((2, dict(block_n=128, warps=2, stages=2, ctas_per_sm=8, marks=True, spread=True)),
               (8, dict(block_n=128, warps=2, stages=2, ctas_per_sm=6, marks=True)),
               (16, dict(block_n=128, warps=2, stages=2, ctas_per_sm=4, marks=False,
                         short=dict(warps=4, ctas_per_sm=3))),
               (24, dict(block_n=128, warps=4, stages=2, ctas_per_sm=2, marks=True)))


@dataclass(frozen=True)
class Config:
    """A launch (ROW_BUCKETS' fields); sum_once: Σx one m16 mma block per warp (below sm_90; the same sums)."""
    block_n: int
    warps: int
    stages: int
    ctas_per_sm: int
    programs: int
    marks: bool
    spread: bool = False
    sum_once: bool = False


def runs(rows: int, device) -> bool:
    """Whether the GEMV runs `rows` rows on `device` (given symmetric group-128 weights and a dense bf16/fp16 x):
    CUDA (or meta, offline) sm_80+, ≤ MAX_ROWS rows. Only then can a linear leave int64 sums."""
    device = torch.device(device)
    return device.type in ("cuda", "meta") and gpu.capability(device) >= (8, 0) and rows <= MAX_ROWS


def supports(x: torch.Tensor, w: Int4Weight) -> bool:
    return (runs(x.numel() // x.shape[-1], x.device) and w.zs is None and w.group == GROUP
            and x.dtype in (torch.bfloat16, torch.float16) and x.stride(-1) == 1)


def config(m: int, n: int, k: int, device, **override) -> Config:
    """The bucket's launch for m rows (override: the sweep's), CTAs per SM capped by the shared memory."""
    p = {"spread": False, **next(p for bound, p in ROW_BUCKETS if m <= bound)}
    short = p.pop("short", None)
    if short and triton.cdiv(n, p["block_n"]) * (k // 128) < SHORT_UNITS * p["ctas_per_sm"] * gpu.num_sms(device):
        p.update(short)
    p.update(override)
    stage = p["block_n"] * 66 + x_rows(m) * 256                        # words, scales, activations
    ring_bytes = p["stages"] * stage + 1024                           # + the 1 KiB the GPU reserves per CTA
    p["ctas_per_sm"] = min(p["ctas_per_sm"], gpu.smem_per_sm(device) // ring_bytes)
    tiles = triton.cdiv(n, p["block_n"])
    p.setdefault("programs", min(tiles * (k // 128), p["ctas_per_sm"] * gpu.num_sms(device), tiles * (MAX_SHARING - 1)))
    p.setdefault("sum_once", gpu.capability(device) < (9, 0))
    return Config(**p)


def launch(x: torch.Tensor, w: Int4Weight, out: torch.Tensor, cfg: Config) -> torch.Tensor:
    """x [..., K] (≤ MAX_ROWS rows) → out [..., N] (any float dtype; or int64 zeros for fixed-point sums, bf16 x)."""
    k, n = w.k, w.n
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    out2 = out.view(-1, n)
    assert m <= MAX_ROWS and x2.stride(-1) == 1 and out2.stride(-1) == 1 and n % 8 == 0 and k % 128 == 0
    assert not deferred(out) or x.dtype == torch.bfloat16, "int64 sums stand for bf16 activations"
    pdl = gpu.pdl(x.device)
    bt, bt2 = token_tile(m)
    assert not bt2 or cfg.marks or deferred(out), "a second token tile needs flush_marked or int64 sums"
    assert -(-cfg.programs // triton.cdiv(n, cfg.block_n)) < MAX_SHARING, "too many programs per column tile"
    ws, cnt = workspace(x.device, 2 * m * n, triton.cdiv(n, cfg.block_n))      # int64 [M, N]
    w_layout = layouts(cfg.block_n, cfg.warps)
    c_layout, ring_layout, x_copy, x_ring_layout = ring_layouts(cfg.warps)
    _int4_gemv_kernel[(cfg.programs,)](
        x2, w.qweight, w.scales, out2, ws, cnt, m, n, k, x2.stride(0), out2.stride(0),
        w_layout, c_layout, ring_layout, x_copy, x_ring_layout, cfg.block_n, bt, bt2, cfg.warps, cfg.stages,
        cfg.block_n // 2, cfg.marks, n % cfg.block_n == 0, pdl, cfg.sum_once, cfg.spread,
        num_warps=cfg.warps, launch_pdl=pdl, maxnreg=65536 // (cfg.ctas_per_sm * cfg.warps * 32))
    return out
