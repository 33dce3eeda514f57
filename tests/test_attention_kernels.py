"""fp8 e4m3 codec, KV writer, split-KV verify attention and prefill attention against their plain-torch
references. CPU: Triton interpreter at tiny shapes; GPU (@gpu): the 27B shapes (Hq 24, Hkv 4, D 256)."""
import math
from dataclasses import replace

import pytest
import torch

from kernels.attention import (KV_FP8_BITS, KV_FP8_NATIVE, alloc_partials, choose_nseg, combine_block_d, kv_cache,
                               kv_scales_from, prefill, prefill_attention, verify, verify_attention, verify_config,
                               verify_gluon, write_kv)
from kernels.attention.config import LAUNCH_CONFIGS, PREFILL_CONFIGS
from kernels.attention.fp8 import decode_e4m3, encode_e4m3
from kernels.attention.kv_write import v_transposed
from kernels.attention.ref import attention_ref, decode_e4m3_ref, encode_e4m3_ref, write_kv_ref
from tests.fixtures import rel_err

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ALL_CODES = torch.arange(256, dtype=torch.uint8)
NAN_CODES = (0x7F, 0xFF)


def max_rel(out, ref):
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def random_cache(slots, hkv, max_len, D, fp8, gen):
    """Poisoned beyond what the tests fill: random e4m3 codes (NaN codes excluded) or bf16 normals."""
    if fp8:
        codes = torch.randint(0, 256, (slots, hkv, max_len, D), dtype=torch.uint8, generator=gen)
        codes[(codes & 0x7F) == 0x7F] ^= 0x01  # no NaN codes: a cache written by write_kv never holds them
        return codes.to(DEV)
    return torch.randn(slots, hkv, max_len, D, generator=gen).bfloat16().to(DEV)


def triton_cfg(q, k_cache, block_m=None, **launch):
    """The Triton kernel's Config for q (or tiles of block_m rows) with some launch parameters set."""
    return replace(verify.config(q, k_cache, block_m=block_m), **launch)


def setup(B, q_len, hq, hkv, D, lens, fp8, seed=0, max_len=None, slots=None, vt=False):
    gen = torch.Generator().manual_seed(seed)
    max_len = max_len or max(lens) + 3
    slots = slots or B + 2
    kc, vc = (random_cache(slots, hkv, max_len, D, fp8, gen) for _ in range(2))
    vc = v_transposed(vc) if vt else vc
    ks, vs = ((torch.rand(hkv, generator=gen) + 0.25).to(DEV) if fp8 else None for _ in range(2))
    rows = torch.randperm(slots, generator=gen)[:B].to(torch.int32).to(DEV)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    q = torch.randn(B, q_len, hq, D, generator=gen).bfloat16().to(DEV)
    return q, kc, vc, ks, vs, rows, kv_lens


# ---- fp8 e4m3 codec ----------------------------------------------------------------------------------------

def test_e4m3_decode_all_codes():
    out = decode_e4m3(ALL_CODES.to(DEV), 1.0).cpu()
    ref = decode_e4m3_ref(ALL_CODES)
    finite = ~ref.isnan()
    assert torch.equal(out[finite], ref[finite])  # bit-exact incl. subnormals and ±0
    assert out[0x80].signbit() and not out[0].signbit()
    assert out[list(NAN_CODES)].tolist() == [480.0, -480.0]  # documented: NaN codes decode to ±480
    assert torch.equal(decode_e4m3(ALL_CODES.to(DEV), 0.375).cpu()[finite], ref[finite] * 0.375)


def test_e4m3_encode_matches_torch():
    values = decode_e4m3_ref(ALL_CODES)
    values = values[~values.isnan()]
    grid = values[values >= 0].sort().values
    mids = (grid[1:] + grid[:-1]) / 2  # exact ties: must round to the even code
    gen = torch.Generator().manual_seed(1)
    x = torch.cat([values, mids, -mids, mids + 1e-7 * mids, torch.randn(20000, generator=gen) * 60,
                   torch.randn(5000, generator=gen) * 3e-3,  # subnormal range
                   torch.tensor([448.0, 449.0, 464.0, 480.0, 1e6, -1e6, 0.0, -0.0, 2.0 ** -10, 2.0 ** -9 * 0.5])])
    for scale in (1.0, 0.37):
        out = encode_e4m3(x.to(DEV), scale).cpu()
        ref = encode_e4m3_ref(x, scale)
        assert torch.equal(out, ref), x[out != ref][:8]
        assert not any((out == c).any() for c in NAN_CODES)  # saturates to ±448, never NaN


# ---- KV writer -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fp8,vt", [(True, False), (False, False), (True, True)])
def test_write_kv_matches_reference(fp8, vt):
    B, n_new, hkv, D = 3, 4, 2, 32
    gen = torch.Generator().manual_seed(2)
    kc, vc = (random_cache(5, hkv, 40, D, fp8, gen) for _ in range(2))
    vc = v_transposed(vc) if vt else vc
    kc_ref, vc_ref = kc.clone(), vc.clone()
    k = (torch.randn(B, n_new, hkv, D, generator=gen) * 3).bfloat16().to(DEV)
    v = torch.randn(B, n_new, hkv, D, generator=gen).bfloat16().to(DEV)
    ks, vs = kv_scales_from(k, v) if fp8 else (None, None)
    rows = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEV)  # row 1 is padding: must not write
    lens = torch.tensor([n_new, 17, 39], dtype=torch.int32, device=DEV)
    write_kv(k, v, kc, vc, ks, vs, rows, lens)
    write_kv_ref(k, v, kc_ref, vc_ref, ks, vs, rows, lens)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


def test_write_kv_round_trip():
    B, n_new, hkv, D = 2, 3, 2, 16
    gen = torch.Generator().manual_seed(3)
    kc, vc = (random_cache(2, hkv, 8, D, True, gen) for _ in range(2))
    k = (torch.randn(B, n_new, hkv, D, generator=gen) * 5).bfloat16().to(DEV)
    v = torch.randn(B, n_new, hkv, D, generator=gen).bfloat16().to(DEV)
    ks, vs = kv_scales_from(k, v)
    rows = torch.tensor([1, 0], dtype=torch.int32, device=DEV)
    lens = torch.tensor([n_new, 8], dtype=torch.int32, device=DEV)
    write_kv(k, v, kc, vc, ks, vs, rows, lens)
    for new, cache, scale in ((k, kc, ks), (v, vc, vs)):
        for b, (slot, end) in enumerate(zip(rows.tolist(), lens.tolist())):
            back = decode_e4m3_ref(cache[slot, :, end - n_new:end], scale.view(-1, 1, 1)).transpose(0, 1)
            x = new[b].float()
            # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 for normals, plus the subnormal step
            assert ((back - x).abs() <= x.abs() / 16 + scale.view(-1, 1) * 2.0 ** -10).all()


@pytest.mark.parametrize("fp8", [True, False])
def test_kv_cache_written_then_attended(fp8):
    """kv_cache's pair (zeroed, V keys-fastest) filled by write_kv in two steps, then attended (the kernel reads V
    to max_len: the zeros past each sequence's length must not matter)."""
    hkv, hq, D, max_len = 2, 4, 16, 48
    kc, vc = kv_cache(3, hkv, max_len, D, torch.uint8 if fp8 else torch.bfloat16, DEV)
    assert not kc.any() and not vc.any() and vc.stride(2) == 1 and vc.shape == kc.shape
    gen = torch.Generator().manual_seed(4)
    rows = torch.tensor([2, 0], dtype=torch.int32, device=DEV)
    k = (torch.randn(2, 20, hkv, D, generator=gen) * 2).bfloat16().to(DEV)
    v = torch.randn(2, 20, hkv, D, generator=gen).bfloat16().to(DEV)
    ks, vs = kv_scales_from(k, v) if fp8 else (None, None)
    for lo, hi in ((0, 15), (15, 20)):
        lens = torch.tensor([hi, hi + 2], dtype=torch.int32, device=DEV)
        write_kv(k[:, lo:hi], v[:, lo:hi], kc, vc, ks, vs, rows, lens)
    q = torch.randn(2, 3, hq, D, generator=gen).bfloat16().to(DEV)
    out = torch.full_like(q, float("nan"))
    verify_attention(q, kc, vc, ks, vs, rows, lens, out, alloc_partials(2, hq, 8, 3, D, DEV), 3,
                     cfg=triton_cfg(q, kc, block_n=16))
    assert rel_err(out, attention_ref(q, kc, vc, ks, vs, rows, lens)) < 1e-2


# ---- attention -------------------------------------------------------------------------------------------

VERIFY_CASES = [  # B, q_len, Hq, Hkv, D, kv_lens, nseg, fp8, block_n
    (3, 5, 4, 2, 32, [37, 96, 5], 3, True, 16),
    (3, 5, 4, 2, 32, [37, 96, 5], 1, True, 16),
    (3, 5, 6, 2, 16, [64, 17, 81], 4, False, 16),  # G = 3: packed rows straddle heads unevenly
    (2, 1, 4, 2, 16, [1, 100], 4, True, 16),
    (2, 3, 4, 2, 16, [50, 3], 2, False, 32),
    (1, 8, 4, 2, 32, [45], 2, True, 16),  # 16 packed rows
]


@pytest.mark.parametrize("B,q_len,hq,hkv,D,lens,nseg,fp8,block_n", VERIFY_CASES)
def test_verify_attention(B, q_len, hq, hkv, D, lens, nseg, fp8, block_n):
    # V stored keys-fastest in every other case (the kernel takes V's strides), the new keys `fresh` in the others
    vt = VERIFY_CASES.index((B, q_len, hq, hkv, D, lens, nseg, fp8, block_n)) % 2 == 1
    q, kc, vc, ks, vs, rows, kv_lens = setup(B, q_len, hq, hkv, D, lens, fp8, vt=vt)
    out = torch.full_like(q, float("nan"))
    partials = alloc_partials(B + 1, hq, 8, 4, D, DEV).fill_(float("nan"))
    verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, partials, nseg, fresh=None if vt else q_len,
                     cfg=triton_cfg(q, kc, block_n=block_n))
    ref = attention_ref(q, kc, vc, ks, vs, rows, kv_lens)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-2 and max_rel(out, ref) < 3e-2


@pytest.mark.parametrize("fp8,nseg", [(True, 3), (False, 3)])
@pytest.mark.slow
def test_verify_rows_are_width_invariant(fp8, nseg):
    """A token decoded alone (q_len 1, kv_len L + 1) and the same token first in a 5-token verify (kv_len L + 5) get
    bitwise the same output from the same Config (segments hold tiles at absolute positions)."""
    # kv_len 146 vs 142: 3 segments of the old kind (a whole number of tiles after kv_len / nseg) differ: 64 vs 48
    q, kc, vc, ks, vs, rows, _ = setup(2, 5, 6, 2, 32, [146, 99], fp8, vt=fp8)
    lens = torch.tensor([146, 99], dtype=torch.int32, device=DEV)
    part = alloc_partials(2, 6, 8, nseg, 32, DEV)
    verify = torch.empty_like(q, dtype=torch.float32)          # fp32 outputs: no rounding hides a difference
    cfg = triton_cfg(q, kc, block_m=32, block_n=16)
    verify_attention(q, kc, vc, ks, vs, rows, lens, verify, part, nseg, cfg=cfg)
    for i in range(5):
        alone = torch.empty_like(verify[:, i:i + 1])
        verify_attention(q[:, i:i + 1].contiguous(), kc, vc, ks, vs, rows, lens - 4 + i, alone, part, nseg, cfg=cfg)
        assert torch.equal(alone[:, 0], verify[:, i])


def test_verify_padding_row_outputs_zero():
    q, kc, vc, ks, vs, rows, kv_lens = setup(2, 2, 4, 2, 16, [20, 33], True)
    rows[0] = -1
    out = torch.full_like(q, float("nan"))
    for nseg in (1, 3):
        verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, alloc_partials(2, 4, 2, 3, 16, DEV), nseg,
                         cfg=triton_cfg(q, kc, block_n=16))
        assert (out[0] == 0).all()
        assert rel_err(out[1], attention_ref(q, kc, vc, ks, vs, rows, kv_lens)[1]) < 1e-2


@pytest.mark.parametrize("fp8", [True, False])
def test_prefill_attention(fp8):
    # 2 sequences, 20 new tokens each after 31 / 0 cached ones; G = 3 → 60 packed rows = 4 tiles of 16
    q, kc, vc, ks, vs, rows, kv_lens = setup(2, 20, 6, 2, 16, [51, 20], fp8)
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, kc, vc, ks, vs, rows, kv_lens, out, cfg=triton_cfg(q, kc, 16, block_n=16, num_warps=4))
    ref = attention_ref(q, kc, vc, ks, vs, rows, kv_lens)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-2 and max_rel(out, ref) < 3e-2


def test_choose_nseg():
    assert choose_nseg(1, 4, 132) == 64 and choose_nseg(8, 4, 132) == 8 and choose_nseg(64, 4, 132) == 1
    assert choose_nseg(16, 4, 82) == 2 and choose_nseg(512, 4, 82) == 1


def test_verify_config():
    """Off sm_90 the Triton kernel takes every call; q_max sizes a decode step's rows as its verify step's."""
    q, kc, vc, *_ = setup(2, 1, 24, 4, 32, [9, 9], True, vt=True)
    cfg = verify_config(q, kc, vc)
    assert isinstance(cfg, verify.Config) and cfg.block_m == 16 and cfg.kv_fmt == KV_FP8_BITS
    assert verify_config(q, kc, vc, q_max=5) == verify.config(q[:, [0] * 5], kc) != cfg
    assert verify_gluon.config(q, kc, q_max=5) == verify_gluon.Config(32) == verify_gluon.config(q[:, [0] * 5], kc)


# ---- GPU, 27B shapes -------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("kv_fmt", [None, KV_FP8_BITS, KV_FP8_NATIVE])
@pytest.mark.parametrize("nseg", [1, 7, 64])
@pytest.mark.parametrize("vt", [False, True])
def test_verify_attention_27b(kv_fmt, nseg, vt):
    fp8 = kv_fmt is not None
    lens = [1536, 16384, 5, 777]
    q, kc, vc, ks, vs, rows, kv_lens = setup(4, 5, 24, 4, 256, lens, fp8, vt=vt)
    out = torch.full_like(q, float("nan"))
    partials = alloc_partials(4, 24, 8, 64, 256, DEV).fill_(float("nan"))
    verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, partials, nseg, cfg=verify_config(q, kc, vc, kv_fmt))
    ref = attention_ref(q, kc, vc, ks, vs, rows, kv_lens)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-2 and max_rel(out, ref) < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("kv_fmt", [None, KV_FP8_BITS, KV_FP8_NATIVE])
@pytest.mark.parametrize("block_n,num_warps,num_stages", LAUNCH_CONFIGS)
def test_verify_launch_configs_27b(kv_fmt, block_n, num_warps, num_stages):
    q, kc, vc, ks, vs, rows, kv_lens = setup(2, 5, 24, 4, 256, [3000, 130], kv_fmt is not None)
    out = torch.full_like(q, float("nan"))
    cfg = replace(verify.config(q, kc, kv_fmt), block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, alloc_partials(2, 24, 8, 16, 256, DEV), 16, cfg=cfg)
    assert rel_err(out, attention_ref(q, kc, vc, ks, vs, rows, kv_lens)) < 1e-2


@pytest.mark.parametrize("nseg", [1, 3])
def test_verify_attention_output_gate(nseg):
    """gate (a strided view, as the q projection hands it over): out = attention · gate, stored once, whether the
    attend kernel or the combine writes the output."""
    q, kc, vc, ks, vs, rows, kv_lens = setup(2, 3, 4, 2, 16, [40, 7], True)
    gate = torch.rand(*q.shape[:3], 2 * q.shape[3], device=DEV).to(q.dtype)[..., 16:]
    out = torch.full_like(q, float("nan"))
    verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, alloc_partials(2, 4, 8, 3, 16, DEV), nseg, gate=gate,
                     cfg=triton_cfg(q, kc, block_n=16))
    ref = attention_ref(q, kc, vc, ks, vs, rows, kv_lens) * gate.float()
    assert rel_err(out, ref) < 1e-2 and max_rel(out, ref) < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("q_len", [1, 8])
def test_verify_q_len_27b(q_len):
    q, kc, vc, ks, vs, rows, kv_lens = setup(3, q_len, 24, 4, 256, [300, 4000, 9], True)
    out = torch.full_like(q, float("nan"))
    verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, alloc_partials(3, 24, 8, 16, 256, DEV), 16)
    assert rel_err(out, attention_ref(q, kc, vc, ks, vs, rows, kv_lens)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("nseg", [1, 16])
def test_verify_output_gate_27b(nseg):
    q, kc, vc, ks, vs, rows, kv_lens = setup(3, 5, 24, 4, 256, [300, 4000, 9], True)
    gate = torch.rand_like(q)
    out = torch.full_like(q, float("nan"))
    verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, alloc_partials(3, 24, 8, 16, 256, DEV), nseg, gate=gate)
    assert rel_err(out, attention_ref(q, kc, vc, ks, vs, rows, kv_lens) * gate.float()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("B,nseg", [(1, 64), (8, 8)])
def test_verify_batch_buckets_27b(B, nseg):
    """One sequence (the combine on quarter heads) and 8 (whole heads, combine_block_d) × 24 heads: against the
    reference, and each token decoded alone (at a Config for the verify's 5 tokens) bitwise equal to its row."""
    lens = [16384, 1536, 5, 777, 64, 65, 3000, 129][:B]
    q, kc, vc, ks, vs, rows, kv_lens = setup(B, 5, 24, 4, 256, lens, True, vt=True)
    assert combine_block_d(B, 24, 256) == (64 if B == 1 else 256)
    part = alloc_partials(B, 24, 8, nseg, 256, DEV).fill_(float("nan"))
    verify = torch.full_like(q, float("nan"), dtype=torch.float32)
    verify_attention(q, kc, vc, ks, vs, rows, kv_lens, verify, part, nseg)
    ref = attention_ref(q, kc, vc, ks, vs, rows, kv_lens)
    assert rel_err(verify, ref) < 1e-2 and max_rel(verify, ref) < 3e-2
    for i in range(5):
        alone = torch.empty_like(verify[:, i:i + 1])
        one = q[:, i:i + 1].contiguous()
        verify_attention(one, kc, vc, ks, vs, rows, kv_lens - 4 + i, alone, part, nseg,
                         cfg=verify_config(one, kc, vc, q_max=5))
        assert torch.equal(alone[:, 0], verify[:, i])


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("block_m,block_n,num_warps,num_stages", PREFILL_CONFIGS)
def test_prefill_launch_configs_27b(fp8, block_m, block_n, num_warps, num_stages):
    q, kc, vc, ks, vs, rows, kv_lens = setup(1, 200, 24, 4, 256, [333], fp8)
    out = torch.full_like(q, float("nan"))
    cfg = replace(prefill.config(q, kc), block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    prefill_attention(q, kc, vc, ks, vs, rows, kv_lens, out, cfg=cfg)
    assert rel_err(out, attention_ref(q, kc, vc, ks, vs, rows, kv_lens)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [True, False])
def test_prefill_and_write_27b(fp8):
    # 300 new tokens after 1000 cached: write them, then prefill attention over all 1300
    T, hkv, D = 300, 4, 256
    q, kc, vc, ks, vs, rows, kv_lens = setup(1, T, 24, hkv, D, [1300], fp8)
    k_new = torch.randn(1, T, hkv, D, device=DEV).bfloat16()
    v_new = torch.randn(1, T, hkv, D, device=DEV).bfloat16()
    kc_ref, vc_ref = kc.clone(), vc.clone()
    write_kv(k_new, v_new, kc, vc, ks, vs, rows, kv_lens)
    write_kv_ref(k_new, v_new, kc_ref, vc_ref, ks, vs, rows, kv_lens)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, kc, vc, ks, vs, rows, kv_lens, out)
    ref = attention_ref(q, kc, vc, ks, vs, rows, kv_lens)
    assert rel_err(out, ref) < 1e-2 and max_rel(out, ref) < 3e-2


@pytest.mark.gpu
def test_verify_graph_capture():
    # captured once, replayed after the lengths change in place: no host sync or allocation inside
    q, kc, vc, ks, vs, rows, kv_lens = setup(2, 5, 24, 4, 256, [700, 2000], True)
    out = torch.empty_like(q)
    partials = alloc_partials(2, 24, 8, 32, 256, DEV)
    run = lambda: verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, partials, 32)  # noqa: E731
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    kv_lens.copy_(torch.tensor([2001, 9], dtype=torch.int32))
    out.fill_(math.nan)
    graph.replay()
    assert rel_err(out, attention_ref(q, kc, vc, ks, vs, rows, kv_lens)) < 1e-2


# ---- the Gluon kernel (sm_90 wgmma, kernels/attention/verify_gluon.py) -------------------------------------

def hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def round_up(lens):
    """A cache length past every sequence's, a multiple of 64 (the Gluon kernel copies V rows 16 bytes at a time)."""
    return -(-(max(lens) + 3) // 64) * 64


GLUON_CASES = [  # B, q_len, Hq, Hkv, D, kv_lens, nseg, gated, padding (row 0 a padding row: zeros)
    (4, 5, 24, 4, 256, [1536, 16384, 5, 777], 64, False, False),
    (4, 5, 24, 4, 256, [1536, 16384, 5, 777], 7, True, True),
    (4, 5, 24, 4, 256, [1536, 1000, 5, 64], 1, True, False),
    (3, 1, 24, 4, 256, [300, 4000, 9], 16, False, False),
    (3, 8, 24, 4, 256, [300, 4000, 9], 16, False, False),       # 48 packed rows
    (2, 5, 16, 2, 128, [2000, 130], 5, False, False),           # head dim 128, G 8: 40 rows
    (2, 2, 4, 2, 128, [65, 3], 3, False, True),                 # 4 rows on a 16-wide tile
]


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma: sm_90")
@pytest.mark.parametrize("B,q_len,hq,hkv,D,lens,nseg,gated,padding", GLUON_CASES)
def test_verify_attention_gluon(B, q_len, hq, hkv, D, lens, nseg, gated, padding):
    q, kc, vc, ks, vs, rows, kv_lens = setup(B, q_len, hq, hkv, D, lens, True, vt=True, max_len=round_up(lens))
    if padding:
        rows[0] = -1
    gate = torch.rand_like(q) if gated else None
    out = torch.full_like(q, float("nan"))
    partials = alloc_partials(B, hq, 8, 64, D, DEV).fill_(float("nan"))
    verify_attention(q, kc, vc, ks, vs, rows, kv_lens, out, partials, nseg, gate=gate,
                     cfg=verify_gluon.config(q, kc))
    ref = attention_ref(q, kc, vc, ks, vs, rows, kv_lens) * (gate.float() if gated else 1)
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-2 and max_rel(out, ref) < 3e-2
    if padding:
        assert (out[0] == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma: sm_90")
def test_verify_rows_are_width_invariant_gluon():
    """As test_verify_rows_are_width_invariant, for the Gluon kernel at the 27B shape (the same rows tile); the
    decoded tokens' kv lengths (3006 … 3010) end in the verify's last tile (3008 on) or the one before."""
    q, kc, vc, ks, vs, rows, _ = setup(2, 5, 24, 4, 256, [3010, 99], True, vt=True, max_len=round_up([3010]))
    lens = torch.tensor([3010, 99], dtype=torch.int32, device=DEV)
    part = alloc_partials(2, 24, 8, 16, 256, DEV)
    verify = torch.empty_like(q, dtype=torch.float32)
    cfg = verify_gluon.config(q, kc)
    assert cfg == verify_gluon.Config(32)
    verify_attention(q, kc, vc, ks, vs, rows, lens, verify, part, 16, cfg=cfg)
    for i in range(5):
        alone = torch.empty_like(verify[:, i:i + 1])
        verify_attention(q[:, i:i + 1].contiguous(), kc, vc, ks, vs, rows, lens - 4 + i, alone, part, 16, cfg=cfg)
        assert torch.equal(alone[:, 0], verify[:, i])


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma: sm_90")
@pytest.mark.parametrize("lens,nseg", [([1536, 16384, 5, 777], 64), ([1536, 130, 64, 69], 7)])
def test_verify_attention_gluon_fresh_keys(lens, nseg):
    """`fresh`: with PDL the kernel reads the earlier steps' keys before the previous kernel completes, the step's
    own keys only after. Captured as a step would be: kv_write of the 5 new tokens over stale codes, then the
    attention; bitwise the launch that reads everything after the wait, and the reference of the written cache."""
    q_len = 5
    q, kc, vc, ks, vs, rows, kv_lens = setup(4, q_len, 24, 4, 256, lens, True, vt=True, max_len=round_up(lens))
    k_new, v_new = (torch.randn(4, q_len, 4, 256, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    out, early = torch.empty_like(q), torch.empty_like(q)
    partials = alloc_partials(4, 24, 8, 64, 256, DEV)

    def step(dst, fresh):
        write_kv(k_new, v_new, kc, vc, ks, vs, rows, kv_lens)
        verify_attention(q, kc, vc, ks, vs, rows, kv_lens, dst, partials, nseg, fresh=fresh,
                         cfg=verify_gluon.config(q, kc))

    step(out, None)
    ref = attention_ref(q, kc, vc, ks, vs, rows, kv_lens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(early, q_len)
    for slot, n in zip(rows.tolist(), lens):    # stale codes where the step's own keys go
        kc[slot, :, n - q_len:n] = 0x7E
        vc[slot, :, n - q_len:n] = 0x7E
    early.fill_(math.nan)
    graph.replay()
    assert torch.equal(early, out) and rel_err(out, ref) < 1e-2


def framed(cache, code):
    """The cache as a view inside a buffer of its layout (V keys-fastest stays so) with a slot of `code` before
    and after it."""
    big = torch.full((cache.shape[0] + 2, *cache.shape[1:]), code, dtype=cache.dtype, device=cache.device)
    if cache.stride(2) == 1:
        big = v_transposed(big)
    big[1:-1] = cache
    return big[1:-1]


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="wgmma: sm_90")
@pytest.mark.parametrize("past", ["slots", 2**30])
@pytest.mark.parametrize("nseg", [1, 16])
def test_verify_attention_gluon_slot_past_cache(nseg, past):
    """A slot id >= the cache's slots is a padding row, as -1 is: zeros, the other rows bitwise as with -1, nothing
    read past the cache (the slot after it holds codes of 1.0: NaN codes would give zeros too). The Triton
    kernels' cases: tests/test_kernel_bounds.py."""
    lens = [1536, 130, 64]
    q, kc, vc, ks, vs, rows, kv_lens = setup(3, 5, 24, 4, 256, lens, True, vt=True, max_len=round_up(lens))
    kc, vc = framed(kc, 0x38), framed(vc, 0x38)
    outs = []
    for slot in (-1, kc.shape[0] if past == "slots" else past):
        rows[0] = slot
        outs.append(torch.full_like(q, math.nan))
        verify_attention(q, kc, vc, ks, vs, rows, kv_lens, outs[-1],
                         alloc_partials(3, 24, 8, 16, 256, DEV).fill_(math.nan), nseg,
                         cfg=verify_gluon.config(q, kc))
    assert (outs[1][0] == 0).all() and torch.equal(outs[1], outs[0])


def test_prefill_padding_row_outputs_zero():
    """A padding row (cache row < 0) of the multi-tile prefill launch outputs exact zeros, the others unaffected
    (the verify launch's padding rows are tested above)."""
    q, kc, vc, ks, vs, rows, kv_lens = setup(2, 20, 6, 2, 16, [51, 20], True)
    rows[0] = -1
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, kc, vc, ks, vs, rows, kv_lens, out, cfg=triton_cfg(q, kc, 16, block_n=16, num_warps=4))
    assert (out[0] == 0).all()
    assert rel_err(out[1], attention_ref(q, kc, vc, ks, vs, rows, kv_lens)[1]) < 1e-2
