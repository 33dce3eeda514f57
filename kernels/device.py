"""The GPU a launch runs on, as the kernels' launch defaults see it. On the CPU (Triton's interpreter) it answers
as a small sm_90 part, so the interpreter runs the Hopper defaults on few programs; tests/aot_compile.py answers
for other targets by replacing num_sms, capability and smem_per_sm. INTERPRET: kernels run in Triton's
interpreter (tests/conftest.py sets it on the CPU), where some take exact fp32 paths (ENGINE.md §7).

Programmatic dependent launch (sm_90+, `pdl`): a kernel launched with launch_pdl=True may start while the previous
kernel of the stream finishes, so its launch and its loads of data no kernel of the step writes (weights, caches
of earlier steps, sampling parameters) overlap the predecessor — so a step's per-replay inputs that kernels read
early (sampling parameters; with attention's `fresh`, cache rows and lengths) must come from host copies made
before the replay, never from a kernel of the same graph. Such a kernel calls `pdl_wait` on every path
before it reads anything an earlier kernel wrote and before it writes anything; `pdl_wait` returns once the
previous kernel has completed, which (since that one waited too) means every earlier kernel has. Captured into
a CUDA graph the overlap holds (H200, bench.harness.time_us: a launch spinning 3 µs before its wait and 3 µs after
it, back to back, 4.0 µs a launch against 7.1 without PDL).
`load_slot` reads a per-sequence slot id of a KV cache or state pool for every kernel that indexes one,
`load_accepted` a sequence's accepted-draft count as the index of its last accepted token."""
import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def capability(dev: torch.device) -> tuple:
    """Compute capability, e.g. (8, 6) for an RTX 3090, (9, 0) for an H200."""
    return torch.cuda.get_device_capability(dev) if dev.type == "cuda" else (9, 0)


@functools.lru_cache(maxsize=None)
def num_sms(dev: torch.device) -> int:
    """Streaming multiprocessors: the grid size that fills the GPU (4 on the CPU keeps interpreter grids small)."""
    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4


@functools.lru_cache(maxsize=None)
def smem_per_sm(dev: torch.device) -> int:
    """Shared memory per multiprocessor in bytes (an H200's 228 KiB off the GPU)."""
    if dev.type != "cuda":
        return 233472
    return torch.cuda.get_device_properties(dev).shared_memory_per_multiprocessor


def check_not_capturing(what: str, device) -> None:
    """State kept across calls (a cached index, a grown workspace) must be made outside CUDA-graph capture: made
    inside it, its contents come from kernels that only that graph's replays run, and every other user — eager
    calls, graphs captured later — reads garbage until the first replay. AssertionError: warm up first."""
    dev = torch.device(device)
    assert not (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()), \
        f"{what}: made during CUDA-graph capture; run the call once before capturing (warm-up)"


def check_dense(where: str, **tensors) -> None:
    """Each tensor given (None: skipped) must be contiguous: `where`'s kernel indexes it as dense rows, so a view (a
    column of a [B, n] table, a slice of a wider buffer) would be read or written at the wrong elements, silently.
    AssertionError naming the argument, as the wrappers' other checks."""
    for name, t in tensors.items():
        assert t is None or t.is_contiguous(), \
            f"{where}: {name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})"


def filling_tile(tiles, programs, dev: torch.device, per_sm: int = 2):
    """The first of `tiles` (widest first) whose launch of programs(tile) programs still puts per_sm on every SM;
    else the last: the narrowest that small batches need to spread their bytes, without the many small programs
    that slow wide batches down."""
    return next((t for t in tiles if programs(t) >= per_sm * num_sms(dev)), tiles[-1])


PDL_ENABLED = True      # bench/layer_step.py turns it off to measure what the overlap saves


def pdl(dev: torch.device) -> bool:
    """Launch with programmatic dependent launch (griddepcontrol is sm_90+; the interpreter has no inline asm)."""
    return PDL_ENABLED and not INTERPRET and dev.type != "cpu" and capability(dev) >= (9, 0)


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
    """The index of a sequence's last accepted token, num_accepted − 1 from the count at ptr, clamped to [0, last]:
    a count of 0 or garbage never indexes out of bounds (−2^31 included: the clamp comes before the subtraction,
    which cannot wrap then)."""
    return tl.minimum(tl.maximum(tl.load(ptr), 1) - 1, last)


@triton.jit
def load_slot(ptr, num_slots):
    """The slot id at ptr of a cache or pool of num_slots slots, or -1 for an id past it: every kernel reads and
    writes nothing for a negative id (a padding row), so a slot id >= num_slots (garbage in a captured step's
    inputs, which no wrapper can inspect) touches nothing outside the pool either."""
    slot = tl.load(ptr)
    return tl.where(slot < num_slots, slot, -1)
