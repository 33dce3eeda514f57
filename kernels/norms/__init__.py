"""Fused norms and activations, optionally with int8 per-token outputs (layers/quant's W4A8 activations):
add_rmsnorm (residual add + RMSNorm), gated_rmsnorm (the GDN output norm), qk_norm_rope (q/k norms, partial RoPE,
the gate split and the KV write), silu_mul. One variant each; references in ref.py."""
from kernels.norms.gated import gated_rmsnorm
from kernels.norms.rmsnorm import add_rmsnorm
from kernels.norms.rope import qk_norm_rope
from kernels.norms.silu import silu_mul

__all__ = ["add_rmsnorm", "gated_rmsnorm", "qk_norm_rope", "silu_mul"]
