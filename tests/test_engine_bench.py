"""bench/engine.py without a GPU (tests do not import bench/: it runs as a command here): its arguments, and
tools/engine_bench.py, the batch files it writes and the rows it reads back from run.py's outputs; the scripts
around it parse."""
import json
import os
import subprocess
import sys
import types

import pytest

from tools.engine_bench import batch_lines, concurrency_row, demo_row, earlier_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_engine(*argv):
    return subprocess.run([sys.executable, "-m", "bench.engine", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("argv, says", [(["--parts", "step,nope"], "--parts: nope"), (["--ks", "0,5"], "--ks"),
                                        (["--concurrency", "1,x"], "not numbers"), (["--parts", ","], "none given"),
                                        (["--demo-prompts", "0"], "--demo-prompts")])
def test_bad_arguments_name_the_flag(argv, says):
    run = bench_engine(*argv)
    assert run.returncode == 2 and says in run.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message without CUDA")
def test_needs_cuda():
    run = bench_engine("--parts", "demo,prefill")
    assert run.returncode == 2 and "bench.engine needs CUDA" in run.stderr


def test_batch_lines_are_valid_requests():
    """Token-id prompts of the asked length, ignore_eos, greedy: what engine/batch.py parses."""
    from engine.batch import RequestDefaults, parse_request
    lines = batch_lines(3, 128, 512)
    assert len({line["custom_id"] for line in lines}) == 3 and lines != batch_lines(3, 128, 512, seed=1)
    body = lines[0]["body"]
    assert len(body["prompt"]) == 128 and body["max_tokens"] == 512 and body["ignore_eos"]
    engine = types.SimpleNamespace(tokenizer=None)                     # token-id prompts need no tokenizer
    request = parse_request(engine, json.loads(json.dumps(lines[0])), RequestDefaults(16, 1.0, 0, 1.0))
    assert request.prompt_ids == body["prompt"] and request.max_tokens == 512 and request.ignore_eos
    assert request.sampling.temperature == 0


def test_rows_from_run_py_outputs():
    summary = {"completed": 4, "failed": 0, "duration": 2.0, "output_throughput": 1024.0, "total_output_tokens": 2048}
    r = concurrency_row(4, summary, 128, 512)
    assert r["tok_s"] == 1024.0 and r["shape"] == "N4 prompt128 gen512 k0" and r["us"] == 2e6
    with pytest.raises(RuntimeError, match="3 completed, 1 failed"):
        concurrency_row(4, {**summary, "completed": 3, "failed": 1}, 128, 512)
    stats = dict(generated=256, decode_seconds=0.5, drafted=400, accepted=300, tokens_per_step=3.0)
    r = demo_row(4, True, [{"stats": stats}, {"stats": {**stats, "decode_seconds": 1.5, "tokens_per_step": 2.0}}])
    assert r["tok_s"] == 256.0 and r["acceptance"] == 0.75 and r["tokens_per_step"] == 2.5
    assert demo_row(0, False, [{"stats": {**stats, "drafted": 0, "accepted": 0}}])["acceptance"] is None


def test_parts_run_apart_add_up(tmp_path):
    path = str(tmp_path / "engine-h200.json")
    assert earlier_rows(path, ["step"]) == []
    with open(path, "w") as f:
        json.dump({"meta": {}, "rows": [{"part": "step", "kernel": "runner step"}, {"part": "demo"}]}, f)
    assert earlier_rows(path, ["step"]) == [{"part": "demo"}]


def test_scripts_parse_and_refuse_unknown_steps():
    for script in ("run_benchmarks.sh", "verify.sh"):
        assert subprocess.run(["bash", "-n", os.path.join(REPO, "bench", script)]).returncode == 0
    run = subprocess.run([os.path.join(REPO, "bench", "run_benchmarks.sh"), "nope"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown step 'nope'" in run.stderr
