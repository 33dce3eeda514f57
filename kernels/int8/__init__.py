"""Int8 weights with per-row scales: the lm_head as a linear, the embedding as a gather (references: ref.py)."""
import torch

from kernels.int8 import embedding, linear
from layers.quant import Int8Weight


def int8_linear(x: torch.Tensor, w: Int8Weight, out: torch.Tensor = None, cfg: linear.Config = None) -> torch.Tensor:
    """x [..., K] bf16/fp16 → [..., N] in x's dtype, or written into `out` (e.g. fp32 logits)."""
    n, k = w.qweight.shape
    assert x.shape[-1] == k and x.stride(-1) == 1 and w.qweight.is_contiguous()
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if out is None:
        out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, n)
    assert out2.shape[0] == m and out2.stride(-1) == 1
    if m:
        linear.launch(x2, w, out2, cfg or linear.config(m, x.device))
    return out


def int8_embedding(ids: torch.Tensor, w: Int8Weight, out: torch.Tensor = None,
                   out_dtype: torch.dtype = torch.bfloat16, cfg: embedding.Config = None) -> torch.Tensor:
    """ids [...] → [..., K]. An id outside [0, V) gathers the nearest row."""
    k = w.qweight.shape[1]
    flat = ids.reshape(-1)
    if out is None:
        out = torch.empty(*ids.shape, k, dtype=out_dtype, device=ids.device)
    assert out.is_contiguous() and out.numel() == flat.numel() * k
    if flat.numel():
        embedding.launch(flat, w, out, cfg or embedding.config())
    return out
