"""The warp-specialised int4 GEMM's launch planner (kernels/int4/wgmma_ws.plan, stages_for): a pure function of
the shape, checked on the CPU — what every launch it makes must satisfy, and the choices the H200 measurements
(docs/notes/int4.md) stand behind."""
import pytest
import triton

from kernels.int4 import wgmma_ws as ws
from tests.int4_cases import SHAPES_27B

SMS = 132                                   # the H200's multiprocessors


@pytest.mark.parametrize("a8", [False, True])
@pytest.mark.parametrize("n,k", SHAPES_27B + [(264, 1024), (520, 1152)])
def test_launch_invariants(n, k, a8):
    groups = k // 128
    unit = 2 if groups % 2 == 0 else 1
    for m in range(1, 4200, 7):
        cfg = ws.plan(m, n, k, SMS, a8)
        if m < (ws.A8_MIN_ROWS if a8 else ws.MIN_ROWS):
            assert cfg is None
            continue
        if cfg is None:                     # fewer programs than half the SMs: the Triton kernel keeps the call
            continue
        bm, bm2, programs = cfg
        assert (bm, bm2) in (ws.SMALL_TILES if m <= ws.SMALL_ROWS else ws.TOKEN_TILES), (m, cfg)
        tiles = triton.cdiv(n, 128) * triton.cdiv(m, bm + bm2)
        assert 2 * programs >= SMS and programs <= tiles * (groups // unit), (m, cfg)
        assert programs == tiles or programs <= SMS, (m, cfg)            # waves only of whole tiles
        assert bm2 < ws.WHOLE_ONLY or programs == tiles, (m, cfg)        # the large tiles only whole
        assert not a8 or bm + bm2 < 256, (m, cfg)                          # W4A8 spills on 256-token tiles


def test_stages_fit_shared_memory():
    for bm, bm2 in ws.TOKEN_TILES + ws.SMALL_TILES:
        stages = ws.stages_for(bm, bm2)
        assert 3 <= stages <= ws.STAGES and stages * ws.stage_bytes(bm, bm2) + 1024 <= ws.SMEM, (bm, bm2, stages)
    assert ws.stages_for(128, 64) == 4          # 3 stages measured 11-13% slower on 192-token tiles
    for bm, bm2 in ws.TOKEN_TILES[:-1]:         # W4A8: half the activation bytes; a deeper ring for ranges
        assert ws.stages_for(bm, bm2, a8=True) == ws.STAGES
        stages = ws.stages_for(bm, bm2, a8=True, ranges=True)
        assert stages == ws.A8_RANGE_STAGES and stages * ws.stage_bytes(bm, bm2, True) + 1024 <= ws.SMEM


@pytest.mark.parametrize("m,n,k,cfg", [
    (320, 16384, 5120, (128, 32, 256)),     # two waves of 160-token tiles
    (320, 5120, 6144, (128, 0, 120)),       # one wave of 128-token tiles (80 of 160 would idle 52 SMs)
    (320, 5120, 17408, (128, 32, 132)),     # stream-K
    (80, 5120, 6144, (128, 0, 120)),        # tiles cut in three pieces
    (192, 16384, 5120, (128, 64, 128)),     # one wave of 192-token tiles, not two of 128
    (200, 14336, 5120, (128, 128, 112)),    # one wave of 256-token tiles
    (200, 5120, 6144, (128, 0, 80)),        # large tiles lose when cut: whole 128-token tiles
    (32, 16384, 5120, (32, 0, 128)),        # 25-64 rows: one wave of 32- or 64-token tiles,
    (64, 14336, 5120, (64, 0, 112)),
    (40, 5120, 6144, (64, 0, 120)),         # cut in three pieces,
    (32, 34816, 5120, (32, 0, 132)),        # or stream-K where whole tiles take three waves
])
def test_launch_choices(m, n, k, cfg):
    assert ws.plan(m, n, k, SMS) == cfg
