"""What a launch that does nothing but move a kernel's bytes achieves in bench.harness.time_us: the floor under the
kernel's fraction of the copy peak. A kernel of the same bytes that reads them after waiting for the launch before
it cannot beat it (it moves those bytes and more: dependent loads, arithmetic). Reads that need no wait (a GEMV's
weights, constants of the step) may start under the launch before, as far as the shared memory and registers it
leaves free allow: only that overlap takes back the launches' fixed cost (docs/notes/bench.md).

`read_floor_us`: read nbytes once (a GEMV's weights, the KV of an attention step). `read_write_floor_us`: read
nbytes once and write them `copies` times (a GDN verify step: its state read, the state after each token written),
optionally with every write depending on a few words read after the wait (its q, k, v, a and b, which the launch
before it writes: the floor of a kernel whose outputs all depend on its step's inputs).
Each is the best over a few launch shapes, with and without programmatic dependent launch (where the GPU has it;
the read-write floor's reads may then start before the previous launch completes, its writes wait for it), from a
rotation of buffers (bench.harness.Rotation, every copy in the timed graph), so every byte comes from or goes to HBM."""
import itertools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from bench.harness import Rotation, time_us
from kernels import device as gpu

BLOCKS = (1024, 2048)           # int32 words a program moves per step (4 warps: 8 or 16 a thread)
INPUT_WORDS = tl.constexpr(4096)  # the inputs a dependent launch reads: 16 KB, in L2 as the step's activations are


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _stream_kernel(src_ptr, dst_ptr, fold_ptr, in_ptr, n_words, per_prog, COPIES: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr, EARLY: tl.constexpr, INPUTS: tl.constexpr):
    # src int32 [n_words], dst int32 [COPIES, n_words], fold int32 [programs], inputs int32 [INPUT_WORDS]. Program p
    # reads words [p·per_prog, (p + 1)·per_prog) once and writes them to each of dst's COPIES rows (COPIES 0: folds
    # them into fold[p], a word a program). PDL: lets the next launch start at once, and waits for the previous one
    # before everything, or (EARLY, with COPIES) only before its first write, so that its first reads overlap the
    # previous launch, as a kernel's loads of what no kernel of the step writes may (a read-only launch reading
    # everything before its wait would not be a kernel's floor: one that computes must wait for its inputs first).
    # INPUTS: what it writes is xor-ed with words of `inputs` read after the wait (the step's activations, which
    # the launch before writes: no write can leave before they arrive).
    if PDL:
        gdc_launch_dependents()
        if not EARLY:
            gdc_wait()
    p = tl.program_id(0)
    lo = p.to(tl.int64) * per_prog         # int64: B64 at 64k context reads 2^31 words and more
    hi = tl.minimum(lo + per_prog, n_words)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(lo, hi, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        ok = offs < hi
        x = tl.load(src_ptr + offs, mask=ok, other=0)
        if COPIES == 0:
            acc ^= x
        else:
            if PDL and EARLY:
                if i == lo:
                    gdc_wait()
            if INPUTS:
                x ^= tl.load(in_ptr + (offs & (INPUT_WORDS - 1)))
            for c in tl.static_range(COPIES):
                tl.store(dst_ptr + c * n_words + offs, x, mask=ok)
    if COPIES == 0:
        tl.store(fold_ptr + p, tl.reduce(acc, 0, _xor))


def _best(nbytes: int, copies: int, inputs: bool = False) -> float:
    """The least time over the launch shapes and PDL placements (µs)."""
    dev = torch.device("cuda")
    n = nbytes // 4
    def pair():                                         # a source and its destination (a word when none)
        return (torch.empty(n, dtype=torch.int32, device=dev),
                torch.empty(max(1, copies * n), dtype=torch.int32, device=dev))
    buffers = Rotation(pair, nbytes * (1 + copies))
    fold = torch.empty(16 * gpu.num_sms(dev), dtype=torch.int32, device=dev)
    words_in = torch.zeros(INPUT_WORDS.value, dtype=torch.int32, device=dev)
    modes = [(False, False)] + ([(True, False)] + [(True, True)] * (copies > 0) if gpu.pdl(dev) else [])
    best = float("inf")
    for per_sm, block, (pdl, early) in itertools.product((4, 8, 16), BLOCKS, modes):
        per = triton.cdiv(triton.cdiv(n, per_sm * gpu.num_sms(dev)), block) * block
        grid = (triton.cdiv(n, per),)

        def call():
            src, dst = buffers()
            _stream_kernel[grid](src, dst, fold, words_in, n, per, copies, block, pdl, early, inputs, num_warps=4,
                                 launch_pdl=pdl)
        best = min(best, time_us(call, reps=buffers.reps))
    return best


def read_floor_us(nbytes: int) -> float:
    """The least time in which a launch reads nbytes (a multiple of 4) in this harness."""
    return _best(nbytes, 0)


def read_write_floor_us(nbytes: int, copies: int, inputs: bool = False) -> float:
    """The least time in which a launch reads nbytes once and writes them `copies` times; inputs: writes that also
    depend on a few words read after its wait (a GDN verify's q, k, v, a, b: its every state depends on them)."""
    return _best(nbytes, copies, inputs)
