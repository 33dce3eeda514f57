"""The Triton kernels a run of launches needs, compiled by parallel processes before it runs (start-up).

Triton compiles a kernel when a launch first needs it, one at a time, in the launching thread (its compiler holds
the GIL: threads do not overlap). A decode step of the 27B at one batch bucket needs dozens of distinct kernels:
20–40 s cold on an H200's host, every bucket, before the first token. compile_ahead(run) calls run() with each
launch that would compile recorded and skipped instead (launches of kernels already compiled still run), then
compiles the recorded kernels in forked worker processes (workers(): one per CPU, at most MAX_WORKERS) into
Triton's on-disk cache — where the real launches then find them, exactly as Triton would have compiled them (the
workers make the very call the launch makes, from the launch's own arguments).

Workers only compile: no CUDA call (the compiler takes the target the parent resolved). A kernel a worker cannot
compile is left to the real launch, which raises the compiler's error where it always did. run() must be fine
with its Triton launches skipped (a CUDA-graph warm-up on padding rows is: it reads what earlier launches left)."""
import multiprocessing
import os
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from triton.runtime.jit import JITFunction

_compile = JITFunction._do_compile
_jobs = []                     # (JITFunction, its _do_compile arguments): forked workers read it by index


def _record(fn, key, signature, device, constexprs, options, attrs, warmup):
    _jobs.append((fn, (key, signature, device, constexprs, options, attrs)))
    return None                # JITFunction.run returns without launching


def _work(i: int) -> bool:
    fn, args = _jobs[i]
    try:
        _compile(fn, *args, True)
        return True
    except Exception:          # left to the real launch, which raises it
        return False


MAX_WORKERS = 16               # each holds a compiler's memory


def workers() -> int:
    """The CPUs this process may use, at most MAX_WORKERS."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cpus, MAX_WORKERS)


def compile_ahead(run, processes: int = None) -> int:
    """run() with launches that would compile skipped, then the kernels they need compiled into Triton's cache by
    `processes` forked workers (default: workers()). Returns how many distinct kernels were compiled."""
    if JITFunction._do_compile is not _compile:
        raise RuntimeError("compile_ahead is already recording launches")
    JITFunction._do_compile = _record
    try:
        run()
    finally:
        JITFunction._do_compile = _compile
    unique = {(id(fn), args[0]): (fn, args) for fn, args in _jobs}
    _jobs[:] = unique.values()
    try:
        n = min(processes or workers(), len(_jobs))
        if n > 1:
            with warnings.catch_warnings():        # fork() of a process with threads: workers touch none of them
                warnings.simplefilter("ignore", DeprecationWarning)
                try:
                    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
                        list(pool.map(_work, range(len(_jobs))))
                except BrokenProcessPool:          # a worker died: what it did not compile, the launches will
                    pass
        else:
            for i in range(len(_jobs)):
                _work(i)
        return len(_jobs)
    finally:
        _jobs.clear()
