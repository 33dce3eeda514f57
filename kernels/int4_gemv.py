"""Int4-weight GEMV for decode and verify (M ≤ 24 rows) on tensor cores: out[M, N] = x[M, K] @ W[N, K]ᵀ, W in the
mma layout (layers/quant.py).

Why a second int4 kernel: at M ≤ 24 the step is a pure weight stream, and the Triton kernel (int4_linear.py)
stages every tile through shared memory with ldmatrix-style reads, the padded activation tile read once per warp
and several barriers per group: on the H200 L1/shared ran at ~70% while DRAM ran at ~30%. Here:
* The weights are the mma's A operand (rows = output columns, m16n8k16) and the activations its B operand
  (columns = tokens, n8 or n16; at 17-24 rows an n16 and an n8 tile on the same A registers), so M ≤ 8 wastes no
  mma width. A group's words (BN columns · 64 contiguous bytes) and activations [BT, 128] are copied as they lie
  (cp.async, 16 bytes per copy) into a ring of shared-memory stages; each thread reads back exactly the words its
  A fragment needs, 16 bytes at once (the mma layout is that fragment's order; the GEMM paths read the same
  weights), and ldmatrix reads the activations as the B fragment (k in natural order, so no permutation anywhere).
* Word → bf16/fp16 pairs with t = (word >> 4p) & 0x000F000F | MAGIC (codes p and p+4 as 128 + q or 1024 + q: the
  fragment's k pair 2t, 2t+1 of the chunk's 8-wide slice p).
* Exact codes in the mma (offset by 128, the offset removed through a ones-operand mma of x: one subtract per
  pair of weights less), the group's partial sum scaled once per group in fp32 (like int4_linear's GEMV form) and
  added across groups in int64 fixed point (FRAC): order-independent, so a token's output does not depend on how
  K is cut into ranges — the same bits whatever the row bucket's launch (decoded alone, or among up to 24 rows of
  a verify step: 4 sequences verifying 4 drafts each).
* The next groups' words, scales and activations are in flight in the ring (no registers hold them: 8 CTAs of 2
  warps fit an SM's registers; with the words prefetched into registers the kernel measured 0.60 instead of 0.63
  of the copy bandwidth at M = 1). The scales loaded into registers one group ahead instead were 3-5% slower at
  M = 1-12 (H200): under a saturated bus a load's latency exceeds a group's time (at 16 rows the ring is ~2%
  slower). On sm_90 the launch is a programmatic dependent launch: the first groups' weights stream while the
  previous kernel finishes.
* Stream-K: the (column tile, K group) work units are cut into one equal range per resident CTA, so every SM
  streams the same bytes (with one split-K count per shape, CTA counts that are no multiple of the SMs left
  up to 21% of the SMs idle at the end; ncu, 34816x5120). A tile shared by programs is summed by integer
  atomics: at 1-8 rows in a workspace that carries each element's arrival count (flush_marked: the last add of
  an element returns its total, so no program waits for the others; with the scales' ring it took 3-15% off
  the time at 1-8 rows against flush_tile's counter), at 9-16 rows through flush_tile.
* Or the flush is left to the consumer: given an int64 output (zeros), shared tiles are added by posted atomics
  (`red`: nothing returns, no program waits) and the kernel that reads the linear's output converts and clears
  the sums (kernels/fixed_sum.py; bitwise the bf16 this kernel stores). H200, against the stored bf16 in the same
  run, M = 1 / 2-5 / 8: qkvz 13.7 -> 11.8 / 15.4 -> 13.5 / 16.4 -> 13.9 µs, gate_up 24.8 -> 23.6 / 27.1 -> 25.2 /
  28.6 -> 25.8, down 14.2 -> 13.0 / 15.5 -> 13.5 / 16.4 -> 14.4, attn_qkv_gate 12.4 -> 10.9 / 13.7 -> 11.8,
  out_proj 7.1 -> 5.9 / 8.0 -> 6.7 (same launch table). Tried (session 19): shared tiles staged in an 8-16 KB
  buffer and added by one TMA reduction each (cp.reduce.async.bulk.tensor .add on the output viewed as uint64;
  Gluon's builder has create_async_tma_reduce): 0.1-0.5 µs faster at 2-8 rows (qkvz M = 5 13.4 against 13.6,
  attn 12.0 against 12.1), 0.4-0.9 slower at 16, and its sums of the qkvz shape were not bitwise the stored
  output in the first try (not chased).
Measured on the H200 (bench/results/kernels-h200.md; the small shapes pay the launch's fixed latency: a launch that
only reads their bytes reaches 0.72-0.97 of the copy peak, bench/floors.py). Against the GPTQ layout (words copied
as 16 rows of the group, read back 4 bytes at a time through a swizzle, activations permuted in registers, fp32
sums, one launch for 1-8 rows): M = 1 1-8% and M = 5 5-11% faster. Tried and not kept: 3-4 ring stages (fewer CTAs
fit the shared memory: slower), 64-column tiles, fewer registers (maxnreg) for 9-10 CTAs per SM (no faster), two
register buffers, L2 prefetch instructions (session 21: each program's next 2-5 units past its ring, 8-32 MB a
launch, issued before the PDL wait so that a small kernel before it would hide them: alone qkvz M = 5 15.5 against
13.7 µs, and bench/layer_step's GDN layer at B1 T5 85.4-87.6 against 83.6, slower the more it prefetched);
activations as k pairs from global memory (16 4-byte loads per thread and group instead of 4 ldmatrix per warp: 137
registers, and slower at 9-16); 64-column tiles with 3-5 stages at 6-16 CTAs of 1-2 warps, for more bytes in flight
per SM (qkvz 14.0-17.2 against 13.2 µs at M = 1, 15.8-19.4 against 15.3 at M = 5). ncu at M = 1 and 5 (qkvz): the
wait for a stage's copies holds 28-35% of the stall samples, yet across the shapes the time grows by 1.02x the copy
roofline per byte: the stream keeps up, and what is left is ~2.7 µs fixed (start, flush, tail).
The flush is most of it: with each tile stored unreduced instead (wrong sums, for timing), qkvz takes 11.6 against
13.2 µs at M = 1 and 12.5 (8 CTAs per SM) against 15.7 at M = 5, gate_up 23.1 against 25.0 and 24.2 against 27.7,
out_proj 6.0 against 7.2 and 6.7 against 8.3. Two ways around it, both exact (bitwise this kernel's sums) and both
slower on the H200: a TMA ring (stages filled by the tensor memory accelerator, one mbarrier each; fewer, deeper
CTAs, so fewer flushed partial tiles): qkvz 17.3-26.8 µs at M = 1, out_proj 9.1-12.4 (Triton puts a CTA barrier
before every TMA copy, and fewer warps per SM leave the unpacking latency-bound: 8 warps per SM 56% of the copy
bandwidth whether cp.async or TMA, 16 warps 75%); and the K split between the warps of a CTA (each tile summed in
shared memory, no global atomics): qkvz 15.3-34.7 µs at M = 1 (the compiler's CTA barriers put a CTA's warps in
lockstep on every group); nor does a tile owned whole by one CTA whose 1-4 warps split its K and stream their
words straight into registers (16 columns each, two groups ahead, activations from L1; no shared memory, no
barrier until the end): qkvz 19.1 against 13.6 µs at M = 1, 25.5 against 15.7 at M = 5. 64-column tiles at 6-12
CTAs per SM (fewer flushed columns) were no faster either. Nor (session 12, same harness) a tile per thread-block
cluster, its groups cut into one range per CTA and summed through distributed shared memory (exact; no
workspace or atomics; clustered launch of the kernel compiled for one CTA, mapa / ld.shared::cluster): qkvz
16.8-18.5 against 13.5 µs at M = 1, 18.9-32.5 against 15.5 at M = 5 — a clustered launch of 4 or 8 CTAs costs
~6 µs even to this stream-K kernel unchanged (pairs cost nothing, but leave a tile shared by clusters); nor
waiting for an inner tile's atomics only after the loop (so the stream goes on while they travel): 0-2% slower;
nor (session 13) Σx from one m16 ones-mma per warp, repeated over the tile's rows (40 instead of 64 mma a group,
bitwise the same sums): every shape within ±0.1 µs at M = 1-8, still 150 registers at M = 2-8 (M = 1, 123: its
odd token columns are never stored, so the compiler drops their sums), and 7-8 CTAs per SM at M = 2-8 still
slower (qkvz M = 5 16.1 / 20.2 against 15.8 µs). Why M = 1 is faster than 2-5 (session 20): a row count of 1 is
specialised, so the n8 tile's odd token columns are dead and half of each group's fixed-point conversions (F2I.S64)
and int64 adds go (8 a thread instead of 16; SASS). So up to 4 rows the tokens can be spread over the even token
columns (SPREAD: token t in column 2t of the n8 tile, its activations in stage row 2t; the odd columns masked, so
the compiler drops their sums as at M = 1: 120-125 registers, 8 CTAs per SM; each column's mma is its token's own,
so the bits are those of any other width). H200, into sums, M = 2 / 3 / 4 against 6 CTAs unspread, same run, us:
qkvz 11.6 / 11.8 / 12.0 against 13.1 / 13.2 / 13.2, attn 11.1 / 11.2 / 11.2 against 11.5 / 11.5 / 11.6, gate_up
23.6 / 23.8 / 24.0 against 24.3 / 24.5 / 24.5, down 12.7 / 13.0 / 13.6 against 13.0 / 13.1 / 13.1, out_proj 6.4 /
6.9 / 6.7 against 6.5 / 6.6 / 6.6 (those two, whose 40 column tiles are each shared by ~26 programs at 8 CTAs per SM,
post more atomics; stored bf16 they too gain or tie); spread at 6 CTAs per SM is slower than unspread (qkvz 14.7).
Inside a whole step (bench/step.py, session 29, against the previous run) the 3-4-row gains did not show (B1 with
3 drafts, 4 rows: 6,100 against 6,093 us; with 2 drafts 5,826 against 5,846) while down lost its 80% at 4 rows
alone (13.6 us: 0.79), so only 1-2 rows spread (B2 decoding 5,457 against 5,512 us, B1 with one draft 5,472
against 5,518). In bench/layer_step's chain (B1, 16k, 8 layer copies, us a layer, same run): 2 rows spread at 8 per
SM GDN 75.4 / attention 85.7 against 76.3 / 86.0 unspread at 6; 1 row at 8 / 7 / 6 per SM GDN 73.3 / 79.7 / 79.3,
attention 84.4 / 86.7 / 90.2 — fewer CTAs (room beside them for the next launch's) lose inside the chain too,
though this does not isolate the room: those launches are slower alone as well (7 per SM ~30% slower than 6 or 8
at 3-5 rows, qkvz M = 5 17.4-17.5 against 13.5 / 13.5-13.6 us, session 30; 6 per SM at one row 15.4 against 11.8).
H200, into sums, M = 5, us against this kernel: the sums kept
in fp32 within a tile segment and converted once (order-dependent bits: timing only) qkvz 13.10 / 13.40, attn 11.29
/ 11.78, out_proj 6.76 / 6.86, down 13.23 / 13.70 (qkvz at 8 CTAs per SM 12.33 / 13.07); the posted atomics left
out (wrong sums) 13.22 / 13.55, 11.15 / 11.75, 6.36 / 6.88; an exact middle way, fp32 sums of aligned pairs of
groups converted once (ranges cut on pairs, two groups an iteration), slower: 14.1, 11.4, 8.1, 14.2.
Session 27 made the fp32 segments width-invariant — one cut of the work for every row count (1,056 ranges on the
H200: at 1-8 rows a range a program, 8 CTAs per SM, 118-122 registers; at 9-16 two consecutive ranges a program, 4
warps, 4 per SM) — correct (3e-6 from the reference) and bitwise the same at every width, but no faster overall (H200,
into sums, us against this kernel in the same run): M = 5 qkvz 12.36 / 13.37, attn 11.45 / 11.82, gate_up 24.43 /
24.88, down 13.82 / 13.62, out_proj 7.39 / 6.92; M = 16 (another run) qkvz 19.8 / 18.4, down 20.9 / 19.2, out_proj
11.2 / 9.0; with 792 ranges instead (6 a SM), M = 1 at 6 CTAs per SM: qkvz 15.4 against 11.8.
On an RTX 3090 (not measured: no such GPU here): GeForce GA102 runs bf16 mma with fp32 accumulation at half its
fp16-accumulate rate, 256 FMA per clock and SM (71 TFLOPS). The SASS (compiled offline, qkvz, per group and warp)
has 40 / 48 / 72 HMMA.16816 at 1-8 / 9-16 / 17-24 rows for sm_90, where the compiler issues the Σx mma once per
k step for all of a warp's row blocks, but 64 / 64 / 96 for sm_86, where it does not: 32 / 64 / 96 FMA per weight
byte, at 936 GB/s 84% / 168% / 252% of a 3090's tensor rate — the GEMV would be tensor-bound there at every width
(sm_90's counts would be 53% / 126% / 189%). So below sm_90 the Σx mma is issued once per warp explicitly
(`sum_once`: bitwise the same sums, sm_86's SASS then 40 / 48 / 72 HMMA and 134 instead of 146 registers at 5 rows;
sm_90's is byte for byte what it was). Beyond that a 3090 would want at 9-24 rows the codes − 8 in the mma instead
(exact in bf16, no Σx at all: 42% / 84% / 126%), or the W4A8 form on its int8 tensor cores (4x the rate). Built
offline, not run (the sums' bits change, so it would go in at every width or none): 32 / 32 / 48 HMMA on sm_86 and
sm_90, 5-13% more instructions (a bf16 subtract per pair of weights), sm_90 registers 134 instead of 146 at 2-8 rows
and 194 instead of 206 at 17-24 into sums. (Not a lead for the H200: its 16-row launch issues its mma at ~210
TFLOPS — qkvz into sums, 19 µs — far below the tensor cores' rate.)
Written in Gluon (Triton's explicit-layout dialect): layouts are spelled out so every conversion is checked to be
free (`assert_trivial`). Gluon does not run in the interpreter: the CPU tests cover int4_linear, which computes
the same function; this kernel is checked against the same reference in the GPU tests and compiled for sm_86 and
sm_90 by tests/aot_compile.py. Symmetric weights only (asymmetric ones take int4_linear).
Reference: layers.quant.dequantize_int4."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from kernels import device as gpu
from kernels.fixed_sum import FRAC, deferred
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait
from kernels.splitk import workspace
from layers.quant import Int4Weight

MAX_ROWS = 24
# Sums in fixed point (kernels/fixed_sum.FRAC): each group's fp32 partial times 2^FRAC, added in int64 — exact for
# partials of magnitude ≥ 2^-9 (smaller ones lose what lies below 2^-32), and the same whatever order they are added
# in; a tile shared by programs must stay below 2^24 in magnitude (the arrival count sits above it, in the top bits
# of the word). So every row given, padding included, must be finite and in range: a NaN, an inf or a larger sum in
# flush_marked's workspace breaks the count, and the element is neither stored nor cleared — wrong for every later
# launch that shares the workspace (padding rows of a batch bucket: zeros).
ONE = gl.constexpr(2.0 ** FRAC)
UNIT = gl.constexpr(2.0 ** -FRAC)
COUNT = gl.constexpr(57)
ARRIVAL = gl.constexpr(1 << COUNT.value)
MAX_SHARING = 31            # programs per tile: the workspace's arrival count (2^57 each) stays below 2^62


def exact_log2(v: int) -> int:
    assert v & (v - 1) == 0, v
    return v.bit_length() - 1


def token_tile(m: int) -> tuple:
    """The mma's token widths (its n side) for m rows: (BT, BT2), a second tile of BT2 tokens after the first."""
    return (8, 0) if m <= 8 else (16, 0) if m <= 16 else (16, 8)


def x_rows(m: int) -> int:
    """Activation rows in a ring stage for m rows: the token tiles rounded up to a power of 2."""
    bt, bt2 = token_tile(m)
    return 2 * bt if bt2 else bt


def layouts(bn: int, warps: int):
    """The words [BN, 4 (t), 4 (w)] layout that hands each thread what its A fragments need, read back from a ring
    stage: lane 4l + t reads words 4t … 4t+3 of its rows, 16 bytes. Row r of a CTA tile: bits 0-2 lane/4, bit 3
    register, bit 4.. warp, then registers."""
    warp_rows = [[16 << i, 0, 0] for i in range(exact_log2(warps))]
    rep_rows = [[16 * warps << i, 0, 0] for i in range(exact_log2(bn // (16 * warps)))]
    return gl.DistributedLinearLayout(                              # word 4t + w of the block, column `row`
        reg_bases=[[8, 0, 0], [0, 0, 1], [0, 0, 2]] + rep_rows,
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=warp_rows, block_bases=[], shape=[bn, 4, 4])


def ring_layouts(warps: int):
    """(words copy [BN, 4, 4]: each thread copies a column's words 4t … 4t+3, 16 bytes; their ring [STAGES, BN, 4, 4]
    as in global memory, unswizzled: a warp's fragment reads — words 4t … 4t+3 of 8 consecutive columns — are 512
    consecutive bytes; activations copy [BT, 128], 16 bytes per thread; their ring [STAGES, BT, 128], 16-byte units
    XOR-swizzled by token, so that ldmatrix's reads — 16 bytes at one k from each of 8 tokens — hit 32 banks)."""
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
    """Words of one group [BN, 4 (t), 4 (w)] → chunk b (word w = b: k = 32b … 32b + 31) as the A operand [BN, 32]
    in DT (offset codes)."""
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
    """Unit u's words [BN, 4, 4] (BN·64 contiguous bytes) and scales (BN/2 int32 pairs; WORDS) and/or activations
    [BT, 128] (ACTS) into a ring stage (cp.async, 16 or 4 bytes per thread and copy)."""
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
    """acc + (part − BASE·Σx)·scale in int64 fixed point; scale = s·2^FRAC (exact: the same bits as scaling by s,
    then by 2^FRAC)."""
    return acc + ((part - BASE * xsum) * scale).to(gl.int64)


@gluon.jit
def _twice(x):
    """[rows, T] → [2·rows, T], the copy below: a register bit of its own, the top bit of the row (no data moves)."""
    return gl.reshape(gl.permute(gl.join(x, x), [2, 0, 1]), [2 * x.shape[0], x.shape[1]])


@gluon.jit
def _every_row(xs, BN: gl.constexpr, mma: gl.constexpr):
    """Σx [rows, T] (16·W: a warp's m16 block, or BN) as the [BN, T] accumulator: past 16·W rows the mma layout
    repeats in registers, so each thread's values stand for all its row blocks."""
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
    """acc [BN, BT] and acc2 [BN, BT2] (tokens BT …, where BT2 > 0) in int64 fixed point += one group, scaled per
    row in fp32: Σ (code − 8)·x = Σ (BASE + code − 8)·x − BASE·Σx, the codes entering the mma as BASE + q (a subtract
    per pair of weights saved) and Σx from a ones operand: [BN, 32], whose mma the compiler for sm_90 issues once
    for all of a warp's row blocks (not for sm_86), or with SUM_ONCE one m16 block per warp (the same mma, the same
    sums). Each token's sums are the same whichever tile holds it."""
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
    """Token column c of a tile of tokens T0 … (or activation row c of a ring stage) → (its token, whether that is
    one of the M): token T0 + c, or with SPREAD token T0 + c / 2 in the even columns only (see the row buckets)."""
    tok = T0 + (c // 2 if SPREAD else c)
    return tok, (tok < M) & (c % 2 == 0) if SPREAD else tok < M


@gluon.jit
def _tile_ptrs(tile, out_ptr, M, N, stride_om, BN: gl.constexpr, BT: gl.constexpr, mma: gl.constexpr,
               T0: gl.constexpr = 0, SPREAD: gl.constexpr = False):
    """A column tile's [BN, BT] elements of tokens T0 … (mma layout; SPREAD: _token_of): (in-bounds mask, output
    pointers, columns, tokens)."""
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
    """The tile's sum over `groups` of its n_groups groups: stored when that is all of them, else added into the
    workspace, and stored by the program whose groups complete the tile's count (as kernels/splitk.store_tile).
    acc is fp64 or int64 fixed point (or fp32, added in fp64): a sum of fp32 partials whose magnitudes lie within
    2^24 of each other is exact in fp64, so the order the programs arrive in does not change the bits (fp32
    atomics made every call's output a little random)."""
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
def _range_start(p, P, units):
    """The first work unit of program p's range: `units` cut into P equal contiguous ranges (p = P: the end)."""
    return p * units // P


@gluon.jit
def _prog_of(u, P, units):
    """The program whose range holds work unit u (ranges as _range_start cuts them)."""
    return ((u + 1) * P - 1) // units


@gluon.jit
def _programs_of(tile, n_groups, P, units):
    """How many programs' ranges hold groups of this tile."""
    return _prog_of((tile + 1) * n_groups - 1, P, units) - _prog_of(tile * n_groups, P, units) + 1


@gluon.jit
def flush_marked(acc, tile, n_groups, P, units, out_ptr, ws_ptr, M, N, stride_om, BN: gl.constexpr,
                 BT: gl.constexpr, mma: gl.constexpr, T0: gl.constexpr = 0, SPREAD: gl.constexpr = False):
    """As flush_tile for an int64 fixed-point acc, without its counter: a tile no other program shares is stored;
    else acc is added into the workspace with an arrival mark (2^COUNT) per program, and the add that brings an
    element's count to the tile's number of programs returns its total: that thread stores it and zeroes the
    element for the next launch. No fence, barrier or counter round trips (flush_tile's cost 2-3 µs per launch
    at 1-8 rows on the H200); but every add returns a value: at 16 rows flush_tile is faster."""
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
    """The int64 fixed-point output (zero on entry; its consumer converts and zeroes it: kernels/fixed_sum.py): a
    tile no other program shares is stored, else acc is added by posted atomics — nothing returns, so no program
    waits at the end for a round trip to L2 (flush_marked's cost)."""
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
    # x [M, K] bf16/fp16 (unit column stride), qw int32 [K/128, N, 16], s [K/128, N], out [M, N] (any float dtype,
    # or int64 fixed-point sums, zero on entry: post_tile); ws fp32 [2·M·N] (used as int64 [M, N]) and cnt int32
    # [tiles] zeroed (kernels/splitk.py). Grid (P,): the tiles · K/128 work units (tile, group), tile-major, are
    # cut into P equal contiguous ranges, one per program ("stream-K"): every SM streams the same number of groups;
    # a tile split between programs is summed through the workspace (flush_marked, or flush_tile and its counters),
    # or posted into int64 sums (post_tile).
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    DT: gl.constexpr = x_ptr.dtype.element_ty
    BASE: gl.constexpr = 1032.0 if DT == gl.float16 else 136.0      # 1024 + 8 or 128 + 8
    n_groups = K // 128
    units = gl.cdiv(N, BN) * n_groups
    pid = gl.program_id(0)
    u_lo = _range_start(pid, gl.num_programs(0), units)
    u_hi = _range_start(pid + 1, gl.num_programs(0), units)

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
    # the scales as SP = BN/2 int32 pairs (with fewer pairs than threads, several threads copy the same pair)
    s_copy: gl.constexpr = gl.BlockedLayout([max(1, SP // (32 * W))], [32], [W], [0])
    sp = gl.arange(0, SP, layout=s_copy)
    s_ptrs = s_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + sp

    # The words, scales and activations stream through a ring of STAGES groups in shared memory (cp.async: no
    # registers hold bytes in flight, so STAGES - 1 groups per CTA are). The prefetch past the range's end reloads
    # its last unit (no predicates).
    ring = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 4, 4], ring_layout)
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])   # of one stage
    s_ring = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES, 2 * SP], flat)
    s_ring32 = s_ring._reinterpret(gl.int32, [STAGES, SP], flat)
    x_ring = gl.allocate_shared_memory(DT, [STAGES, XT, 128], x_ring_layout)
    if PDL:
        # Programmatic dependent launch (sm_90): let the next kernel's CTAs start as ours retire; the weights
        # (constants) stream while the previous kernel finishes, which may write x: wait before reading it.
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
            else:       # (a second token tile takes flush_marked: this counter counts one flush a program)
                flush_tile(acc, tile, u + 1 - gl.maximum(u_lo, tile * n_groups), n_groups, out_ptr, ws_ptr, cnt_ptr,
                           M, N, stride_om, BN, BT, mma, SPREAD)
            acc = gl.zeros([BN, BT], gl.int64, mma)
            if BT2 > 0:
                acc2 = gl.zeros([BN, A2], gl.int64, mma)
    async_copy.wait_group(0)


# Per row bucket (upper bound inclusive): columns per CTA, warps per CTA, ring stages, and CTAs per SM in the grid:
# as many as stay resident at once; the launch caps the registers to fit them (maxnreg = 64K registers per SM /
# threads), and a CTA waiting for a second wave doubles the time (at 137 registers 7 of 8 fit: M = 2-8 ran 20-40%
# slower); shared memory caps the count further on smaller parts. H200 sweep at the 27B shapes with the mma layout
# (bench/kernels_int4.py --sweep): M = 1 8 CTAs per SM (6: 10-20% slower); M = 2-8 6 (170 registers: none spill)
# by 1-15% over 8 (128: a few spill, and more programs flush more partial tiles; out_proj 8.95 against 10.47 us at
# M = 5), and 7 ran a second wave although 140 registers did not spill: a quarter of the SM (16K registers) holds 4
# of its 14 warps, so 7 CTAs of 2 warps need ≤ 128 (30-40% slower); M = 9-16 128 columns on 4 warps, 4 per SM
# (half the accumulator per thread) 1.4-1.6x faster than on 2 warps, 6 per SM. 2 stages beat 3 throughout. (The
# sums are in fixed point, so the buckets' different K ranges give every token the same bits.) Into int64 sums
# (post_tile), same sweep: M = 2-8 6 per SM still (8: 0-15% slower, 4 warps 4 per SM 1-9%), M = 9-16 3 per SM
# 3-9% faster than 4 (qkvz 18.2 against 18.8 µs, out_proj 8.5 against 9.1 at M = 12). Session 15, into sums:
# 64-column tiles (fewer posted adds per element) 5-15% slower at M = 1-5 (2-3 stages, 6-12 CTAs of 1-2 warps);
# 4 warps at 4-5 CTAs per SM or 256 columns on 8 warps: qkvz M = 5 14.1-18.0 against 13.7 µs. ncu, qkvz into
# sums: M = 1 114 registers, 14.5 warps per SM, 5.44M instructions; M = 5 146 registers, 10.8 warps, 5.71M
# instructions — the same stream on 3/4 of the warps. Yet 8 CTAs at M = 2-8 (128 registers, no spills) are
# slower but for qkvz at 2-5 rows (µs, 6 -> 8 per SM: qkvz M = 5 13.5 -> 13.2, attn 11.9 -> 12.5, gate_up 25.2 ->
# 25.2, down 13.6 -> 14.6, out_proj 6.9 -> 7.5). Deeper rings — more of the weights in flight before the PDL wait,
# while a small kernel before the GEMV runs — do not pay inside a step either (session 21, bench/layer_step, B1 T5,
# GDN / attention layer, us: 2 stages x 6 CTAs 83.3-83.7 / 96.1-96.3, 3 x 6 87.4-87.6 / 100.7-100.8, 4 x 5
# 96.8-96.9 / 108.4-108.8, 6 x 3 102.2-102.6 / 114.6-115.0). Nor do programs fewer than the register slots, so
# that the next launch's CTAs fit beside ours and copy their first stages early (session 25, H200, into sums, us,
# slots / programs per SM / stages against the table's 8/8/2 at M = 1 and 6/6/2 at M = 5): M = 1 qkvz 8/4/2 13.17,
# 8/7/2 12.82, 6/4/2 13.20 against 11.55, out_proj 6.12 / 6.42 / 6.37 against 5.95; M = 5 qkvz 8/4/2 13.97, 8/6/2
# 16.07, 6/4/2 17.28, 6/3/3 15.98 against 13.56, out_proj 6.84 (within noise) / 8.02 / 8.21 / 7.60 against 6.97
# (attn and down alike). M = 17-24 (session 27; 4 sequences verifying 4 drafts each, which the wgmma kernel took
# before, its output not the GEMV's bits): an n16 and an n8 token tile on 4 warps, 2 CTAs per SM (206-218 registers,
# no spills), into sums, H200, us at M = 20 against int4_wgmma in the same run: qkvz 25.2 / 29.0, out_proj 11.4 /
# 15.4, attn 21.9 / 28.8, gate_up 48.0 / 48.5, down 25.6 / 34.0 (17 and 24 rows alike; stored bf16 through
# flush_marked 30.0 / 15.4 / 26.8 / 53.4 / 30.1); 3 CTAs per SM (170 registers, spills) 46-50% slower, 8 warps at
# 1-2 per SM, 64 columns at 4 per SM or 256 at 1 12-41% slower; one 32-token tile (a dead n8 tile at 20 rows) qkvz
# 29.6, gate_up 58.2 at M = 20. In bench/layer_step at B 4 T 5 (same run, us, against the wgmma GEMM at 20 rows):
# GDN layer 142.9 / 155.3, attention layer at 16k 171.3 / 185.9.
# M = 9-16 (session 29): 2 warps at 4 per SM (64 columns a warp: the Σx mma and the activations' ldmatrix shared by
# twice the row blocks; 256 registers, no spills), where 6 had spilled, against 4 warps at 3 per SM (into sums) or
# 4 (stored), H200, us at M = 9 / 12 / 16, into sums: qkvz+ba 16.9 / 17.0 / 17.5 against 18.4 / 18.6 / 19.0, attn
# 15.0 / 15.3 / 16.0 against 16.2 / 16.5 / 16.9, gate_up 30.7 / 31.1 / 32.0 against 35.3 / 35.6 / 35.9, down 17.4 /
# 17.8 / 18.4 against 18.7 / 19.0 / 19.3; stored 5-10% faster alike; 5 per SM (204 registers) spills, 22-60%
# slower. out_proj, 1,920 units — under 4 a program at 4 per SM — keeps 4 warps (`short`): 2 warps 8.4 / 8.9 / 9.5
# against 8.1 / 8.6 / 9.1 into sums, and stored 4 warps at 3 per SM beat 4 per SM there (10.6 / 11.5 / 12.3 against
# 11.3 / 12.1 / 13.2).
# M = 1-2 spread over the even token columns at 8 per SM (SPREAD, above; 3-4 rows are not: see there).
SHORT_UNITS = 6             # work units a program below which a bucket takes its `short` launch
ROW_BUCKETS = ((2, dict(block_n=128, warps=2, stages=2, ctas_per_sm=8, marks=True, spread=True)),
               (8, dict(block_n=128, warps=2, stages=2, ctas_per_sm=6, marks=True)),
               (16, dict(block_n=128, warps=2, stages=2, ctas_per_sm=4, marks=False,
                         short=dict(warps=4, ctas_per_sm=3))),
               (24, dict(block_n=128, warps=4, stages=2, ctas_per_sm=2, marks=True)))


def supports(x: torch.Tensor, w: Int4Weight) -> bool:
    """Whether this kernel takes the call: CUDA sm_80+, ≤ MAX_ROWS rows, symmetric weights, group 128."""
    return (x.is_cuda and gpu.capability(x.device) >= (8, 0) and x.numel() // x.shape[-1] <= MAX_ROWS
            and w.zs is None and w.group == 128 and x.dtype in (torch.bfloat16, torch.float16)
            and x.stride(-1) == 1)


def pick(m: int, n: int, k: int, device, **override) -> dict:
    """Launch parameters for m rows: the bucket's tile (its `short` launch where the work units would give each
    program fewer than SHORT_UNITS), the CTAs per SM that fit, and one program per resident CTA (at most one per
    work unit). The same whether the output is stored or left as int64 sums."""
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
    return p


def int4_gemv(x: torch.Tensor, w: Int4Weight, out: torch.Tensor, block_n: int = None, warps: int = None,
              programs: int = None, stages: int = None, ctas_per_sm: int = None, marks: bool = None,
              spread: bool = None, sum_once: bool = None) -> torch.Tensor:
    """x [..., K] (≤ MAX_ROWS rows, bf16/fp16) → out [..., N] (any float dtype; or, from bf16 x, int64 zeros that
    receive the fixed-point sums for a consumer to convert: kernels/fixed_sum.py); launch parameters default to
    pick() (marks: flush_marked, else flush_tile; neither for int64 sums; spread: token t in token column 2t, 4 rows at
    most). sum_once: Σx as one m16 mma block per warp (_group_product), by default below sm_90, whose compiler does
    not share the ones mma itself (SASS, sm_86: 64 / 64 / 96 HMMA a group and warp at 1-8 / 9-16 / 17-24 rows, with
    it 40 / 48 / 72 as sm_90's); bitwise the same sums either way."""
    k, n = w.k, w.n
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    out2 = out.view(-1, n)
    assert m <= MAX_ROWS and x2.stride(-1) == 1 and out2.stride(-1) == 1 and n % 8 == 0 and k % 128 == 0
    assert not deferred(out) or x.dtype == torch.bfloat16, "int64 sums stand for bf16 activations"
    given = {key: v for key, v in dict(block_n=block_n, warps=warps, programs=programs, stages=stages,
                                       ctas_per_sm=ctas_per_sm, marks=marks, spread=spread).items() if v is not None}
    p = pick(m, n, k, x.device, **given)
    pdl = gpu.pdl(x.device)
    bt, bt2 = token_tile(m)
    assert not bt2 or p["marks"] or deferred(out), "a second token tile needs flush_marked or int64 sums"
    assert -(-p["programs"] // triton.cdiv(n, p["block_n"])) < MAX_SHARING, "too many programs per column tile"
    ws, cnt = workspace(x.device, 2 * m * n, triton.cdiv(n, p["block_n"]))      # int64 [M, N]
    w_layout = layouts(p["block_n"], p["warps"])
    c_layout, ring_layout, x_copy, x_ring_layout = ring_layouts(p["warps"])
    _int4_gemv_kernel[(p["programs"],)](
        x2, w.qweight, w.scales, out2, ws, cnt, m, n, k, x2.stride(0), out2.stride(0),
        w_layout, c_layout, ring_layout, x_copy, x_ring_layout, p["block_n"], bt, bt2, p["warps"], p["stages"],
        p["block_n"] // 2, p["marks"], n % p["block_n"] == 0, pdl,
        gpu.capability(x.device) < (9, 0) if sum_once is None else sum_once, p["spread"],
        num_warps=p["warps"], launch_pdl=pdl, maxnreg=65536 // (p["ctas_per_sm"] * p["warps"] * 32))
    return out
