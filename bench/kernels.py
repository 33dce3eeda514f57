"""Kernel benchmark at the Qwen3.8-27B shapes: `python -m bench.kernels [--only int4,attn,...] [--passes N]`.

Measures the peak bandwidth once, then runs each suite (a module bench/kernels_<name>.py with
`run(peak_Bps) -> list[row]`) `--passes` times (default 2), keeps each row from its fastest pass, and writes
bench/results/kernels-<gpu>.json and .md; after a full run also targets-<gpu>.md, issue 3's targets against these
results (tools/targets.py). Passes, because interference from other work on the GPU only ever slows a row down
(docs/notes/bench.md). A row's derived columns (vs_cublas) are its own pass's."""
import argparse
import importlib
import traceback

import torch

from bench.harness import gpu_name, gpu_slug, measure_bandwidth, write_results
from tools import targets

SUITES = ["int4", "int8", "attn", "gdn", "sampler", "norms"]  # bench/kernels_<name>.py modules, in report order


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", default="", help="comma-separated suite names")
    ap.add_argument("--passes", type=int, default=2, help="runs of each suite; a row keeps its fastest")
    args = ap.parse_args()
    bw = measure_bandwidth()
    peak = bw["copy_Bps"]
    meta = {"gpu": gpu_name(), "torch": torch.__version__, "peak_copy_GBps": round(peak / 1e9, 1),
            "peak_read_GBps": round(bw["read_Bps"] / 1e9, 1), "frac_peak is relative to": "peak_copy_GBps",
            "passes": args.passes}
    rows, name = [], "kernels" if not args.only else "kernels-" + args.only.replace(",", "-")
    for suite in (args.only.split(",") if args.only else SUITES):
        passes = []
        for _ in range(args.passes):
            try:
                passes.append(importlib.import_module(f"bench.kernels_{suite}").run(peak))
            except Exception as e:      # one broken suite must not cost the others' results
                traceback.print_exc()
                error = {"kernel": suite, "shape": "suite failed", "error": f"{type(e).__name__}: {e}"[:200]}
        rows += targets.fastest(passes) if passes else [error]
        md = write_results(name, rows, meta)    # rewritten after every suite: a run cut short keeps what it has
    print(md)
    if not args.only:
        print(targets.write(rows, meta, gpu_slug()))


if __name__ == "__main__":
    main()
