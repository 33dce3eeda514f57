"""kernels/int8 in plain torch, from the dequantised weights."""
import torch

from layers.quant import Int8Weight, dequantize_int8


def int8_linear_ref(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x [..., K] -> fp32 [..., N]."""
    return x.float() @ dequantize_int8(w).T


def int8_embedding_ref(ids: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """ids [...] in [0, V) -> fp32 [..., K]."""
    return dequantize_int8(w)[ids.long()]
