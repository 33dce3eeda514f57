"""The GPU a launch runs on, as the kernels' launch defaults see it. On the CPU (Triton's interpreter) it answers
as a small sm_90 part, so the interpreter runs the Hopper defaults on few programs; tests/aot_compile.py answers
for other targets by replacing these two functions. INTERPRET: kernels run in Triton's interpreter (tests/conftest.py
sets it on the CPU), where some take exact fp32 paths (ENGINE.md §7)."""
import functools
import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def capability(dev: torch.device) -> tuple:
    """Compute capability, e.g. (8, 6) for an RTX 3090, (9, 0) for an H200."""
    return torch.cuda.get_device_capability(dev) if dev.type == "cuda" else (9, 0)


@functools.lru_cache(maxsize=None)
def num_sms(dev: torch.device) -> int:
    """Streaming multiprocessors: the grid size that fills the GPU (4 on the CPU keeps interpreter grids small)."""
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
