"""Int4 quantisation (layers/quant.py) and the int4-weight linears (kernels/int4) against the dequantising reference
(kernels/int4/ref.py). CPU cases run in the Triton interpreter at small odd shapes; GPU cases at the 27B shapes; the
dispatch at every engine shape on a simulated H200 and RTX 3090."""
import pytest
import torch

from kernels import device as gpu
from kernels.int4 import config, gemv, int4_linear, mma, w4a8_linear, wgmma_ws
from kernels.int4.mma import CODES, NATURAL, WEIGHTS_A, Config
from kernels.int4.ref import int4_linear_ref, w4a8_linear_ref
from kernels.int4.splitk import workspace
from layers.quant import (Int4Weight, a8_k, a8_permute, concat_outputs, dequantize_int4, int4_from_gptq, mma_k,
                          pack_int4, pack_mma, quantize_act_int8, quantize_int4, unpack_int4, unpack_mma)
from tests.fixtures import rel_err
from tests.int4_cases import SHAPES_27B

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter's runtime-bounded loops trip a numpy deprecation (ENGINE.md §7): not ours
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def random_weight(n, k, sym, scale_dtype, gen):
    w = torch.randn(n, k, generator=gen) * (1 + torch.rand(n, 1, generator=gen))     # rows of varied scale
    return quantize_int4(w, sym=sym, scale_dtype=scale_dtype)


# --- quantisation ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dim", [((40, 24), 0), ((24, 40), 1), ((3, 16, 8), 1)])
def test_pack_unpack_round_trip(shape, dim):
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, shape, generator=gen, dtype=torch.uint8)
    words = pack_int4(codes, dim=dim)
    assert words.dtype == torch.int32 and words.shape[dim] == shape[dim] // 8
    assert torch.equal(unpack_int4(words, dim=dim), codes)


def test_pack_layout_is_gptq():
    codes = torch.arange(16, dtype=torch.uint8).reshape(16, 1) % 16         # k = 0..15 in one column
    words = pack_int4(codes)
    assert words[0, 0].item() == 0x76543210 and words[1, 0].item() == -0x01234568   # 0xFEDCBA98 as int32


def test_mma_layout():
    """pack_mma/unpack_mma round-trip; every k of a block has one slot; a code lands where the fragment wants it:
    k = 128 + 32w + 16p1 + 8p0 + 2t + e in word 4t + w of block 1, nibble 4e + 2p1 + p0."""
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (384, 24), generator=gen, dtype=torch.uint8)
    words = pack_mma(codes)
    assert words.dtype == torch.int32 and words.shape == (3, 24, 16)
    assert torch.equal(unpack_mma(words), codes)
    assert torch.equal(mma_k().flatten().sort().values, torch.arange(128))
    one = torch.zeros(256, 3, dtype=torch.uint8)
    w, p1, p0, t, e = 2, 1, 0, 3, 1
    one[128 + 32 * w + 16 * p1 + 8 * p0 + 2 * t + e, 2] = 0xB
    words = pack_mma(one)
    assert words.count_nonzero() == 1 and words[1, 2, 4 * t + w].item() == 0xB << 4 * (4 * e + 2 * p1 + p0)


def test_a8_operand_order():
    """The W4A8 wgmma operand (kernels/int4/wgmma_ws._a_operand_i8), modelled here: word 4t + w of a column unpacked as
    bytes q of (word >> 4r) & 0x0F0F0F0F fills slot k' = 32w + 16r + 4t + q; against activations in a8_permute's
    order every slot meets its own k, so the dot product is the dequantised one."""
    gen = torch.Generator().manual_seed(6)
    codes = torch.randint(0, 16, (256, 24), generator=gen, dtype=torch.uint8)
    x = torch.randint(-127, 128, (3, 256), generator=gen)
    words = pack_mma(codes).to(torch.int64) & 0xFFFFFFFF                       # [K/128, N, 16 (4t + w)]
    t, w, r, q = torch.meshgrid(torch.arange(4), torch.arange(4), torch.arange(2), torch.arange(4), indexing="ij")
    nib = (words[..., (4 * t + w).flatten()] >> (4 * r + 8 * q).flatten()) & 0xF   # [K/128, N, (t, w, r, q)]
    slot = (32 * w + 16 * r + 4 * t + q).flatten()
    operand = torch.empty_like(nib)
    operand[..., slot] = nib                                                    # [K/128, N, k']
    operand = operand.permute(0, 2, 1).reshape(256, 24) - 8                     # codes − 8 in slot order
    assert torch.equal(a8_permute(x) @ operand, x @ (codes.long() - 8))
    assert torch.equal(a8_permute(x)[:, :32], x[:, a8_k()])


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_quantize_dequantize(sym, scale_dtype):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(24, 384, generator=gen)
    q = quantize_int4(w, sym=sym, scale_dtype=scale_dtype)
    assert q.qweight.shape == (3, 24, 16) and q.scales.shape == (3, 24) and q.scales.dtype == scale_dtype
    assert (q.zs is None) == sym
    err = rel_err(dequantize_int4(q), w)
    assert 0.02 < err < 0.12, err                                          # int4 RTN: ~0.08 sym, ~0.07 asym
    # codes are round-to-nearest against the stored scales: within half a step (+ the scale's rounding at the clamp)
    step = q.scales.float().repeat_interleave(128, 0).t()
    assert bool(((dequantize_int4(q) - w).abs() <= 0.54 * step).all())


@pytest.mark.parametrize("sym", [True, False])
def test_concat_outputs(sym):
    """Two linears of one input as one (concat_outputs): the same weights column for column, and one launch gives
    what the two give."""
    gen = torch.Generator().manual_seed(4)
    parts = [random_weight(n, 256, sym, torch.float16, gen) for n in (40, 16)]
    both = concat_outputs(*parts)
    assert torch.equal(dequantize_int4(both), torch.cat([dequantize_int4(w) for w in parts]))
    x = torch.randn(3, 256, generator=gen).to(DEV, torch.bfloat16)
    run = lambda w: int4_linear(x, w.to(DEV), out=torch.empty(3, w.n, device=DEV))     # fp32 outputs
    assert rel_err(run(both), torch.cat([run(w) for w in parts], 1)) < 1e-6     # the split-K sums may group apart


@pytest.mark.parametrize("sym", [True, False])
def test_int4_from_gptq_v1(sym):
    gen = torch.Generator().manual_seed(3)
    q = quantize_int4(torch.randn(16, 256, generator=gen), sym=sym)
    if sym:
        z = torch.full((2, 16), 8)
    else:
        z = torch.round(-q.zs.float() / q.scales.float()).to(torch.int64)
    qzeros = pack_int4((z - 1).to(torch.uint8), dim=1)                    # GPTQ v1 stores z − 1
    qweight = pack_int4(unpack_mma(q.qweight))
    c = int4_from_gptq(qweight, qzeros, q.scales, sym=sym, g_idx=torch.arange(256) // 128)
    assert rel_err(dequantize_int4(c), dequantize_int4(q)) < 1e-3
    # what the mma layout cannot hold is refused, not converted into other weights
    with pytest.raises(ValueError, match="act-order"):
        int4_from_gptq(qweight, qzeros, q.scales, sym=sym, g_idx=torch.randperm(256, generator=gen) // 128)
    with pytest.raises(ValueError, match="not one per 64 of K = 256"):
        int4_from_gptq(qweight, qzeros, q.scales, sym=sym, group=64)
    if sym:
        with pytest.raises(ValueError, match="zero points other than 8"):
            int4_from_gptq(qweight, pack_int4(torch.full((2, 16), 6, dtype=torch.uint8), dim=1), q.scales, sym=True)


def test_quantize_act_int8():
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 256, generator=gen)
    x[2] = 0
    xq, s = quantize_act_int8(x)
    assert xq.dtype == torch.int8 and s.shape == (5,) and int(xq.abs().max()) == 127
    assert rel_err(xq.float() * s[:, None], x) < 0.01


# --- kernels, CPU interpreter ------------------------------------------------------------------------------

# (M, N, K, sym, scale dtype, x dtype, Config): every M bucket of the table, N odd multiples of 8, split-K on and
# off, both scale placements
CASES = [
    (1, 40, 128, True, torch.float16, torch.bfloat16, Config(16, 64, 1)),
    (3, 40, 384, True, torch.bfloat16, torch.bfloat16, Config(16, 32, 3)),
    (8, 136, 384, False, torch.float16, torch.bfloat16, Config(16, 64, 2)),
    (17, 136, 256, True, torch.float16, torch.float16, Config(16, 64, 2)),
    (5, 40, 256, False, torch.bfloat16, torch.float16, Config(16, 32, 1, form=WEIGHTS_A)),
    (17, 40, 384, True, torch.bfloat16, torch.bfloat16, Config(32, 64, 2, form=WEIGHTS_A)),
    (33, 40, 384, True, torch.float16, torch.bfloat16, Config(32, 64, 2, form=NATURAL)),
    (9, 136, 256, False, torch.bfloat16, torch.float16, Config(16, 64, 1, form=NATURAL)),
]


@pytest.mark.parametrize("m,n,k,sym,sdt,xdt,cfg", CASES)
def test_int4_linear(m, n, k, sym, sdt, xdt, cfg):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    w = random_weight(n, k, sym, sdt, gen).to(DEV)
    x = torch.randn(m, k, generator=gen).to(xdt).to(DEV)
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device=DEV)      # poisoned, fp32 to see all bits
    int4_linear(x, w, out=out, cfg=cfg)
    ref = int4_linear_ref(x, w)
    assert not out.isnan().any()
    tol = 4e-3                                 # the GPU rounds each scaled weight to x's dtype before the mma
    assert rel_err(out, ref) < tol, rel_err(out, ref)
    assert (out - ref).abs().max() / ref.abs().max() < 10 * tol


def test_int4_linear_strided_and_default_output():
    gen = torch.Generator().manual_seed(5)
    w = random_weight(40, 256, True, torch.float16, gen).to(DEV)
    xbig = torch.randn(3, 300, generator=gen).bfloat16().to(DEV)
    x = xbig[:, 10:266]                                                    # row stride 300
    obig = torch.full((3, 50), float("nan"), dtype=torch.bfloat16, device=DEV)
    int4_linear(x, w, out=obig[:, 5:45], cfg=Config(16, 32, 2))
    ref = int4_linear_ref(x, w)
    assert rel_err(obig[:, 5:45], ref) < 5e-3
    assert obig[:, :5].isnan().all() and obig[:, 45:].isnan().all()          # nothing written outside the view
    out = int4_linear(x.reshape(1, 3, 256).contiguous(), w, cfg=Config(16, 64, 1))
    assert out.shape == (1, 3, 40) and out.dtype == torch.bfloat16 and rel_err(out[0], ref) < 5e-3


def test_split_k_leaves_workspace_zero_and_repeats_exactly():
    gen = torch.Generator().manual_seed(6)
    w = random_weight(72, 512, False, torch.float16, gen).to(DEV)
    x = torch.randn(2, 512, generator=gen).bfloat16().to(DEV)
    cfg = Config(16, 32, 4)
    a = int4_linear(x, w, cfg=cfg)
    b = int4_linear(x, w, cfg=cfg)
    assert torch.equal(a, b)
    ws, cnt = workspace(x.device, 1, 1)
    assert not ws.any() and not cnt.any()


@pytest.mark.parametrize("m,n,k,sym,cfg", [(1, 40, 256, True, Config(16, 64, 2)),
                                           (9, 136, 384, False, Config(16, 64, 3)),
                                           (17, 40, 128, True, Config(32, 32, 1, form=WEIGHTS_A)),
                                           (5, 136, 256, False, Config(16, 64, 2, form=WEIGHTS_A)),
                                           (33, 40, 384, True, Config(32, 32, 2, form=NATURAL)),
                                           (9, 136, 256, False, Config(16, 64, 1, form=NATURAL))])
def test_w4a8_linear(m, n, k, sym, cfg):
    gen = torch.Generator().manual_seed(7 + m)
    w = random_weight(n, k, sym, torch.float16, gen).to(DEV)
    x = torch.randn(m, k, generator=gen).to(DEV)
    xq, s_a = quantize_act_int8(x)
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device=DEV)
    w4a8_linear(xq, s_a, w, out=out, cfg=cfg)
    ref = w4a8_linear_ref(xq, s_a, w)                                       # exact int8 codes × int4 codes
    assert rel_err(out, ref) < 1e-5, rel_err(out, ref)
    out_a8 = w4a8_linear(a8_permute(xq), s_a, w, out_dtype=torch.float32, cfg=cfg, a8_order=True)
    assert rel_err(out_a8, ref) < 1e-5                                       # given in the operand's k order


def test_mma_config_splits_evenly():
    for m in (1, 5, 64, 320):
        for n, k in SHAPES_27B:
            cfg = mma.config(m, n, k, torch.device(DEV))
            groups = k // 128
            per = -(-groups // cfg.split_k)
            assert (cfg.split_k - 1) * per < groups                          # no empty split
            if m <= 16:
                assert cfg.block_m == 16
            assert mma.config(m, n, k, torch.device(DEV), a8=True).form != NATURAL    # W4A8 keeps WEIGHTS_A


# --- dispatch: the variant each engine shape takes ---------------------------------------------------------

H200, RTX3090 = gpu.Gpu((9, 0), 132, 233472), gpu.Gpu((8, 6), 82, 102400)
ENGINE_ROWS = list(range(1, 321)) + [512, 1024, 2048, 4096]      # 1-64 sequences × 1-5 tokens; prefill chunks


def dispatched(m, n, k, card, a8=False, sym=True):
    """The Config kernels.int4.config picks for m rows of an (n, k) linear on a simulated GPU (meta tensors)."""
    meta = dict(device="meta")
    scales = torch.empty(k // 128, n, dtype=torch.float16, **meta)
    w = Int4Weight(torch.empty(k // 128, n, 16, dtype=torch.int32, **meta), scales, None if sym else scales)
    x = torch.empty(m, k, dtype=torch.int8 if a8 else torch.bfloat16, **meta)
    with gpu.simulated(card):
        return config(x, w)


@pytest.mark.parametrize("n,k", SHAPES_27B)
def test_dispatch_at_engine_shapes(n, k):
    """Each variant and form is the one taken somewhere: the GEMV up to 24 rows (sm_90 and sm_86), the
    warp-specialised wgmma GEMM beyond on sm_90 (W4A8 from 65 rows), the Triton kernel on sm_86 beyond 24 rows
    (CODES), for W4A8 below 65 rows (CODES, WEIGHTS_A) and for asymmetric weights (all three forms on sm_90)."""
    for m in ENGINE_ROWS:
        c = dispatched(m, n, k, H200)
        assert isinstance(c, gemv.Config if m <= 24 else wgmma_ws.Config), (m, c)
        c = dispatched(m, n, k, H200, a8=True)
        assert isinstance(c, wgmma_ws.Config) if m >= 65 else c.form == (CODES if m <= 16 else WEIGHTS_A), (m, c)
        c = dispatched(m, n, k, H200, sym=False)
        assert c.form == (CODES if m <= 16 else WEIGHTS_A if m <= 64 else NATURAL), (m, c)
        c = dispatched(m, n, k, RTX3090)
        assert isinstance(c, gemv.Config) if m <= 24 else c.form == CODES, (m, c)
        assert dispatched(m, n, k, RTX3090, a8=True).form == CODES, m


# --- GPU, the 27B shapes -----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("n,k", SHAPES_27B)
@pytest.mark.parametrize("m", [1, 5, 320])
def test_int4_linear_27b_shapes(m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    w = quantize_int4(torch.randn(n, k, device="cuda", generator=gen), sym=(n != 5120))
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    out = int4_linear(x, w)
    ref = int4_linear_ref(x, w)
    assert rel_err(out, ref) < 6e-3, rel_err(out, ref)
    xq, s_a = quantize_act_int8(x)
    out8 = w4a8_linear(xq, s_a, w)
    ref8 = w4a8_linear_ref(xq, s_a, w)
    assert rel_err(out8, ref8) < 6e-3, rel_err(out8, ref8)
    out8 = w4a8_linear(a8_permute(xq), s_a, w, a8_order=True)             # given in the operand's k order
    assert rel_err(out8, ref8) < 6e-3, rel_err(out8, ref8)


@pytest.mark.gpu
def test_int4_linear_cuda_graph_replay():
    w = quantize_int4(torch.randn(5120, 6144, device="cuda"))
    x = torch.randn(3, 6144, device="cuda").bfloat16()
    out = torch.empty(3, 5120, device="cuda", dtype=torch.bfloat16)
    assert mma.config(3, 5120, 6144, x.device).split_k > 1
    int4_linear(x, w, out=out)                                              # warm-up: compiles, sizes the workspace
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        int4_linear(x, w, out=out)
    ref = int4_linear_ref(x, w)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, ref) < 6e-3
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert rel_err(out, int4_linear_ref(x, w)) < 6e-3
