"""Benchmark result rows and issue 3's speed targets read from them: `python -m tools.targets [gpu slug]` reads
bench/results/kernels-<gpu>.json and writes bench/results/targets-<gpu>.md (bench.kernels does it after a full run).

`row` is the form of a result row (every suite in bench/ writes rows so); `fastest` keeps each row from the fastest
of several passes. Each target's measured value sits beside the floor the same run measured where bench/floors.py
has one: the fraction of the copy peak that a launch which only moves the kernel's bytes reaches, so a target above
its floor cannot be met by a kernel that reads those bytes after waiting for the launch before it. Torch-free."""
import json
import os
import sys

from layers.config import qwen38_27b

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results")
CFG = qwen38_27b()

GEMV = "int4_gemv W4A16 -> int64 sums"          # the form the layer step takes (the next kernel converts the sums)
GEMV_STORED = "int4_linear W4A16"                # bf16 stored by the linear itself
ATTENTION = "attn_verify[fp8-native, V keys-fastest]"      # the engine's cache layout (on sm_90 the Gluon kernel)
W4A8, W4A8_KERNEL = "w4a8_linear", "w4a8 ws, operand order"  # beside the W4A16 GEMM (int8 activations: its note)
# the floors' rows (bench/floors.py), as the suites name them
GEMV_FLOOR, ATTENTION_FLOOR = "read floor", "attn_verify[read floor]"
GDN_FLOOR = "floor: read a state, write it T times"
GDN_FLOOR_INPUTS = GDN_FLOOR + ", after inputs read past the wait"      # its writes wait for inputs: the target's


CUBLAS = "bf16 matmul"
# The bytes issue 3 measures two targets by (the rows count the kernel's other operands too: q and out; q, k, v, a,
# b and o): the fp8 KV at B 1 and 16k context (K and V of every kv head, a byte each), and the GDN verify's fp16
# state traffic at B 1, T 5 (every value head's dk × dv state read once and written after each of the 5 tokens).
KV_BYTES_16K = 1 * 16384 * CFG.num_key_value_heads * CFG.head_dim * 2
GDN_STATE_BYTES = (1 + 5) * CFG.linear_num_value_heads * CFG.linear_key_head_dim * CFG.linear_value_head_dim * 2

# One-row targets: (target, kernel, shape, field, goal, the floor's (kernel, shape; None: its first row) or None,
# the bytes whose fraction of the copy peak the goal is (None: the field as the row gives it))
ROW_TARGETS = [
    ("verify attention B1 q5 16k fp8 (KV bytes)", ATTENTION, "B1 ctx16384 q5", "frac_peak", ">= 0.70",
     (ATTENTION_FLOOR, "B1 ctx16384 q5"), KV_BYTES_16K),
    ("verify attention B1 q5 1.5k fp8, us", ATTENTION, "B1 ctx1536 q5", "us", "< 15", None, None),
    ("GDN verify B1 T5 fp16 state (state bytes)", "gdn_verify", "B1 T5 state float16", "frac_peak", ">= 0.70",
     (GDN_FLOOR_INPUTS, None), GDN_STATE_BYTES),
    ("sampler, one row top-k 20 / top-p 0.95, us", "sample qwen T1 k20 p.95", f"1x{CFG.vocab_size}", "us", "< 20", None, None),
    ("sampler, five rows + rejection, us", "5 rows + rejection", f"B1 k4 V{CFG.vocab_size}", "us", "< 40", None, None),
]


def row(kernel: str, shape: str, us: float, nbytes: float, flops: float, peak_Bps: float, **extra) -> dict:
    """One result: time, the work's bytes and FLOPs, achieved bandwidth and its fraction of the peak."""
    return {"kernel": kernel, "shape": shape, "us": round(us, 2), "bytes": int(nbytes), "flops": int(flops),
            "GBps": round(nbytes / (us * 1e-6) / 1e9, 1), "frac_peak": round(nbytes / (us * 1e-6) / peak_Bps, 3),
            "roofline_us": round(nbytes / peak_Bps * 1e6, 2), **extra}


def fastest(passes: list) -> list:
    """Row by row, the pass with the least time (a row without one, an error, from the first pass); passes whose
    rows are not the first's, kernel and shape in the same order, are left out."""
    keys = [(r["kernel"], r["shape"]) for r in passes[0]]
    same = [p for p in passes if [(r["kernel"], r["shape"]) for r in p] == keys]
    return [min((p[i] for p in same if "us" in p[i]), key=lambda r: r["us"], default=passes[0][i])
            for i in range(len(keys))]


def results_slug(gpu_name: str) -> str:
    """The results files' name for a GPU: "NVIDIA H200" -> "h200"."""
    return gpu_name.lower().replace("nvidia", "").strip().replace(" ", "-")


def _row(rows, kernel, shape):
    """The row of that kernel and shape (shape None: its first row), or None."""
    return next((r for r in rows if r["kernel"] == kernel and shape in (None, r["shape"])), None)


def _value(rows, kernel, shape, field="frac_peak"):
    """The field of the row of that kernel and shape (shape None: its first row), or None."""
    r = _row(rows, kernel, shape)
    return None if r is None else r.get(field)


def _fraction(r, nbytes, peak_GBps=None):
    """nbytes over the row's time as a fraction of the copy peak (the run's, else the row's own: its frac_peak
    scaled by nbytes / its bytes); None without the row."""
    if r is None or "us" not in r:
        return None
    if peak_GBps:
        return round(nbytes / (r["us"] * 1e-6) / (peak_GBps * 1e9), 3)
    return round(r["frac_peak"] * nbytes / r["bytes"], 3)


def _ratio(rows, shape):
    """cuBLAS bf16's time over ours (the stored int4_linear) at that shape, from the two rows' times (the rows'
    vs_cublas is rounded to 0.01: 0.995 would read as 1.0); None where either is missing."""
    ours, cublas = _row(rows, GEMV_STORED, shape), _row(rows, CUBLAS, shape)
    return None if ours is None or cublas is None else round(cublas["us"] / ours["us"], 3)


def int4_bytes(m, n, k, act_bytes=2):
    """The bytes an int4 linear out[m, n] = x[m, k] @ W[n, k]ᵀ must move: the codes, the fp16 scales of 128-groups,
    the activations in (act_bytes each) and bf16 outputs out — whatever form the kernel leaves them in (the GEMV's
    int64 sums stand for bf16 outputs). The benchmarks' rows and the GEMV targets count with this one formula."""
    return n * k // 2 + n * (k // 128) * 2 + m * k * act_bytes + m * n * 2


def int8_head_bytes(m, n, k, out_bytes=2):
    """The bytes an int8 head (lm_head, draft head) out[m, n] = x[m, k] @ W[n, k]ᵀ must move: the codes, the fp16
    row scales, the bf16 activations in and the outputs (out_bytes each)."""
    return n * k + n * 2 + m * k * 2 + m * n * out_bytes


def layer_bytes(cfg, kind: str, B: int, T: int, ctx: int) -> int:
    """The bytes one decoder layer ("gdn" or "attn") of B rows × T tokens must move: its int4 weights and scales
    (int4_bytes without activations: they are small), and its cache — a GDN layer's fp16 state read once and
    written after each token, an attention layer's fp8 K and V of ctx cached tokens."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    if kind == "gdn":
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        mixer = [(cfg.linear_conv_dim + hv * dv + 2 * hv, H), (H, hv * dv)]          # in_proj qkvz+ba, out_proj
        cache = (1 + T) * B * hv * dk * dv * 2
    elif kind == "attn":
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        mixer = [(2 * hq * d + 2 * hkv * d, H), (H, hq * d)]                          # qkv_gate, o_proj
        cache = B * ctx * hkv * d * 2
    else:
        raise ValueError(f"layer kind {kind!r}: expected 'gdn' or 'attn'")
    return sum(int4_bytes(0, n, k) for n, k in mixer + [(2 * I, H), (H, I)]) + cache


def step_bytes(cfg, B: int, k: int, ctx: int, draft_vocab: int) -> int:
    """The bytes one MTP-k decode step of B sequences at ctx cached tokens must move (bench.step's roofline): the
    verify pass at B·(k+1) rows — every layer (layer_bytes), the embedding's int8 rows in and bf16 out, the lm_head
    with bf16 logits — and, k > 0, k draft passes at B rows, each reading the MTP's gated-attention layer, its fc
    (2H -> H) and a draft head of draft_vocab rows."""
    T, H = k + 1, cfg.hidden_size
    kinds = {"linear_attention": "gdn", "full_attention": "attn"}
    total = (sum(layer_bytes(cfg, kinds[t], B, T, ctx) for t in cfg.layer_types)
             + int8_head_bytes(B * T, cfg.vocab_size, H) + 3 * B * T * H)
    if k:
        draft = layer_bytes(cfg, "attn", B, 1, ctx) + int4_bytes(B, H, 2 * H) + int8_head_bytes(B, draft_vocab, H)
        total += k * draft
    return total


def int4_work_bytes(shape: str) -> int:
    """int4_bytes of a row's shape "<name> NxK M=m"."""
    dims, m = shape.rsplit(" ", 2)[1:]
    n, k = map(int, dims.split("x"))
    return int4_bytes(int(m.removeprefix("M=")), n, k)


def _fractions(rows, kernel, shapes, nbytes=None, peak_GBps=None):
    """Per shape, the row's fraction of the copy peak (nbytes(shape) given: of those bytes over the row's time);
    None where a row is missing."""
    found = [_row(rows, kernel, s) for s in shapes]
    if nbytes is None:
        return [None if r is None else r.get("frac_peak") for r in found]
    return [_fraction(r, nbytes(s), peak_GBps) for r, s in zip(found, shapes)]


def _least(values):
    """The least of those fractions, or None where one is missing."""
    return None if None in values else min(values)


def _weakest(values, shapes):
    """The rows (" M=…") where the least fraction falls: the GEMV targets' note."""
    least = _least(values)
    return "" if least is None else ", ".join(s.rsplit(" ", 1)[1] for s, v in zip(shapes, values) if v == least)


def _check(name, goal, value, floor=None, note=""):
    """One line of the table; goal '>= x' or '< x'; value None: the run has no such row."""
    op, bound = goal.split()
    met = value is not None and (value >= float(bound) if op == ">=" else value < float(bound))
    return dict(target=name, goal=goal, measured="not measured" if value is None else value,
                floor="" if floor is None else floor, status="missing" if value is None else "met" if met else "missed",
                note=note)


def evaluate(rows: list, peak_GBps: float = None) -> list:
    """The targets of issue 3's "Done when" against benchmark rows (`row` dicts); peak_GBps: the copy
    peak of their run (for the targets measured by other bytes than the row's; else derived from the row)."""
    linears = list(dict.fromkeys(r["shape"].rsplit(" M=", 1)[0] for r in rows if r["kernel"] == GEMV))
    out = []
    for shape in linears:
        m15 = [f"{shape} M={m}" for m in range(1, 6)]
        sums = _fractions(rows, GEMV, m15, int4_work_bytes, peak_GBps)
        stored = _least(_fractions(rows, GEMV_STORED, m15, int4_work_bytes, peak_GBps))
        out.append(_check(f"int4 GEMV {shape}, M 1-5 (least)", ">= 0.80", _least(sums),
                          _value(rows, GEMV_FLOOR, f"{shape} M=1 bytes"),
                          f"into int64 sums; least at {_weakest(sums, m15)}" +
                          ("" if stored is None else f"; stored bf16: {stored:.3f}")))
    out.append(_check("int8 lm_head GEMV, M 1-5 (least)", ">= 0.85",
                      _least(_fractions(rows, "int8_linear", [f"lm_head {CFG.vocab_size}x{CFG.hidden_size} M={m}" for m in range(1, 6)]))))
    for shape in linears:
        a8 = [_value(rows, kernel, f"{shape} M=320", "vs_cublas") for kernel in (W4A8_KERNEL, W4A8)]
        note = "" if None in a8 else f"W4A8: {a8[0]} (kernel, operand order), {a8[1]} (w4a8_linear)"
        out.append(_check(f"int4 GEMM {shape}, M 320: cuBLAS bf16 time / ours", ">= 1.00",
                          _ratio(rows, f"{shape} M=320"), note=note))
    for name, kernel, shape, field, goal, floor, nbytes in ROW_TARGETS:
        r, f = _row(rows, kernel, shape), floor and _row(rows, *floor)
        if nbytes is None:
            out.append(_check(name, goal, None if r is None else r.get(field), f and f.get("frac_peak")))
            continue
        note = "" if r is None else f"{nbytes:,} bytes; the row's {r['bytes']:,}: {r['frac_peak']}"
        out.append(_check(name, goal, _fraction(r, nbytes, peak_GBps), f and _fraction(f, nbytes, peak_GBps), note))
    return out


def write(rows: list, meta: dict, slug: str, directory: str = RESULTS) -> str:
    """targets-<slug>.md in `directory` from a kernel benchmark's rows and meta; returns the markdown."""
    checks = evaluate(rows, meta.get("peak_copy_GBps"))
    met = sum(c["status"] == "met" for c in checks)
    lines = [f"# Issue 3 targets on {meta.get('gpu', '?')}", "",
             f"From kernels-{slug}.json (fractions of the copy peak measured in that run, "
             f"{meta.get('peak_copy_GBps', '?')} GB/s; floor: a launch that only moves the same bytes, as a fraction "
             f"of the same bytes). {met} of {len(checks)} met.", "",
             f"Rows read: int4 GEMV — `{GEMV}` (the form bench/layer_step.py takes up to 24 rows: the next kernel "
             f"converts the sums), the stored-bf16 `{GEMV_STORED}` in the note, both over the bytes of the work "
             "(codes, scales, bf16 activations in and out: the sums' 8 bytes an output are not work); int8 lm_head "
             f"— `int8_linear` (fp32 logits); int4 GEMM — cuBLAS bf16's time over `{GEMV_STORED}`'s at 320 rows, "
             f"from the two rows' times; verify attention — `{ATTENTION}`, its "
             "fraction over the KV bytes alone (the row also counts q and out: in the note); GDN verify — "
             "`gdn_verify` on the engine's state layout, its fraction over the state's bytes alone (the row also "
             "counts q, k, v, a, b and o); sampler — `sample qwen T1 k20 p.95` (one row, T 1, top-k 20, top-p "
             "0.95) and `5 rows + rejection` (B 1, 4 drafts: the target's 5 rows sampled and the accept pass).", "",
             "| target | goal | measured | floor | status | note |", "|---|---|---|---|---|---|"]
    lines += [f"| {c['target']} | {c['goal']} | {c['measured']} | {c['floor']} | {c['status']} | {c['note']} |"
              for c in checks]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(directory, f"targets-{slug}.md"), "w") as f:
        f.write(md)
    return md


def main(argv: list) -> int:
    if argv:
        name = argv[0]
    else:                                           # this machine's GPU
        import torch
        name = results_slug(torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    with open(os.path.join(RESULTS, f"kernels-{name}.json")) as f:
        data = json.load(f)
    print(write(data["rows"], data["meta"], name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
