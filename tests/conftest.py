"""Test setup. Without CUDA, Triton kernels run in its interpreter, which must be chosen before any kernel
module is imported (ENGINE.md §7), so it is set here, at the top of the first file pytest imports."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels import device as gpu  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def interpreter_gpu():
    """Without CUDA the kernels launch in Triton's interpreter, as on a small sm_90 part (kernels/device.py)."""
    if torch.cuda.is_available():
        yield None
    else:
        with gpu.simulated(gpu.INTERPRETER_GPU) as simulated:
            yield simulated


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
