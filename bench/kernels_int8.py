"""Int8 lm_head GEMV/GEMM (248320 × 5120, per-row scales) and the int8 embedding gather, with cuBLAS bf16 timed at
the same shape in the same run. Weight copies rotate so that every call reads HBM (bench/kernels_int4.rotation).
Bytes: int8 weights + row scales + activations + outputs (bf16 logits).

`python -m bench.kernels_int8 --sweep` times alternatives to kernels/int8_linear.py's M_BUCKETS."""

import torch

from bench.harness import best_of, row, suite_main, time_us
from bench.kernels_int4 import rotation
from kernels.int8_embedding import int8_embedding
from kernels.int8_linear import Config, int8_linear, pick_config
from layers.quant import Int8Weight

VOCAB, HIDDEN = 248320, 5120
LINEAR_M = (1, 2, 3, 4, 5, 64, 320)
PEER_M = (1, 5, 320)
GATHER_T = (1, 320, 4096)


def random_int8(n, k):
    return Int8Weight(torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda"),
                      (torch.rand(n, device="cuda") * 0.01).half())


def lm_head_bytes(m, n=VOCAB, k=HIDDEN):
    return n * k + n * 2 + m * k * 2 + m * n * 2


def time_ours(m, cfg=None, n=VOCAB, k=HIDDEN):
    weights = rotation(lambda: random_int8(n, k), n * k)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return time_us(lambda: int8_linear(x, weights(), out=out, cfg=cfg))


def run(peak_Bps: float) -> list:
    rows, cublas = [], {}
    shape = f"lm_head {VOCAB}x{HIDDEN}"
    for m in PEER_M:
        weights = rotation(lambda: torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16), VOCAB * HIDDEN * 2)
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, VOCAB, device="cuda", dtype=torch.bfloat16)
        cublas[m] = us = time_us(lambda: torch.mm(x, weights().t(), out=out))
        rows.append(row("bf16 matmul", f"{shape} M={m}", us, VOCAB * HIDDEN * 2 + m * HIDDEN * 2 + m * VOCAB * 2,
                        2 * m * VOCAB * HIDDEN, peak_Bps, peer="cublas-bf16"))
        del weights
    for m in LINEAR_M:
        us = time_ours(m)
        extra = {"vs_cublas": round(cublas[m] / us, 2)} if m in cublas else {}
        rows.append(row("int8_linear", f"{shape} M={m}", us, lm_head_bytes(m), 2 * m * VOCAB * HIDDEN, peak_Bps,
                        peer="ours", config=_cfg_str(pick_config(m)), **extra))
    table = random_int8(VOCAB, HIDDEN)
    for t in GATHER_T:
        ids = torch.randint(0, VOCAB, (t,), device="cuda")
        out = torch.empty(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        us = time_us(lambda: int8_embedding(ids, table, out=out))
        rows.append(row("int8_embedding", f"embed {VOCAB}x{HIDDEN} T={t}", us, t * (HIDDEN * 3 + 2 + 8), 0,
                        peak_Bps, peer="ours"))
    return rows


def _cfg_str(c: Config) -> str:
    return f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} st{c.num_stages}" + (" A" if c.weights_a else "")


GEMV_SWEEP = [Config(16, bn, bk, w, st) for bn, bk, w, st in ((64, 256, 4, 3), (128, 128, 4, 3), (128, 128, 4, 4),
                                                             (128, 256, 4, 3), (256, 128, 8, 3), (128, 256, 8, 3))]
GEMM_SWEEP = [Config(bm, bn, bk, w, 3, wa) for bm, bn, bk, w, wa in ((64, 128, 128, 4, True), (128, 128, 128, 8, True),
                                                                    (128, 256, 64, 8, True), (64, 256, 128, 8, True),
                                                                    (128, 128, 128, 8, False))]


def sweep(peak_Bps: float) -> list:
    rows = []
    for m, configs in ((1, GEMV_SWEEP), (5, GEMV_SWEEP), (64, GEMM_SWEEP), (320, GEMM_SWEEP)):
        rows += best_of(configs, lambda c: time_ours(m, c),
                        lambda c, us: row("int8_linear", f"lm_head M={m}", us, lm_head_bytes(m),
                                          2 * m * VOCAB * HIDDEN, peak_Bps, config=_cfg_str(c)))
    return rows


if __name__ == "__main__":
    suite_main(run, sweep, __doc__)
