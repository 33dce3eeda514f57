"""Plain-torch references of the attention kernels, the KV writer and the e4m3 codec (torch only)."""
import math

import torch

E4M3_MAX = 448.0


def decode_e4m3_ref(bits: torch.Tensor, scale=1.0) -> torch.Tensor:
    """uint8 e4m3 codes -> fp32 values times `scale` (broadcasting)."""
    return bits.view(torch.float8_e4m3fn).float() * scale


def encode_e4m3_ref(x: torch.Tensor, scale=1.0) -> torch.Tensor:
    """x / scale -> uint8 e4m3 codes, saturated to ±448, round to nearest even."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def dequantize_kv_ref(cache, scale, slot: int, length: int) -> torch.Tensor:
    """fp32 [Hkv, length, D] of one slot of a cache."""
    if cache.dtype == torch.bfloat16:
        return cache[slot, :, :length].float()
    return decode_e4m3_ref(cache.view(torch.uint8)[slot, :, :length], scale.view(-1, 1, 1))


def attention_ref(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens) -> torch.Tensor:
    """verify_attention / prefill_attention in fp32: [B, q_len, Hq, D]."""
    B, q_len, hq, D = q.shape
    G = hq // k_cache.shape[1]
    out = torch.zeros(B, q_len, hq, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        slot, length = int(cache_rows[b]), int(kv_lens[b])
        if slot < 0:
            continue
        k = dequantize_kv_ref(k_cache, k_scale, slot, length).repeat_interleave(G, 0)  # [Hq, L, D]: h -> h // G
        v = dequantize_kv_ref(v_cache, v_scale, slot, length).repeat_interleave(G, 0)
        s = torch.einsum("thd,hld->htl", q[b].float(), k) / math.sqrt(D)
        pos = torch.arange(length, device=q.device)
        allowed = pos[None, :] <= (length - q_len + torch.arange(q_len, device=q.device))[:, None]  # [t, L]
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
        out[b] = torch.einsum("htl,hld->thd", p, v)
    return out


def write_kv_ref(k_new, v_new, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens):
    """write_kv (same arguments, writes in place)."""
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
