"""Split-KV verify/decode attention over an fp8 cache on sm_90, in Gluon: verify.py's contract, partials and width
invariance. Query rows on the products' N side: S^T = K·Q^T on wgmma, O^T = V^T·P^T on mma.sync, K and V^T decoded
into A operands by the warp that uses them, contraction orders permuted (`_qk_order`, `_pv_key`) so those reads
are whole 16-byte fragments. H200, 5 tokens, caches out of L2: B1 16k ~18.6 µs, B64 16k ~615 µs."""
import math
from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from kernels import device as gpu
from kernels.attention.common import KV_FP8_NATIVE, NEG, split_args
from kernels.attention.kv_write import cache_args, load_kv_len
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait

BLOCK_N = gl.constexpr(64)     # keys a tile: one wgmma M


@gluon.jit
def _pv_key(m):
    """The key of a 64-key tile that the P·V product's contraction index m reads: a thread's A fragment (V^T) holds
    m = 16s + 8j1 + 2t + j0 (k steps s), read as keys 16t + 4s + 2j1 + j0 (16 contiguous bytes of a V^T row)."""
    return (m & 1) | ((m >> 3) & 1) << 1 | ((m >> 4) & 3) << 2 | ((m >> 1) & 3) << 4


def load_layouts(D: int):
    """Register layouts of K [64, D] and V^T [D, 64] tiles as read for the A operands."""
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
    """Keys n0 … n0 + 63 into a ring stage; K row m holds key n0 + _pv_key(m) (zeros from hi on)."""
    async_copy.async_copy_global_to_shared(k_stage, k_base + n0.to(gl.int64) * s_cn + k_off, mask=k_key < hi - n0)
    async_copy.async_copy_global_to_shared(v_stage, v_base + n0 + v_off, mask=v_key < max_len - n0)


@gluon.jit
def _prefetch_tile(k_base, v_base, n0, s_cn, s_vd, D: gl.constexpr, pf_l: gl.constexpr):
    """Keys n0 … n0 + 63 of K and V into L2."""
    t = gl.arange(0, 128, layout=pf_l)
    k = k_base + n0.to(gl.int64) * s_cn + t * (BLOCK_N * D // 128)
    gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [k], dtype=gl.int32, is_pure=False, pack=1)
    for j in gl.static_range(D // 128):
        v = v_base + (t + 128 * j).to(gl.int64) * s_vd + n0
        gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [v], dtype=gl.int32, is_pure=False,
                                  pack=1)


@gluon.jit
def _load_q(q_row, kvh, q_len, s_qt, s_qh, G: gl.constexpr, D: gl.constexpr, R: gl.constexpr, q_l: gl.constexpr):
    """The R packed rows of q for kv head kvh (zeros past q_len·G)."""
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
    # As verify.py's kernel; caches uint8, V keys-fastest. Grid (B, Hkv, nseg).
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
    kv_len = load_kv_len(lens_ptr + b, slot, max_len)     # padding rows: 0
    if not EARLY:
        q = _load_q(q_ptr + b * s_qb, kvh, q_len, s_qt, s_qh, G, D, R, q_l)
    score_scale = qk_scale * gl.load(ks_ptr + kvh)
    v_unit = gl.load(vs_ptr + kvh)
    start = seg * BLOCK_N
    step = nseg * BLOCK_N
    hi = kv_len
    old = kv_len - fresh                    # keys before it: earlier steps'
    k_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, D], k_smem_l)
    v_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, D, BLOCK_N], v_smem_l)
    row = gl.maximum(slot, 0).to(gl.int64)  # a padding row's V copies stay in the cache
    k_base = kc_ptr + row * s_cs + kvh * s_ch
    v_base = vc_ptr + row * s_vs + kvh * s_vh
    k_key = gl.expand_dims(_pv_key(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_copy))), 1)
    k_off = k_key * s_cn + gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(0, k_copy)), 0)
    k_key = k_key + gl.zeros([BLOCK_N, D], gl.int32, k_copy)
    v_key = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, v_copy)), 0)
    v_off = gl.expand_dims(gl.arange(0, D, layout=gl.SliceLayout(1, v_copy)), 1) * s_vd + v_key
    v_key = v_key + gl.zeros([D, BLOCK_N], gl.int32, v_copy)
    if EARLY:
        # before the wait: the ring's first tiles where they hold only earlier steps' keys
        for j in gl.static_range(STAGES - 1):
            if start + j * step + BLOCK_N <= old:
                _copy_tile(k_ring.index(j), v_ring.index(j), k_base, v_base, start + j * step, hi, max_len, s_cn,
                           k_key, k_off, v_key, v_off)
        async_copy.commit_group()
        gdc_wait()
        gdc_launch_dependents()
    # segments past the end are skipped (the combine stops at the same count)
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

        # Q^T, the B operand, times the score scale, permuted as the K fragments
        q_smem.store(_qk_order((q.to(gl.float32) * score_scale).to(gl.float16), D))

        last = gl.expand_dims(kv_len - q_len + gl.arange(0, R, layout=cols_l) // G, 0)   # each row's causal limit
        m_key = _pv_key(gl.arange(0, BLOCK_N, layout=keys_l))          # tile row m holds key n0 + m_key[m]

        m_i = gl.full([R], NEG, gl.float32, cols_l)
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


@dataclass(frozen=True)
class Config:
    rows: int           # packed rows a program (the products' N), 16 to 64

    @property
    def block_n(self) -> int:
        return BLOCK_N.value


def supports(q, k_cache, v_cache, kv_fmt, rows=None) -> bool:
    """sm_90, native e4m3, V keys-fastest, cache length a multiple of 16, head dim 128 / 256, ≤ 64 packed rows."""
    B, q_len, hq, D = q.shape
    return (not gpu.INTERPRET and q.device.type != "cpu" and gpu.capability(q.device) == (9, 0)
            and kv_fmt == KV_FP8_NATIVE and D in (128, 256) and v_cache.stride(2) == 1 and k_cache.stride(3) == 1
            and k_cache.shape[2] % 16 == 0 and max(rows or 0, q_len * (hq // k_cache.shape[1])) <= 64)


def config(q, k_cache, q_max=None) -> Config:
    """The packed rows of q_max (default q_len) tokens a sequence."""
    return Config(max(16, triton.next_power_of_2((q_max or q.shape[1]) * (q.shape[2] // k_cache.shape[1]))))


def launch(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials, nseg, gate, cfg: Config,
           fresh=None):
    """The attend kernel: out when nseg == 1, else partials."""
    B, q_len, hq, D = q.shape
    hkv = k_cache.shape[1]
    G = hq // hkv
    R = cfg.rows
    assert q_len * G <= R <= 64 and q.stride(-1) == 1 and out.stride(-1) == 1
    cache, cache_strides, _ = cache_args(k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, hkv, D)
    s_cs, s_ch, s_cn, s_vs, s_vh, s_vn, s_vd = cache_strides
    assert s_vn == 1, "V keys-fastest"
    part, s_part, g, s_gate = split_args(q, out, partials, nseg, gate)
    pdl = gpu.pdl(q.device)
    early = pdl and fresh is not None
    _attend_kernel[(B, hkv, nseg)](
        q, *cache, out, part, g, q_len, nseg, math.log2(math.e) / math.sqrt(D), k_cache.shape[0], k_cache.shape[2],
        fresh or 0, *q.stride()[:3], *out.stride()[:3], s_cs, s_ch, s_cn, s_vs, s_vh, s_vd, *s_part, *s_gate,
        *load_layouts(D), G=G, D=D, R=R, STAGES=2, PF=int(nseg == 1), SPLIT=nseg > 1, GATED=gate is not None,
        PDL=pdl, EARLY=early, num_warps=4, launch_pdl=pdl)
