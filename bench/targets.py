"""Issue 3's speed targets checked against the kernel benchmark's results: `python -m bench.targets [gpu slug]`
reads bench/results/kernels-<gpu>.json and writes bench/results/targets-<gpu>.md (bench.kernels does it after a full
run). Each target's measured value sits beside the floor the same run measured where bench/floors.py has one: the
fraction of the copy peak that a launch which only moves the kernel's bytes reaches in this harness, so a target
above its floor cannot be met here by a kernel that reads those bytes after waiting for the launch before it (reads
that need no wait can overlap that launch: bench/floors.py)."""
import json
import os
import sys

from bench.harness import RESULTS, gpu_slug

GEMV = "int4_gemv W4A16 -> int64 sums"          # the form the layer step takes (the next kernel converts the sums)
GEMV_STORED = "int4_linear W4A16"                # bf16 stored by the linear itself
ATTENTION = "attn_verify[fp8-native, V keys-fastest]"      # the engine's cache layout (on sm_90 the Gluon kernel)
W4A8, W4A8_KERNEL = "w4a8_linear", "w4a8 ws, operand order"  # beside the W4A16 GEMM (int8 activations: its note)


# One-row targets: (target, kernel, shape, field, goal, the floor's (kernel, shape; None: its first row) or None)
ROW_TARGETS = [
    ("verify attention B1 q5 16k fp8", ATTENTION, "B1 ctx16384 q5", "frac_peak", ">= 0.70",
     ("attn_verify[read floor]", "B1 ctx16384 q5")),
    ("verify attention B1 q5 1.5k fp8, us", ATTENTION, "B1 ctx1536 q5", "us", "< 15", None),
    ("GDN verify B1 T5 fp16 state", "gdn_verify", "B1 T5 state float16", "frac_peak", ">= 0.70",
     ("floor: read a state, write it T times", None)),
    ("sampler, one row top-k 20 / top-p 0.95, us", "sample qwen T1 k20 p.95", "1x248320", "us", "< 20", None),
    ("sampler, five rows + rejection, us", "5 rows + rejection", "B1 k4 V248320", "us", "< 40", None),
]


def _value(rows, kernel, shape, field="frac_peak"):
    """The field of the row of that kernel and shape (shape None: its first row), or None."""
    r = next((r for r in rows if r["kernel"] == kernel and shape in (None, r["shape"])), None)
    return None if r is None else r.get(field)


def _least(rows, kernel, shapes):
    """The least fraction of the copy peak over those shapes, or None where one is missing."""
    values = [_value(rows, kernel, s) for s in shapes]
    return None if None in values else min(values)


def _weakest(rows, kernel, shapes):
    """The rows (" M=…") where the least fraction over those shapes falls: the GEMV targets' note."""
    least = _least(rows, kernel, shapes)
    return "" if least is None else ", ".join(s.rsplit(" ", 1)[1] for s in shapes if _value(rows, kernel, s) == least)


def _check(name, goal, value, floor=None, note=""):
    """One line of the table; goal '>= x' or '< x'; value None: the run has no such row."""
    op, bound = goal.split()
    met = value is not None and (value >= float(bound) if op == ">=" else value < float(bound))
    return dict(target=name, goal=goal, measured="not measured" if value is None else value,
                floor="" if floor is None else floor, status="missing" if value is None else "met" if met else "missed",
                note=note)


def evaluate(rows: list) -> list:
    """The targets of issue 3's "Done when" against benchmark rows (bench.harness.row dicts)."""
    linears = list(dict.fromkeys(r["shape"].rsplit(" M=", 1)[0] for r in rows if r["kernel"] == GEMV))
    out = []
    for shape in linears:
        m15 = [f"{shape} M={m}" for m in range(1, 6)]
        stored = _least(rows, GEMV_STORED, m15)
        out.append(_check(f"int4 GEMV {shape}, M 1-5 (least)", ">= 0.80", _least(rows, GEMV, m15),
                          _value(rows, "read floor", f"{shape} M=1 bytes"),
                          f"least at {_weakest(rows, GEMV, m15)}" + ("" if stored is None else
                                                                     f"; stored bf16: {stored:.3f}")))
    out.append(_check("int8 lm_head GEMV, M 1-5 (least)", ">= 0.85",
                      _least(rows, "int8_linear", [f"lm_head 248320x5120 M={m}" for m in range(1, 6)])))
    for shape in linears:
        a8 = [_value(rows, kernel, f"{shape} M=320", "vs_cublas") for kernel in (W4A8_KERNEL, W4A8)]
        note = "" if None in a8 else f"W4A8: {a8[0]} (kernel, operand order), {a8[1]} (w4a8_linear)"
        out.append(_check(f"int4 GEMM {shape}, M 320: cuBLAS bf16 time / ours", ">= 1.00",
                          _value(rows, GEMV_STORED, f"{shape} M=320", "vs_cublas"), note=note))
    for name, kernel, shape, field, goal, floor in ROW_TARGETS:
        out.append(_check(name, goal, _value(rows, kernel, shape, field), floor and _value(rows, *floor)))
    return out


def write(rows: list, meta: dict, slug: str, directory: str = RESULTS) -> str:
    """targets-<slug>.md in `directory` from a kernel benchmark's rows and meta; returns the markdown."""
    checks = evaluate(rows)
    met = sum(c["status"] == "met" for c in checks)
    lines = [f"# Issue 3 targets on {meta.get('gpu', '?')}", "",
             f"From kernels-{slug}.json (fractions of the copy peak measured in that run, "
             f"{meta.get('peak_copy_GBps', '?')} GB/s; floor: a launch that only moves the same bytes). "
             f"{met} of {len(checks)} met.", "",
             "| target | goal | measured | floor | status | note |", "|---|---|---|---|---|---|"]
    lines += [f"| {c['target']} | {c['goal']} | {c['measured']} | {c['floor']} | {c['status']} | {c['note']} |"
              for c in checks]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(directory, f"targets-{slug}.md"), "w") as f:
        f.write(md)
    return md


if __name__ == "__main__":
    slug = sys.argv[1] if len(sys.argv) > 1 else gpu_slug()
    with open(os.path.join(RESULTS, f"kernels-{slug}.json")) as f:
        data = json.load(f)
    print(write(data["rows"], data["meta"], slug))
