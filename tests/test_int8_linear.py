"""Int8 per-row quantisation (layers/quant.py), the int8 linear and the int8 embedding gather (kernels/int8) against
the dequantising references (kernels/int8/ref.py); CPU in the Triton interpreter at small odd shapes, GPU at the
27B lm_head shape."""
import pytest
import torch

from kernels.int8 import embedding, int8_embedding, int8_linear, linear
from kernels.int8.linear import GEMM_SWEEP, GEMV_SWEEP, Config
from kernels.int8.ref import int8_embedding_ref, int8_linear_ref
from layers.config import qwen38_27b
from layers.quant import dequantize_int8, quantize_int8_rows
from tests.fixtures import rel_err

DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_quantize_int8_rows(scale_dtype):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(24, 200, generator=gen) * torch.rand(24, 1, generator=gen)
    q = quantize_int8_rows(w, scale_dtype)
    assert q.qweight.dtype == torch.int8 and q.scales.dtype == scale_dtype and q.scales.shape == (24,)
    assert int(q.qweight.abs().max()) <= 127
    step = q.scales.float()[:, None]
    assert bool(((dequantize_int8(q) - w).abs() <= 0.54 * step).all())


# (M, N, K, x dtype, out dtype, scale dtype, Config): K not a multiple of BLOCK_K exercises the masked tail; M
# beyond a tile's tokens (4 with three planes in 16 rows) several M-tiles
CASES = [
    (1, 40, 200, torch.bfloat16, torch.float32, torch.float16, Config(16, 32, 64)),
    (3, 136, 384, torch.bfloat16, torch.bfloat16, torch.bfloat16, Config(16, 64, 128)),
    (17, 40, 96, torch.float16, torch.float32, torch.float16, Config(16, 32, 64)),
    (5, 136, 256, torch.bfloat16, torch.float32, torch.float16, Config(32, 64, 128)),
    (17, 136, 200, torch.bfloat16, torch.float32, torch.bfloat16, Config(32, 64, 64, weights_a=True)),
    (6, 200, 160, torch.bfloat16, torch.float32, torch.float16, Config(16, 32, 64, parts=2)),
    (19, 136, 200, torch.bfloat16, torch.float32, torch.float16, Config(16, 32, 64, weights_a=True, parts=1)),
]
# relative error of the activation planes (kernels/int8/linear.py), for randn rows of hundreds to thousands
PARTS_TOL = {1: 2e-2, 2: 2e-4, 3: 1e-5}


@pytest.mark.parametrize("m,n,k,xdt,odt,sdt,cfg", CASES)
def test_int8_linear(m, n, k, xdt, odt, sdt, cfg):
    gen = torch.Generator().manual_seed(m * 100 + n + k)
    w = quantize_int8_rows(torch.randn(n, k, generator=gen), sdt)
    w.qweight[0, :] = -128 if k > 100 else 127                                # the extreme codes
    w = w.to(DEV)
    x = torch.randn(m, k, generator=gen).to(xdt).to(DEV)
    out = torch.full((m, n), float("nan"), dtype=odt, device=DEV)
    int8_linear(x, w, out=out, cfg=cfg)
    ref = int8_linear_ref(x, w)
    assert not out.isnan().any()
    tol = max(PARTS_TOL[cfg.parts], 1e-5 if odt == torch.float32 else 5e-3)
    assert rel_err(out, ref) < tol, rel_err(out, ref)


def test_int8_linear_default_output_and_strides():
    gen = torch.Generator().manual_seed(2)
    w = quantize_int8_rows(torch.randn(40, 128, generator=gen)).to(DEV)
    xbig = torch.randn(2, 3, 160, generator=gen).bfloat16().to(DEV)
    x = xbig[..., :128].contiguous()
    out = int8_linear(x, w, cfg=Config(16, 32, 64))
    assert out.shape == (2, 3, 40) and out.dtype == torch.bfloat16
    assert rel_err(out, int8_linear_ref(x, w)) < 5e-3
    x2 = xbig[0, :, 16:144]                                                 # row stride 160
    obig = torch.full((3, 48), float("nan"), device=DEV)
    int8_linear(x2, w, out=obig[:, 4:44], cfg=Config(16, 32, 64))
    assert rel_err(obig[:, 4:44], int8_linear_ref(x2, w)) < 1e-5
    assert obig[:, :4].isnan().all() and obig[:, 44:].isnan().all()


@pytest.mark.parametrize("odt", [torch.bfloat16, torch.float32])
def test_int8_embedding(odt):
    gen = torch.Generator().manual_seed(3)
    w = quantize_int8_rows(torch.randn(50, 300, generator=gen)).to(DEV)
    ids = torch.tensor([[3, 0, 49], [3, 17, 3]]).to(DEV)
    out = torch.full((2, 3, 300), float("nan"), dtype=odt, device=DEV)
    int8_embedding(ids, w, out=out, cfg=embedding.Config(block_k=128))
    ref = int8_embedding_ref(ids, w)
    # one bf16 ulp: the interpreter truncates fp32 → bf16 where the GPU rounds
    tol = ref.abs() * 2**-7 if odt == torch.bfloat16 else 1e-6
    assert bool(((out.float() - ref).abs() <= tol).all())
    assert int8_embedding(ids[0, :0], w).shape == (0, 300)
    column = torch.tensor([[7, 3, 0], [41, 9, 2]], dtype=torch.int32, device=DEV)[:, 1]    # strided: step 1's drafts
    assert torch.equal(int8_embedding(column, w, out_dtype=torch.float32), int8_embedding_ref(column, w))


M27 = qwen38_27b()
VOCAB, HIDDEN = M27.vocab_size, M27.hidden_size


@pytest.fixture(scope="module")
def lm_head():
    """A random int8 head of the 27B shape and its dequantised fp32 copy."""
    w = quantize_int8_rows(torch.randn(VOCAB, HIDDEN, device="cuda"))
    return w, dequantize_int8(w)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 8, 64, 320])
def test_int8_linear_lm_head(lm_head, m):
    w, wf = lm_head
    x = torch.randn(m, HIDDEN, device="cuda").bfloat16()
    out = int8_linear(x, w, out=torch.full((m, VOCAB), float("nan"), device="cuda"))
    tol = PARTS_TOL[linear.config(m, "cuda").parts]
    assert rel_err(out, x.float() @ wf.T) < tol, rel_err(out, x.float() @ wf.T)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", list(dict.fromkeys(GEMV_SWEEP + GEMM_SWEEP)), ids=str)
def test_int8_linear_lm_head_sweep(lm_head, cfg):
    """Every config the benchmark sweeps computes the head (M = 5, and two M-tiles, the second part-filled)."""
    w, wf = lm_head
    for m in (5, 2 * cfg.tokens - 1):
        x = torch.randn(m, HIDDEN, device="cuda").bfloat16()
        out = int8_linear(x, w, out=torch.full((m, VOCAB), float("nan"), device="cuda"), cfg=cfg)
        assert rel_err(out, x.float() @ wf.T) < PARTS_TOL[cfg.parts], (m, rel_err(out, x.float() @ wf.T))


@pytest.mark.gpu
def test_int8_embedding_vocab():
    w = quantize_int8_rows(torch.randn(VOCAB, HIDDEN, device="cuda"))
    ids = torch.randint(0, VOCAB, (300,), device="cuda")
    out = int8_embedding(ids, w)
    assert rel_err(out, int8_embedding_ref(ids, w)) < 4e-3
