"""The Gated DeltaNet verify/decode update of kernels/gdn_recurrent.py (token-by-token scheme: same contract,
reference and bitwise width invariance) in Gluon; kernels/gdn_recurrent.gdn_verify takes it on sm_80+ (its launch
table, `pick` below).

Why: the Triton kernel's narrow launch (16 columns on one warp) is one warp's serial stream of ~4100 instructions
(395 shuffles) with ~3 warps per SM, latency-bound, and Triton's cross-warp reductions cost ~100 barriers on 2
warps. Here a program's state tile S [DK, BV] is spread over lanes_dk x (32 / lanes_dk) lanes (dk x v) and over
the warps, either along dk (a token's two reductions over dk: in-register FMAs, shuffles and one exchange between
the warps) or along v (no exchange: each warp reduces its own columns). A launch is (BV, warps, lanes_dk, warps
along v, qk_smem: the tokens' normalised k_t, q_t kept in shared memory and read back token by token instead of
held in registers from the start); each token's chain of dependent instructions is the cost (at B 1, 2 warps per
CTA: ~500 instructions a token at ~3.8 cycles each, ncu), so the table trades lanes for registers per width. H200,
T 5 / T 1, fp16 state (us, against the one layout before it: 4 lanes along dk, warps along dk): B 1 (16, 2, 8, dk)
5.85 / 2.80 against 6.42 / 2.58; B 4 (32, 2, 8, dk) 12.6 / 4.76 against 16.3 / 4.14; B 8 27.0 / 8.23 against 39.9 /
7.35; B 16 (64, 4, 16, v) 56.7 / 15.2 against 88.6 / 13.1, B 64 230 / 71.5 against 370 / 99.4. Decode and verify
take the same launch (the width invariance), so T 1 gives back a little where T 5 gains; B 2 and fp32 states keep
the old layout (there the others were no faster). Tried and not kept (session 12, T 5 / T 1 at B 1): 32 lanes along dk
with 4-16 columns per program (4-8 state elements a thread, up to 46 warps per SM): 19-60 us, and 8-16 columns
on 16 lanes along dk 20-32 us: their stores cover 4-8 bytes of a row per thread and less than a 32-byte sector
per warp, so L2 takes 4-8x the written sectors (ncu: 46 and 95 MB for 8 MB of states; full-sector stores need
16 columns a warp, i.e. 64 / warps-along-dk elements a thread); 4-8 warps along dk (16-32 columns; one exchange
between the warps per token) 6.9-10.9 us; the slot row and the state tile read before the wait for the
previous kernel (they come from an earlier step, so they could be): 5.77 / 3.47 against 5.73 / 2.75 us; again
in session 32 with the state pool rotated out of L2 (as in a step), T 5, B 1 / 8 / 64: 5.06-5.26 / 27.2 / 227
against 5.22 / 25.5 / 198 us, and bench/layer_step's GDN layer at B 1 80.9-81.2 against 81.2-81.6 (noise).
Where B 1's time goes (session 32 probes, H200, fp16 dk fastest, state out of L2, us, two runs): T 1 2.82-2.86, T 5
5.12-5.18 — a fixed ~2.8 (an empty launch of this grid takes 1.06; then the slot row's and the state's latency) and
~0.58 a token; with only the last token's state stored (wrong, timing only) 4.92-5.06 (B 8: 20.7-20.9 against 25.1,
where the stores do bound it), without the re-rounding to the stored state 4.94-5.00, with streaming store hints
(.cs, evict_first) 5.09-5.12. So at one sequence the four later tokens' chain alone (~2.3 us) comes near 0.70 of
the state bytes' time (3.14 us): out of reach for a token-serial update, which width invariance needs. Nor can any
other form reach it (session 33, bench/floors.py): a launch that reads one state before its wait and writes it five
times, each write also depending on 16 KB of inputs read after the wait — as every state this kernel writes depends
on its q, k, v, a, b, which the launch before writes — takes 3.38-3.41 us, 0.64-0.65 of the copy peak over the
state bytes (without the inputs 3.00-3.17).
Session 16, the two reductions on a tensor core (not kept): a warp per 8 columns, u and w of each token one m16n8k16
product per 16 dk of [k; q; 0 …] (16-bit k, q times powers of 2 that keep them exact in fp16) and the fp16 state
as stored (exact: every token starts from it), the state's dk order permuted so a thread's B fragment is 32
contiguous dk (16-byte loads and stores, no register moves); correct and bitwise width-invariant (the GPU tests
passed), but H200, T 5 / T 1, fp16 dk fastest: B 1 7.55 / 2.56 against 4.80 / 2.03 us, B 8 39.7 / 10.6 against
25.2 / 6.1, B 64 299 / 65.9 against 206 / 59.9 (2 / 4 warps a CTA slower still). Its SASS: 2,984 instructions a
thread for 5 tokens (a warp, 8 columns) against 2,648 here (two warps, 16 columns): the rank-1 update (fp16 -> fp32,
multiply, fma, pack: 4.5 instructions an element) and building the A operands stay on the CUDA cores and outweigh
the reductions moved to the tensor core.
State layout: the engine stores the state dk fastest (kernels/gdn_common.state_pool), where the S layout runs its
registers and lanes along dk (each thread stores 16 contiguous bytes of a row), and (16, 2, 8, dk) is the fastest
or within noise of it at every width (H200, T 5, fp16, two sweeps, us against the dv-fastest layout's table: B 1
4.9-5.4 against 5.7-5.8, B 2 6.9-8.1 against 8.4-8.8, B 4 12.2 against 12.4-16.1, B 8 25.6-27.5 against 27.1, B 16
51.5 against 57.2, B 64 214 against 231). With k_t, q_t in shared memory (session 17: 102 registers instead of
150, no spills) it is faster from 16 sequences on, and (32, 2, 8, dk) so at 3-4 (H200, three sweeps, T 5 / T 1,
us against the registers' (16, 2, 8, dk)): B 3 9.5-9.7 / 3.8 against 10.9-11.0 / 3.9, B 4 10.6-10.7 / 4.5-4.7
against 12.0-12.2 / 4.3-4.4, B 16 48.6-49.1 / 11.8-12.0 against 49.8-50.3 / 10.6-10.7, B 32 94.9-95.8 / 27-28
against 102-103 / 29.4-29.7, B 64 187-188 / 54-55 against 205-206 / 59.5-60; slower at B 1 / 2 / 8 (4.81 / 7.95 /
27.0 against 4.85 / 6.51 / 25.0). The table takes each width's fastest at T 5; decode and verify take the same
launch at a width (the invariance). An fp32 state dk fastest takes (8, 2, 32, v): B 1 / 8 6.5-7.1 / 44.6-45.3
against 6.7-7.1 / 50.1-50.2. Small tiles (4-8 columns, 32 lanes along dk) no longer split sectors there, yet are
no faster (B 1: 6.2-10.2 us): the per-token chain, not the stores, bounds them; nor are fewer lanes along dk with
the warps along v and k_t, q_t in shared memory (one column a thread, 32-64 dk rows: no exchange, one or two
shuffles a reduction): (8, 1, 4, v) 8.35 / 3.30 us at B 1, (16, 1, 2, v) 10.6 / 3.6 — the in-thread sums over 32-64
rows are the longer chain.
Session 21 (H200, fp16 dk fastest, T 5, us against (16, 2, 8, dk) in the same run): 8-column tiles, twice the
warps per SM, slower at every width (B 4 / 8 / 64: 15.7 / 30.9 / 248 against 12.0 / 25.2 / 204); one shared
allocation a token for the partial sums (the barrier analysis then leaves one CTA barrier a token instead of
two) within noise (12.0 / 25.0 / 204). At B 1 the time is a fixed ~1.5 us and ~0.7 us a token (T 1: 2.2 us); a
launch that only reads one state and writes it five times takes 2.9-3.1 us (bench/floors.py). Session 24 (H200,
fp16 dk fastest, T 5 / T 1 at B 1, us against (16, 2, 8, dk) 4.80 / 2.17): 8 columns, twice the programs, (8, 2, 8,
dk) 5.77 / 2.47 (k_t, q_t in shared memory 5.12 / 2.56), (8, 4, 8, dk) 7.44 / 2.99, (8, 1, 8, dk) 6.69 / 2.22,
(8, 2, 4, dk) 6.15 / 2.66, (8, 2, 16, dk) 6.68 / 2.17; (16, 4, 8, dk) 6.67 / 2.16; (4, 2, 16, dk) 8.14 / 2.58.
Shapes and slots: as kernels/gdn_recurrent.gdn_verify (its docstring)."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels import device as gpu, fixed_sum
from kernels.gdn_common import slot_row, state_tile
from kernels.gluon_pdl import gdc_launch_dependents, gdc_wait


def fits(dk: int, dv: int, cfg: tuple) -> bool:
    """The layouts below tile this head shape with cfg = (BV, warps, lanes_dk, along_v, qk_smem): dk a power of 2 with
    at least one row per lane and warp along it, a whole number of columns per lane and warp along v."""
    bv, warps, lanes_dk, along_v = cfg[:4]
    rows, cols = lanes_dk * (1 if along_v else warps), (32 // lanes_dk) * (warps if along_v else 1)
    return dk & (dk - 1) == 0 and dk >= max(32, rows) and bv % cols == 0 and dv % bv == 0


def layouts(dk: int, cfg: tuple, dk_fastest: bool):
    """(S [DK, BV] on lanes_dk x (32 / lanes_dk) lanes and the warps along dk or v, its registers and lanes running
    along the state's contiguous axis; a [DK] vector whole in every warp, DK / 32 values per lane, for the norms:
    their reductions then stay inside a warp; with the warps along dk, the layout in which every thread reads back
    the warps' partial sums [warps, BV, 2] of its columns: all of them in registers, replicated along dk)."""
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


# Launch (BV, warps, lanes_dk, along_v, qk_smem) by the 32-column tiles per SM (at most; None: beyond) on an fp16
# state, by its layout (dk fastest: kernels/gdn_common.state_pool); an fp32 state takes FP32_LAUNCH. H200 sweeps:
# the module docstring.
FP16_LAUNCHES = {False: ((1.5, (16, 2, 8, False, False)), (3, (32, 2, 4, False, False)),
                         (12, (32, 2, 8, False, False)), (None, (64, 4, 16, True, False))),
                 True: ((3, (16, 2, 8, False, False)), (6, (32, 2, 8, False, True)), (12, (16, 2, 8, False, False)),
                        (None, (16, 2, 8, False, True)))}
FP32_LAUNCH = {False: (32, 2, 4, False, False), True: (8, 2, 32, True, False)}


def pick(B: int, HV: int, DV: int, fp16: bool, sms: int, dk_fastest: bool) -> tuple:
    """The launch for a batch width and state layout (never for a token count: decode and verify must take the
    same one); at most DV columns per program."""
    per_sm = B * HV * triton.cdiv(DV, 32) / sms
    table = FP16_LAUNCHES[dk_fastest]
    cfg = FP32_LAUNCH[dk_fastest] if not fp16 else next(c for bound, c in table if bound is None or per_sm <= bound)
    return (min(cfg[0], DV),) + cfg[1:]


# With warps along dk, up to this many CTAs per SM sum each token's partials through shared-memory slots of their
# own: bitwise the compiler's reduction, one barrier a token instead of two, but ~20 more registers (fewer CTAs fit
# an SM). H200, fp16 dk fastest, (16, 2, 8, dk), against the compiler's reduction in the same run: T 5, B 1 / 2
# 4.92 / 6.71 against 5.29 / 8.12 us (and 5.08 against 5.40 in another; T 1 2.06 against 2.24); taken everywhere,
# B 8 / 64 lost: 26.8 / 223 against 25.3 / 216.
SLOT_EXCHANGE_CTAS = 6


@gluon.jit
def _gates(a, b, A_log, dt_bias):
    """fp32 decay e^g, g = -exp(A_log)·softplus(a + dt_bias) (torch's threshold 20), and beta = sigmoid(b)."""
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
    # q, k [B, T, Hk, DK]; v, o [B, T, Hv, DV]; a, b [B, T, Hv]; state [slots, Hv, DK, DV] (DK_FASTEST: stored as
    # [slots, Hv, DV, DK]); slots [B, T].
    # Grid (B, Hv, DV / BV); S [DK, BV] fp32 in S_LAYOUT; the token loop is unrolled, per-token values are tuples.
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

    # every load up front (as the Triton kernel): the initial slot from the slot row, then the state tile
    slots, first = slot_row(num_acc_ptr, slots_ptr, bi, ss_b, num_slots, T)
    ok = gl.full([DK, BV], 1, gl.int1, S_LAYOUT) & (first >= 0)
    S = gl.load(state_ptr + first.to(gl.int64) * (HV * DK * DV) + tile, mask=ok, other=0.0).to(gl.float32)
    # q_t, k_t twice: whole in every warp (the norms and q_t.k_t reduce inside a warp) and as the tile's rows
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

    # while the state is in flight: l2-normalised k_t, scaled q_t (l2norm's eps), q_t.k_t, decays, betas
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
    if QK_SMEM:     # the tokens' k_t, q_t wait in shared memory, read back token by token: fewer live registers
        qk_rows = gl.allocate_shared_memory(gl.float32, [2 * T, DK],
                                            gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
        for t in gl.static_range(T):
            qk_rows.index(2 * t).store(kn[t])
            qk_rows.index(2 * t + 1).store(qn[t])
        gl.thread_barrier()

    if SLOTS:   # warps along dk: each token's partial sums through a shared-memory slot of its own
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
        if SLOTS:   # one barrier a token (the compiler's reduction across warps takes two)
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
        # the next token starts from the state as stored: token t of a verify is bitwise token t decoded alone
        S = S.to(state_ptr.dtype.element_ty).to(gl.float32)
        o = es[t] * w + qk[t] * d
        gl.store(o_ptr + bi * so_b + t * so_t + h * so_h + offs_v, o.to(o_ptr.dtype.element_ty))


def launch(q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o, cfg, dk_fastest):
    """Launch cfg = (BV, warps, lanes_dk, along_v, qk_smem) on arguments kernels/gdn_recurrent.gdn_verify has checked
    and picked (dk_fastest: the state's layout, kernels/gdn_common.dk_fastest); o [B, T, Hv, dv] is written."""
    B, T, HK, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    bv, warps = cfg[:2]
    wd = 1 if cfg[3] else warps                                         # warps along dk
    exchange = wd > 1 and B * HV * triton.cdiv(DV, bv) <= SLOT_EXCHANGE_CTAS * gpu.num_sms(v.device)
    pdl = gpu.pdl(v.device)
    _gdn_verify_gluon_kernel[(B, HV, triton.cdiv(DV, bv))](
        q, k, v, a, b, A_log, dt_bias, state, state_slots, num_accepted, o,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        o.stride(0), o.stride(1), o.stride(2), state_slots.stride(0), state.shape[0], DK ** -0.5,
        T, HV, HV // HK, DK, DV, bv, dk_fastest, *layouts(DK, cfg, dk_fastest), wd, exchange, cfg[4], pdl,
        num_warps=warps, launch_pdl=pdl)
