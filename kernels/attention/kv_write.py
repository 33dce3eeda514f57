"""Writes new K/V tokens into the KV cache (e4m3 codes for an fp8 cache). The layout every attention kernel reads:
  k_cache, v_cache  [slots, Hkv, max_len, D]  uint8 e4m3 codes (x / scale) or bf16; K contiguous, V any strided
                                              view (kv_cache: keys-fastest); entries past a length must be finite
  k_scale, v_scale  [Hkv] fp32                per-(layer, kv-head) scales
  cache_rows        [B] int32                 slot of row b; < 0 or >= slots: a padding row, nothing touched
  kv_lens           [B] int32                 tokens cached for row b including the n new ones, which sit at
                                              positions kv_len - n … kv_len - 1"""
import torch
import triton
import triton.language as tl

from kernels.attention.fp8 import e4m3_encode
from kernels.device import check_dense, load_slot, pdl_args, pdl_wait


@triton.jit
def store_token(k, v, offs, mask, b, t, n_new, h, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr,
                s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots, max_len, FP8: tl.constexpr):
    """Token t of n_new of row b, kv head h: k, v fp32 [D] into the caches; nothing outside the row's slot."""
    slot = load_slot(rows_ptr + b, num_slots)
    pos = tl.load(lens_ptr + b) - n_new + t
    if (slot >= 0) & (pos >= 0) & (pos < max_len):
        dst = slot.to(tl.int64) * s_cs + h * s_ch + pos.to(tl.int64) * s_cn + offs
        v_dst = slot.to(tl.int64) * s_vcs + h * s_vch + pos.to(tl.int64) * s_vcn + offs * s_vcd
        if FP8:
            # exact division: the codes match torch's cast bit for bit
            k_out = e4m3_encode(tl.div_rn(k, tl.load(ks_ptr + h)))
            v_out = e4m3_encode(tl.div_rn(v, tl.load(vs_ptr + h)))
        else:
            k_out, v_out = k, v
        tl.store(kc_ptr + dst, k_out.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + v_dst, v_out.to(vc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_kv_len(ptr, slot, max_len):
    """A row's cached length as all readers take it: 0 for a padding row, at most max_len."""
    return tl.where(slot >= 0, tl.minimum(tl.load(ptr), max_len), 0)


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr, n_new,
                     s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots,
                     max_len, D: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr):
    # k, v [B, n_new, Hkv, D], D contiguous. Grid (B * n_new, Hkv): a token of a kv head per program.
    pdl_wait(PDL)
    b = tl.program_id(0) // n_new
    t = tl.program_id(0) % n_new
    h = tl.program_id(1)
    offs = tl.arange(0, D)
    k = tl.load(k_ptr + b * s_kb + t * s_kt + h * s_kh + offs).to(tl.float32)
    v = tl.load(v_ptr + b * s_vb + t * s_vt + h * s_vh + offs).to(tl.float32)
    store_token(k, v, offs, offs < D, b, t, n_new, h, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr,
                s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots, max_len, FP8)


def kv_cache(num_slots: int, num_kv_heads: int, max_len: int, head_dim: int, dtype, device):
    """A zeroed (k_cache, v_cache) pair of dtype (uint8 or bf16), V keys-fastest. Allocate before any capture."""
    k = torch.zeros(num_slots, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)
    v = torch.zeros(num_slots, num_kv_heads, head_dim, max_len, dtype=dtype, device=device).transpose(2, 3)
    return k, v


def cache_args(k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, hkv: int, head_dim: int):
    """Checked kernel arguments (fp8 caches as uint8, placeholder scales for bf16), cache strides, whether fp8."""
    assert v_cache.shape == k_cache.shape and k_cache.stride(-1) == 1, "caches: same shape, K head dim contiguous"
    assert k_cache.shape[1] == hkv and k_cache.shape[3] == head_dim, f"caches: shape {tuple(k_cache.shape)}"
    fp8 = k_cache.dtype in (torch.uint8, torch.float8_e4m3fn)
    check_dense("KV cache arguments", cache_rows=cache_rows, kv_lens=kv_lens,
                k_scale=k_scale if fp8 else None, v_scale=v_scale if fp8 else None)
    if fp8:
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    else:
        k_scale = v_scale = cache_rows  # unused placeholders for the pointer arguments
    return (k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens), (*k_cache.stride()[:3], *v_cache.stride()), fp8


def write_kv(k_new, v_new, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens):
    """k_new, v_new [B, n_new, Hkv, D] -> the last n_new positions of each row (scales None for bf16)."""
    B, n_new, hkv, D = k_new.shape
    assert k_new.stride(-1) == 1 and v_new.stride(-1) == 1
    ptrs, strides, fp8 = cache_args(k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, hkv, D)
    _kv_write_kernel[(B * n_new, hkv)](
        k_new, v_new, *ptrs, n_new, *k_new.stride()[:3], *v_new.stride()[:3], *strides, k_cache.shape[0],
        k_cache.shape[2], D=D, FP8=fp8, **pdl_args(k_new.device))


def kv_scales_from(k, v):
    """Per-kv-head scales from sample K/V [..., Hkv, D]: max|k| / 200, max|v| / 100 (vLLM's rule)."""
    amax = lambda x: x.float().abs().flatten(0, -3).amax(dim=(0, 2)).clamp_min(1e-6)  # noqa: E731
    return (amax(k) / 200.0).contiguous(), (amax(v) / 100.0).contiguous()


def v_transposed(v_cache):
    """The same V cache stored keys-fastest (the same [.., max_len, D] view)."""
    return v_cache.transpose(2, 3).contiguous().transpose(2, 3)
