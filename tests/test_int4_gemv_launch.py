"""The int4 GEMV's launch table (kernels/int4_gemv.pick, token_tile): a pure function of the shape and the GPU,
checked on the CPU for an H200 and an RTX 3090 — every launch fits one wave in the SM's shared memory, no program
shares a tile with more than the workspace's arrival count allows, the token tiles cover the rows, and the GEMM
paths begin where the GEMV ends."""
import pytest
import torch
import triton

from kernels import device as gpu, int4_gemv as gemv, int4_wgmma, int4_wgmma_ws
from tests.int4_cases import SHAPES_27B

GPUS = {"h200": dict(sms=132, smem=228 * 1024), "rtx3090": dict(sms=82, smem=100 * 1024)}


@pytest.fixture(params=sorted(GPUS))
def card(request, monkeypatch):
    spec = GPUS[request.param]
    monkeypatch.setattr(gpu, "num_sms", lambda _: spec["sms"])
    monkeypatch.setattr(gpu, "smem_per_sm", lambda _: spec["smem"])
    return spec


def test_token_tiles_cover_the_rows():
    for m in range(1, gemv.MAX_ROWS + 1):
        bt, bt2 = gemv.token_tile(m)
        assert bt in (8, 16) and bt2 in (0, 8) and m <= bt + bt2, m
        rows = gemv.x_rows(m)
        assert rows >= bt + bt2 and rows & (rows - 1) == 0, m              # the ring stage's power-of-2 rows
    assert int4_wgmma.MIN_ROWS == int4_wgmma_ws.MIN_ROWS == gemv.MAX_ROWS + 1     # no row count falls between the paths


@pytest.mark.parametrize("n,k", SHAPES_27B + [(40, 128), (1032, 1152)])
def test_launch_fits_one_wave(card, n, k):
    dev = torch.device("meta")
    for m in range(1, gemv.MAX_ROWS + 1):
        p = gemv.pick(m, n, k, dev)
        tiles, units = triton.cdiv(n, p["block_n"]), triton.cdiv(n, p["block_n"]) * (k // 128)
        ring = p["stages"] * (p["block_n"] * 66 + gemv.x_rows(m) * 256) + 1024
        assert p["ctas_per_sm"] >= 1 and p["ctas_per_sm"] * ring <= card["smem"], (m, p)
        assert 1 <= p["programs"] <= min(units, p["ctas_per_sm"] * card["sms"]), (m, p)      # one wave
        assert -(-p["programs"] // tiles) < gemv.MAX_SHARING, (m, p)
        assert p["block_n"] % (16 * p["warps"]) == 0, (m, p)                 # whole m16 tiles a warp
        assert 65536 // (p["ctas_per_sm"] * p["warps"] * 32) >= 128, (m, p)  # the registers the kernels compile to
        if gemv.token_tile(m)[1]:
            assert p["marks"], (m, p)               # two token tiles, stored: flush_marked
        if p["spread"]:
            assert gemv.token_tile(m) == (8, 0) and 2 * m <= 8, (m, p)      # token t in column 2t of one n8 tile
