"""gdn_verify in Gluon (sm_80+), token by token as recurrent.py (width-invariant; its gates differ in the last
bits). The state tile S [DK, BV] lies on lanes_dk x (32 / lanes_dk) lanes (dk x v) and on the warps, along dk (one
exchange of partial sums a token) or along v. H200, B 1, T 5: 5.2 us. Notes: docs/notes/gdn.md."""
from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels import device as gpu, fixed_sum
from kernels.gdn.common import dk_fastest, slot_row, state_tile
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait


@dataclass(frozen=True)
class Config:
    block_v: int
    num_warps: int
    lanes_dk: int           # lanes of a warp along dk
    along_v: bool           # warps along v (else dk)
    qk_smem: bool           # k_t, q_t in shared memory
    slot_exchange: bool     # SLOT_EXCHANGE_CTAS

    @property
    def tile(self) -> tuple:
        return self.block_v, self.num_warps, self.lanes_dk, self.along_v, self.qk_smem


def fits(dk: int, dv: int, tile: tuple) -> bool:
    """tile = (BV, warps, lanes_dk, along_v, qk_smem) covers this head shape (dk a power of 2)."""
    bv, warps, lanes_dk, along_v = tile[:4]
    rows, cols = lanes_dk * (1 if along_v else warps), (32 // lanes_dk) * (warps if along_v else 1)
    return dk & (dk - 1) == 0 and dk >= max(32, rows) and bv % cols == 0 and dv % bv == 0


def supports(q, v, cfg: Config) -> bool:
    """sm_80+ (meta tensors: compiling for it), and a tile that fits."""
    return (not gpu.INTERPRET and v.device.type in ("cuda", "meta") and gpu.capability(v.device) >= (8, 0)
            and fits(q.shape[3], v.shape[3], cfg.tile))


def layouts(dk: int, cfg: tuple, dk_fastest: bool):
    """(S's layout, registers and lanes along the state's contiguous axis; a [DK] vector whole in every warp, so
    the norms reduce inside a warp; with warps along dk, the partial sums [warps, BV, 2] as each thread reads back
    its columns')."""
    assert fits(dk, cfg[0], cfg), (dk, cfg)
    bv, warps, lanes_dk, along_v = cfg[:4]
    wd, wv = (1, warps) if along_v else (warps, 1)
    lanes_v = 32 // lanes_dk
    s = gl.BlockedLayout(size_per_thread=[dk // (lanes_dk * wd), bv // (lanes_v * wv)],
                         threads_per_warp=[lanes_dk, lanes_v], warps_per_cta=[wd, wv],
                         order=[0, 1] if dk_fastest else [1, 0])
    log2 = {1 << i: i for i in range(8)}
    regs = log2[dk // 32]
    vec = gl.DistributedLinearLayout(reg_bases=[[1 << i] for i in range(regs)],
                                     lane_bases=[[1 << (regs + i)] for i in range(5)],
                                     warp_bases=[[0]] * log2[warps], block_bases=[], shape=[dk])
    spt_v = bv // (lanes_v * wv)                                   # S's registers along v
    v_lanes, dk_lanes = [[0, spt_v << i, 0] for i in range(log2[lanes_v])], [[0, 0, 0]] * log2[lanes_dk]
    partials = [[1 << i, 0, 0] for i in range(log2[wd])] + [[0, 0, 1]]
    xchg = gl.DistributedLinearLayout(            # dims (warp along dk, column, k / q sum); unused with warps along v
        reg_bases=partials + [[0, 1 << i, 0] for i in range(log2[spt_v])],
        lane_bases=dk_lanes + v_lanes if dk_fastest else v_lanes + dk_lanes,
        warp_bases=[[0, 0, 0]] * log2[warps], block_bases=[], shape=[wd, bv, 2])
    return s, vec, xchg


# fp16 state: tile by 32-column tiles per SM (at most; None: beyond), by layout (True: dk fastest)
FP16_TILES = {False: ((1.5, (16, 2, 8, False, False)), (3, (32, 2, 4, False, False)),
                      (12, (32, 2, 8, False, False)), (None, (64, 4, 16, True, False))),
              True: ((3, (16, 2, 8, False, False)), (6, (32, 2, 8, False, True)), (12, (16, 2, 8, False, False)),
                     (None, (16, 2, 8, False, True)))}
FP32_TILE = {False: (32, 2, 4, False, False), True: (8, 2, 32, True, False)}
# up to this many CTAs per SM sum partials through a shared slot a token (one barrier, ~20 more registers)
SLOT_EXCHANGE_CTAS = 6
# bench/kernels_gdn.py --sweep, the GPU tests
SWEEP = tuple(tile + (smem,) for smem, tiles in (
    (False, ((16, 2, 4, False), (32, 2, 4, False), (16, 2, 8, False), (32, 2, 8, False), (32, 4, 8, False),
             (64, 4, 8, False), (32, 2, 16, True), (16, 1, 16, True), (64, 4, 16, True), (8, 2, 4, False),
             (16, 2, 16, True), (8, 1, 16, True), (32, 4, 16, True), (8, 2, 32, True), (16, 4, 32, True),
             (16, 2, 8, True), (8, 1, 8, True), (32, 4, 8, True), (16, 1, 8, True))),
    (True, ((16, 2, 4, False), (16, 2, 8, False), (32, 2, 8, False), (32, 4, 4, False), (8, 1, 4, True))))
              for tile in tiles)


def config(v, state, tile: tuple | None = None) -> Config:
    """`tile` (default: the table's by width and layout, never by T) at v's shape."""
    B, _, HV, DV = v.shape
    sms = gpu.num_sms(v.device)
    if tile is None:
        dk_major = dk_fastest(state, HV, state.shape[2], DV)
        per_sm = B * HV * triton.cdiv(DV, 32) / sms
        tile = FP32_TILE[dk_major] if state.element_size() != 2 else \
            next(t for bound, t in FP16_TILES[dk_major] if bound is None or per_sm <= bound)
        tile = (min(tile[0], DV),) + tile[1:]
    bv, warps, lanes_dk, along_v, qk_smem = tile
    wd = 1 if along_v else warps                                        # warps along dk
    exchange = wd > 1 and B * HV * triton.cdiv(DV, bv) <= SLOT_EXCHANGE_CTAS * sms
    return Config(bv, warps, lanes_dk, along_v, qk_smem, exchange)


@gluon.jit
def _gates(a, b, A_log, dt_bias):
    """fp32 e^g and beta (common.gdn_gates with the exp folded in)."""
    x = a.to(gl.float32) + dt_bias
    y = gl.exp(gl.minimum(x, 20.0))
    u = 1.0 + y
    sp = gl.where(x > 20.0, x, gl.where(u == 1.0, y, gl.log(u) * y / (u - 1.0)))
    return gl.exp(-gl.exp(A_log) * sp), 1.0 / (1.0 + gl.exp(-b.to(gl.float32)))


@gluon.jit
def _gdn_verify_gluon_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr,
                             num_acc_ptr, o_ptr,
                             sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sa_b, sa_t, sb_b, sb_t,
                             so_b, so_t, so_h, ss_b, num_slots, scale,
                             T: gl.constexpr, HV: gl.constexpr, KV_GROUP: gl.constexpr, DK: gl.constexpr,
                             DV: gl.constexpr, BV: gl.constexpr, DK_FASTEST: gl.constexpr, S_LAYOUT: gl.constexpr,
                             VEC: gl.constexpr, XCHG: gl.constexpr, WD: gl.constexpr, SLOTS: gl.constexpr,
                             QK_SMEM: gl.constexpr, PDL: gl.constexpr):
    # Grid (B, Hv, DV / BV); S [DK, BV] fp32 in S_LAYOUT; token loops unrolled, per-token values in tuples
    bi = gl.program_id(0)
    h = gl.program_id(1)
    kh = h // KV_GROUP
    ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    COLS: gl.constexpr = gl.SliceLayout(0, S_LAYOUT)
    offs_k = gl.arange(0, DK, layout=ROWS)
    offs_v = gl.program_id(2) * BV + gl.arange(0, BV, layout=COLS)
    tile = state_tile(h, offs_k, offs_v, DK, DV, DK_FASTEST)
    A_log = gl.load(A_log_ptr + h).to(gl.float32)      # weights: read while the previous kernel finishes
    dt_bias = gl.load(dt_bias_ptr + h).to(gl.float32)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

    # every load up front (as the Triton kernel)
    slots, first = slot_row(num_acc_ptr, slots_ptr, bi, ss_b, num_slots, T)
    ok = gl.full([DK, BV], 1, gl.int1, S_LAYOUT) & (first >= 0)
    S = gl.load(state_ptr + first.to(gl.int64) * (HV * DK * DV) + tile, mask=ok, other=0.0).to(gl.float32)
    # q_t, k_t whole in every warp (for the norms and q_t.k_t) and as the tile's rows
    offs_f = gl.arange(0, DK, layout=VEC)
    qf, kf, qs, ks, vs, a_s, b_s = (), (), (), (), (), (), ()
    for t in gl.static_range(T):
        q_row = q_ptr + bi * sq_b + t * sq_t + kh * sq_h
        k_row = k_ptr + bi * sk_b + t * sk_t + kh * sk_h
        qf, kf = qf + (gl.load(q_row + offs_f).to(gl.float32),), kf + (gl.load(k_row + offs_f).to(gl.float32),)
        if not QK_SMEM:
            qs, ks = qs + (gl.load(q_row + offs_k).to(gl.float32),), ks + (gl.load(k_row + offs_k).to(gl.float32),)
        vs = vs + (gl.load(v_ptr + bi * sv_b + t * sv_t + h * sv_h + offs_v).to(gl.float32),)
        a_s = a_s + (fixed_sum.load(a_ptr + bi * sa_b + t * sa_t + h, True),)     # stored, or int64 sums
        b_s = b_s + (fixed_sum.load(b_ptr + bi * sb_b + t * sb_t + h, True),)

    # while the state is in flight
    kn, qn, qk, es, betas = (), (), (), (), ()
    for t in gl.static_range(T):
        rk = gl.rsqrt(gl.sum(kf[t] * kf[t], axis=0) + 1e-6)
        rq = gl.rsqrt(gl.sum(qf[t] * qf[t], axis=0) + 1e-6) * scale
        e, beta = _gates(a_s[t], b_s[t], A_log, dt_bias)
        if QK_SMEM:
            kn, qn = kn + (kf[t] * rk,), qn + (qf[t] * rq,)
        else:
            kn, qn = kn + (ks[t] * rk,), qn + (qs[t] * rq,)
        es, betas = es + (e,), betas + (beta,)
        qk = qk + (gl.sum(qf[t] * kf[t], axis=0) * (rq * rk),)
    if QK_SMEM:     # fewer live registers
        qk_rows = gl.allocate_shared_memory(gl.float32, [2 * T, DK],
                                            gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
        for t in gl.static_range(T):
            qk_rows.index(2 * t).store(kn[t])
            qk_rows.index(2 * t + 1).store(qn[t])
        gl.thread_barrier()

    if SLOTS:   # a slot of partial sums a token
        parts = gl.allocate_shared_memory(gl.float32, [T, WD, BV, 2],
                                          gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0]))
    for t in gl.static_range(T):
        if QK_SMEM:
            k_t, q_t = qk_rows.index(2 * t).load(ROWS), qk_rows.index(2 * t + 1).load(ROWS)
        else:
            k_t, q_t = kn[t], qn[t]
        k2 = gl.expand_dims(k_t, 1)
        # k_t.S and q_t.S of S_{t-1} in one reduction
        kq = gl.join(S * k2, S * gl.expand_dims(q_t, 1))                                    # [DK, BV, 2]
        if SLOTS:   # one barrier a token (the compiler's reduction takes two)
            parts.index(t).store(gl.sum(gl.reshape(kq, [WD, DK // WD, BV, 2]), axis=1))
            gl.thread_barrier()
            u, w = gl.split(gl.sum(parts.index(t).load(XCHG), axis=0))
        else:
            u, w = gl.split(gl.sum(kq, axis=0))
        u, w = gl.convert_layout(u, COLS, assert_trivial=True), gl.convert_layout(w, COLS, assert_trivial=True)
        d = (vs[t] - es[t] * u) * betas[t]
        S = S * es[t] + k2 * gl.expand_dims(d, 0)
        slot_ok = gl.full([DK, BV], 1, gl.int1, S_LAYOUT) & (slots[t] >= 0)
        gl.store(state_ptr + slots[t].to(gl.int64) * (HV * DK * DV) + tile, S.to(state_ptr.dtype.element_ty),
                 mask=slot_ok)
        # the next token starts from the state as stored (width invariance)
        S = S.to(state_ptr.dtype.element_ty).to(gl.float32)
        o = es[t] * w + qk[t] * d
        gl.store(o_ptr + bi * so_b + t * so_t + h * so_h + offs_v, o.to(o_ptr.dtype.element_ty))


def launch(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o, cfg: Config):
    B, T, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    dk_major = dk_fastest(state, HV, DK, DV)
    pdl = gpu.pdl(v.device)
    _gdn_verify_gluon_kernel[(B, HV, triton.cdiv(DV, cfg.block_v))](
        q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        o.stride(0), o.stride(1), o.stride(2), state_slots.stride(0), state.shape[0], DK ** -0.5,
        T, HV, HV // HK, DK, DV, cfg.block_v, dk_major, *layouts(DK, cfg.tile, dk_major),
        1 if cfg.along_v else cfg.num_warps, cfg.slot_exchange, cfg.qk_smem, pdl,
        num_warps=cfg.num_warps, launch_pdl=pdl)
