"""The `run.py` contract (issue 2) on a tiny real checkpoint: --json objects, flags (--raw, --spec-k, --ignore-eos,
--seed, sampling defaults from generation_config, --no-think, --system), the mlx-style human output, the batch and
interactive modes, and user errors (one line, exit status 2, no traceback)."""
import io
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import run
from engine import engine as engine_module
from engine.engine import Engine
from engine.sampling import SamplingParams
from tests.fixtures import make_tiny_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUMAN_OUTPUT = re.compile(r"==========\n(?P<text>.*)\n==========\nPrompt: (\d+) tokens, [\d.]+ tokens-per-sec\n"
                          r"Generation: (\d+) tokens, [\d.]+ tokens-per-sec\n(MTP accept: \d+/\d+ \(\d+%\)\n)?",
                          re.DOTALL)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def tiny_engine(model_dir):
    return Engine.load(model_dir)


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "run.py", *args], cwd=REPO, input=stdin, capture_output=True, text=True,
                          timeout=120)


def run_json(capsys, model_dir, *args):
    assert run.main(["--model", model_dir, "--json", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def chat_ids(engine, prompt, **kw):
    messages = ([{"role": "system", "content": kw.pop("system")}] if "system" in kw else []) + [
        {"role": "user", "content": prompt}]
    return engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages, **kw))


def test_json_contract_in_a_subprocess(model_dir, tiny_engine):
    proc = cli("--model", model_dir, "--prompt", "hello", "--prompt", "second prompt", "--max-new-tokens", "5",
               "--temperature", "0", "--device", "cpu", "--dtype", "float32", "--json", "--ignore-eos")
    assert proc.returncode == 0, proc.stderr
    objects = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(objects) == 2
    for obj, prompt in zip(objects, ("hello", "second prompt")):
        assert len(obj["token_ids"]) == 5 and obj["finish_reason"] == "length"
        assert obj["text"] == tiny_engine.tokenizer.decode(obj["token_ids"])
        stats = obj["stats"]
        assert {"steps", "drafted", "accepted", "tokens_per_second", "prompt_tokens", "generated"} <= set(stats)
        assert stats["generated"] == 5 and stats["drafted"] > 0
        ref = tiny_engine.generate(chat_ids(tiny_engine, prompt), 5, SamplingParams(temperature=0), ignore_eos=True)
        assert obj["token_ids"] == ref.token_ids and stats["prompt_tokens"] == ref.stats.prompt_tokens


def test_spec_k_zero_turns_drafting_off(capsys, model_dir):
    (obj,) = run_json(capsys, model_dir, "--prompt", "hi", "--max-new-tokens", "6", "--ignore-eos", "--spec-k", "0")
    assert obj["stats"]["drafted"] == obj["stats"]["accepted"] == 0 and obj["stats"]["steps"] == 5


def test_seed_makes_sampling_reproducible(capsys, model_dir):
    args = ["--prompt", "hi", "--max-new-tokens", "8", "--ignore-eos", "--temperature", "1", "--seed", "3"]
    assert run_json(capsys, model_dir, *args)[0]["token_ids"] == run_json(capsys, model_dir, *args)[0]["token_ids"]


def test_prompt_formats(capsys, model_dir, tiny_engine):
    def prompt_tokens(*args):
        return run_json(capsys, model_dir, "--prompt", "a question", "--max-new-tokens", "1", *args)[0]["prompt_tokens"]
    assert prompt_tokens("--raw") == len(tiny_engine.tokenizer.encode("a question"))
    assert prompt_tokens() == len(chat_ids(tiny_engine, "a question"))
    assert prompt_tokens("--no-think") == len(chat_ids(tiny_engine, "a question", enable_thinking=False))
    assert prompt_tokens("--system", "Be brief.") == len(chat_ids(tiny_engine, "a question", system="Be brief."))
    assert prompt_tokens("--no-think") > prompt_tokens()


@pytest.mark.parametrize("flags, expected", [
    ([], SamplingParams(temperature=1.0, top_k=20, top_p=0.95)),          # the fixture's generation_config
    (["--temperature", "0.5", "--top-k", "0", "--top-p", "0.8", "--seed", "9"], SamplingParams(0.5, 0, 0.8, 9)),
])
def test_sampling_defaults_come_from_generation_config(capsys, model_dir, monkeypatch, flags, expected):
    seen = []
    real = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, ids, n, sampling, **kw: seen.append(sampling)
                        or real(self, ids, n, sampling, **kw))
    run_json(capsys, model_dir, "--prompt", "x", "--max-new-tokens", "2", *flags)
    assert seen == [expected]


def test_human_output_is_mlx_style(capsys, model_dir, tiny_engine):
    assert run.main(["--model", model_dir, "--prompt", "hello", "--max-new-tokens", "7", "--temperature", "0",
                     "--ignore-eos", "--no-think"]) == 0
    match = HUMAN_OUTPUT.fullmatch(capsys.readouterr().out)
    assert match and match[3] == "7" and match[4]
    ref = tiny_engine.generate(chat_ids(tiny_engine, "hello", enable_thinking=False), 7, SamplingParams(temperature=0),
                               ignore_eos=True)
    assert match["text"].rstrip("\n") == tiny_engine.tokenizer.decode(ref.token_ids).rstrip("\n")
    assert match[2] == str(ref.stats.prompt_tokens)


def test_batch_mode(capsys, model_dir, tmp_path):
    batch = tmp_path / "in.jsonl"
    batch.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                                 "body": {"prompt": "x", "max_tokens": 3}}) + "\n")
    out, summary = tmp_path / "out.jsonl", tmp_path / "summary.json"
    assert run.main(["--model", model_dir, "--batch-file", str(batch), "--output", str(out),
                     "--batch-summary-json", str(summary), "--temperature", "0"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in records] == ["a"] and records[0]["error"] is None
    assert json.loads(summary.read_text())["completed"] == 1
    err = capsys.readouterr().err
    assert "Successful requests:" in err and "failed (" not in err


@pytest.mark.parametrize("separate", [False, True], ids=["in the output", "in the errors file"])
def test_batch_with_a_failed_request_exits_1_saying_where_the_errors_are(model_dir, tmp_path, separate):
    """The batch runs to the end; the exit status is 1 and stderr's last line counts the failures and names the file
    holding their records, the errors file where one is given."""
    batch = tmp_path / "in.jsonl"
    request = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 3}}
    too_long = {**request, "custom_id": "b", "body": {"prompt": "x", "max_tokens": 9999}}
    batch.write_text("\n".join([json.dumps(request), "not json", json.dumps(too_long)]))
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    proc = cli("--model", model_dir, "--batch-file", str(batch), "--output", str(out),
               *(["--batch-errors", str(errors)] if separate else []))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.endswith(f"2 of 3 requests failed (2 bad input); errors in {errors if separate else out}\n")
    failures = [json.loads(line) for line in (errors if separate else out).read_text().splitlines()][-2:]
    assert [r["error"]["message"][:7] for r in failures] == ["line 2:", "line 3:"]
    assert "body.max_tokens (9999) exceeds" in failures[1]["error"]["message"]


def test_interactive_mode(capsys, model_dir, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n/reset\nagain\n/exit\n"))
    assert run.main(["--model", model_dir, "--interactive", "--max-new-tokens", "4", "--no-think"]) == 0
    out = capsys.readouterr().out
    assert out.count("[ Prompt: ") == 2 and "[ conversation cleared ]" in out


def test_missing_model_is_one_line_exit_2_without_traceback(tmp_path):
    proc = cli("--model", str(tmp_path / "nope"), "--prompt", "x")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and "nope" in proc.stderr and proc.stderr.count("\n") == 1


def test_model_that_is_a_file_says_so(capsys, model_dir):
    """--model naming a file said 'does not exist'."""
    path = os.path.join(model_dir, "config.json")
    assert run.main(["--model", path, "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "config.json' is a file, not a model directory" in err
    assert err.count("\n") == 1


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_small_model_on_the_cpu_runs_on_one_thread(capsys, model_dir, monkeypatch, keep_threads):
    """A small model on the CPU takes one thread (on busy cores more threads made the demo model 10-40x slower),
    unless OMP_NUM_THREADS or --threads says otherwise; a large model keeps torch's default."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    Engine.load(model_dir, spec_k=0)
    assert torch.get_num_threads() == 1
    run_json(capsys, model_dir, "--prompt", "x", "--max-new-tokens", "1", "--threads", "3")
    assert torch.get_num_threads() == 3
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    Engine.load(model_dir, spec_k=0)
    assert torch.get_num_threads() == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    model = torch.nn.Linear(8, 8)
    assert engine_module.choose_threads(model, "cuda", None) == 2
    monkeypatch.setattr(engine_module, "SMALL_MODEL", 64)
    assert engine_module.choose_threads(model, "cpu", None) == 2
    assert engine_module.choose_threads(model, "cpu", 1) == 1


def test_prompt_too_long_exits_2(capsys, model_dir):
    assert run.main(["--model", model_dir, "--raw", "--prompt", "x" * 600, "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "max_position_embeddings" in err and err.count("\n") == 1
    # every prompt is checked before the first is answered: nothing generated, nothing on stdout
    assert run.main(["--model", model_dir, "--raw", "--prompt", "ok", "--prompt", "x" * 600, "--max-new-tokens",
                     "4"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: --prompt 2: ")


@pytest.mark.parametrize("args, message", [
    (["--batch-file", "{dir}/missing.jsonl", "--output", "{dir}/out.jsonl"], "cannot read batch file"),
    (["--batch-file", "{dir}", "--output", "{dir}/out.jsonl"], "cannot read batch file"),
])
def test_unreadable_batch_file_exits_2(capsys, model_dir, tmp_path, args, message):
    assert run.main(["--model", model_dir, *[a.format(dir=tmp_path) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    ([], "give --prompt"),
    (["--batch-file", "in.jsonl"], "--batch-file needs --output"),
    (["--prompt", "x", "--top-p", "2"], "--top-p must be in (0, 1]"),
    (["--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--prompt", "x", "--interactive"], "not allowed with"),
    (["--prompt", "x", "--output", "o.jsonl"], "--output cannot be used without --batch-file"),
    (["--batch-file", "in.jsonl", "--output", "o.jsonl", "--json", "--no-think"],
     "--json, --no-think cannot be used with --batch-file"),
    (["--prompt", ""], "--prompt must not be empty"),
    (["--prompt", "\udcff\udcfehi"], "--prompt is not valid UTF-8"),          # argv bytes 0xff 0xfe
    (["--prompt", "x", "--temperature", "inf"], "--temperature must be a finite number"),
    (["--prompt", "x", "--temperature", "nan"], "--temperature must be a finite number"),
    (["--prompt", "x", "--top-k", "99999999999999999999"], "--top-k must be in [0, 2^31)"),
    (["--prompt", "x", "--spec-k", "1000"], "--spec-k must be in [0, 16]"),
    (["--prompt", "x", "--seed", str(2**64)], "--seed must be in [-2^63, 2^64)"),
    (["--prompt", "x", "--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    (["--prompt", "x", "--threads", "0"], "--threads must be >= 1"),
    (["--prompt", "x", "--model", ""], "--model must name a checkpoint directory"),
    (["--prompt", "x", "--device", "cpu", "--max-seqs", "2", "--body", "bf16"],
     "--max-seqs, --body cannot be used with the plain-torch engine"),
    (["--prompt", "x", "--eager", "--profile-steps", "3"], "--profile-steps cannot be used with the plain-torch"),
    (["--prompt", "x", "--device", "cuda", "--dtype", "bfloat16"], "--dtype cannot be used with the graph engine"),
    (["--prompt", "x", "--device", "cuda", "--max-len", "0"], "--max-len must be >= 1"),
])
def test_bad_flags_exit_2(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        run.main(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_profile_steps_without_cuda_python_is_said_before_loading(capsys, monkeypatch):
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime"):      # `from cuda.bindings import runtime` fails
        monkeypatch.setitem(sys.modules, name, None)
    assert run.main(["--device", "cuda", "--prompt", "x", "--profile-steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: profiling steps needs cuda-python") and err.count("\n") == 1


@pytest.mark.parametrize("argv, want", [
    (["--prompt", "a", "--prompt", "b"], 2), (["--interactive"], 1), (["--prompt", "a", "--max-seqs", "5"], 5),
    (["--batch-file", "in.jsonl", "--output", "out.jsonl"], None), (["--prompt", "a"] * 100, 64)])
def test_graph_engine_slots_follow_the_mode(argv, want):
    """One prompt needs one slot (one graph to capture, all the context for it); a batch file the largest bucket."""
    args = run.build_parser().parse_args(argv + ["--device", "cuda", "--profile", "h200"])
    assert run._max_seqs(args) == want
