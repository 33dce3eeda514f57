"""Int4-weight linears at the Qwen3.8-27B shapes, with their peers timed in the same run: ours (W4A16 — the Gluon
GEMV for ≤ 24 rows, beyond it on sm_90 the warp-specialised Gluon wgmma GEMM (config `ws`), else the Triton
kernel, and the Triton kernel beside them as `[triton]`; W4A8 from int8 activations — w4a8_linear, and
from 65 rows on sm_90 its warp-specialised kernel alone (`w4a8 ws, operand order`: the activations in the operand's
k order, as kernels/norms writes them with a8_order, without the wrapper's permuting copy)), cuBLAS bf16
(`x @ w.T`), torch's `_weight_int4pack_mm` (group 128), and a launch that only reads the M = 1 GEMV's bytes
(`read floor`, bench/floors.py: what no kernel that reads those bytes after its PDL wait beats in this harness).

Every timed call reads another copy of the weights (together ≥ 256 MiB, over 4× the H200's L2), so weights come
from HBM as they do in a model step. Bytes per call: the weight codes, their scales, the activations and the
outputs (QUANT.md §7); `-> int64 sums`: the GEMV's output left as fixed-point sums for its consumer to
convert (kernels/fixed_sum.py), counted with the same bytes as the stored form — the work's outputs are bf16
activations; the 6 more bytes an output its int64 form moves (posted by the GEMV, read and cleared by the consumer)
are that design's overhead, not work; `vs_cublas` = cuBLAS time / this time at the same shape. torch's int4pack
peer rotates its weights with their bf16 scale-and-zero pairs (counted: 4 bytes a group and column).

`python -m bench.kernels_int4 --sweep` times alternatives to the launch tables (kernels/int4: gemv.ROW_BUCKETS,
mma.M_BUCKETS) and prints them fastest first, to retune them."""
import itertools

import torch

from bench.floors import read_floor_us
from bench.harness import Rotation, best_of, suite_main, time_us
from kernels import device as gpu
from kernels.int4 import config, gemv, int4_linear, mma, w4a8_linear, wgmma_ws
from kernels.int4.mma import CODES, NATURAL, WEIGHTS_A
from layers.config import qwen38_27b
from layers.quant import Int4Weight, a8_permute
from tools.targets import GEMV_FLOOR, int4_bytes, row

SHAPES = tuple((name, n, k) for name, (n, k) in qwen38_27b().linear_shapes.items())     # name, N, K
GEMV_M = (1, 2, 3, 4, 5)
GEMM_M = (20, 40, 64, 200, 320)
PEER_M = (1, 5) + GEMM_M


def random_int4(n, k, device="cuda"):
    words = torch.randint(-2**31, 2**31 - 1, (k // 128, n, 16), dtype=torch.int32, device=device)
    return Int4Weight(words, (torch.rand(k // 128, n, device=device) * 0.01).half())


def time_ours(m, n, k, a8=False, cfg=None, sums=False):
    """int4_linear, or w4a8_linear (a8), dispatched (cfg None) or forced to a variant by its Config; W4A8 with a
    wgmma_ws.Config takes the activations already in its operand order; sums: the GEMV's output as int64 sums
    (kernels/fixed_sum.py; never cleared here)."""
    weights = Rotation(lambda: random_int4(n, k), int4_bytes(0, n, k))
    out = torch.zeros(m, n, device="cuda", dtype=torch.int64 if sums else torch.bfloat16)
    if a8:
        x = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
        s_a = torch.rand(m, device="cuda")
        ws = isinstance(cfg, wgmma_ws.Config)
        x = a8_permute(x) if ws else x
        call = lambda: w4a8_linear(x, s_a, weights(), out=out, cfg=cfg, a8_order=ws)
    else:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        call = lambda: int4_linear(x, weights(), out=out, cfg=cfg)
    return time_us(call, reps=weights.reps)


def time_cublas(m, n, k):
    weights = Rotation(lambda: torch.randn(n, k, device="cuda", dtype=torch.bfloat16), n * k * 2)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return time_us(lambda: torch.mm(x, weights().t(), out=out), reps=weights.reps)


def time_torch_int4pack(m, n, k):
    def make():                         # its weights with their scales and zeros (bf16 pairs), rotated together
        codes = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
        return (torch._convert_weight_to_int4pack((codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8), 8),
                torch.rand(k // 128, n, 2, device="cuda", dtype=torch.bfloat16))
    weights = Rotation(make, n * k // 2 + n * (k // 128) * 4)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    return time_us(lambda: (lambda w, sz: torch._weight_int4pack_mm(x, w, 128, sz))(*weights()), reps=weights.reps)


def run(peak_Bps: float) -> list:
    rows = []
    for name, n, k in SHAPES:
        shape = f"{name} {n}x{k}"
        cublas = {}
        for m in PEER_M:
            cublas[m] = us = time_cublas(m, n, k)
            rows.append(row("bf16 matmul", f"{shape} M={m}", us, n * k * 2 + m * k * 2 + m * n * 2, 2 * m * n * k,
                            peak_Bps, peer="cublas-bf16"))
            try:
                us = time_torch_int4pack(m, n, k)
                rows.append(row("int4 matmul", f"{shape} M={m}", us, int4_bytes(m, n, k) + n * (k // 128) * 2,
                                2 * m * n * k, peak_Bps, peer="torch-int4pack", vs_cublas=round(cublas[m] / us, 2)))
            except RuntimeError as e:                                    # report, keep benchmarking
                rows.append({"kernel": "int4 matmul", "shape": f"{shape} M={m}", "peer": "torch-int4pack",
                             "error": str(e).splitlines()[0][:80]})
        nbytes = int4_bytes(1, n, k) // 4 * 4
        rows.append(row(GEMV_FLOOR, f"{shape} M=1 bytes", read_floor_us(nbytes), nbytes, 0, peak_Bps, peer="read"))
        dev = torch.device("cuda")
        for m in GEMV_M + GEMM_M:
            us = time_ours(m, n, k)
            extra = {"vs_cublas": round(cublas[m] / us, 2)} if m in cublas else {}
            rows.append(row("int4_linear W4A16", f"{shape} M={m}", us, int4_bytes(m, n, k), 2 * m * n * k, peak_Bps,
                            peer="ours", config=_str(_chosen(m, n, k)), **extra))
        for m in GEMV_M + (8, 16, 20):  # the work's bytes: outputs as the bf16 they stand for (module docstring)
            us = time_ours(m, n, k, sums=True)
            rows.append(row("int4_gemv W4A16 -> int64 sums", f"{shape} M={m}", us, int4_bytes(m, n, k),
                            2 * m * n * k, peak_Bps, peer="ours", config=_str(gemv.config(m, n, k, dev))))
        for m in PEER_M:
            cfg = mma.config(m, n, k, dev)
            us = time_ours(m, n, k, cfg=cfg)
            rows.append(row("int4_linear W4A16 [triton]", f"{shape} M={m}", us, int4_bytes(m, n, k), 2 * m * n * k,
                            peak_Bps, peer="ours", vs_cublas=round(cublas[m] / us, 2), config=_str(cfg)))
        for m in PEER_M:
            us = time_ours(m, n, k, a8=True)
            rows.append(row("w4a8_linear", f"{shape} M={m}", us, int4_bytes(m, n, k, act_bytes=1) + 4 * m,
                            2 * m * n * k, peak_Bps, peer="ours", vs_cublas=round(cublas[m] / us, 2)))
            ws_cfg = _chosen(m, n, k, torch.int8)
            if isinstance(ws_cfg, wgmma_ws.Config):
                us = time_ours(m, n, k, a8=True, cfg=ws_cfg)
                rows.append(row("w4a8 ws, operand order", f"{shape} M={m}", us,
                                int4_bytes(m, n, k, act_bytes=1) + 4 * m, 2 * m * n * k, peak_Bps, peer="ours",
                                vs_cublas=round(cublas[m] / us, 2), config=_str(ws_cfg)))
    return rows


def _chosen(m, n, k, dtype=torch.bfloat16):
    """The dispatcher's Config (kernels.int4.config) for m rows on this GPU, asked with meta tensors."""
    w = Int4Weight(torch.empty(k // 128, n, 16, dtype=torch.int32, device="meta"),
                   torch.empty(k // 128, n, dtype=torch.float16, device="meta"))
    with gpu.simulated(gpu.gpu_of(torch.device("cuda"))):
        return config(torch.empty(m, k, dtype=dtype, device="meta"), w)


def _str(c) -> str:
    """A Config as the results table's `config` column writes it."""
    if isinstance(c, gemv.Config):
        return f"gemv {c.block_n}x{c.warps}w st{c.stages} p{c.programs}" + (" marks" if c.marks else "")
    if isinstance(c, wgmma_ws.Config):
        return f"ws {c.bm}+{c.bm2} p{c.programs}"
    return f"{c.block_m}x{c.block_n} s{c.split_k} w{c.num_warps} st{c.num_stages}" + \
        {NATURAL: " N", WEIGHTS_A: " A"}.get(c.form, "")


# Alternatives to mma.M_BUCKETS for --sweep: entries override the bucket's dict in mma.config.
GEMM_VARIANTS = [dict(block_m=bm, block_n=bn, num_warps=w, num_stages=st, form=form, ctas_per_sm=1)
                 for bm, bn, w, st, form in ((64, 128, 4, 3, WEIGHTS_A), (128, 128, 8, 3, WEIGHTS_A),
                                             (128, 256, 8, 3, WEIGHTS_A), (128, 128, 8, 3, CODES),
                                             (128, 128, 8, 3, NATURAL), (128, 128, 8, 2, NATURAL),
                                             (64, 128, 4, 3, NATURAL))]
A8_VARIANTS = [dict(block_m=bm, block_n=bn, num_warps=w, num_stages=3, form=form, ctas_per_sm=1)
               for bm, bn, w, form in ((64, 128, 4, WEIGHTS_A), (128, 128, 8, WEIGHTS_A), (64, 256, 8, WEIGHTS_A),
                                       (128, 128, 8, CODES))]


# Alternatives to gemv.ROW_BUCKETS for --sweep
GEMV_VARIANTS = [dict(block_n=bn, warps=w, stages=st, ctas_per_sm=c) for bn, w, st, c in
                 ((128, 2, 2, 8), (128, 2, 2, 6), (128, 2, 3, 7), (128, 2, 2, 4), (128, 4, 2, 4), (128, 4, 3, 4),
                  (256, 4, 2, 4), (256, 4, 3, 3), (64, 2, 3, 12))]


def sweep(peak_Bps: float) -> list:
    rows = []
    for (name, n, k), m in itertools.product(SHAPES, (1, 5, 16)):
        configs = [gemv.config(m, n, k, torch.device("cuda"), **v) for v in GEMV_VARIANTS]
        rows += best_of(configs, lambda c: time_ours(m, n, k, cfg=c),
                        lambda c, us: row("int4_gemv", f"{name} {n}x{k} M={m}", us, int4_bytes(m, n, k), 2 * m * n * k,
                                          peak_Bps, config=_str(c)), show=4)
    cases = [([s for s in SHAPES if s[0] in ("mlp_gate_up", "mlp_down")], GEMM_M, GEMM_VARIANTS, False),
             ([s for s in SHAPES if s[0] in ("mlp_gate_up", "mlp_down")], GEMM_M, A8_VARIANTS, True)]
    for shapes, ms, variants, a8 in cases:
        for (name, n, k), m in itertools.product(shapes, ms):
            configs = [(mma.config(m, n, k, torch.device("cuda"), a8=a8, **v), v["ctas_per_sm"]) for v in variants]
            rows += best_of(configs, lambda c: time_ours(m, n, k, a8=a8, cfg=c[0]),
                            lambda c, us: row("w4a8_linear" if a8 else "int4_linear", f"{name} {n}x{k} M={m}", us,
                                              int4_bytes(m, n, k, 1 if a8 else 2), 2 * m * n * k, peak_Bps,
                                              config=_str(c[0]) + f" c{c[1]}"), show=6)
    return rows


if __name__ == "__main__":
    suite_main(run, sweep, __doc__)
