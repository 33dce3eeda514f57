"""Write new K/V tokens into the attention KV cache, quantising to fp8 e4m3 on the way in.
KV cache layout (one pair per full-attention layer, shared by every kernel in kernels/attention_*.py):
  k_cache, v_cache  [num_slots, Hkv, max_len, D]   uint8 (e4m3 codes) or bf16; one slot per resident sequence
  k_scale, v_scale  [Hkv] fp32                      per-(layer, kv-head) static scales; stored code = x / scale
  cache_rows        [B] int32                       slot of batch row b; < 0 marks a padding row (skipped), as
                                                    does one >= num_slots (the caller's error: nothing touched)
  kv_lens           [B] int32                       tokens in the cache for row b INCLUDING the new ones, so the
                                                    n new tokens of row b sit at positions kv_len - n … kv_len - 1
K is contiguous (one token of one head a D-vector). V may be any strided view of that shape; kv_cache() stores it
keys-fastest ([slots, Hkv, D, max_len] memory), the layout in which the attention's P·V operand is read as whole
words: on the H200, fp8, 11-13% faster than D-fastest V (B1 16k 22.1 -> 19.6 µs, 64k 60.7 -> 53.2, B64 16k
861 -> 764). The kernels read V up to max_len, not the sequence's length (so the loads vectorise along the keys):
entries past a sequence's length must be finite, which a zeroed cache and write_kv keep true."""
import torch
import triton
import triton.language as tl

from kernels.device import check_dense, load_slot, pdl_args, pdl_wait
from kernels.fp8 import e4m3_encode, encode_e4m3_ref


@triton.jit
def store_token(k, v, offs, mask, b, t, n_new, h, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr,
                s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots, max_len, FP8: tl.constexpr):
    """New token t (of n_new) of batch row b, kv head h: k, v fp32 [D] (elements offs where mask) into the caches
    (strides s_c*: k, D contiguous; s_vc*: v, any; num_slots slots of max_len positions), as e4m3(x / scale) codes
    when FP8; nothing for a padding row (a slot < 0 or >= num_slots), nor at a position outside the slot (a length
    short of n_new or past max_len: the caller's error, which must not write into a neighbouring slot or outside
    the cache)."""
    slot = load_slot(rows_ptr + b, num_slots)
    pos = tl.load(lens_ptr + b) - n_new + t
    if (slot >= 0) & (pos >= 0) & (pos < max_len):
        dst = slot.to(tl.int64) * s_cs + h * s_ch + pos.to(tl.int64) * s_cn + offs
        v_dst = slot.to(tl.int64) * s_vcs + h * s_vch + pos.to(tl.int64) * s_vcn + offs * s_vcd
        if FP8:
            # exact division so the codes match torch's reference cast bit for bit
            k_out = e4m3_encode(tl.div_rn(k, tl.load(ks_ptr + h)))
            v_out = e4m3_encode(tl.div_rn(v, tl.load(vs_ptr + h)))
        else:
            k_out, v_out = k, v
        tl.store(kc_ptr + dst, k_out.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + v_dst, v_out.to(vc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_kv_len(ptr, slot, max_len):
    """A batch row's cached length (kv_lens at ptr) as every reader of the cache takes it — the attention kernels
    and the combine must agree, or the combine reads partials no program wrote: 0 for a padding row (slot < 0:
    device.load_slot), at most max_len (a longer one, the caller's error, reads no other slot)."""
    return tl.where(slot >= 0, tl.minimum(tl.load(ptr), max_len), 0)


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr, n_new,
                     s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_cs, s_ch, s_cn, s_vcs, s_vch, s_vcn, s_vcd, num_slots,
                     max_len, D: tl.constexpr, FP8: tl.constexpr, PDL: tl.constexpr):
    # k, v: [B, n_new, Hkv, D] (strides s_*b, s_*t, s_*h; D contiguous); caches [slots, Hkv, max_len, D]
    # (k cache strides s_c*, D contiguous; v cache strides s_vc*, any). Grid (B * n_new, Hkv): one token of one kv
    # head per program.
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
    """A zeroed (k_cache, v_cache) pair [num_slots, Hkv, max_len, D] of dtype (torch.uint8 for e4m3 codes, or
    torch.bfloat16), V stored keys-fastest. Allocate once, before any graph capture."""
    k = torch.zeros(num_slots, num_kv_heads, max_len, head_dim, dtype=dtype, device=device)
    v = torch.zeros(num_slots, num_kv_heads, head_dim, max_len, dtype=dtype, device=device).transpose(2, 3)
    return k, v


def cache_args(k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, hkv: int, head_dim: int):
    """The cache arguments of the kernels that write or read the caches (store_token after the row and head, the
    attention kernels of kernels/attention_verify.py after q), checked: (k cache, v cache, k scale, v scale, cache
    rows, kv lens) with e4m3 caches as uint8 and the scales' pointers as placeholders for bf16 caches; the cache
    strides (k [3], v [4]); and whether the caches are fp8."""
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
    """k_new, v_new [B, n_new, Hkv, D] -> caches at positions kv_lens[b] - n_new … kv_lens[b] - 1 of slot
    cache_rows[b]. fp8 (uint8) caches store e4m3(x / scale); bf16 caches ignore the scales (pass None).
    (kernels/norms.qk_norm_rope can do this write itself, as it makes k.)"""
    B, n_new, hkv, D = k_new.shape
    assert k_new.stride(-1) == 1 and v_new.stride(-1) == 1
    ptrs, strides, fp8 = cache_args(k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, hkv, D)
    _kv_write_kernel[(B * n_new, hkv)](
        k_new, v_new, *ptrs, n_new, *k_new.stride()[:3], *v_new.stride()[:3], *strides, k_cache.shape[0],
        k_cache.shape[2], D=D, FP8=fp8, **pdl_args(k_new.device))


def write_kv_ref(k_new, v_new, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens):
    """Plain-torch reference of write_kv (same arguments, writes in place)."""
    n_new = k_new.shape[1]
    fp8 = k_cache.dtype in (torch.uint8, torch.float8_e4m3fn)
    for b in range(k_new.shape[0]):
        slot = int(cache_rows[b])
        if slot < 0:
            continue
        end = int(kv_lens[b])
        for new, cache, scale in ((k_new, k_cache, k_scale), (v_new, v_cache, v_scale)):
            x = new[b].transpose(0, 1)  # [Hkv, n_new, D]
            if fp8:
                cache.view(torch.uint8)[slot, :, end - n_new:end] = encode_e4m3_ref(x, scale.view(-1, 1, 1))
            else:
                cache[slot, :, end - n_new:end] = x.to(cache.dtype)


def kv_scales_from(k, v):
    """Per-kv-head scales from sample K/V [..., Hkv, D] using the vLLM on-the-fly rule (max|k|/200, max|v|/100,
    ENGINE.md §5), clamped away from zero; a calibration pass would replace these."""
    amax = lambda x: x.float().abs().flatten(0, -3).amax(dim=(0, 2)).clamp_min(1e-6)  # noqa: E731
    return (amax(k) / 200.0).contiguous(), (amax(v) / 100.0).contiguous()

