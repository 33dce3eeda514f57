"""The README's results table, from the committed H200 results: `python -m tools.results_table` prints it as
markdown; `--write` puts it into README.md between the RESULTS markers (tests/test_readme.py checks that the
README holds what this prints, so the table moves with bench/results/).

Each row is one op at the shape the engine runs most (one sequence verifying 4 MTP drafts: 5 rows, 16k cached
tokens), with the kernel the dispatcher chose there, its time and its fraction of the copy bandwidth measured in
the same run (`frac_peak` in bench/results/*.json)."""
import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
README = REPO / "README.md"
BEGIN, END = "<!-- RESULTS: python -m tools.results_table --write -->", "<!-- /RESULTS -->"

# (results file, row's kernel, row's shape, op, kernel chosen (None: from the row), shape as shown)
ROWS = [
    ("kernels-h200.json", "int4_linear W4A16", "mlp_gate_up 34816x5120 M=5", "int4 linear", None,
     "gate_up 34816×5120, 5 rows"),
    ("kernels-h200.json", "int4_linear W4A16", "mlp_gate_up 34816x5120 M=320", "int4 linear", None,
     "gate_up, 320 rows"),
    ("kernels-h200.json", "int8_linear", "lm_head 248320x5120 M=5", "int8 lm_head", "`int8/linear.py`",
     "248320×5120, 5 rows"),
    ("kernels-h200.json", "attn_verify[fp8-native, V keys-fastest]", "B1 ctx16384 q5", "verify attention",
     "Gluon, fp8 KV (`attention/verify_gluon.py`)", "5 queries, 16k keys"),
    ("kernels-h200.json", "gdn_verify", "B1 T5 state float16", "GDN update", "Gluon (`gdn/recurrent_gluon.py`)",
     "5 tokens, fp16 state"),
    ("kernels-h200.json", "conv1d_update", "B1 L5 C10240", "conv1d", "`gdn/conv1d.py`", "5 tokens"),
    ("kernels-h200.json", "add_rmsnorm", "T5", "norms", "`norms/` (add_rmsnorm)", "5 tokens"),
    ("kernels-h200.json", "5 rows + rejection", "B1 k4 V248320", "sampler", "`sampler/`",
     "5 rows + rejection"),
    ("step-h200.json", "step", "B1 k4 ctx16384 draft vocab 32768", "decode step", None,
     "MTP-4, 16k context"),
]
INT4_VARIANTS = {"gemv": "GEMV, Gluon (`int4/gemv.py`)", "ws": "warp-specialised wgmma (`int4/wgmma_ws.py`)"}


def _row(rows: list, kernel: str, shape: str) -> dict:
    for r in rows:
        if r["kernel"] == kernel and r["shape"] == shape:
            return r
    raise KeyError(f"no row kernel={kernel!r} shape={shape!r}")


def _us(us: float) -> str:
    return f"{us:,.0f}" if us >= 100 else f"{us:.1f}" if us >= 10 else f"{us:.2f}"


def markdown(results: pathlib.Path = RESULTS) -> str:
    loaded = {}
    lines = ["| op | kernel (sm_90) | shape | H200 µs | of copy BW |", "|---|---|---|---|---|"]
    for file, kernel, shape, op, chosen, shown in ROWS:
        if file not in loaded:
            loaded[file] = json.loads((results / file).read_text())["rows"]
        try:
            r = _row(loaded[file], kernel, shape)
        except KeyError as e:
            raise KeyError(f"{results / file}: {e.args[0]}") from None
        if chosen is None:
            chosen = (f"one CUDA graph, {r['launches']} launches" if "launches" in r
                      else INT4_VARIANTS[r["config"].split()[0]])
        if "tok_s" in r:
            op = f"{op} ({r['tok_s']:.0f} tok/s)"
        lines.append(f"| {op} | {chosen} | {shown} | {_us(r['us'])} | {r['frac_peak']:.0%} |")
    return "\n".join(lines) + "\n"


def readme_table(text: str) -> str:
    """What README.md holds between the markers."""
    start, end = text.index(BEGIN) + len(BEGIN) + 1, text.index(END)
    return text[start:end]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = ap.parse_args(argv)
    table = markdown()
    if not args.write:
        sys.stdout.write(table)
        return 0
    text = README.read_text()
    README.write_text(text.replace(readme_table(text), table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
