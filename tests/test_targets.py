"""tools/targets.py: result rows and issue 3's targets read from them (CPU; synthetic rows in `row`'s form)."""
import pytest

from tools import targets
from tools.targets import fastest, row

PEAK = 4e12
ATTN_16K = "verify attention B1 q5 16k fp8 (KV bytes)"
GDN = "GDN verify B1 T5 fp16 state (state bytes)"


def rows_with(gemv_us: float, attn_16k_us: float, cublas_320_us: float = 30.6) -> list:
    shape, nbytes = "out_proj 5120x6144", 16e6
    rows = [row("read floor", f"{shape} M=1 bytes", nbytes / (0.7 * PEAK) * 1e6, nbytes, 0, PEAK)]
    for m in range(1, 6):
        rows.append(row(targets.GEMV, f"{shape} M={m}", gemv_us + 0.1 * m, nbytes, 0, PEAK))
        rows.append(row(targets.GEMV_STORED, f"{shape} M={m}", gemv_us + 1, nbytes, 0, PEAK))
    rows.append(row(targets.CUBLAS, f"{shape} M=320", cublas_320_us, 4 * nbytes, 0, PEAK))
    rows.append(row(targets.GEMV_STORED, f"{shape} M=320", 30, nbytes, 0, PEAK,
                    vs_cublas=round(cublas_320_us / 30, 2)))
    rows.append(row(targets.W4A8, f"{shape} M=320", 29, nbytes, 0, PEAK, vs_cublas=1.05))
    rows.append(row(targets.W4A8_KERNEL, f"{shape} M=320", 28, nbytes, 0, PEAK, vs_cublas=1.09))
    rows.append(row(targets.ATTENTION, "B1 ctx16384 q5", attn_16k_us, targets.KV_BYTES_16K + 122880, 0, PEAK))
    rows.append(row("attn_verify[read floor]", "B1 ctx16384 q5", 9.0, targets.KV_BYTES_16K + 122880, 0, PEAK))
    return rows


def by_target(checks):
    return {c["target"]: c for c in checks}


def test_targets_met_missed_and_missing():
    checks = by_target(targets.evaluate(rows_with(gemv_us=4.2, attn_16k_us=20.0)))
    gemv = checks["int4 GEMV out_proj 5120x6144, M 1-5 (least)"]
    assert gemv["status"] == "met" and gemv["floor"] == 0.7          # the least over M 1-5: M = 5, 4.7 us
    assert gemv["note"].startswith("into int64 sums; least at M=5; stored bf16: ")
    gemm = checks["int4 GEMM out_proj 5120x6144, M 320: cuBLAS bf16 time / ours"]
    assert gemm["status"] == "met" and gemm["measured"] == 1.02
    assert gemm["note"] == "W4A8: 1.09 (kernel, operand order), 1.05 (w4a8_linear)"
    assert checks[ATTN_16K]["status"] == "missed"
    assert checks["sampler, five rows + rejection, us"]["status"] == "missing"
    assert checks[GDN]["status"] == "missing" and checks[GDN]["floor"] == ""
    slow = by_target(targets.evaluate(rows_with(gemv_us=5.0, attn_16k_us=10.0)))
    assert slow["int4 GEMV out_proj 5120x6144, M 1-5 (least)"]["status"] == "missed"
    assert slow[ATTN_16K]["status"] == "met"


def test_gemm_ratio_from_the_rows_times():
    """29.88 / 30 = 0.996: the row's vs_cublas rounds it to 1.0, the target must not count it met."""
    rows = rows_with(4.2, 20.0, cublas_320_us=29.88)
    ours = [r for r in rows if r["kernel"] == targets.GEMV_STORED and r["shape"].endswith("M=320")]
    assert [r["vs_cublas"] for r in ours] == [1.0]
    gemm = by_target(targets.evaluate(rows))["int4 GEMM out_proj 5120x6144, M 320: cuBLAS bf16 time / ours"]
    assert gemm["measured"] == 0.996 and gemm["status"] == "missed"
    no_peer = [r for r in rows if r["kernel"] != targets.CUBLAS]
    assert by_target(targets.evaluate(no_peer))[gemm["target"]]["status"] == "missing"


def test_gemv_measured_by_the_work_bytes():
    """A GEMV row that counts its int64 sums at 8 bytes an output is read over the work's bytes (bf16 outputs):
    0.799 of the peak over the work is missed though the row's own bytes make it 0.801-0.806."""
    shape = "out_proj 5120x6144"
    work = {m: 5120 * 6144 // 2 + 5120 * 48 * 2 + m * 6144 * 2 + m * 5120 * 2 for m in range(1, 6)}
    assert all(targets.int4_work_bytes(f"{shape} M={m}") == work[m] for m in work)
    rows = []
    for m, nbytes in work.items():
        us = nbytes / (0.799 * PEAK) * 1e6
        counted = nbytes + 6 * m * 5120
        rows.append(dict(kernel=targets.GEMV, shape=f"{shape} M={m}", us=us, bytes=counted,
                         frac_peak=round(counted / (us * 1e-6) / PEAK, 3)))
    assert min(r["frac_peak"] for r in rows) >= 0.8
    for peak_GBps in (None, PEAK / 1e9):
        gemv = by_target(targets.evaluate(rows, peak_GBps))[f"int4 GEMV {shape}, M 1-5 (least)"]
        assert gemv["measured"] == 0.799 and gemv["status"] == "missed"


@pytest.mark.parametrize("peak_GBps", [None, PEAK / 1e9])
def test_attention_measured_by_its_kv_bytes(peak_GBps):
    """The goal is a fraction of the KV bytes' bandwidth time: q and out, which the row counts too, are left out —
    of the kernel's time and of the floor's."""
    rows = rows_with(4.2, 12.0)                 # 12 us: 0.702 of the peak over the row's bytes, 0.699 over the KV
    assert [r["frac_peak"] for r in rows if r["kernel"] == targets.ATTENTION] == [0.702]
    check = by_target(targets.evaluate(rows, peak_GBps))[ATTN_16K]
    assert check["measured"] == 0.699 and check["status"] == "missed"
    assert check["floor"] == round(targets.KV_BYTES_16K / 9e-6 / PEAK, 3)
    assert check["note"] == "33,554,432 bytes; the row's 33,677,312: 0.702"


def test_write_table(tmp_path):
    md = targets.write(rows_with(4.2, 20.0), {"gpu": "test", "peak_copy_GBps": 4000}, "test", str(tmp_path))
    assert (tmp_path / "targets-test.md").read_text() == md and "| met |" in md and "| missed |" in md
    assert "Rows read: int4 GEMV" in md and f"`{targets.ATTENTION}`" in md and "{" not in md


def test_fastest_pass_row_by_row():
    """bench.kernels keeps each row from its fastest pass; an error row stays, and a pass whose rows differ is left
    out."""
    a = [row("k", "s1", 10.0, 1e6, 0, PEAK), {"kernel": "k", "shape": "s2", "error": "boom"},
         row("k", "s3", 5, 1, 0, PEAK)]
    b = [row("k", "s1", 9.0, 1e6, 0, PEAK), row("k", "s2", 7.0, 1e6, 0, PEAK), row("k", "s3", 6, 1, 0, PEAK)]
    other = [row("k", "s1", 1.0, 1e6, 0, PEAK)]
    best = fastest([a, b, other])
    assert [r.get("us") for r in best] == [9.0, 7.0, 5]
    assert fastest([a])[1]["error"] == "boom"


@pytest.mark.parametrize("B, k, ctx, nbytes", [
    (1, 0, 4096, 14113385472), (1, 4, 4096, 15998684160), (64, 0, 4096, 32114684928), (64, 4, 4096, 55297717248),
    (1, 1, 16384, 15012529152), (16, 3, 16384, 31266960384), (64, 4, 16384, 87509971968)])
def test_step_bytes_match_the_recorded_steps(B, k, ctx, nbytes):
    """The 27B step's bytes as bench.step counted them when it ran its own kernel chain (step-ctx4096-h200.json,
    step-h200.json; draft vocabulary 32768), so rows before and after it drives the runner compare."""
    assert targets.step_bytes(targets.CFG, B, k, ctx, 32768) == nbytes


def test_layer_bytes_match_the_recorded_layers():
    """layer-step-h200.json: B 1, T 5, 16k context."""
    assert targets.layer_bytes(targets.CFG, "gdn", 1, 5, 16384) == 207035904
    assert targets.layer_bytes(targets.CFG, "attn", 1, 5, 16384) == 225492992
    with pytest.raises(ValueError, match="'moe'"):
        targets.layer_bytes(targets.CFG, "moe", 1, 5, 16384)
