"""Fused norms and activations, optionally with int8 per-token outputs; references in ref.py. The ops load on first
use, so that kernels.norms.ref (layers/model.py's) needs torch only."""
import importlib

_MODULES = {"add_rmsnorm": "rmsnorm", "gated_rmsnorm": "gated", "qk_norm_rope": "rope", "silu_mul": "silu"}
__all__ = list(_MODULES)


def __getattr__(name):
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
