"""bench/engine.py's parts that need no GPU: arguments, the batch files it writes, the rows it reads from run.py's
outputs, and the results files."""
import json

import pytest

import bench.harness as harness
from bench.engine import batch_lines, concurrency_row, demo_row, earlier_rows, main, parse_args


def test_arguments():
    args = parse_args(["--parts", "step, prefill", "--ks", "0,4", "--concurrency", "1,8"])
    assert args.parts == ["step", "prefill"] and args.ks == [0, 4] and args.concurrency == [1, 8]
    assert args.accept == [.84, .60, .38, .22] and args.prefill_lengths == [4096, 32768]


@pytest.mark.parametrize("argv, says", [(["--parts", "step,nope"], "--parts: nope"), (["--ks", "0,5"], "--ks"),
                                        (["--concurrency", "1,x"], "not numbers"), (["--parts", ","], "none given"),
                                        (["--demo-prompts", "0"], "--demo-prompts")])
def test_bad_arguments_name_the_flag(argv, says, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert says in capsys.readouterr().err


def test_needs_cuda(capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--parts", "demo"]) == 2 and "needs CUDA" in capsys.readouterr().err


def test_batch_lines_are_valid_requests():
    """Token-id prompts of the asked length, ignore_eos, greedy: what engine/batch.py parses."""
    from engine.batch import RequestDefaults, parse_request

    class Engine:                                   # what parse_request reads of an engine
        class tokenizer:
            pass
        class model:
            class cfg:
                vocab_size = 248320
                max_position_embeddings = 262144

    lines = batch_lines(3, 128, 512)
    assert len({l["custom_id"] for l in lines}) == 3 and lines != batch_lines(3, 128, 512, seed=1)
    body = lines[0]["body"]
    assert len(body["prompt"]) == 128 and body["max_tokens"] == 512 and body["ignore_eos"]
    request = parse_request(Engine, json.loads(json.dumps(lines[0])), RequestDefaults(16, 1.0, 0, 1.0))
    assert request.prompt_ids == body["prompt"] and request.max_tokens == 512 and request.ignore_eos


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


def test_results_files(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", str(tmp_path))
    rows = [concurrency_row(1, {"completed": 1, "failed": 0, "duration": 1.0, "output_throughput": 50.0,
                                "total_output_tokens": 50}, 128, 512),
            {"kernel": "transformers", "shape": "skipped", "note": "no Qwen3_5ForCausalLM"}]
    md = harness.write_results("engine", rows, {"gpu": "cpu", "peak_copy_GBps": 1.0})
    assert (tmp_path / "engine-cpu.json").exists() and (tmp_path / "engine-cpu.md").read_text() == md
    assert "| concurrency | N1 prompt128 gen512 k0 | 1000000.0 |" in md and "no Qwen3_5ForCausalLM" in md
    assert json.loads((tmp_path / "engine-cpu.json").read_text())["rows"][1]["note"] == "no Qwen3_5ForCausalLM"


def test_parts_run_apart_add_up(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS", str(tmp_path))
    assert earlier_rows(["step"]) == []
    harness.write_results("engine", [{"part": "step", "kernel": "runner step"}, {"part": "demo", "kernel": "demo"}],
                          {})
    assert earlier_rows(["step"]) == [{"part": "demo", "kernel": "demo"}]


def test_scripts_parse_and_refuse_unknown_steps():
    import os
    import subprocess
    bench = os.path.dirname(harness.__file__)
    for script in ("run_benchmarks.sh", "verify.sh"):
        assert subprocess.run(["bash", "-n", os.path.join(bench, script)]).returncode == 0
    run = subprocess.run([os.path.join(bench, "run_benchmarks.sh"), "nope"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown step 'nope'" in run.stderr
