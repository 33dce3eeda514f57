"""The GPU a launch runs on, as the launch defaults see it, and the device-side helpers every kernel shares.

`capability`, `num_sms` and `smem_per_sm` read a CUDA device's properties; on any other device they answer only
inside `simulated(Gpu(...))` (the CPU tests run the interpreter as a small sm_90; tools/aot_compile.py targets
sm_86 and sm_90 on meta tensors).

Programmatic dependent launch (sm_90+): a kernel launched with launch_pdl=True may start while its predecessor
finishes, so it may load, before `pdl_wait`, only what no kernel of the step writes (weights, earlier steps' caches,
host-copied per-step inputs). It calls `pdl_wait` on every path before reading anything an earlier kernel wrote
and before writing anything; the wait returns once every earlier kernel has completed."""
import contextlib
import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Gpu:
    """What the launch defaults read of a GPU: compute capability, multiprocessors, shared memory per SM (bytes)."""
    capability: tuple
    num_sms: int
    smem_per_sm: int


INTERPRETER_GPU = Gpu((9, 0), 4, 233472)   # the tests' CPU: Hopper defaults on few programs
_simulated = []                            # innermost simulated() first
_pdl_off = []


@contextlib.contextmanager
def simulated(gpu: Gpu):
    """Within the block every device (the CPU, meta tensors) answers as `gpu`."""
    _simulated.insert(0, gpu)
    try:
        yield gpu
    finally:
        _simulated.remove(gpu)


@functools.lru_cache(maxsize=None)
def _cuda_gpu(dev: torch.device) -> Gpu:
    props = torch.cuda.get_device_properties(dev)
    return Gpu(torch.cuda.get_device_capability(dev), props.multi_processor_count,
               props.shared_memory_per_multiprocessor)


def gpu_of(dev) -> Gpu:
    """The Gpu a launch on `dev` targets: the simulated one inside `simulated`, else the CUDA device's own."""
    if _simulated:
        return _simulated[0]
    dev = torch.device(dev)
    if dev.type != "cuda":
        raise RuntimeError(f"kernels launch on CUDA devices; on {dev.type} only inside kernels.device.simulated()")
    return _cuda_gpu(dev)


def capability(dev) -> tuple:
    """Compute capability, e.g. (8, 6) for an RTX 3090, (9, 0) for an H200."""
    return gpu_of(dev).capability


def num_sms(dev) -> int:
    """Streaming multiprocessors: the grid size that fills the GPU."""
    return gpu_of(dev).num_sms


def smem_per_sm(dev) -> int:
    """Shared memory per multiprocessor in bytes."""
    return gpu_of(dev).smem_per_sm


def check_not_capturing(what: str, device) -> None:
    """State kept across calls (a cached index, a grown workspace) must be made outside CUDA-graph capture, where
    only that graph's replays would fill it. AssertionError: warm up first."""
    dev = torch.device(device)
    assert not (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()), \
        f"{what}: made during CUDA-graph capture; run the call once before capturing (warm-up)"


def check_dense(where: str, **tensors) -> None:
    """Each tensor given (None: skipped) must be contiguous, as `where`'s kernel indexes it as dense rows."""
    for name, t in tensors.items():
        assert t is None or t.is_contiguous(), \
            f"{where}: {name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})"


def filling_tile(tiles, programs, dev: torch.device, per_sm: int = 2):
    """The first of `tiles` (widest first) whose programs(tile) programs put per_sm on every SM, else the last."""
    return next((t for t in tiles if programs(t) >= per_sm * num_sms(dev)), tiles[-1])


@contextlib.contextmanager
def pdl_disabled():
    """Launches inside the block run without programmatic dependent launch (to measure what the overlap saves)."""
    _pdl_off.append(True)
    try:
        yield
    finally:
        _pdl_off.pop()


def pdl(dev: torch.device) -> bool:
    """Launch with programmatic dependent launch (griddepcontrol is sm_90+; the interpreter has no inline asm)."""
    return not _pdl_off and not INTERPRET and dev.type != "cpu" and capability(dev) >= (9, 0)


def pdl_args(dev: torch.device) -> dict:
    """Launch keywords for a kernel with a `PDL: tl.constexpr` parameter that calls pdl_wait."""
    on = pdl(dev)
    return dict(PDL=on, launch_pdl=on)


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the previous kernel of the stream (and so for all earlier ones); let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def load_accepted(ptr, last):
    """num_accepted − 1 from the count at ptr, clamped to [0, last] (clamped before the subtraction: no wrap)."""
    return tl.minimum(tl.maximum(tl.load(ptr), 1) - 1, last)


@triton.jit
def load_slot(ptr, num_slots):
    """The slot id at ptr, or -1 (a padding row: kernels touch nothing) for an id past the pool's num_slots."""
    slot = tl.load(ptr)
    return tl.where(slot < num_slots, slot, -1)
