"""The Gluon int4 GEMV (kernels/int4/gemv.py) against the dequantising reference. Gluon has no interpreter, so
these run on a GPU only; on the CPU the kernel is compiled for sm_86/sm_90 by tests/test_kernels_compile.py and
the same function is covered by int4_linear's interpreter tests."""
import pytest
import torch

from kernels.int4 import gemv
from kernels.int4.ref import int4_linear_ref
from kernels.int4.splitk import workspace
from layers.quant import quantize_int4
from tests.fixtures import rel_err
from tests.int4_cases import SHAPES_27B, check_graph_replay, int4_case

pytestmark = pytest.mark.gpu


def case(m, n, k, xdt, sdt, seed):
    x, w = int4_case(m, n, k, xdt, sdt, seed)
    return x, w, int4_linear_ref(x, w)


def int4_gemv(x, w, out, **override):
    """The GEMV's launch for x's rows (gemv.config), with any of its fields overridden."""
    return gemv.launch(x, w, out, gemv.config(x.numel() // x.shape[-1], w.n, w.k, x.device, **override))


# M across the token widths (8, 16, 16 + 8), N an odd multiple of 8 (ragged last tile), K odd numbers of groups;
# the programs cut the tiles' groups into ranges that end inside tiles, span several, or take one group or tile
# each; rings of 2 (the default), 3 and 4 stages; both reductions of shared tiles (two token tiles: flush_marked)
@pytest.mark.parametrize("marks", [True, False])
@pytest.mark.parametrize("m,n,k,xdt,sdt,cfg", [
    (1, 40, 128, torch.bfloat16, torch.float16, dict(block_n=64, warps=2, programs=1)),
    (3, 136, 384, torch.bfloat16, torch.bfloat16, dict(block_n=32, warps=2, programs=4)),
    (5, 200, 640, torch.float16, torch.float16, dict(block_n=64, warps=2, programs=7, stages=3)),
    (8, 1032, 1152, torch.bfloat16, torch.float16, dict(block_n=128, warps=4, programs=10, stages=4)),
    (9, 136, 384, torch.float16, torch.bfloat16, dict(block_n=64, warps=4, programs=9)),
    (16, 520, 896, torch.bfloat16, torch.float16, dict(block_n=128, warps=2, programs=3)),
    (17, 136, 384, torch.float16, torch.float16, dict(block_n=64, warps=4, programs=5)),
    (24, 1032, 1152, torch.bfloat16, torch.float16, dict(block_n=128, warps=4, programs=11, stages=3)),
])
def test_int4_gemv(m, n, k, xdt, sdt, cfg, marks):
    if m > 16 and not marks:
        pytest.skip("two token tiles are flushed by flush_marked (or posted into int64 sums)")
    x, w, ref = case(m, n, k, xdt, sdt, m * 1000 + n + k)
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")      # poisoned
    int4_gemv(x, w, out, marks=marks, **cfg)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-3, rel_err(out, ref)                   # exact codes and sums, x rounded only
    ws, cnt = workspace(x.device, 1, 1)
    assert not ws.any() and not cnt.any()                                # split tiles leave the workspace zeroed


@pytest.mark.parametrize("m", [1, 16, 24])
def test_int4_gemv_large_outputs(m):
    """Outputs near 10^5 (the fixed-point sums hold up to 2^24 where programs share a tile) with both reductions."""
    x, w, ref = case(m, 5120, 17408, torch.bfloat16, torch.float16, 7)
    x, ref = x * 512, ref * 512
    assert ref.abs().max() > 3e4
    for marks in (True, False) if m <= 16 else (True,):
        out = torch.empty(m, 5120, dtype=torch.float32, device="cuda")
        int4_gemv(x, w, out, marks=marks)
        assert rel_err(out, ref) < 1e-3, (marks, rel_err(out, ref))


@pytest.mark.parametrize("n,k", SHAPES_27B)
@pytest.mark.parametrize("m", [1, 5, 16, 20])
def test_int4_gemv_27b_shapes(m, n, k):
    x, w, ref = case(m, n, k, torch.bfloat16, torch.float16, m + n)
    assert gemv.supports(x, w)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    int4_gemv(x, w, out)
    assert rel_err(out, ref) < 6e-3, rel_err(out, ref)


@pytest.mark.parametrize("n,k", SHAPES_27B)
def test_int4_gemv_width_invariant(n, k):
    """Each token's output is bitwise the same alone (decode) or among 2, 4, 5, 8, 16, 17 or 24 (verify steps: every
    row bucket, each its own launch geometry, token tiles — spread over the even token columns at 1-2 rows — and K
    ranges), and run to run."""
    x, w, _ = case(24, n, k, torch.bfloat16, torch.float16, n + k)
    outs = {}
    for m in (1, 2, 4, 5, 8, 16, 17, 24):
        outs[m] = torch.empty(m, n, dtype=torch.float32, device="cuda")
        int4_gemv(x[:m], w, outs[m])
    again = torch.empty(24, n, dtype=torch.float32, device="cuda")
    int4_gemv(x, w, again)
    for m in (1, 2, 4, 5, 8, 16, 17):
        assert torch.equal(outs[m], outs[24][:m]), m
    assert torch.equal(outs[24], again)
    for t in (11, 20):                                                  # in the first token tile, in the second
        single = torch.empty(1, n, dtype=torch.float32, device="cuda")
        int4_gemv(x[t:t + 1], w, single)
        assert torch.equal(single[0], outs[24][t]), t


@pytest.mark.parametrize("n,k", SHAPES_27B)
def test_int4_gemv_sum_once_same_bits(n, k):
    """Σx as one m16 mma block per warp (sum_once: the default below sm_90, forced here) gives the sums of the
    [BN, 32] ones mma bit for bit, at every token width, stored and into int64 sums."""
    x, w, _ = case(24, n, k, torch.bfloat16, torch.float16, 5 * n + k)
    for m in (1, 5, 8, 12, 16, 20, 24):
        for dtype in (torch.bfloat16, torch.int64):
            outs = [torch.zeros(m, n, dtype=dtype, device="cuda") for _ in range(2)]
            for out, once in zip(outs, (False, True)):
                int4_gemv(x[:m], w, out, sum_once=once)
            assert torch.equal(outs[0], outs[1]), (m, dtype)


@pytest.mark.parametrize("n,k", SHAPES_27B)
def test_int4_gemv_spread_same_bits(n, k):
    """Tokens spread over the even token columns (the launch at 1-2 rows; up to 4 fit) give the sums of the packed
    columns bit for bit, stored and into int64 sums."""
    x, w, _ = case(4, n, k, torch.bfloat16, torch.float16, 7 * n + k)
    for m in (1, 2, 3, 4):
        for dtype in (torch.bfloat16, torch.int64):
            outs = [torch.zeros(m, n, dtype=dtype, device="cuda") for _ in range(2)]
            for out, spread in zip(outs, (False, True)):
                int4_gemv(x[:m], w, out, spread=spread)
            assert torch.equal(outs[0], outs[1]), (m, dtype)


@pytest.mark.parametrize("m", [4, 20])
def test_int4_gemv_strided_rows_and_graph_replay(m):
    x = torch.randn(m, 6144 + 128, device="cuda").bfloat16()[:, 64:64 + 6144]    # row stride 6272
    w = quantize_int4(torch.randn(5120, 6144, device="cuda"))
    out = torch.empty(m, 5120, dtype=torch.bfloat16, device="cuda")
    check_graph_replay(lambda: int4_gemv(x, w, out), x, out, lambda x: int4_linear_ref(x, w))


@pytest.mark.parametrize("n,k", SHAPES_27B)
def test_int4_gemv_deferred_sums(n, k):
    """Into int64 zeros the GEMV posts its fixed-point sums (kernels/fixed_sum.py); converted they are bitwise the
    bf16 output it stores itself, at every row bucket, and the same run to run. (Zero on entry: a tile one program
    holds whole is stored, not added — at 17-24 rows, 2 CTAs per SM, gate_up's programs hold 41 groups.)"""
    from kernels.fixed_sum import to_bf16_ref
    x, w, _ = case(24, n, k, torch.bfloat16, torch.float16, 3 * n + k)
    for m in (1, 2, 5, 8, 12, 16, 20, 24):
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        sums = torch.zeros(m, n, dtype=torch.int64, device="cuda")
        int4_gemv(x[:m], w, out)
        int4_gemv(x[:m], w, sums)
        assert torch.equal(to_bf16_ref(sums), out), m
        again = torch.zeros_like(sums)
        int4_gemv(x[:m], w, again)
        assert torch.equal(again, sums), m
