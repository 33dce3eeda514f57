"""Shared by the int4 kernels' tests: the Qwen3.8-27B linear shapes, random GPU cases, and the CUDA-graph replay
check."""
import torch

from layers.config import qwen38_27b
from layers.quant import quantize_int4
from tests.fixtures import rel_err

SHAPES_27B = list(qwen38_27b().linear_shapes.values())          # (N, K) of the five fused linears


def int4_case(m, n, k, xdt, sdt, seed):
    """x [m, k] in xdt and W [n, k] quantised with sdt scales (rows of varied scale), on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=gen) * (1 + torch.rand(n, 1, device="cuda", generator=gen))
    w = quantize_int4(w, scale_dtype=sdt)
    x = torch.randn(m, k, device="cuda", generator=gen).to(xdt)
    return x, w


def check_graph_replay(run, x, out, reference, tol=6e-3):
    """run() writes out from x: once to warm up (compiles, sizes the workspace), then captured in a CUDA graph and
    replayed twice on fresh x (int8 x: fresh codes) into a poisoned out, each checked against reference(x)."""
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(2):
        x.copy_(torch.randint_like(x, -127, 128) if x.dtype == torch.int8 else torch.randn_like(x))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, reference(x)) < tol
