"""The warp-specialised Gluon wgmma int4 GEMM (kernels/int4/wgmma_ws.py) against the dequantising reference. Gluon
has no interpreter and wgmma needs sm_90, so these run on a Hopper GPU only; on the CPU the kernel is compiled for
sm_90 by tests/test_kernels_compile.py, and int4_linear's interpreter tests cover the same function."""
import pytest
import torch

from kernels.int4 import config, int4_linear, w4a8_linear, wgmma_ws
from kernels.int4.ref import int4_linear_ref, w4a8_linear_ref
from kernels.int4.splitk import workspace
from kernels.int4.wgmma_ws import PIECES
from layers.quant import Int4Weight, a8_permute, dequantize_int4, quantize_act_int8, quantize_int4
from tests.fixtures import rel_err
from tests.int4_cases import SHAPES_27B, check_graph_replay, int4_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available()
                                                  or torch.cuda.get_device_capability() < (9, 0), reason="sm_90")]


def rounded_ref(x, w):
    """x @ Wᵀ with W = (q − 8)·s rounded to x's dtype, s first rounded to it: the weights the kernel multiplies."""
    w16 = dequantize_int4(Int4Weight(w.qweight, w.scales.to(x.dtype))).to(x.dtype)
    return x.float() @ w16.float().T


def assert_case(run, m, n, k, xdt, sdt):
    """run(x, w, out) on a random case writes every element of a poisoned fp32 out: the sums of the products the
    kernel multiplies, close to the exact dequantised product, and the split-K workspace left zeroed."""
    x, w = int4_case(m, n, k, xdt, sdt, m * 1000 + n + k)
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")      # poisoned
    run(x, w, out)
    assert not out.isnan().any()
    assert rel_err(out, rounded_ref(x, w)) < 1e-5, rel_err(out, rounded_ref(x, w))  # fp32 sums of the same products
    assert rel_err(out, int4_linear_ref(x, w)) < 4e-3
    ws, cnt = workspace(x.device, 1, 1)
    assert not ws.any() and not cnt.any()                                # split tiles leave the workspace zeroed
    assert not workspace(x.device, 1, 1, PIECES)[1].any()                # and the stream-K counters


def ws_config(x, w, cfg, **override):
    """wgmma_ws.config for x's rows with the cut (BM, BM2, programs) given."""
    bm, bm2, programs = cfg
    return wgmma_ws.config(x.numel() // x.shape[-1], w.n, w.k, x.device, x.dtype == torch.int8, bm=bm, bm2=bm2,
                           programs=programs, **override)


# The warp-specialised form: M ragged in both token tiles (the 32-token sub-tile partly or wholly past M, a last
# tile of one row), N with a ragged column tile, odd group counts (units of one group, no overlap) and even ones
# (units of a pair, overlap), both dtypes; programs whose ranges hold whole tiles only, ranges cutting tiles in 2-9
# pieces, ranges inside one tile (both ends partial), one unit a program, one program for everything, one tile a
# program; the 192- and 256-token tiles
WS_CASES = [
    (65, 136, 384, torch.bfloat16, torch.float16, (128, 0, 1), False),
    (200, 264, 1024, torch.float16, torch.bfloat16, (128, 32, 5), True),
    (321, 520, 1152, torch.bfloat16, torch.float16, (128, 32, 7), False),
    (150, 1032, 2304, torch.bfloat16, torch.bfloat16, (128, 32, 81), True),
    (320, 392, 640, torch.float16, torch.float16, (128, 0, 2), False),
    (257, 136, 512, torch.bfloat16, torch.float16, (128, 0, 3), True),
    (321, 520, 1152, torch.bfloat16, torch.float16, (128, 32, 13), False),
    (150, 1032, 2304, torch.float16, torch.bfloat16, (128, 32, 40), True),
    (90, 264, 1024, torch.bfloat16, torch.float16, (128, 0, 11), True),
    (130, 264, 768, torch.float16, torch.float16, (128, 0, 6), True),
    (200, 264, 1024, torch.bfloat16, torch.float16, (128, 128, 3), True),     # the 192- and 256-token tiles:
    (192, 520, 2304, torch.bfloat16, torch.bfloat16, (128, 64, 5), True),     # whole, and in ranges
    (390, 136, 640, torch.float16, torch.bfloat16, (128, 64, 4), False),
    (25, 136, 384, torch.bfloat16, torch.float16, (32, 0, 1), False),        # the 32- and 64-token tiles: whole,
    (40, 264, 1024, torch.float16, torch.bfloat16, (64, 0, 6), False),        # in pieces, in ranges over tiles,
    (57, 520, 1152, torch.bfloat16, torch.float16, (32, 0, 13), False),       # two token tiles, with the overlap
    (33, 264, 768, torch.bfloat16, torch.bfloat16, (32, 0, 7), True),
]


@pytest.mark.parametrize("m,n,k,xdt,sdt,cfg,overlap", WS_CASES)
def test_int4_wgmma_ws(m, n, k, xdt, sdt, cfg, overlap):
    assert_case(lambda x, w, out: wgmma_ws.launch(x, w, out, ws_config(x, w, cfg, overlap=overlap)), m, n, k, xdt,
                sdt)


@pytest.mark.parametrize("m,n,k,xdt,sdt,cfg,overlap", WS_CASES)
def test_int4_wgmma_ws_a8(m, n, k, xdt, sdt, cfg, overlap):
    """W4A8, the same cuts of the work: int8 activations in the operand's k order (layers.quant.a8_permute), each
    group's int32 sums scaled in fp32: the exact products of the codes, summed in fp32."""
    x, w = int4_case(m, n, k, xdt, sdt, m * 1000 + n + k)
    xq, s_a = quantize_act_int8(x)
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")      # poisoned
    wgmma_ws.launch(a8_permute(xq), w, out, ws_config(xq, w, cfg), x_scale=s_a)
    ref = w4a8_linear_ref(xq, s_a, w)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-5, rel_err(out, ref)
    assert not workspace(x.device, 1, 1, PIECES)[1].any()                # the stream-K counters left zeroed


@pytest.mark.parametrize("n,k", SHAPES_27B)
@pytest.mark.parametrize("m", [25, 40, 64, 80, 200, 320])
def test_int4_linear_ws_27b(m, n, k):
    """5 to 64 sequences verifying 4 drafts: int4_linear takes the warp-specialised form at every 27B shape."""
    x, w = int4_case(m, n, k, torch.bfloat16, torch.float16, m + n + k)
    assert isinstance(config(x, w), wgmma_ws.Config)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    int4_linear(x, w, out=out)
    assert rel_err(out, rounded_ref(x, w)) < 6e-3


@pytest.mark.parametrize("m,n,k,kind", [(320, 16384, 5120, "tiles"), (200, 16384, 5120, "tiles"),
                                         (80, 5120, 6144, "pieces"), (200, 5120, 17408, "stream-K"),
                                         (32, 5120, 6144, "pieces"), (40, 34816, 5120, "stream-K")])
def test_int4_wgmma_ws_graph_replay(m, n, k, kind):
    """Each cut of the work as the H200's launch picks it: one tile a program (qkvz at 320 rows; at 200 one tile
    of 256 tokens), tiles cut in pieces (out_proj at 80; at 32 rows 32-token tiles), stream-K (down at 200, gate_up
    at 40 rows on 64-token tiles)."""
    x = torch.randn(m, k + 128, device="cuda").bfloat16()[:, 64:64 + k]            # row stride k + 128
    w = quantize_int4(torch.randn(n, k, device="cuda"))
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    c = config(x, w)
    tiles = -(-n // 128) * -(-m // (c.bm + c.bm2))
    assert kind == ("tiles" if c.programs == tiles else "pieces" if c.programs % tiles == 0 else "stream-K")
    check_graph_replay(lambda: int4_linear(x, w, out=out), x, out, lambda x: rounded_ref(x, w))


@pytest.mark.parametrize("m,n,k,a8_order", [(320, 5120, 17408, True), (200, 14336, 5120, False)])
def test_w4a8_ws_graph_replay(m, n, k, a8_order):
    """W4A8 through w4a8_linear in a CUDA graph: stream-K (down at 320 rows) on activations in the operand order,
    and whole tiles (attn at 200) behind the wrapper's permuting copy; the codes change between replays."""
    xq = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
    s_a = torch.rand(m, device="cuda") * 0.01
    w = quantize_int4(torch.randn(n, k, device="cuda"))
    out = torch.empty(m, n, dtype=torch.float32, device="cuda")
    assert isinstance(config(xq, w), wgmma_ws.Config)
    x = a8_permute(xq) if a8_order else xq
    natural = (lambda x: a8_permute(x, inverse=True)) if a8_order else (lambda x: x)
    check_graph_replay(lambda: w4a8_linear(x, s_a, w, out=out, a8_order=a8_order), x, out,
                       lambda x: w4a8_linear_ref(natural(x), s_a, w), tol=1e-5)
