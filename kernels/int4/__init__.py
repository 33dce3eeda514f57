"""Int4-weight linears: out[M, N] = x[M, K] @ W[N, K]ᵀ, W in the mma int4 layout (layers/quant.py), group 128.
int4_linear: W4A16 (x bf16/fp16). w4a8_linear: int8 x_q with per-token scales (layers.quant.quantize_act_int8).

`config(x, w)` picks the variant:
  gemv.py      W4A16, ≤ MAX_ROWS (24) rows, symmetric weights, sm_80+
  wgmma_ws.py  sm_90, symmetric weights, W4A16 from 25 rows, W4A8 from 65, TMA-aligned rows (every 27B shape)
  mma.py       the rest: sm_8x from 25 rows, W4A8 below 65 rows, asymmetric weights, the CPU interpreter
A Config passed as cfg forces its variant. Reference: ref.int4_linear_ref."""
import torch

from kernels import fixed_sum
from kernels.int4 import gemv, mma, wgmma_ws
from kernels.int4.common import MAX_ROWS
from layers.quant import Int4Weight, a8_permute

__all__ = ["int4_linear", "w4a8_linear", "config", "defers", "MAX_ROWS"]


def config(x: torch.Tensor, w: Int4Weight):
    """The chosen variant's Config for this call (int8 x: W4A8)."""
    m = x.numel() // x.shape[-1]
    if gemv.supports(x, w):
        return gemv.config(m, w.n, w.k, x.device)
    a8 = x.dtype == torch.int8
    if wgmma_ws.supports(x, w):
        return wgmma_ws.config(m, w.n, w.k, x.device, a8)
    assert mma.supports(x, w), (x.dtype, x.shape, w.group)
    return mma.config(m, w.n, w.k, x.device, a8)


def defers(rows: int, device) -> bool:
    """Whether int4_linear of `rows` rows on `device` may write int64 sums (kernels/fixed_sum.py): the GEMV runs."""
    return gemv.runs(rows, device)


def int4_linear(x: torch.Tensor, w: Int4Weight, out: torch.Tensor = None, cfg=None) -> torch.Tensor:
    """x [..., K] bf16/fp16 → [..., N] in x's dtype, or into `out` (any float; or int64 zeros: kernels/fixed_sum)."""
    assert x.dtype in (torch.bfloat16, torch.float16)
    if out is None:
        out = torch.empty(*x.shape[:-1], w.n, dtype=x.dtype, device=x.device)
    cfg = cfg or config(x, w)
    if isinstance(cfg, gemv.Config):
        return gemv.launch(x, w, out, cfg)
    assert not fixed_sum.deferred(out), "int64 sums (kernels/fixed_sum.py) come from the GEMV's rows only"
    if isinstance(cfg, wgmma_ws.Config):
        return wgmma_ws.launch(x, w, out, cfg)
    return mma.launch(x, w, out, cfg)


def w4a8_linear(x_q: torch.Tensor, s_a: torch.Tensor, w: Int4Weight, out: torch.Tensor = None,
                out_dtype: torch.dtype = torch.bfloat16, cfg=None, a8_order: bool = False) -> torch.Tensor:
    """x_q int8 [..., K] with per-token fp32 scales s_a [...] → [..., N] in out_dtype (or into `out`); a8_order: x_q
    in the Hopper kernel's k order (layers.quant.a8_permute), which spares it a permuting copy."""
    assert x_q.dtype == torch.int8 and s_a.dtype == torch.float32 and s_a.is_contiguous()
    if out is None:
        out = torch.empty(*x_q.shape[:-1], w.n, dtype=out_dtype, device=x_q.device)
    cfg = cfg or config(x_q, w)
    if isinstance(cfg, wgmma_ws.Config):
        x_k = x_q.reshape(-1, w.k)
        return wgmma_ws.launch(x_k if a8_order else a8_permute(x_k), w, out, cfg, x_scale=s_a)
    return mma.launch(a8_permute(x_q, inverse=True) if a8_order else x_q, w, out, cfg, x_scale=s_a)
