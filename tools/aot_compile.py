"""Compile every Triton kernel, as its wrapper launches it at the Qwen3.8-27B shapes, for sm_86 (RTX 3090) and
sm_90 (H100/H200) on a machine without a GPU: `python -m tools.aot_compile [86] [90]` (default both).

The interpreter runs the kernels' logic on the CPU but never compiles them, so it misses what only the compiler
sees: type errors in code paths it takes differently, launches that need more shared memory than the card has
(sm_86: 99 KiB per block), and int64 sums zeroed with no CTA barrier after their loads (unordered_clears).
Wrappers are called with meta tensors; their kernel launches are recorded instead of run, then compiled for each
target, one process per CPU. Must run without TRITON_INTERPRET (tests/test_kernels_compile.py starts it so)."""
import contextlib
import itertools
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import warnings

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import JITFunction, mangle_type

import kernels.attention as attention
import kernels.device as gpu
from kernels.gdn import causal_conv1d, gdn_prefill, gdn_verify, recurrent, recurrent_gluon
from kernels.int4 import gemv, int4_linear, mma, w4a8_linear, wgmma_ws
from kernels.int8 import int8_embedding, int8_linear
from kernels.norms import add_rmsnorm, gated_rmsnorm, qk_norm_rope, silu_mul
from kernels.precompile import workers
from kernels.sampler import SamplingTensors, rejection_sample, sample
from kernels.tables import commit, gather, pass_tables
from layers.config import qwen38_27b
from layers.quant import Int4Weight, Int8Weight

# per target: SMs, shared memory a CTA may hold, and an SM's (the launch tables' residency: kernels/device.smem_per_sm)
TARGETS = {86: dict(sms=82, smem=99 * 1024, smem_sm=100 * 1024), 90: dict(sms=132, smem=227 * 1024, smem_sm=228 * 1024)}
POINTER = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32",
           torch.int64: "*i64", torch.uint8: "*u8", torch.int8: "*i8", torch.bool: "*i1",
           torch.float8_e4m3fn: "*fp8e4nv"}
OPTIONS = ("num_warps", "num_stages", "launch_pdl", "maxnreg")
CFG = qwen38_27b()
H, V, I = CFG.hidden_size, CFG.vocab_size, CFG.intermediate_size                            # hidden, vocabulary, MLP
HQ, HKV, D = CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim                 # gated attention
HK, HV, DK = CFG.linear_num_key_heads, CFG.linear_num_value_heads, CFG.linear_key_head_dim  # GDN
B, T = 4, 5                                        # a batch bucket of 4 sequences verifying k = 4 drafts


def empty(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def launches():
    """Call every wrapper once per configuration the engine uses; yields a label per call."""
    rows_m = (1, B * T, 320)                        # decode, a verify bucket, 64 sequences × 5 tokens
    for n, k in CFG.linear_shapes.values():
        w = Int4Weight(empty(k // 128, n, 16, dtype=torch.int32), empty(k // 128, n, dtype=torch.float16))
        dev = torch.device("meta")
        for m in rows_m:                            # the Triton kernel (the sm_8x and interpreter path)
            mma.launch(empty(m, k), w, empty(m, n), mma.config(m, n, k, dev))
        for m in (1, 2, 5, 16, 20):                 # the GEMV
            gemv.launch(empty(m, k), w, empty(m, n), gemv.config(m, n, k, dev))
            gemv.launch(empty(m, k), w, empty(m, n, dtype=torch.int64), gemv.config(m, n, k, dev))    # deferred sums
        for m in rows_m:                            # as the dispatcher picks
            int4_linear(empty(m, k), w)
        if gpu.capability("meta") >= (9, 0):
            for tile in wgmma_ws.TOKEN_TILES:       # the warp-specialised form's tiles, overlap or not: the
                whole = tile[1] >= wgmma_ws.WHOLE_ONLY      # smaller cut in ranges, the larger whole
                m, programs = (sum(tile), -(-n // 128)) if whole else (320, 132)
                cut = dict(bm=tile[0], bm2=tile[1], programs=programs)
                for overlap in (True, False):
                    cfg = wgmma_ws.config(m, n, k, dev, overlap=overlap, **cut)
                    wgmma_ws.launch(empty(m, k), w, empty(m, n), cfg)
                if tile != wgmma_ws.TOKEN_TILES[-1]:        # W4A8 (plan never takes it the 256-token tile)
                    cfg = wgmma_ws.config(m, n, k, dev, a8=True, **cut)
                    wgmma_ws.launch(empty(m, k, dtype=torch.int8), w, empty(m, n), cfg,
                                    x_scale=empty(m, dtype=torch.float32))
            for tile in wgmma_ws.SMALL_TILES:       # 25-64 rows: whole tiles and stream-K ranges
                for programs in (-(-n // 128), 132):
                    m = tile[0]
                    wgmma_ws.launch(empty(m, k), w, empty(m, n),
                                    wgmma_ws.config(m, n, k, dev, bm=tile[0], bm2=tile[1], programs=programs))
        w4a8_linear(empty(320, k, dtype=torch.int8), empty(320, dtype=torch.float32), w)
        mma.launch(empty(320, k, dtype=torch.int8), w, empty(320, n), mma.config(320, n, k, dev, a8=True),
                   x_scale=empty(320, dtype=torch.float32))
        yield f"int4 {n}x{k}"
    head = Int8Weight(empty(V, H, dtype=torch.int8), empty(V, dtype=torch.float16))
    for m in rows_m:
        int8_linear(empty(m, H), head, out=empty(m, V, dtype=torch.float32))
    int8_embedding(empty(B * T, dtype=torch.int64), head)
    yield "int8 lm_head + embedding"
    rows, lens = empty(B, dtype=torch.int32), empty(B, dtype=torch.int32)
    scale = empty(HKV, dtype=torch.float32)
    for cache_dtype in (torch.uint8, torch.bfloat16):
        kc, vc = empty(B, HKV, 4096, D, dtype=cache_dtype), empty(B, HKV, D, 4096, dtype=cache_dtype).transpose(2, 3)
        fmts = (attention.KV_BF16,) if cache_dtype == torch.bfloat16 else \
            (attention.KV_FP8_BITS,) + ((attention.KV_FP8_NATIVE,) if gpu.capability("meta") >= (8, 9) else ())
        for fmt in fmts:
            q = empty(B, T, HQ, D)
            for nseg in (1, 16):                                     # the output written by attend / combine
                attention.verify_attention(q, kc, vc, scale, scale, rows, lens, empty(B, T, HQ, D),
                                           attention.alloc_partials(B, HQ, 8, 16, D, "meta"), nseg,
                                           gate=empty(B, T, HQ, D), cfg=attention.verify_config(q, kc, vc, fmt))
            qp = empty(1, 512, HQ, D)
            attention.prefill_attention(qp, kc, vc, scale, scale, rows[:1], lens[:1], empty(1, 512, HQ, D),
                                        cfg=attention.prefill.config(qp, kc, fmt))
        attention.write_kv(empty(B, T, HKV, D), empty(B, T, HKV, D), kc, vc, scale, scale, rows, lens)
    yield "attention verify + prefill + kv write"
    conv_dim = CFG.linear_conv_dim
    for state_dtype, dk_fastest in itertools.product((torch.float16, torch.float32), (False, True)):
        for width, gluon in ((B, False), (1, True), (B, True), (16, True)):      # the Gluon kernel's launches
            qk, v = empty(width, T, HK, DK), empty(width, T, HV, DK)
            pool = empty(width * T, HV, DK, DK, dtype=state_dtype)
            state = pool.transpose(-1, -2) if dk_fastest else pool
            gdn_verify(qk, qk, v, empty(width, T, HV), empty(width, T, HV),
                       empty(HV, dtype=torch.float32), empty(HV, dtype=torch.float32), state,
                       empty(width, T, dtype=torch.int32), empty(width, dtype=torch.int32),
                       cfg=(recurrent_gluon if gluon else recurrent).config(v, state))
    sums = empty(B, T, 2, HV, dtype=torch.int64)                        # b and a as deferred sums
    for gluon in (False, True):
        qk, v = empty(B, T, HK, DK), empty(B, T, HV, DK)
        state = empty(B * T, HV, DK, DK, dtype=torch.float16).transpose(-1, -2)
        gdn_verify(qk, qk, v, sums[:, :, 0], sums[:, :, 1], empty(HV, dtype=torch.float32),
                   empty(HV, dtype=torch.float32), state, empty(B, T, dtype=torch.int32), empty(B, dtype=torch.int32),
                   cfg=(recurrent_gluon if gluon else recurrent).config(v, state))
    for dtype in (torch.bfloat16, torch.float32):                       # fp32 inputs take a pipeline stage less
        qk = empty(1, 256, HK, DK, dtype=dtype)
        gdn_prefill(qk, qk, empty(1, 256, HV, DK, dtype=dtype), empty(1, 256, HV, dtype=dtype),
                    empty(1, 256, HV, dtype=dtype), empty(HV, dtype=torch.float32), empty(HV, dtype=torch.float32),
                    empty(2, HV, DK, DK, dtype=torch.float32).transpose(-1, -2), rows[:1], rows[:1])
    weight = empty(conv_dim, 4)
    causal_conv1d(empty(B, T, conv_dim), weight, empty(B, conv_dim, 3 + 4), rows, num_accepted=lens)
    causal_conv1d(empty(1, 256, conv_dim), weight, empty(1, conv_dim, 3 + 4), rows[:1])
    causal_conv1d(empty(B, T, conv_dim, dtype=torch.int64), weight, empty(B, conv_dim, 3 + 4), rows,
                  num_accepted=lens)
    yield "gdn verify + prefill + conv1d"
    for quant in (False, True):
        add_rmsnorm(empty(B * T, H), empty(B * T, H), empty(H), 1e-6, quant=quant)
        gated_rmsnorm(empty(B * T, HV, DK), empty(B * T, HV, DK), empty(DK, dtype=torch.float32), 1e-6, quant=quant)
        if quant:                                                       # int8 in the W4A8 operand order
            add_rmsnorm(empty(B * T, H), empty(B * T, H), empty(H), 1e-6, quant=True, a8_order=True)
            gated_rmsnorm(empty(B * T, HV, DK), empty(B * T, HV, DK), empty(DK, dtype=torch.float32), 1e-6,
                          quant=True, a8_order=True)
            silu_mul(empty(B * T, I), empty(B * T, I), quant=True, a8_order=True)
        gated_rmsnorm(empty(B * T, HV, DK), empty(B * T, HV, DK, dtype=torch.int64), empty(DK, dtype=torch.float32),
                      1e-6, quant=quant, clear=empty(B * T, 2 * HV, dtype=torch.int64))
        silu_mul(empty(B * T, I), empty(B * T, I), quant=quant)
        sums = empty(B * T, 2 * I, dtype=torch.int64)                   # deferred sums (kernels/fixed_sum.py)
        add_rmsnorm(empty(B * T, H, dtype=torch.int64), empty(B * T, H), empty(H), 1e-6, quant=quant)
        silu_mul(sums[:, :I], sums[:, I:], quant=quant)
    qk_norm_rope(empty(B * T, HQ * 2 * D), empty(B * T, HKV * D), empty(D), empty(D), empty(B * T, 64),
                 empty(B * T, 64), HQ, HKV, 1e-6)
    scale, rows = empty(HKV, dtype=torch.float32), empty(B, dtype=torch.int32)
    for cache_dtype in (torch.uint8, torch.bfloat16):                   # with the KV write
        kc = empty(B, HKV, 4096, D, dtype=cache_dtype)
        qk_norm_rope(empty(B * T, HQ * 2 * D), empty(B * T, HKV * D), empty(D), empty(D), empty(B * T, 64),
                     empty(B * T, 64), HQ, HKV, 1e-6, v=empty(B * T, HKV * D),
                     kv=(kc, empty(B, HKV, D, 4096, dtype=cache_dtype).transpose(2, 3), scale, scale, rows, rows))
        sums = empty(B * T, HQ * 2 * D + 2 * HKV * D, dtype=torch.int64)
        qk_norm_rope(sums[:, :HQ * 2 * D], sums[:, HQ * 2 * D:-HKV * D], empty(D), empty(D), empty(B * T, 64),
                     empty(B * T, 64), HQ, HKV, 1e-6, v=sums[:, -HKV * D:],
                     kv=(kc, empty(B, HKV, D, 4096, dtype=cache_dtype).transpose(2, 3), scale, scale, rows, rows))
    yield "fused norms"
    params = SamplingTensors(empty(B, dtype=torch.float32), empty(B, dtype=torch.int32), empty(B, dtype=torch.float32))
    seed, offset = empty(1, dtype=torch.int64), empty(1, dtype=torch.int64)
    sample(empty(B, V), params, seed, offset)
    rejection_sample(empty(B, T, V), empty(B, T - 1, V), empty(B, T - 1, dtype=torch.int32), params, seed, offset)
    yield "sampler + rejection"
    i32 = dict(dtype=torch.int32)
    commit(empty(B, **i32), empty(B, **i32), empty(B, **i32), empty(B, **i32), empty(B, T, **i32), empty(B * T, H),
           *(empty(B + 1, **i32) for _ in range(4)), empty(B + 1, T, **i32), empty(B + 1, T, H), acc_offset=0)
    f32 = dict(dtype=torch.float32)
    tables = [empty(B + 1, **i32)] * 4 + [empty(B + 1, **f32), empty(B + 1, **i32), empty(B + 1, **f32)]
    gather(empty(B, **i32), empty(B, dtype=torch.int64), *tables, *(empty(B, dtype=t.dtype) for t in tables),
           empty(B + 1, T, **i32), empty(B, T, **i32))
    rd = CFG.rotary_dim
    for slots, acc in ((None, None), (empty(B, T, **i32), None), (empty(B, T, **i32), empty(B, **i32))):
        pass_tables(empty(B, **i32), empty(B, **i32), empty(4096, rd), empty(4096, rd), empty(B, **i32),
                    empty(B * T, rd), empty(B * T, rd), slots=slots, fixed=4, acc=acc, state_at=empty(B, **i32),
                    shift=empty(B, **i32), slots_per_seq=T)
    yield "step tables"


CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resources(cubin: bytes) -> str:
    """Registers per thread and stack frame (spills, local arrays) of a compiled kernel, read back by the cuobjdump
    that ships with Triton: register counts decide how many CTAs fit an SM, so a change shows here without a GPU."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            out = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        except OSError:
            out = ""
    found = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return f"regs {found[1]:>3} stack {found[2]:>4}" if found else "regs   ? stack    ?"


def unordered_clears(ttgir: str) -> int:
    """Stores of int64 zeros (kernels/fixed_sum.clear) with a load of int64 tensors before them and no CTA barrier
    between: the compiler may map the store's elements to other threads than the load's, so a thread could zero
    what another has yet to read. A scan of the TritonGPU IR in program order."""
    zeros, loaded, found = set(), False, 0
    for line in ttgir.splitlines():
        const = re.match(r"\s*(%[\w.]+) = arith\.constant dense<0> : tensor<[^>]*xi64", line)
        if const:
            zeros.add(const[1])
        elif "gpu.barrier" in line:
            loaded = False
        elif re.search(r"= tt\.load .*!tt\.ptr<i64>", line):
            loaded = True
        else:
            store = re.match(r"\s*tt\.store %[\w.]+, (%[\w.]+)[,\s].*!tt\.ptr<i64>", line)
            found += bool(store and store[1] in zeros and loaded)
    return found


def signature(fn, args, kwargs):
    """(signature, constexprs, attrs) as the JIT would specialise this launch: integers equal to 1 become constants,
    pointers (16-byte aligned, as torch allocates) and integers divisible by 16 carry tt.divisibility 16, which
    vectorised and asynchronous copies need."""
    bound = dict(zip(fn.arg_names, args), **{k: v for k, v in kwargs.items() if k not in OPTIONS})
    sig, constants, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        value = bound[p.name]
        if p.is_constexpr:
            sig[p.name], constants[p.name] = "constexpr", value
            continue
        if type(value) is int and value == 1 and not p.do_not_specialize:
            sig[p.name], constants[p.name] = "constexpr", 1           # as the JIT does (unit strides)
            continue
        if isinstance(value, TensorDescriptor):             # host TMA descriptor: its type names block and layout
            sig[p.name] = mangle_type(value)
            continue
        if isinstance(value, torch.Tensor):
            sig[p.name] = POINTER[value.dtype]
        elif isinstance(value, bool):
            sig[p.name] = "i1"
        elif isinstance(value, int):
            sig[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {p.name} of type {type(value).__name__}")
        aligned = isinstance(value, torch.Tensor) or (type(value) is int and value % 16 == 0)
        if aligned and not (p.do_not_specialize or p.do_not_specialize_on_alignment):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, constants, attrs


@contextlib.contextmanager
def recording(arch):
    """Kernel launches are recorded, not run; the wrappers see a GPU of this architecture."""
    recorded, run = [], JITFunction.run
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: recorded.append((self, args, kwargs))
    try:
        with gpu.simulated(gpu.Gpu(divmod(arch, 10), TARGETS[arch]["sms"], TARGETS[arch]["smem_sm"])):
            yield recorded
    finally:
        JITFunction.run = run


_JOBS = []    # (arch, label, fn, signature, constexprs, attrs, options): forked workers read it by index


def compile_one(i: int) -> tuple:
    """(shared bytes, register use, "ok" or what is wrong) of the i-th recorded launch compiled for its target."""
    arch, _, fn, sig, constants, attrs, options = _JOBS[i]
    try:
        source = (GluonASTSource if fn.is_gluon() else ASTSource)(fn, sig, constexprs=constants, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as e:
        return -1, "", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    shared, smem = compiled.metadata.shared, TARGETS[arch]["smem"]
    racy = unordered_clears(compiled.asm["ttgir"])
    status = (f"needs {shared} B shared memory" if shared > smem else
              f"{racy} int64 clears not ordered after their loads by a barrier" if racy else "ok")
    return shared, resources(compiled.asm["cubin"]), status


def main(argv=()):
    archs = [int(a) for a in argv] or list(TARGETS)
    unknown = [a for a in archs if a not in TARGETS]
    if unknown:
        print(f"no target sm_{unknown[0]}: known {', '.join(map(str, TARGETS))}", file=sys.stderr)
        return 2
    seen = set()
    for arch in archs:
        with recording(arch) as recorded:
            for label in launches():
                for fn, args, kwargs in recorded:
                    sig, constants, attrs = signature(fn, args, kwargs)
                    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
                    key = (arch, fn.__name__, tuple(sorted(sig.items())), tuple(sorted(map(str, constants.items()))),
                           tuple(sorted(options.items())))
                    if key not in seen:
                        seen.add(key)
                        _JOBS.append((arch, label, fn, sig, constants, attrs, options))
                recorded.clear()
    n = min(workers(), len(_JOBS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with multiprocessing.get_context("fork").Pool(n) as pool:     # compiles are independent: one per CPU
            results = pool.imap(compile_one, range(len(_JOBS)))
            failures = []
            for (arch, label, fn, *_), (shared, usage, status) in zip(_JOBS, results):
                print(f"sm_{arch}  {label:38s} {fn.__name__:28s} shared {shared:>7}  {usage}  {status}", flush=True)
                if status != "ok":
                    failures.append((arch, fn.__name__, status))
    print(f"{len(seen)} launches compiled, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
