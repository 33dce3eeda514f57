"""Int8 embedding gather: out[t, :] = q[ids[t], :] · s[ids[t]]; ids [T] any stride, q int8 [V, K], s [V], out
[T, K] contiguous. One program per (token, K block)."""
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Config:
    block_k: int = 1024


def config() -> Config:
    return Config()


def launch(flat: torch.Tensor, w: Int8Weight, out: torch.Tensor, cfg: Config) -> None:
    """flat ids [T] (T > 0), out [T, K] contiguous."""
    k = w.qweight.shape[1]
    _int8_embedding_kernel[(flat.numel(), triton.cdiv(k, cfg.block_k))](flat, flat.stride(0), w.qweight, w.scales,
                                                                         out, w.qweight.shape[0], k,
                                                                         BLOCK_K=cfg.block_k)
