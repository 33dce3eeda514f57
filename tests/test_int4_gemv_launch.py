"""The int4 GEMV's launch table (kernels/int4/gemv.config, token_tile): a pure function of the shape and the GPU,
checked on the CPU for an H200 and an RTX 3090 — every launch fits one wave in the SM's shared memory, no program
shares a tile with more than the workspace's arrival count allows, the token tiles cover the rows, and the GEMM
paths begin where the GEMV ends."""
import pytest
import torch
import triton

from kernels import device as gpu
from kernels.int4 import MAX_ROWS, gemv, wgmma_ws
from tests.int4_cases import SHAPES_27B

GPUS = {"h200": gpu.Gpu((9, 0), 132, 228 * 1024), "rtx3090": gpu.Gpu((8, 6), 82, 100 * 1024)}


@pytest.fixture(params=sorted(GPUS))
def card(request):
    with gpu.simulated(GPUS[request.param]) as spec:
        yield spec


def test_token_tiles_cover_the_rows():
    for m in range(1, MAX_ROWS + 1):
        bt, bt2 = gemv.token_tile(m)
        assert bt in (8, 16) and bt2 in (0, 8) and m <= bt + bt2, m
        rows = gemv.x_rows(m)
        assert rows >= bt + bt2 and rows & (rows - 1) == 0, m              # the ring stage's power-of-2 rows
    assert wgmma_ws.MIN_ROWS == MAX_ROWS + 1                            # no row count falls between the paths


@pytest.mark.parametrize("n,k", SHAPES_27B + [(40, 128), (1032, 1152)])
def test_launch_fits_one_wave(card, n, k):
    dev = torch.device("meta")
    for m in range(1, MAX_ROWS + 1):
        c = gemv.config(m, n, k, dev)
        tiles, units = triton.cdiv(n, c.block_n), triton.cdiv(n, c.block_n) * (k // 128)
        ring = c.stages * (c.block_n * 66 + gemv.x_rows(m) * 256) + 1024
        assert c.ctas_per_sm >= 1 and c.ctas_per_sm * ring <= card.smem_per_sm, (m, c)
        assert 1 <= c.programs <= min(units, c.ctas_per_sm * card.num_sms), (m, c)      # one wave
        assert -(-c.programs // tiles) < gemv.MAX_SHARING, (m, c)
        assert c.block_n % (16 * c.warps) == 0, (m, c)                      # whole m16 tiles a warp
        assert 65536 // (c.ctas_per_sm * c.warps * 32) >= 128, (m, c)       # the registers the kernels compile to
        assert c.sum_once == (card.capability < (9, 0)), (m, c)
        if gemv.token_tile(m)[1]:
            assert c.marks, (m, c)                  # two token tiles, stored: flush_marked
        if c.spread:
            assert gemv.token_tile(m) == (8, 0) and 2 * m <= 8, (m, c)      # token t in column 2t of one n8 tile
