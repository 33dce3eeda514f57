"""bench/targets.py: issue 3's targets read from benchmark rows (CPU; synthetic rows in bench.harness.row's form)."""
from bench import targets
from bench.harness import row

PEAK = 4e12


def rows_with(gemv_us: float, attn_16k_us: float) -> list:
    shape, nbytes = "out_proj 5120x6144", 16e6
    rows = [row("read floor", f"{shape} M=1 bytes", nbytes / (0.7 * PEAK) * 1e6, nbytes, 0, PEAK)]
    for m in range(1, 6):
        rows.append(row(targets.GEMV, f"{shape} M={m}", gemv_us + 0.1 * m, nbytes, 0, PEAK))
        rows.append(row(targets.GEMV_STORED, f"{shape} M={m}", gemv_us + 1, nbytes, 0, PEAK))
    rows.append(row(targets.GEMV_STORED, f"{shape} M=320", 30, nbytes, 0, PEAK, vs_cublas=1.02))
    rows.append(row(targets.W4A8, f"{shape} M=320", 29, nbytes, 0, PEAK, vs_cublas=1.05))
    rows.append(row(targets.W4A8_KERNEL, f"{shape} M=320", 28, nbytes, 0, PEAK, vs_cublas=1.09))
    rows.append(row(targets.ATTENTION, "B1 ctx16384 q5", attn_16k_us, 33.5e6, 0, PEAK))
    return rows


def by_target(checks):
    return {c["target"]: c for c in checks}


def test_targets_met_missed_and_missing():
    checks = by_target(targets.evaluate(rows_with(gemv_us=4.2, attn_16k_us=20.0)))
    gemv = checks["int4 GEMV out_proj 5120x6144, M 1-5 (least)"]
    assert gemv["status"] == "met" and gemv["floor"] == 0.7          # the least over M 1-5: M = 5, 4.7 us
    assert gemv["note"].startswith("least at M=5; stored bf16: ")
    gemm = checks["int4 GEMM out_proj 5120x6144, M 320: cuBLAS bf16 time / ours"]
    assert gemm["status"] == "met" and gemm["note"] == "W4A8: 1.09 (kernel, operand order), 1.05 (w4a8_linear)"
    assert checks["verify attention B1 q5 16k fp8"]["status"] == "missed"
    assert checks["sampler, five rows + rejection, us"]["status"] == "missing"
    slow = by_target(targets.evaluate(rows_with(gemv_us=5.0, attn_16k_us=10.0)))
    assert slow["int4 GEMV out_proj 5120x6144, M 1-5 (least)"]["status"] == "missed"
    assert slow["verify attention B1 q5 16k fp8"]["status"] == "met"


def test_write_table(tmp_path):
    md = targets.write(rows_with(4.2, 20.0), {"gpu": "test", "peak_copy_GBps": 4000}, "test", str(tmp_path))
    assert (tmp_path / "targets-test.md").read_text() == md and "| met |" in md and "| missed |" in md
