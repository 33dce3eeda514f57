"""Int8 lm_head GEMV/GEMM (the 27B vocabulary × hidden, per-row scales) and the int8 embedding gather, with cuBLAS
bf16 timed at the same shape in the same run. Weight copies rotate so that every call reads HBM
(bench/harness.Rotation).
Bytes: int8 weights + fp16 row scales + bf16 activations + outputs (fp32 logits here: the eager model's dtype;
bench/step.py's chain writes bf16 logits, 2 bytes less an element, with lm_head_bytes(out_bytes=2)). The embedding
gather reads fixed ids, so its rows sit in L2 across the timed calls (not rotated: no target reads it).

`python -m bench.kernels_int8 --sweep` times alternatives to kernels/int8/linear.py's tables (GEMV_SWEEP, GEMM_SWEEP
beside them)."""

import torch

from bench.harness import Rotation, best_of, suite_main, time_us
from kernels.int8 import int8_embedding, int8_linear
from kernels.int8.linear import GEMM_SWEEP, GEMV_SWEEP, Config, config, split_activations
from layers.config import qwen38_27b
from layers.quant import Int8Weight
from tools.targets import row

VOCAB, HIDDEN = qwen38_27b().vocab_size, qwen38_27b().hidden_size
LINEAR_M = (1, 2, 3, 4, 5, 64, 320)
PEER_M = (1, 5, 320)
GATHER_T = (1, 320, 4096)


def random_int8(n, k):
    return Int8Weight(torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda"),
                      (torch.rand(n, device="cuda") * 0.01).half())


def lm_head_bytes(m, n=VOCAB, k=HIDDEN, out_bytes=4):
    """An int8 lm_head's bytes for m tokens: weights, fp16 scales, bf16 activations in, logits out (fp32 here)."""
    return n * k + n * 2 + m * k * 2 + m * n * out_bytes


def time_ours(m, cfg=None, n=VOCAB, k=HIDDEN):
    weights = Rotation(lambda: random_int8(n, k), n * k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.float32)
    return time_us(lambda: int8_linear(x, weights(), out=out, cfg=cfg), reps=weights.reps)


def run(peak_Bps: float) -> list:
    rows, cublas = [], {}
    shape = f"lm_head {VOCAB}x{HIDDEN}"
    for m in PEER_M:
        weights = Rotation(lambda: torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16), VOCAB * HIDDEN * 2)
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, VOCAB, device="cuda", dtype=torch.bfloat16)
        cublas[m] = us = time_us(lambda: torch.mm(x, weights().t(), out=out), reps=weights.reps)
        rows.append(row("bf16 matmul", f"{shape} M={m}", us, VOCAB * HIDDEN * 2 + m * HIDDEN * 2 + m * VOCAB * 2,
                        2 * m * VOCAB * HIDDEN, peak_Bps, peer="cublas-bf16"))
        weights = None                                          # free this copy before the next
    for m in LINEAR_M:
        us = time_ours(m)
        extra = {"vs_cublas": round(cublas[m] / us, 2)} if m in cublas else {}
        rows.append(row("int8_linear", f"{shape} M={m}", us, lm_head_bytes(m), 2 * m * VOCAB * HIDDEN, peak_Bps,
                        peer="ours", config=_cfg_str(config(m, "cuda")), **extra))
    table = random_int8(VOCAB, HIDDEN)
    for t in GATHER_T:
        ids = torch.randint(0, VOCAB, (t,), device="cuda")
        out = torch.empty(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        us = time_us(lambda: int8_embedding(ids, table, out=out))
        rows.append(row("int8_embedding", f"embed {VOCAB}x{HIDDEN} T={t}", us, t * (HIDDEN * 3 + 2 + 8), 0,
                        peak_Bps, peer="ours"))
    return rows


def _cfg_str(c: Config) -> str:
    a = " A" if c.weights_a else ""
    return f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} st{c.num_stages}{a} p{c.parts}"


def sweep(peak_Bps: float) -> list:
    """Each M against the configs that hold it in one M-tile (GEMV) or any (GEMM); rows print as they come."""
    rows = []
    for m, configs in ((1, GEMV_SWEEP), (5, GEMV_SWEEP), (20, GEMM_SWEEP), (64, GEMM_SWEEP), (320, GEMM_SWEEP)):
        def make_row(c, us, m=m):
            r = row("int8_linear", f"lm_head M={m}", us, lm_head_bytes(m), 2 * m * VOCAB * HIDDEN, peak_Bps,
                    config=_cfg_str(c))
            print(f"  M={m:<4d} {r['config']:40s} {us:9.2f} us  {r['frac_peak']:.3f}", flush=True)
            return r
        rows += best_of([c for c in configs if m > 8 or m <= c.tokens], lambda c, m=m: time_ours(m, c), make_row)
    for m in (1, 5, 320):                                       # the activation split alone (part of every p row)
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        us = time_us(lambda: split_activations(x, config(m, "cuda")))
        rows.append(row("split_activations", f"M={m}", us, m * HIDDEN * 3 + m * 4, 0, peak_Bps))
        print(f"  split_activations M={m}: {us:.2f} us", flush=True)
    return rows


if __name__ == "__main__":
    suite_main(run, sweep, __doc__)
