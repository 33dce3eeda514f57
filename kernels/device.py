"""The GPU a launch runs on, as the kernels' launch defaults see it. On the CPU (Triton's interpreter) it answers
as an sm_90 part, so the interpreter runs the Hopper defaults; tests/aot_compile.py answers for other targets."""
import torch


def capability(t: torch.Tensor) -> tuple:
    """Compute capability of the tensor's GPU, e.g. (8, 6) for an RTX 3090, (9, 0) for an H200."""
    return torch.cuda.get_device_capability(t.device) if t.is_cuda else (9, 0)
