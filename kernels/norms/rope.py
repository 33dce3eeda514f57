"""qk_norm_rope: RMSNorm_1p and partial RoPE per q and k head, the gate split out (optionally sigmoid-ed), and
optionally the KV cache write (kernels/attention/kv_write.py). One program per (token, head)."""
from dataclasses import dataclass

import triton
import triton.language as tl

from kernels import fixed_sum
from kernels.device import check_dense, pdl_args, pdl_wait
from kernels.attention.kv_write import cache_args, store_token
from kernels.norms.common import buf, rne


@triton.jit
def _qk_norm_rope_kernel(qg_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, ko_ptr, gate_ptr,
                         HQ, HKV, D, RD, eps, qg_stride, k_stride, cs_stride,
                         v_ptr, v_stride, n_new, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr,
                         s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots, max_len,
                         SIGMOID_GATE: tl.constexpr, KV_WRITE: tl.constexpr, FP8: tl.constexpr, BD: tl.constexpr,
                         PDL: tl.constexpr):
    """qg [T, HQ·2D] rows [q_0 | gate_0 | q_1 …], k [T, HKV·D], cos/sin [T, RD] -> q, gate [T, HQ, D], k out
    [T, HKV, D]; grid (T, HQ + HKV). KV_WRITE: T = B rows × n_new tokens; k heads also store k and v. qg, k, v may
    be int64 sums."""
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
            g = rne(tl.sigmoid(g), dt)
        tl.store(gate_ptr + (t * HQ + h) * D + d, g, mask=m)
    else:
        src, w_ptr, dst = k_ptr + t * k_stride + (h - HQ) * D, kw_ptr, ko_ptr + (t * HKV + h - HQ) * D
    xf = fixed_sum.load(src + d, m)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / D + eps)
    y = rne(xf * rstd * (1.0 + tl.load(w_ptr + d, mask=m, other=0.0).to(tl.float32)), dt)
    # rotate_half partner of dim j < RD: j + RD/2 (negated) or j − RD/2
    half = RD // 2
    rot = d < RD
    pd = tl.where(d < half, d + half, d - half)
    xp = fixed_sum.load(src + pd, rot)
    fixed_sum.clear(src + d, m)                 # after every thread's reads, its partner's included
    yp = rne(xp * rstd * (1.0 + tl.load(w_ptr + pd, mask=rot, other=0.0).to(tl.float32)), dt)
    yp = tl.where(d < half, -yp, yp)
    c = tl.load(cos_ptr + t * cs_stride + d, mask=rot, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * cs_stride + d, mask=rot, other=0.0).to(tl.float32)
    # HF rounds r·cos and rotate_half(r)·sin to the activation dtype, then their sum
    out = tl.where(rot, rne(rne(y * c, dt) + rne(yp * s, dt), dt), y)
    tl.store(dst + d, out, mask=m)
    if KV_WRITE:
        if not is_q:
            v = fixed_sum.load(v_ptr + t * v_stride + (h - HQ) * D + d, m)
            fixed_sum.clear(v_ptr + t * v_stride + (h - HQ) * D + d, m)
            store_token(out, v, d, m, t // n_new, t % n_new, n_new, h - HQ, kc_ptr, vc_ptr, ks_ptr, vs_ptr,
                        rows_ptr, lens_ptr, s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots, max_len, FP8)


@dataclass(frozen=True)
class Config:
    num_warps: int = 2


def config() -> Config:
    return Config()


def launch(qg, k, q_w, k_w, cos, sin, heads, kv_heads, eps, sigmoid_gate, q, k_out, gate, v, kv, cfg: Config):
    T = qg.shape[0]
    D = k.shape[1] // kv_heads
    if kv is not None:
        ptrs, strides, fp8 = cache_args(*kv, kv_heads, D)
        write = (v, v.stride(0), T // kv[4].shape[0], *ptrs, *strides, kv[0].shape[0], kv[0].shape[2])
    else:
        fp8, write = False, (k, 0, 1) + (k,) * 6 + (0,) * 9              # placeholders, never read
    _qk_norm_rope_kernel[(T, heads + kv_heads)](qg, k, q_w, k_w, cos, sin, q, k_out, gate, heads, kv_heads, D,
                                                cos.shape[1], eps, qg.stride(0), k.stride(0), cos.stride(0),
                                                *write, SIGMOID_GATE=sigmoid_gate, KV_WRITE=kv is not None, FP8=fp8,
                                                BD=triton.next_power_of_2(D), num_warps=cfg.num_warps,
                                                **pdl_args(qg.device))


def qk_norm_rope(qg, k, q_w, k_w, cos, sin, heads, kv_heads, eps, sigmoid_gate=False, q=None, k_out=None,
                 gate=None, v=None, kv=None, cfg=None):
    """qg [T, heads·2D] (per head [q_h | gate_h]), k [T, kv_heads·D], cos/sin [T, rd] (ref.rope_tables) ->
    q [T, heads, D], k [T, kv_heads, D], gate [T, heads, D]. kv = (k_cache, v_cache, k_scale, v_scale, cache_rows,
    kv_lens), v [T, kv_heads·D]: k and v also written as write_kv does."""
    T = qg.shape[0]
    D = k.shape[1] // kv_heads
    assert qg.stride(1) == 1 and k.stride(1) == 1 and cos.stride(1) == 1 and cos.stride() == sin.stride()
    assert qg.dtype == k.dtype and (v is None or v.dtype == k.dtype)
    assert kv is not None or not fixed_sum.deferred(qg), "int64 sums: v is read (and cleared) with the KV write"
    check_dense("qk_norm_rope", q_w=q_w, k_w=k_w, q=q, k_out=k_out, gate=gate)
    dt = fixed_sum.activation_dtype(qg)
    q = buf(q, (T, heads, D), dt, qg.device)
    gate = buf(gate, (T, heads, D), dt, qg.device)
    k_out = buf(k_out, (T, kv_heads, D), dt, k.device)
    if kv is not None:
        cache_rows = kv[4]
        assert v is not None and v.shape == k.shape and v.stride(1) == 1, "v: [T, kv_heads·D] with the caches"
        assert T % cache_rows.shape[0] == 0, f"{T} rows are not {cache_rows.shape[0]} batch rows of equal length"
    launch(qg, k, q_w, k_w, cos, sin, heads, kv_heads, eps, sigmoid_gate, q, k_out, gate, v, kv, cfg or config())
    return q, k_out, gate
