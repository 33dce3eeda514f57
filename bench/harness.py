"""Timing, bandwidth and result-writing helpers shared by the benchmarks in bench/.

Every benchmark reports, per case, the time, the bytes the work must move and the FLOPs it must do, and the
fraction of the peak bandwidth measured in the same run (a large device-to-device copy)."""
import itertools
import json
import os
import statistics

import torch

from tools.targets import RESULTS, results_slug

ROTATE_BYTES = 256 << 20                # over 4x the H200's L2


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def gpu_slug() -> str:
    return results_slug(gpu_name())


def measure_bandwidth(nbytes: int = 2 << 30) -> dict:
    """Peak bandwidth in bytes/s: a device-to-device copy (read + write counted) and a large sum (read only).
    Inside a graph `copy_` becomes a memcpy node that may run on a copy engine, slower than the SMs, so the copy is
    also done by a kernel (`mul` by 1) and the faster of the two counts."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy_us = min(time_us(lambda: dst.copy_(src)), time_us(lambda: torch.mul(src, 1, out=dst)))
    read_us = time_us(lambda: src.sum(dtype=torch.float32))
    return {"copy_Bps": 2 * nbytes / (copy_us * 1e-6), "read_Bps": nbytes / (read_us * 1e-6)}


def time_us(fn, reps: int = 20, trials: int = 7) -> float:
    """Median time of one call in µs, from CUDA-graph replays of `reps` back-to-back calls (no launch gaps)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


class Rotation:
    """Enough copies of make() (nbytes each) that they cannot all sit in L2, handed out in turn by calling it: every
    timed call then reads its operands from HBM, as a model step does. time_us replays the calls it captured, so it
    must capture at least one call per copy — pass it reps=rotation.reps: with its default 20 calls, copies of under
    ROTATE_BYTES / 20 (13.4 MB) would cycle through only 20 of them, a working set L2 may largely hold."""

    def __init__(self, make, nbytes: int):
        copies = [make() for _ in range(max(2, -(-ROTATE_BYTES // nbytes)))]      # at least ROTATE_BYTES, two or more
        self.reps = max(20, len(copies))        # time_us's reps that put every copy in its graph
        self._next = itertools.cycle(copies)

    def __call__(self):
        return next(self._next)


def write_results(name: str, rows: list, meta: dict) -> str:
    """bench/results/<name>-<gpu>.json and .md; returns the markdown table."""
    os.makedirs(RESULTS, exist_ok=True)
    base = os.path.join(RESULTS, f"{name}-{gpu_slug()}")
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    cols = ["kernel", "shape", "us", "roofline_us", "GBps", "frac_peak"]
    cols += [c for c in dict.fromkeys(k for r in rows for k in r) if c not in cols + ["bytes", "flops"]]
    lines = [f"# {name} on {meta.get('gpu', gpu_name())}", "",
             "  ".join(f"{k}: {v}" for k, v in meta.items()), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    md = "\n".join(lines) + "\n"
    with open(base + ".md", "w") as f:
        f.write(md)
    return md


def best_of(configs, time_one, make_row, show: int = 4) -> list:
    """Sweep helper: time each config (one that fails to build, e.g. out of shared memory, is reported and
    skipped), print the fastest `show`, return every row. make_row(config, us) -> row."""
    found = []
    for config in configs:
        try:
            us = time_one(config)
        except Exception as e:
            print(f"{config}: {type(e).__name__} {str(e)[:60]}", flush=True)
            continue
        found.append(make_row(config, us))
    for r in sorted(found, key=lambda r: r["us"])[:show]:
        print(f"{r['kernel']:12s} {r['shape']:32s} {r.get('config', ''):28s} {r['us']:9.2f} us  {r['frac_peak']:.3f}",
              flush=True)
    return found


def suite_main(run, sweep, doc: str):
    """`python -m bench.kernels_<name> [--sweep]`: one suite on its own; the sweep prints its own ranking."""
    import argparse
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--sweep", action="store_true", help="try every config of the table's search space")
    args = ap.parse_args()
    peak = measure_bandwidth()["copy_Bps"]
    print(f"{gpu_name()}: peak copy {peak / 1e9:.0f} GB/s")
    rows = sweep(peak) if args.sweep else run(peak)
    if not args.sweep:
        for r in rows:
            print(r)
