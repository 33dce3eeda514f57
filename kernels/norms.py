"""Fused small ops around the matmuls (MODEL.md §3.1–§3.4), one pass over the activations each:

  add_rmsnorm      h = x + residual; y = RMSNorm_1p(h, w)                      (every decoder / final / MTP norm)
  gated_rmsnorm    y = (w · x̂.to(dtype)) · silu(z)  per head, plain w          (GDN output norm)
  qk_norm_rope     per head of q_proj's [q_h | gate_h] layout and of k_proj: RMSNorm_1p, then partial RoPE on
                   the first rd dims (pairs j, j + rd/2); the gate is split out unnormed (optionally sigmoid-ed);
                   optionally k and v written into the KV cache as well (kernels/kv_write.py)
  silu_mul         y = silu(gate) · up                                          (MLP)

Each output can also come as int8 per token for a W4A8 matmul (QUANT.md): s = max|y| / 127 (at least 1e-6),
q = round-half-even(y / s), computed from the rounded y; with a8_order its columns land in the Hopper W4A8 kernel's
operand order (layers.quant.a8_permute), which saves w4a8_linear its permuting copy. The maths follows HF rounding
step by step (products of bf16 tensors rounded to bf16 where HF rounds them), so only rsqrt/exp differ in the last
bits.
Weights are read before the wait for the previous kernel (programmatic dependent launch): no kernel of a step writes
them, and after the wait only the producer's output is left to fetch (H200, bench/layer_step B1 T5, two alternating
runs, us against the weights read after the wait: GDN layer 81.8 / 81.8 against 83.1 / 83.1, attention layer 91.6 /
91.5 against 92.6 / 92.3, conv1d's taps likewise; add_rmsnorm's cost in the chain 2.9-3.0 against 3.5-3.7).
References: the *_ref functions below, built from layers/model.py."""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import fixed_sum
from kernels.device import check_dense, filling_tile, pdl_args, pdl_wait
from kernels.kv_write import cache_args, store_token
from layers.model import apply_rope, gated_rms_norm, rms_norm_1p


# ------------------------------------------------------------------------------------------- references
def int8_per_token_ref(y):
    """y [T, N] -> (q int8 [T, N], s fp32 [T])."""
    yf = y.float()
    amax = yf.abs().amax(-1)
    # tensor / tensor: CUDA torch turns a division by a Python scalar into a multiply by its reciprocal
    s = (amax / torch.full_like(amax, 127.0)).clamp_min(1e-6)
    return torch.round(yf / s[:, None]).clamp(-127, 127).to(torch.int8), s


def add_rmsnorm_ref(x, residual, w, eps):
    h = x if residual is None else x + residual
    return h, rms_norm_1p(h, w, eps)


def gated_rmsnorm_ref(x, z, w, eps):
    """x, z [T, heads, D]."""
    return gated_rms_norm(x, z, w, eps)


def qk_norm_rope_ref(qg, k, q_w, k_w, cos, sin, heads, kv_heads, eps, sigmoid_gate=False):
    """qg [T, heads·2D] (per head [q_h | gate_h]), k [T, kv_heads·D], cos/sin [T, rd] -> q, k, gate [T, h, D]."""
    T = qg.shape[0]
    q, gate = qg.view(T, heads, -1).chunk(2, -1)
    k = k.view(T, kv_heads, -1)
    q = apply_rope(rms_norm_1p(q, q_w, eps)[None], cos, sin)[0]
    k = apply_rope(rms_norm_1p(k, k_w, eps)[None], cos, sin)[0]
    return q, k, torch.sigmoid(gate) if sigmoid_gate else gate.contiguous()


def silu_mul_ref(gate, up):
    return F.silu(gate) * up


# ------------------------------------------------------------------------------------------- kernels
@triton.jit
def _rne(x, dtype: tl.constexpr):
    """fp32 x rounded to `dtype`, returned as fp32. bf16 is rounded to nearest-even by hand because the
    Triton interpreter truncates fp32 -> bf16; on the GPU this equals the hardware conversion."""
    if dtype == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def _int8_scale(amax):
    return tl.maximum(tl.div_rn(amax, 127.0), 1e-6)


@triton.jit
def _a8_pos(k, A8: tl.constexpr):
    """Where column k's code goes: k itself, or with A8 its place in the W4A8 operand order
    (layers.quant.a8_permute: within each 32 columns, k's bits q0 r t1 t0 q1 become r t1 t0 q1 q0)."""
    if A8:
        return (k & ~31) | (((k >> 3) & 1) << 4) | (((k >> 1) & 3) << 2) | ((k & 1) << 1) | ((k >> 4) & 1)
    else:
        return k


@triton.jit
def _int8_codes(y, s):
    """round-half-even(y / s) via the 1.5·2^23 shift (exact for |v| < 2^22), no libdevice needed."""
    v = tl.div_rn(y, s)
    v = (v + 12582912.0) - 12582912.0
    return tl.minimum(tl.maximum(v, -127.0), 127.0).to(tl.int8)


@triton.jit
def _int8_store(q_ptr, y, s, mask):
    tl.store(q_ptr, _int8_codes(y, s), mask=mask)


@triton.jit
def _a8_codes(y, s):
    """_int8_codes in the W4A8 operand order (_a8_pos) within each 32 elements of the flattened tile (its rows whole
    32-column blocks), permuted in registers: the store stays contiguous. A scattered store (_a8_pos) made the compiler
    lay the whole kernel out otherwise, and so sum the row's squares in another order: y and q then differed from the
    natural order's in the last bit."""
    c = _int8_codes(y, s)
    return tl.reshape(tl.permute(tl.reshape(c, [c.numel // 32, 2, 2, 4, 2]), (0, 2, 3, 4, 1)), c.shape)


@triton.jit
def _add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, h_ptr, y_ptr, q_ptr, s_ptr, H, eps,
                        HAS_RES: tl.constexpr, QUANT: tl.constexpr, A8: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    """x, residual, h, y [T, H] contiguous, w [H]; grid (T,). h may alias residual (written after reading);
    x may be a linear's int64 sums (kernels/fixed_sum.py: converted, then cleared). A8: q in the W4A8 operand
    order (_a8_pos)."""
    d = tl.arange(0, BLOCK)
    m = d < H
    w = tl.load(w_ptr + d, mask=m, other=0.0).to(tl.float32)        # a weight: no kernel of the step writes it
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    hf = fixed_sum.load(x_ptr + t * H + d, m)
    fixed_sum.clear(x_ptr + t * H + d, m)
    if HAS_RES:   # the residual add rounds to the activation dtype, as a bf16 torch add does
        hf = _rne(hf + tl.load(res_ptr + t * H + d, mask=m, other=0.0).to(tl.float32), h_ptr.dtype.element_ty)
        tl.store(h_ptr + t * H + d, hf, mask=m)
    rstd = tl.rsqrt(tl.sum(hf * hf, 0) / H + eps)
    y = _rne(hf * rstd * (1.0 + w), y_ptr.dtype.element_ty)
    tl.store(y_ptr + t * H + d, y, mask=m)
    if QUANT:
        s = _int8_scale(tl.max(tl.abs(y), 0))
        tl.store(s_ptr + t, s)
        if A8:
            tl.store(q_ptr + t * H + d, _a8_codes(y, s), mask=m)
        else:
            _int8_store(q_ptr + t * H + d, y, s, m)


@triton.jit
def _gated_rmsnorm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, q_ptr, s_ptr, c_ptr, NH, D, stride_z, NC, stride_c, eps,
                          QUANT: tl.constexpr, A8: tl.constexpr, W_ROUNDS: tl.constexpr, BH: tl.constexpr,
                          BD: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr):
    """x, y [T, NH, D] contiguous, z [T, NH, D] with row stride stride_z (heads and D contiguous: z may be the
    tail of a fused projection's rows; or its int64 sums, kernels/fixed_sum.py, converted and cleared), w [D];
    c [T, NC] int64 sums (row stride stride_c) to clear (by the token's first program), NC = 0: none.
    Grid (T, cdiv(NH, BH)): BH heads of a token in one [BH, BD] tile (QUANT: all of them)."""
    d = tl.arange(0, BD)[None, :]
    w = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)     # a weight: read before the wait
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    hh = tl.program_id(1) * BH + tl.arange(0, BH)[:, None]
    m = (hh < NH) & (d < D)
    offs = t * NH * D + hh * D + d
    dt = y_ptr.dtype.element_ty
    xf = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    xn = _rne(xf * tl.rsqrt(tl.sum(xf * xf, 1) / D + eps)[:, None], dt)
    g = w * xn
    if W_ROUNDS:   # w in the activation dtype: HF's w · x̂ product is rounded to it
        g = _rne(g, dt)
    z = fixed_sum.load(z_ptr + t * stride_z + hh * D + d, m)
    fixed_sum.clear(z_ptr + t * stride_z + hh * D + d, m)
    if BC > 0:
        cols = tl.arange(0, BC)
        fixed_sum.clear(c_ptr + t * stride_c + cols, (cols < NC) & (tl.program_id(1) == 0))
    y = _rne(g * (z * tl.sigmoid(z)), dt)
    tl.store(y_ptr + offs, y, mask=m)
    if QUANT:
        s = _int8_scale(tl.max(tl.max(tl.abs(y), 1), 0))
        tl.store(s_ptr + t, s)
        if A8:
            tl.store(q_ptr + t * NH * D + hh * D + d, _a8_codes(y, s), mask=m)
        else:
            _int8_store(q_ptr + t * NH * D + hh * D + d, y, s, m)


@triton.jit
def _qk_norm_rope_kernel(qg_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, ko_ptr, gate_ptr,
                         HQ, HKV, D, RD, eps, qg_stride, k_stride, cs_stride,
                         v_ptr, v_stride, n_new, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr,
                         s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots, max_len,
                         SIGMOID_GATE: tl.constexpr, KV_WRITE: tl.constexpr, FP8: tl.constexpr, BD: tl.constexpr,
                         PDL: tl.constexpr):
    """qg [T, HQ·2D] rows [q_0 | gate_0 | q_1 | gate_1 …]; k [T, HKV·D]; cos/sin [T, RD];
    q, gate [T, HQ, D] and k out [T, HKV, D] contiguous. grid (T, HQ + HKV): one head per program.
    KV_WRITE: rows are B batch rows × n_new tokens, and each k head's program also writes its k and v [T, HKV·D]
    (row stride v_stride) into the KV caches (kernels/kv_write.store_token). qg, k and v may be a linear's int64
    sums (kernels/fixed_sum.py: converted, and cleared once the program has read them)."""
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BD)
    m = d < D
    is_q = h < HQ
    dt = q_ptr.dtype.element_ty
    if is_q:
        src, w_ptr, dst = qg_ptr + t * qg_stride + h * 2 * D, qw_ptr, q_ptr + (t * HQ + h) * D
        g = fixed_sum.load(src + D + d, m)
        fixed_sum.clear(src + D + d, m)
        if SIGMOID_GATE:
            g = _rne(tl.sigmoid(g), dt)
        tl.store(gate_ptr + (t * HQ + h) * D + d, g, mask=m)
    else:
        src, w_ptr, dst = k_ptr + t * k_stride + (h - HQ) * D, kw_ptr, ko_ptr + (t * HKV + h - HQ) * D
    xf = fixed_sum.load(src + d, m)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / D + eps)
    y = _rne(xf * rstd * (1.0 + tl.load(w_ptr + d, mask=m, other=0.0).to(tl.float32)), dt)
    # rotate_half partner of dim j < RD: j + RD/2 (negated) or j − RD/2; normed from its own raw value
    half = RD // 2
    rot = d < RD
    pd = tl.where(d < half, d + half, d - half)
    xp = fixed_sum.load(src + pd, rot)
    if qg_ptr.dtype.element_ty == tl.int64:
        tl.debug_barrier()                      # every thread's partner read before the row is cleared
    fixed_sum.clear(src + d, m)
    yp = _rne(xp * rstd * (1.0 + tl.load(w_ptr + pd, mask=rot, other=0.0).to(tl.float32)), dt)
    yp = tl.where(d < half, -yp, yp)
    c = tl.load(cos_ptr + t * cs_stride + d, mask=rot, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * cs_stride + d, mask=rot, other=0.0).to(tl.float32)
    # HF rounds r·cos and rotate_half(r)·sin to the activation dtype, then their sum
    out = tl.where(rot, _rne(_rne(y * c, dt) + _rne(yp * s, dt), dt), y)
    tl.store(dst + d, out, mask=m)
    if KV_WRITE:
        if not is_q:
            v = fixed_sum.load(v_ptr + t * v_stride + (h - HQ) * D + d, m)
            fixed_sum.clear(v_ptr + t * v_stride + (h - HQ) * D + d, m)
            store_token(out, v, d, m, t // n_new, t % n_new, n_new, h - HQ, kc_ptr, vc_ptr, ks_ptr, vs_ptr,
                        rows_ptr, lens_ptr, s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots, max_len, FP8)


@triton.jit
def _silu_mul_value(g_ptr, u_ptr, offs, m, CLEAR: tl.constexpr):
    """y at offs; gate and up may be int64 sums (kernels/fixed_sum.py: bf16), cleared by the pass that CLEARs."""
    dt: tl.constexpr = tl.bfloat16 if g_ptr.dtype.element_ty == tl.int64 else g_ptr.dtype.element_ty
    g = fixed_sum.load(g_ptr + offs, m)
    u = fixed_sum.load(u_ptr + offs, m)
    if CLEAR:
        fixed_sum.clear(g_ptr + offs, m)
        fixed_sum.clear(u_ptr + offs, m)
    act = _rne(g * tl.sigmoid(g), dt)                             # F.silu rounds to the input dtype
    return _rne(act * u, dt)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, amax_ptr, I, g_stride, u_stride, NCH,
                     WRITE_Y: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """gate, up [T, I] (row strides given, e.g. halves of a merged gate_up), y [T, I] contiguous; grid (T, NCH).
    With QUANT each chunk's max |y| goes to amax [T, NCH] for _silu_mul_int8_kernel."""
    pdl_wait(PDL)
    t, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    y = _silu_mul_value(g_ptr + t * g_stride, u_ptr + t * u_stride, offs, m, not QUANT)
    if WRITE_Y:
        tl.store(y_ptr + t * I + offs, y, mask=m)
    if QUANT:
        tl.store(amax_ptr + t * NCH + c, tl.max(tl.abs(y), 0))


@triton.jit
def _silu_mul_int8_kernel(g_ptr, u_ptr, amax_ptr, q_ptr, s_ptr, I, g_stride, u_stride, NCH,
                          A8: tl.constexpr, BLOCK: tl.constexpr, NCHP: tl.constexpr, PDL: tl.constexpr):
    """grid (T, NCH): the row's scale from its chunk maxima, then this chunk's codes from y recomputed (the same
    instructions as the first pass, so bit-identical) rather than a row loop in one program per token."""
    pdl_wait(PDL)
    t, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i = tl.arange(0, NCHP)
    s = _int8_scale(tl.max(tl.load(amax_ptr + t * NCH + i, mask=i < NCH, other=0.0), 0))
    if c == 0:
        tl.store(s_ptr + t, s)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    m = offs < I
    y = _silu_mul_value(g_ptr + t * g_stride, u_ptr + t * u_stride, offs, m, True)
    _int8_store(q_ptr + t * I + _a8_pos(offs, A8), y, s, m)


# ------------------------------------------------------------------------------------------- host side
# Outputs may be passed in (graph capture: no allocation in the hot call); missing ones are allocated. The kernels
# write them as dense rows (each wrapper checks the given ones: check_dense).
def _buf(t, shape, dtype, device):
    return t if t is not None else torch.empty(shape, dtype=dtype, device=device)


def _check_a8_order(a8_order, quant, width):
    """a8_order (the W4A8 operand's k order) permutes int8 codes within blocks of 32 columns: quant, whole blocks
    (rows of add_rmsnorm and silu_mul, heads of gated_rmsnorm)."""
    assert not a8_order or (quant and width % 32 == 0), "a8_order: int8 output, whole 32-column blocks"


def add_rmsnorm(x, residual, w, eps, quant=False, h=None, y=None, q=None, s=None, a8_order=False):
    """x, residual [T, H] contiguous (residual None: h = x) -> (h, y), plus (q int8 [T, H], s [T]) when quant
    (a8_order: q in the W4A8 operand's k order, layers.quant.a8_permute, as kernels/int4_linear.w4a8_linear takes
    it with a8_order; likewise in gated_rmsnorm and silu_mul).
    Pass h=residual to update the residual stream in place. x may be a linear's int64 sums (with a residual):
    their 8-byte rows take 16 warps (H200, T 5 x 5120: 3.3 against 3.6 µs on 8; stored bf16 2.4 on 8).
    Tried and not kept (session 28, H200): a program per 512 columns, the row's programs meeting at a barrier (an
    arrival counter) for its sum of squares, and where they cannot all be resident one program per row summing the
    same chunks (the same bits either way): int64 sums T 1 / 5 / 20 2.45 / 2.62 / 3.01 against 3.24 / 3.37 / 3.40 µs
    alone, yet bench/layer_step at B1 T5 GDN / attention layer 82.7 / 90.7 against 82.9 / 92.1 µs and B4 ~1 µs
    slower; and that per-row path on 4 warps took 10.5 against 3.5 µs at T 64 (a wide row wants one 16-warp pass)."""
    T, H = x.shape
    check_dense("add_rmsnorm", x=x, residual=residual, w=w, h=h, y=y, q=q, s=s)
    assert residual is not None or not fixed_sum.deferred(x), "int64 sums are added to a residual"
    _check_a8_order(a8_order, quant, H)
    dt = fixed_sum.activation_dtype(x)
    h = x if residual is None else _buf(h, (T, H), dt, x.device)
    y = _buf(y, (T, H), dt, x.device)
    q, s = (_buf(q, (T, H), torch.int8, x.device), _buf(s, (T,), torch.float32, x.device)) if quant else (y, w)
    _add_rmsnorm_kernel[(T,)](x, x if residual is None else residual, w, h, y, q, s, H, eps,
                              HAS_RES=residual is not None, QUANT=quant, A8=a8_order,
                              BLOCK=triton.next_power_of_2(H), num_warps=16 if fixed_sum.deferred(x) else 8,
                              **pdl_args(x.device))
    return (h, y, q, s) if quant else (h, y)


def gated_rmsnorm(x, z, w, eps, quant=False, y=None, q=None, s=None, clear=None, heads=None, a8_order=False):
    """x [T, heads, D] contiguous, z [T, heads, D] (heads and D contiguous, any row stride; or a linear's int64
    sums) -> y [T, heads, D], plus (q int8 [T, heads·D], s [T]) per token when quant. clear: int64 sums [T, n]
    (unit column stride) that earlier kernels read but could not clear, zeroed here — the GDN layer's b and a,
    which every program of a head reads in gdn_verify (kernels/fixed_sum.py). heads: per program (all with
    quant), by default the most that give every SM two programs, at least 2. H200, 48 heads of 128: T 5, heads
    per program 48 / 16 / 8 / 4 / 2: stored z 3.42 / 1.45 / 1.28 / 1.33 / 1.26 µs, int64 sums 3.80 / 1.98 / 2.13
    / 1.79 / 1.44; T 40 48 / 2: 3.5 / 1.8; T 320 48 / 2: 7.9 / 9.9."""
    T, NH, D = x.shape
    assert x.is_contiguous() and z.shape == x.shape and z.stride(2) == 1 and z.stride(1) == D
    assert clear is None or (fixed_sum.deferred(clear) and clear.shape[0] == T and clear.stride(1) == 1)
    check_dense("gated_rmsnorm", w=w, y=y, q=q, s=s)
    _check_a8_order(a8_order, quant, D)
    y = _buf(y, (T, NH, D), x.dtype, x.device)
    q, s = (_buf(q, (T, NH * D), torch.int8, x.device), _buf(s, (T,), torch.float32, x.device)) if quant else (y, w)
    c, nc = (clear, clear.shape[1]) if clear is not None else (z, 0)
    top = triton.next_power_of_2(NH)
    if quant:
        bh = top
    elif heads:
        bh = triton.next_power_of_2(heads)
    else:                                                           # top, top / 2, ..., 2
        bh = filling_tile([top >> i for i in range(top.bit_length() - 1)] or [1], lambda h: T * triton.cdiv(NH, h),
                          x.device)
    _gated_rmsnorm_kernel[(T, triton.cdiv(NH, bh))](x, z, w, y, q, s, c, NH, D, z.stride(0), nc, c.stride(0), eps,
                                                    QUANT=quant, A8=a8_order, W_ROUNDS=w.dtype == x.dtype, BH=bh,
                                                    BD=triton.next_power_of_2(D),
                                                    BC=triton.next_power_of_2(nc) if nc else 0,
                                                    num_warps=max(1, min(8, bh // 2)), **pdl_args(x.device))
    return (y, q, s) if quant else y


def qk_norm_rope(qg, k, q_w, k_w, cos, sin, heads, kv_heads, eps, sigmoid_gate=False, q=None, k_out=None,
                 gate=None, v=None, kv=None):
    """qg [T, heads·2D] (q_proj output, per head [q_h | gate_h]), k [T, kv_heads·D], cos/sin [T, rd]
    (layers.model.rope_tables) -> q [T, heads, D], k [T, kv_heads, D] normed and rotated, gate [T, heads, D].
    kv = (k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens) with v [T, kv_heads·D]: the T rows are
    len(cache_rows) batch rows of T / len(cache_rows) new tokens, and k (as returned) and v also go into the caches
    as kernels/kv_write.write_kv would put them (one launch less)."""
    T = qg.shape[0]
    D = k.shape[1] // kv_heads
    assert qg.stride(1) == 1 and k.stride(1) == 1 and cos.stride(1) == 1 and cos.stride() == sin.stride()
    assert qg.dtype == k.dtype and (v is None or v.dtype == k.dtype)
    assert kv is not None or not fixed_sum.deferred(qg), "int64 sums: v is read (and cleared) with the KV write"
    check_dense("qk_norm_rope", q_w=q_w, k_w=k_w, q=q, k_out=k_out, gate=gate)
    dt = fixed_sum.activation_dtype(qg)
    q = _buf(q, (T, heads, D), dt, qg.device)
    gate = _buf(gate, (T, heads, D), dt, qg.device)
    k_out = _buf(k_out, (T, kv_heads, D), dt, k.device)
    if kv is not None:
        cache_rows = kv[4]
        assert v is not None and v.shape == k.shape and v.stride(1) == 1, "v: [T, kv_heads·D] with the caches"
        assert T % cache_rows.shape[0] == 0, f"{T} rows are not {cache_rows.shape[0]} batch rows of equal length"
        ptrs, strides, fp8 = cache_args(*kv, kv_heads, D)
        write = (v, v.stride(0), T // cache_rows.shape[0], *ptrs, *strides, kv[0].shape[0], kv[0].shape[2])
    else:
        fp8, write = False, (k, 0, 1) + (k,) * 6 + (0,) * 9              # placeholders, never read
    _qk_norm_rope_kernel[(T, heads + kv_heads)](qg, k, q_w, k_w, cos, sin, q, k_out, gate, heads, kv_heads, D,
                                                cos.shape[1], eps, qg.stride(0), k.stride(0), cos.stride(0),
                                                *write, SIGMOID_GATE=sigmoid_gate, KV_WRITE=kv is not None, FP8=fp8,
                                                BD=triton.next_power_of_2(D), num_warps=2, **pdl_args(qg.device))
    return q, k_out, gate


def silu_mul(gate, up, quant=False, write_y=True, y=None, q=None, s=None, amax=None, block=1024, a8_order=False):
    """gate, up [T, I] (unit stride along I; e.g. the halves of a merged gate_up; or a linear's int64 sums,
    kernels/fixed_sum.py) -> y [T, I] and, when quant, (q int8 [T, I], s [T]); write_y=False skips y when only
    the int8 copy is consumed. amax [T, cdiv(I, block)] fp32 is the int8 scratch (pass it, like the outputs, for
    graph capture). H200, T 5 x 17408, block 4096 / 2048 / 1024 / 512: stored 1.57 / 1.33 / 1.14 / 1.38 µs,
    int64 sums 3.36 / 2.45 / 1.64 / 1.86."""
    T, I = gate.shape
    assert gate.stride(1) == 1 and up.stride(1) == 1 and (write_y or quant) and gate.dtype == up.dtype
    _check_a8_order(a8_order, quant, I)
    check_dense("silu_mul", y=y, q=q, s=s, amax=amax)
    block = min(block, triton.next_power_of_2(I))
    nch = triton.cdiv(I, block)
    y = _buf(y, (T, I), fixed_sum.activation_dtype(gate), gate.device) if write_y else None
    if quant:
        q, s = _buf(q, (T, I), torch.int8, gate.device), _buf(s, (T,), torch.float32, gate.device)
        amax = _buf(amax, (T, nch), torch.float32, gate.device)
    _silu_mul_kernel[(T, nch)](gate, up, y if write_y else gate, amax if quant else gate, I, gate.stride(0),
                               up.stride(0), nch, WRITE_Y=write_y, QUANT=quant, BLOCK=block, num_warps=8,
                               **pdl_args(gate.device))
    if not quant:
        return y
    _silu_mul_int8_kernel[(T, nch)](gate, up, amax, q, s, I, gate.stride(0), up.stride(0), nch, A8=a8_order,
                                    BLOCK=block, NCHP=triton.next_power_of_2(nch), num_warps=8,
                                    **pdl_args(gate.device))
    return tuple(o for o in (y, q, s) if o is not None)
