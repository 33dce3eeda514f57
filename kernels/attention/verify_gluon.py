"""Split-KV verify/decode attention over an fp8 KV cache on Hopper (sm_90, Gluon): the contract, partials and
combine of kernels/attention_verify.py, which takes this kernel wherever `supports` says it runs.

Why a second kernel: the Triton kernel puts the packed query rows (5 tokens x 6 heads = 30) on the mma's M side
and its 4 warps along the keys, so every tile's row max, row sum and P cross the warps through shared memory (8 CTA
barriers and ~1,130 instructions a warp and 64-key tile). Here the roles are swapped, the query rows on the N side
(8-64 wide, no padding to 64): S^T = K·Q^T on wgmma (keys on M, a warp per 16 keys; Q^T in shared memory) and
O^T = V^T·P^T on mma.sync (head dim on M, a warp per 64 rows; P^T handed over through shared memory):
* K and V^T are A operands in registers: each warp decodes only its own part of the fp8 tile, one native
  conversion per two codes, read from shared memory 16 bytes at a time. For those reads to be whole fragments the
  contraction orders are permuted: the QK product's is `_qk_order` of a key's bytes (Q^T is stored
  permuted to match, once a program) and key k of the P·V product is key `_pv_key(k)` of the tile (row m of the
  K tile holds key `_pv_key(m)`, so S^T's row m, P^T's row m and V^T's column m are one key): nothing moves.
* One column-max exchange between the warps a tile; the column sums stay per thread until the end.
* P^T is mma.sync's operand (read with ldmatrix, after one CTA barrier). The P·V product on wgmma (P^T in the
  NVMMA layout, a proxy fence a tile) measured the same: 0.86 of the Triton kernel's time at B64 16k either way.
  (The fence, MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, does not wait for the ring's copies in flight: a probe, H200,
  64 ns after 16 KB of cp.async were issued, which landed ~600 ns after.)
~640 instructions a warp and tile (SASS), 252 registers, 2 CTAs per SM. H200, us against the Triton kernel in the
same run (bench/results/kernels-h200.md: 5 tokens, choose_nseg's segments, caches rotated out of L2, `fresh`): B1
1.5k / 16k / 64k 10.4 / 19.7 / 46.2 against 10.7 / 21.4 / 51.0, B8 17.5 / 84.5 / 306 against 18.2 / 89.7 / 347, B64
63.1 / 612 / 2774 against 72.8 / 758 / 3019 (session 22, the caches left in L2 between calls, before `fresh`: B1
10.4 / 18.0 / 47.4, B8 15.7 / 85.6 / 317, B64 66.2 / 621 / 2895). Still latency-bound (ncu, B64 16k: issue slots 36%
busy, 0.49 eligible of 1.95 warps a scheduler, the tensor pipe 36%), and with one tile a program in flight: an L2
prefetch of the tile after it takes B64 16k from 664 to 618 us where the tiles are consecutive (one segment) and
costs 4-12% elsewhere (so it is issued only there). q is requested with the sequence's slot and length (16-byte
loads, permuted in registers), not after them with the head dim's permutation in its addresses (2-byte loads): B1
1.5k / 16k 10.5 / 18.0 against 12.2-12.8 / 19.2, B64 16k 637-640 against 626-629 (same run).
Given `fresh` (EARLY: the step's own keys are the rows' last q_len, everything else comes from earlier steps) the
slot, length and scales are read and the ring's first tile copied, where it holds only older keys, before the PDL
wait; q and the tiles holding fresh keys after it. With the combine, caches rotated out of L2, two runs (us, this
against the wait first): B1 1.5k / 16k / 64k 10.3-10.4 / 18.6-19.2 / 45.2-45.6 against 10.9-11.7 / 19.6-20.1 /
46.2-46.8, B8 1.5k / 16k 16.8-17.2 / 81.0-82.1 against 17.3 / 82.2-82.7, B64 1.5k / 16k 63.1-64.2 / 615-620 against
65.8-66.6 / 623 (bitwise the same outputs).
Where a short context's time goes (CUPTI timeline of graph replays, B1, 64 segments, 512 / 1.5k / 16k keys): a pair
repeats every 9.5 / 9.9 / 19.2 us; once the previous combine has ended the attention still needs 6.5 / 6.7 / 14.3 us
(the wait's release, q, the tile holding the fresh keys, a tile's products, the partials' stores), and its combine
ends 3.0 / 3.2 / 4.8 us after it (2.0 at 512 keys with 16 segments): two dependent launches of a few memory round
trips each.
One launch was built and measured (session 24, not kept): the nseg programs of a (sequence, kv head) meet at a
barrier after storing their partials (a counter per pair: a release add, a spin on an acquire load, a departure
add, the last to leave zeroing it; safe only with every program resident at once, so a cooperative launch, which
fails rather than hangs) and then combine a (packed row, 32 head-dim columns) unit each. Correct (the GPU tests,
bitwise width-invariant, graph replays with changing lengths), and slower: H200, B1, us against these two launches
(same run, fresh = 5): ctx 64 6.6-6.7 / 7.1-8.3, 1.5k 11.7 / 10.2, 4k 17.4 / 13.1, 16k 23.5 / 19.4, 64k 49.8 /
46.6, B8 1.5k 21.6 / 17.7, B16 16k 164 / 162; in bench/layer_step's attention layer at B1 (in the chain) 12.2 /
10.8 at 1.5k, 24.3 / 19.8 at 16k. By part (4k / 16k): attention and barrier without the combine 11.8 / 17.5
(against 13.3 / 19.5 with the combine launch: the barrier costs little), the combine without the barrier 15.6 /
23.3: the in-grid combine itself took 4-6 us (the loop's SASS is the same, 612-626 instructions a tile; its partial
loads were 96 4-byte L2 loads a thread, LDG.E.STRONG.GPU: rows of D + 2 floats, as then, are not 16-byte aligned); the
cooperative attribute costs ~0.7 us (16.9 against 17.7 at 4k, the barrier then unguarded); how the spin polls
(atomic, ld.acquire, with 100-400 ns sleeps) changed nothing. At best (a combine of ~1 us) it would save ~1 us at
B1, less the cooperative launch's ~0.7.
Tried and not kept (same harness): before the wait, L2 prefetches of the program's next 2-8 older tiles as well (B1
16k 18.5-19.3 against 17.4 us, 64k 46.1-52.3 against 45.4); the programs with no tile leaving without the wait (B1
512 / 1.5k / 16k 9.9 / 10.4 / 19.5 against 9.7 / 10.2 / 19.4); segments that take spans of 2-6 consecutive tiles in
turn (fewer partials at short contexts: B1 1.5k 12.1-17.6 against 10.3, 16k 19.3-22.4 against 19.6); QK on e4m3
wgmma straight from the ring (q as e4m3 hi + lo, no K conversion: 16 fewer instructions a tile): no faster, and its
first outputs were wrong; the V conversions overlapped with the QK wgmma: no change; rings of 3-4 stages (1 CTA per
SM): 720 us at B64 16k; 3 stages at 2 CTAs per SM (P^T in the K stage just read: 115,200 bytes a CTA), two tiles in
flight a program: 4-7% slower at every shape (B64 16k 662 against 626-655, B8 16k 89.5 against 85.5); (session 32)
a lazy rescale — a row keeps its running max until a tile's exceeds it by 2^8, and the 80 multiplies of acc and the
column sums are skipped when no row's max moved (97 instructions branched over; the loop 570 a tile then, against
612): correct, bitwise width-invariant, and no faster (two runs, us, against this: B1 1.5k / 16k / 64k 10.37-10.39 /
19.49-19.58 / 45.79-46.18 against 9.97-10.05 / 19.29-19.31 / 45.51-45.95, B8 16k 81.7-82.1 against 81.6-82.1, B64
1.5k 63.3-63.4 against 62.9-63.0): the loop's count of instructions is not what bounds it. Nor is V's layout
at 16k (session 32, a Triton probe that only reads the bytes, a 64-key tile a program, B1, 4 kv heads, us): K and
V 10.35 with V keys-fastest as stored (a tile's 256 rows of 64 bytes, max_len apart) against 10.18 with each V
tile's 16 KB contiguous; at 64k 35.4 against 32.3 (V alone 20.1 against 17.3) — a tiled V layout is worth ~9% of
the bytes' time there only. What does bound B1 16k (same probes): its programs' shape. Reading the same bytes as
this kernel walks them — 256 programs, each 4 tiles in turn, one in flight — takes 17.2-17.3 us with no
arithmetic at all (this kernel's attend ~17.5 before its combine); one tile a program (1,024 programs, ~8
resident a SM: 4x the bytes in flight) 10.1-11.2; a register prefetch one tile ahead (8 warps) 15.7; each
program's later tiles requested into L2 up front, by prefetch.global.L2 per 128-byte line (V tiled or not) or by
cp.async.bulk.prefetch.L2, slower: 19.0 / 23.8. So B1 needs more bytes in flight per SM than 2 CTAs of this size
(246 registers, two 32 KB stages each) can hold — more resident programs, not fewer instructions or prefetches.
Not deeper rings on one program a SM (session 33, partials of D + 2 then; B1, 33 segments — 132 programs, 8 tiles
each — against 2 stages at 64, us, same run): 3 / 4 / 5 / 6 stages 1.5k 8.5 / 8.6 / 8.5 / 8.7 against 10.2, 16k
19.2 / 20.4 / 21.3 / 22.4 against 19.4, 64k 51.4 / 52.6 / 53.5 / 54.7 against 47.0 (2 stages at 33 segments: 10.1
/ 23.1 / 66.4; B8 16k, 4 segments, 4 / 6 stages 99.0 / 101.1 against 85.2 at 8): one program's chain of tiles,
~1.3 us a tile, then bounds it. And what the partials' stores cost (same session, acc left unstored, timing
only): B1 1.5k / 16k / 64k 7.1 / 17.3 / 44.6 against 10.1 / 19.3 / 46.9, B8 16k 79.3 against 84.7 — hence
kernels/attention_verify.PART_EXTRA.
KV: uint8 e4m3 codes, V stored keys-fastest (kernels/kv_write.kv_cache), cache length a multiple of 16; head dim
128 or 256; up to 64 packed rows (at 64, q_len 8 with G 6, registers spill: correct, slower). Reference:
kernels/attention_verify.attention_ref."""
import math

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from kernels import device as gpu
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait
from kernels.kv_write import cache_args, load_kv_len

BLOCK_N = gl.constexpr(64)     # keys a tile: one wgmma M
_NEG = gl.constexpr(-1.0e30)


@gluon.jit
def _pv_key(m):
    """The key of a 64-key tile that the P·V product's contraction index m reads: a thread's A fragment (V^T) holds
    m = 16s + 8j1 + 2t + j0 (k steps s), read as keys 16t + 4s + 2j1 + j0 (16 contiguous bytes of a V^T row)."""
    return (m & 1) | ((m >> 3) & 1) << 1 | ((m >> 4) & 3) << 2 | ((m >> 1) & 3) << 4


def load_layouts(D: int):
    """(K tile [64, D] codes as read for the QK A operand, V^T tile [D, 64] for the P·V one): registers 0-3 a
    16-byte unit, then the fragment's other rows and chunks; lanes and warps as the wgmma fragment's."""
    k_regs = [[0, 1], [0, 2], [0, 4], [0, 8], [8, 0], [0, 16]] + ([[0, 128]] if D == 256 else [])
    k_load = gl.DistributedLinearLayout(reg_bases=k_regs, lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
                                        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[BLOCK_N.value, D])
    v_regs = [[0, 1], [0, 2], [0, 4], [0, 8], [8, 0], [64, 0]] + ([[128, 0]] if D == 256 else [])
    v_load = gl.DistributedLinearLayout(reg_bases=v_regs, lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
                                        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[D, BLOCK_N.value])
    return k_load, v_load


@gluon.jit
def _qk_order(x, D: gl.constexpr):
    """[rows, D] in byte order -> the same values in the QK product's contraction order: column k = 64c + 16s + 8j1
    + 2t + j0 holds byte 16(2t + c0 + 8c1) + 4s + 2j1 + j0, so a thread's A fragment of a key is units 2t + c0 + 8c1
    of its row (16 bytes each; conflict-free under the 128-byte swizzle). A relabelling: no data moves."""
    ROWS: gl.constexpr = x.shape[0]
    if D == 256:
        x = gl.reshape(x, [ROWS, 2, 2, 2, 2, 2, 2, 2, 2])           # byte bits 7 … 0
        x = gl.permute(x, [0, 1, 4, 5, 6, 7, 2, 3, 8])               # k bits 7 … 0
    else:
        x = gl.reshape(x, [ROWS, 2, 2, 2, 2, 2, 2, 2])               # byte bits 6 … 0
        x = gl.permute(x, [0, 3, 4, 5, 6, 1, 2, 7])
    return gl.reshape(x, [ROWS, D])


@gluon.jit
def _k_operand(codes, D: gl.constexpr, a_op: gl.constexpr):
    """K tile codes [64, D] (columns = bytes) -> fp16 A operand [64, D] (columns in `_qk_order`)."""
    x = codes.to(gl.float8e4nv, bitcast=True).to(gl.float16)
    return gl.convert_layout(_qk_order(x, D), a_op, assert_trivial=True)


@gluon.jit
def _v_operand(codes, D: gl.constexpr, a_op: gl.constexpr):
    """V^T tile codes [D, 64] (columns = keys) -> fp16 A operand [D, 64] (columns in `_pv_key` order)."""
    x = codes.to(gl.float8e4nv, bitcast=True).to(gl.float16)
    x = gl.reshape(x, [D, 2, 2, 2, 2, 2, 2])                         # key bits 5 … 0
    x = gl.permute(x, [0, 3, 4, 5, 1, 2, 6])
    return gl.convert_layout(gl.reshape(x, [D, BLOCK_N]), a_op, assert_trivial=True)


@gluon.jit
def _copy_tile(k_stage, v_stage, k_base, v_base, n0, hi, max_len, s_cn, k_key, k_off, v_key, v_off):
    """Keys n0 … n0 + 63 into a ring stage (cp.async, 16 bytes a copy): row m of the K stage holds key n0 + _pv_key(m)
    (keys from hi on: zeros), V^T stage as stored (keys below max_len: finite, kernels/kv_write.py). The offsets
    within a tile (k_off, v_off: int32) are loop invariants; a tile moves the scalar bases only."""
    async_copy.async_copy_global_to_shared(k_stage, k_base + n0.to(gl.int64) * s_cn + k_off, mask=k_key < hi - n0)
    async_copy.async_copy_global_to_shared(v_stage, v_base + n0 + v_off, mask=v_key < max_len - n0)


@gluon.jit
def _prefetch_tile(k_base, v_base, n0, s_cn, s_vd, D: gl.constexpr, pf_l: gl.constexpr):
    """Keys n0 … n0 + 63 of K and V into L2 (prefetch.global.L2, one 128-byte line of K and D / 128 rows of V a
    thread): the ring holds one tile in flight per program; the bus needs more."""
    t = gl.arange(0, 128, layout=pf_l)
    k = k_base + n0.to(gl.int64) * s_cn + t * (BLOCK_N * D // 128)
    gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [k], dtype=gl.int32, is_pure=False, pack=1)
    for j in gl.static_range(D // 128):
        v = v_base + (t + 128 * j).to(gl.int64) * s_vd + n0
        gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [v], dtype=gl.int32, is_pure=False,
                                  pack=1)


@gluon.jit
def _load_q(q_row, kvh, q_len, s_qt, s_qh, G: gl.constexpr, D: gl.constexpr, R: gl.constexpr, q_l: gl.constexpr):
    """The R packed rows of q for kv head kvh (row r: token r // G of head kvh·G + r % G; zeros past q_len·G)."""
    qr = gl.arange(0, R, layout=gl.SliceLayout(1, q_l))
    qd = gl.arange(0, D, layout=gl.SliceLayout(0, q_l))
    return gl.load(q_row + gl.expand_dims((qr // G) * s_qt + (kvh * G + qr % G) * s_qh, 1) + gl.expand_dims(qd, 0),
                   mask=gl.expand_dims(qr < q_len * G, 1), other=0.0)


@gluon.jit
def _attend_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr, out_ptr, part_ptr, gate_ptr,
                   q_len, nseg, qk_scale, num_slots, max_len, fresh,
                   s_qb, s_qt, s_qh, s_ob, s_ot, s_oh, s_cs, s_ch, s_cn, s_vs, s_vh, s_vd, s_pb, s_ph, s_pt, s_ps,
                   s_gb, s_gt, s_gh,
                   k_load: gl.constexpr, v_load: gl.constexpr, G: gl.constexpr, D: gl.constexpr, R: gl.constexpr,
                   STAGES: gl.constexpr, SPLIT: gl.constexpr, GATED: gl.constexpr, PDL: gl.constexpr,
                   PF: gl.constexpr, EARLY: gl.constexpr):
    # q, out [B, q_len, Hq, D] (D contiguous); k cache [slots, Hkv, max_len, D] uint8 (D contiguous), v cache of
    # the same shape, keys contiguous (s_vd its head-dim stride); k/v scales [Hkv] fp32; cache_rows, kv_lens [B]
    # int32; partials [B_max, Hq, Q_MAX, NSEG_max, D + PART_EXTRA] fp32 (SPLIT: kernels/attention_verify.py); gate
    # like out (GATED). Grid (B, Hkv, nseg): program (b, kvh, seg) attends the R packed rows (row r: token r // G
    # of head kvh·G + r % G) over key tiles seg, seg + nseg, … (as the Triton kernel: the same tiles, in the same
    # order).
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, R, 16])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_o: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    b_o: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=o_l, k_width=2)
    o_cols_l: gl.constexpr = gl.SliceLayout(0, o_l)                 # the same for O^T
    k_copy: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // D, D // 16], [4, 1], [1, 0])
    v_copy: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    k_smem_l: gl.constexpr = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])
    v_smem_l: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    op_smem_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    p_smem_l: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
    cols_l: gl.constexpr = gl.SliceLayout(0, acc_l)                 # [R]: one value per packed row (S^T)
    keys_l: gl.constexpr = gl.SliceLayout(1, acc_l)                 # [64]: one value per key of a tile

    b = gl.program_id(0)
    kvh = gl.program_id(1)
    seg = gl.program_id(2)
    if PDL and not EARLY:
        gdc_wait()
        gdc_launch_dependents()
    slot = gpu.load_slot(rows_ptr + b, num_slots)
    # padding rows (a slot < 0 or past the cache) attend to nothing and output 0; a length past the cache (the
    # caller's error) reads no other slot
    kv_len = load_kv_len(lens_ptr + b, slot, max_len)
    if not EARLY:   # q requested with the slot and length, not after them
        q = _load_q(q_ptr + b * s_qb, kvh, q_len, s_qt, s_qh, G, D, R, q_l)
    score_scale = qk_scale * gl.load(ks_ptr + kvh)
    v_unit = gl.load(vs_ptr + kvh)
    start = seg * BLOCK_N
    step = nseg * BLOCK_N
    hi = kv_len
    old = kv_len - fresh                    # keys before it were written by earlier steps (EARLY: read at once)
    k_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, D], k_smem_l)
    v_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, D, BLOCK_N], v_smem_l)
    row = gl.maximum(slot, 0).to(gl.int64)  # a padding row's V copies (masked by max_len only) stay in the cache
    k_base = kc_ptr + row * s_cs + kvh * s_ch
    v_base = vc_ptr + row * s_vs + kvh * s_vh
    k_key = gl.expand_dims(_pv_key(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_copy))), 1)
    k_off = k_key * s_cn + gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, k_copy)), 0)
    k_key = k_key + gl.zeros([BLOCK_N, D], gl.int32, k_copy)
    v_key = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, v_copy)), 0)
    v_off = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(1, v_copy)), 1) * s_vd + v_key
    v_key = v_key + gl.zeros([D, BLOCK_N], gl.int32, v_copy)
    if EARLY:
        # before the wait for the previous kernel: the ring's first tiles, where they hold only earlier steps' keys
        for j in gl.static_range(STAGES - 1):
            if start + j * step + BLOCK_N <= old:
                _copy_tile(k_ring.index(j), v_ring.index(j), k_base, v_base, start + j * step, hi, max_len, s_cn,
                           k_key, k_off, v_key, v_off)
        async_copy.commit_group()
        gdc_wait()
        gdc_launch_dependents()
    # segments past the end are skipped; the combine stops at the same count. Without a split, always write.
    if (start < kv_len) | (nseg == 1):
        if EARLY:
            q = _load_q(q_ptr + b * s_qb, kvh, q_len, s_qt, s_qh, G, D, R, q_l)
        q_smem = gl.allocate_shared_memory(gl.float16, [R, D], op_smem_l)
        p_smem = gl.allocate_shared_memory(gl.float16, [R, BLOCK_N], p_smem_l)
        for j in gl.static_range(STAGES - 1):
            if (not EARLY) or (start + j * step + BLOCK_N > old):
                _copy_tile(k_ring.index(j), v_ring.index(j), k_base, v_base, start + j * step, hi, max_len, s_cn,
                           k_key, k_off, v_key, v_off)
            async_copy.commit_group()

        # Q^T, the B operand: times the score scale (log2 units, the K scale folded in), permuted along the head
        # dim as the K fragments are
        q_smem.store(_qk_order((q.to(gl.float32) * score_scale).to(gl.float16), D))

        last = gl.expand_dims(kv_len - q_len + gl.arange(0, R, layout=cols_l) // G, 0)   # each row's causal limit
        m_key = _pv_key(gl.arange(0, BLOCK_N, layout=keys_l))          # tile row m holds key n0 + m_key[m]

        m_i = gl.full([R], _NEG, gl.float32, cols_l)
        l_acc = gl.zeros([BLOCK_N, R], gl.float32, acc_l)               # column sums, kept per thread
        acc = gl.zeros([D, R], gl.float32, o_l)                         # O^T
        fence_async_shared()                        # Q^T's store is visible to the tensor cores' reads
        n_tiles = gl.cdiv(hi - start, step)
        for i in range(0, n_tiles):
            n0 = start + i * step
            async_copy.wait_group(STAGES - 2)       # this thread's copies of tile i have landed
            gl.thread_barrier()                     # everyone's have; everyone is done with tile i - 1
            nxt = (i + STAGES - 1) % STAGES
            _copy_tile(k_ring.index(nxt), v_ring.index(nxt), k_base, v_base, n0 + (STAGES - 1) * step, hi,
                       max_len, s_cn, k_key, k_off, v_key, v_off)
            async_copy.commit_group()
            if PF > 0:
                if n0 + (STAGES - 1 + PF) * step < hi:
                    _prefetch_tile(k_base, v_base, n0 + (STAGES - 1 + PF) * step, s_cn, s_vd, D,
                                   gl.BlockedLayout([1], [32], [4], [0]))
            cur = i % STAGES
            a_k = _k_operand(k_ring.index(cur).load(k_load), D, a_op)
            s = warpgroup_mma(a_k, q_smem.permute((1, 0)), gl.zeros([BLOCK_N, R], gl.float32, acc_l),
                              use_acc=False)
            key = gl.expand_dims(n0 + m_key, 1)
            s = gl.where(key <= last, s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 0))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - gl.expand_dims(m_new, 0))
            l_acc = l_acc * gl.expand_dims(alpha, 0) + p
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_cols_l), 0)
            m_i = m_new
            # P^T to the other warps through shared memory, as mma.sync's B operand
            p_smem.store(gl.permute(p.to(gl.float16), (1, 0)))
            gl.thread_barrier()
            a_v = _v_operand(v_ring.index(cur).load(v_load), D, a_o)
            acc = mma_v2(a_v, p_smem.permute((1, 0)).load(b_o), acc)
        async_copy.wait_group(0)
        acc = acc * v_unit
        l_i = gl.convert_layout(gl.sum(l_acc, 0), o_cols_l)
        m_i = gl.convert_layout(m_i, o_cols_l)
        r = gl.arange(0, R, layout=o_cols_l)
        tok = r // G
        head = kvh * G + r % G
        row_ok = r < q_len * G
        d = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(1, o_l)), 1)
        if SPLIT:
            p_row = part_ptr + b * s_pb + head * s_ph + tok * s_pt + seg * s_ps
            gl.store(gl.expand_dims(p_row, 0) + d, acc, mask=gl.expand_dims(row_ok, 0) & (d >= 0))
            gl.store(p_row + D, m_i, mask=row_ok)
            gl.store(p_row + D + 1, l_i, mask=row_ok)
        else:
            o = gl.where(gl.expand_dims(l_i, 0) > 0, acc / gl.expand_dims(l_i, 0), 0.0)
            mask = gl.expand_dims(row_ok, 0) & (d >= 0)
            if GATED:
                o = o * gl.load(gate_ptr + b * s_gb + gl.expand_dims(tok * s_gt + head * s_gh, 0) + d, mask=mask,
                                other=0.0).to(gl.float32)
            gl.store(out_ptr + b * s_ob + gl.expand_dims(tok * s_ot + head * s_oh, 0) + d,
                     o.to(out_ptr.dtype.element_ty), mask=mask)


def supports(q, k_cache, v_cache, kv_fmt, rows=None) -> bool:
    """Whether this kernel takes the call: sm_90 (wgmma) with e4m3 codes decoded natively, V keys-fastest, a cache
    length that keeps V's rows 16-byte aligned, head dim 128 / 256, at most 64 packed rows."""
    from kernels.attention_verify import KV_FP8_NATIVE
    B, q_len, hq, D = q.shape
    return (not gpu.INTERPRET and q.device.type != "cpu" and gpu.capability(q.device) == (9, 0)
            and kv_fmt == KV_FP8_NATIVE and D in (128, 256) and v_cache.stride(2) == 1 and k_cache.stride(3) == 1
            and k_cache.shape[2] % 16 == 0 and max(rows or 0, q_len * (hq // k_cache.shape[1])) <= 64)


def attend(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials, nseg, gate=None, rows=None,
           fresh=None):
    """As kernels/attention_verify.attend's attend step (the combine is the caller's): writes partials when
    nseg > 1, else out. rows: the packed-row tile (N of the products), default the next power of 2 ≥ q_len·G
    (≥ 8); a decode step whose rows must be bitwise a verify step's passes the verify's."""
    B, q_len, hq, D = q.shape
    hkv = k_cache.shape[1]
    G = hq // hkv
    R = rows or max(8, triton.next_power_of_2(q_len * G))
    assert q_len * G <= R <= 64 and q.stride(-1) == 1 and out.stride(-1) == 1
    cache, cache_strides, _ = cache_args(k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, hkv, D)
    s_cs, s_ch, s_cn, s_vs, s_vh, s_vn, s_vd = cache_strides
    assert s_vn == 1, "V keys-fastest"
    split = nseg > 1
    part = partials if split else out
    s_part = partials.stride()[:4] if split else (0, 0, 0, 0)
    g, s_gate = (gate, gate.stride()[:3]) if gate is not None else (out, (0, 0, 0))
    pdl = gpu.pdl(q.device)
    early = pdl and fresh is not None
    _attend_kernel[(B, hkv, nseg)](
        q, *cache, out, part, g, q_len, nseg, math.log2(math.e) / math.sqrt(D), k_cache.shape[0], k_cache.shape[2],
        fresh or 0, *q.stride()[:3], *out.stride()[:3], s_cs, s_ch, s_cn, s_vs, s_vh, s_vd, *s_part, *s_gate,
        *load_layouts(D), G=G, D=D, R=R, STAGES=2, PF=int(nseg == 1), SPLIT=split, GATED=gate is not None, PDL=pdl,
        EARLY=early,
        num_warps=4, launch_pdl=pdl)
    return out
