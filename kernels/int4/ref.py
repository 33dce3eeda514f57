"""The int4 linears' plain-torch references (torch only): the products of the dequantised weights in fp32."""
import torch

from layers.quant import Int4Weight, dequantize_int4


def int4_linear_ref(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x [..., K] @ dequantize_int4(w).T in fp32 → [..., N]."""
    return x.float() @ dequantize_int4(w).T


def w4a8_linear_ref(x_q: torch.Tensor, s_a: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """(int8 codes x_q [..., K] · per-token scales s_a [...]) @ dequantize_int4(w).T in fp32 → [..., N]."""
    return (x_q.float() * s_a[..., None]) @ dequantize_int4(w).T
