"""Int8 embedding gather: out[t, :] = q[ids[t], :] · s[ids[t]] (per-row int8 table, e.g. embed_tokens).

Shapes: ids int32/int64 [T] (any stride: e.g. a column of [B, k] drafts), q int8 [V, K] row-major, s [V]
fp16/bf16, out [T, K] bf16 (or any float dtype).
Reference: layers.quant.dequantize_int8(w)[ids]. One CTA per (token, K block): pure bandwidth, no reuse."""
import torch
import triton
import triton.language as tl

from layers.quant import Int8Weight


@triton.jit
def _int8_embedding_kernel(ids_ptr, ids_stride, qw_ptr, s_ptr, out_ptr, V, K, BLOCK_K: tl.constexpr):
    # grid (T, cdiv(K, BLOCK_K))
    t = tl.program_id(0)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = rk < K
    row = tl.minimum(tl.maximum(tl.load(ids_ptr + t * ids_stride).to(tl.int64), 0), V - 1)    # never outside the table
    q = tl.load(qw_ptr + row * K + rk, mask=k_ok, other=0)
    s = tl.load(s_ptr + row).to(tl.float32)
    tl.store(out_ptr + t.to(tl.int64) * K + rk, (q.to(tl.float32) * s).to(out_ptr.dtype.element_ty), mask=k_ok)


def int8_embedding(ids: torch.Tensor, w: Int8Weight, out: torch.Tensor = None,
                   out_dtype: torch.dtype = torch.bfloat16, block_k: int = 1024) -> torch.Tensor:
    """ids [...] → [..., K]. An id outside [0, V) (a −1 fill, garbage) gathers the nearest row, never memory
    past the table: the device cannot refuse it."""
    k = w.qweight.shape[1]
    flat = ids.reshape(-1)
    if out is None:
        out = torch.empty(*ids.shape, k, dtype=out_dtype, device=ids.device)
    assert out.is_contiguous() and out.numel() == flat.numel() * k
    if flat.numel():
        _int8_embedding_kernel[(flat.numel(), triton.cdiv(k, block_k))](flat, flat.stride(0), w.qweight, w.scales,
                                                                         out, w.qweight.shape[0], k, BLOCK_K=block_k)
    return out
