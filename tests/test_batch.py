"""The OpenAI Batch JSONL runner (engine/batch.py) on a tiny real checkpoint: output shapes (ASSETS.md §5), stop
strings, the reasoning split, per-line errors, duplicate ids, resuming after a crash, progress and summary."""
import io
import json
import os

import pytest

from engine.batch import BatchFileError, RequestDefaults, run_batch
from engine.text_stream import TextStream
from engine.engine import Engine
from engine.generate import GenerationResult, GenerationStats
from engine.sampling import SamplingParams
from tests.fixtures import make_tiny_checkpoint

GREEDY = RequestDefaults(max_tokens=12, temperature=0.0, top_k=0, top_p=1.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    return Engine.load(make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny"))))


def chat(custom_id, content="Hi", **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "qwen3.5-27b", "messages": [{"role": "user", "content": content}], **body}}


def completion(custom_id, prompt="def fib(n):", **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"model": "qwen3.5-27b", "prompt": prompt, **body}}


def write_lines(path, items):
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items))
    return str(path)


def read_records(path):
    return [json.loads(line) for line in open(path)]


def run(engine, tmp_path, items, defaults=GREEDY, **kw):
    log = io.StringIO()
    out = str(tmp_path / "out.jsonl")
    summary = run_batch(engine, write_lines(tmp_path / "in.jsonl", items), out, defaults, log=log, **kw)
    return read_records(out), summary, log.getvalue()


def test_output_shapes_follow_the_openai_batch_format(tiny_engine, tmp_path):
    items = [chat("req-1", max_completion_tokens=7, temperature=0.0, top_p=1.0, seed=7,
                  chat_template_kwargs={"enable_thinking": False}),
             completion("req-2", max_tokens=5)]
    records, summary, _ = run(tiny_engine, tmp_path, items)
    assert [r["custom_id"] for r in records] == ["req-1", "req-2"]
    for r, n, obj in zip(records, (7, 5), ("chat.completion", "text_completion")):
        assert r["id"].startswith("batch_req_") and r["error"] is None
        assert r["response"]["status_code"] == 200 and r["response"]["request_id"].startswith("req_")
        body = r["response"]["body"]
        assert body["object"] == obj and body["model"] == "qwen3.5-27b" and isinstance(body["created"], int)
        usage, timings = body["usage"], body["timings"]
        assert usage["completion_tokens"] == n == timings["predicted_n"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["prompt_tokens"] == timings["prompt_n"]
        assert {"prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second", "ttft_ms"} <= set(timings)
        assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"] and timings["draft_n"] > 0
        assert body["choices"][0]["finish_reason"] == "length" and body["choices"][0]["index"] == 0
    chat_body, text_body = records[0]["response"]["body"], records[1]["response"]["body"]
    assert chat_body["id"].startswith("chatcmpl-") and text_body["id"].startswith("cmpl-")
    message = chat_body["choices"][0]["message"]
    assert message["role"] == "assistant" and message["reasoning_content"] is None

    tok = tiny_engine.tokenizer        # usage counts the templated prompt; the text is the greedy continuation
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert chat_body["usage"]["prompt_tokens"] == len(tok.encode(prompt))
    ref = tiny_engine.generate(tok.encode("def fib(n):"), 5, SamplingParams(temperature=0), ignore_eos=True)
    assert text_body["choices"][0]["text"] == tok.decode(ref.token_ids)
    assert summary.ok == 2 and summary.failed == 0
    assert summary.generated == 12 and summary.prompt_tokens == sum(
        r["response"]["body"]["usage"]["prompt_tokens"] for r in records)


def test_logprobs_in_both_response_shapes(tiny_engine, tmp_path):
    """Chat: logprobs.content, an entry per generated token (token text, logprob, bytes, top_logprobs); completions:
    tokens / token_logprobs / top_logprobs (the sampled token always among them) / text_offset. The numbers are the
    generator's own; the token bytes joined are the generated text."""
    items = [chat("c", max_tokens=6, logprobs=True, top_logprobs=2, chat_template_kwargs={"enable_thinking": False}),
             chat("c0", max_tokens=3, logprobs=True), chat("off", max_tokens=3, logprobs=False),
             completion("t", max_tokens=6, logprobs=1)]
    records, summary, _ = run(tiny_engine, tmp_path, items)
    assert summary.ok == 4
    bodies = {r["custom_id"]: r["response"]["body"] for r in records}
    tok = tiny_engine.tokenizer
    ref = tiny_engine.generate(tok.encode("def fib(n):"), 6, SamplingParams(temperature=0), ignore_eos=True,
                               logprobs=1)
    text = bodies["t"]["choices"][0]
    lp = text["logprobs"]
    assert lp["token_logprobs"] == [e.logprob for e in ref.logprobs]
    assert lp["tokens"] == [tok.token_bytes(t).decode("utf-8", "replace") for t in ref.token_ids]
    assert all(len(d) in (1, 2) and d[tok_] == v for d, tok_, v in zip(lp["top_logprobs"], lp["tokens"],
                                                                         lp["token_logprobs"]))
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert b"".join(tok.token_bytes(t) for t in ref.token_ids).decode("utf-8", "replace") == text["text"]
    content = bodies["c"]["choices"][0]["logprobs"]["content"]
    assert len(content) == bodies["c"]["usage"]["completion_tokens"] == 6
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 2
        assert e["token"] == bytes(e["bytes"]).decode("utf-8", "replace") and e["logprob"] <= 0
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert e["top_logprobs"][0]["logprob"] == e["logprob"]          # greedy: the sampled token is the top one
    assert all(e["top_logprobs"] == [] for e in bodies["c0"]["choices"][0]["logprobs"]["content"])
    assert bodies["off"]["choices"][0]["logprobs"] is None


def test_defaults_apply_and_body_parameters_override_them(tiny_engine, tmp_path, monkeypatch):
    seen = []
    real = tiny_engine.generate
    monkeypatch.setattr(tiny_engine, "generate", lambda ids, n, sampling, **kw: seen.append((n, sampling, kw))
                        or real(ids, n, sampling, **kw))
    defaults = RequestDefaults(max_tokens=3, temperature=0.7, top_k=20, top_p=0.9, seed=5)
    run(tiny_engine, tmp_path, [completion("a"),
                                completion("b", max_tokens=2, temperature=0, top_k=-1, top_p=0.5, seed=1),
                                chat("c", max_tokens=9, max_completion_tokens=4, ignore_eos=True)], defaults)
    assert seen[0][:2] == (3, SamplingParams(0.7, 20, 0.9, 5)) and seen[0][2]["ignore_eos"] is False
    assert seen[1][:2] == (2, SamplingParams(0.0, 0, 0.5, 1))
    assert seen[2][0] == 4 and seen[2][2]["ignore_eos"] is True     # max_completion_tokens wins over max_tokens


def test_seeded_sampling_is_reproducible(tiny_engine, tmp_path):
    items = [completion(f"s{i}", max_tokens=8, temperature=1.0, seed=11) for i in range(2)]
    records, _, _ = run(tiny_engine, tmp_path, items)
    texts = [r["response"]["body"]["choices"][0]["text"] for r in records]
    assert texts[0] == texts[1]


@pytest.mark.parametrize("as_list", [False, True])
def test_stop_string_trims_the_text_and_finishes_with_stop(tiny_engine, tmp_path, as_list):
    tok = tiny_engine.tokenizer
    ids = tiny_engine.generate(tok.encode("def fib(n):"), 24, SamplingParams(temperature=0), ignore_eos=True).token_ids
    full = tok.decode(ids)
    at = next(i for i in range(3, len(full) - 2) if "\ufffd" not in full[i:i + 2] and full.find(full[i:i + 2]) == i)
    stop = full[at:at + 2]
    records, _, _ = run(tiny_engine, tmp_path, [completion("x", max_tokens=24, stop=[stop, "never"] if as_list
                                                            else stop)])
    choice = records[0]["response"]["body"]["choices"][0]
    assert choice["text"] == full[:at] and choice["finish_reason"] == "stop"
    assert records[0]["response"]["body"]["usage"]["completion_tokens"] < 24


class ScriptedEngine:
    """The tiny engine's tokenizer with a scripted output, emitted two ids per step, to drive reasoning splits."""

    def __init__(self, engine, output_ids):
        self.tokenizer, self.model_dir, self.output_ids = engine.tokenizer, engine.model_dir, output_ids

    def generate(self, prompt_ids, max_new_tokens, sampling, *, ignore_eos=False, on_tokens=None, **_):
        out, reason = [], "length"
        for i in range(0, min(len(self.output_ids), max_new_tokens), 2):
            step = self.output_ids[i:min(i + 2, max_new_tokens)]
            out += step
            if on_tokens(step):
                reason = "stop"
                break
        stats = GenerationStats(prompt_tokens=len(prompt_ids), generated=len(out), steps=len(out) // 2)
        return GenerationResult(out, reason, stats)


def scripted(engine, text_before, text_after=None):
    tok = engine.tokenizer
    ids = tok.encode(text_before)
    return ids if text_after is None else ids + [tok.token_to_id("</think>")] + tok.encode(text_after)


@pytest.mark.parametrize("thinking, output, stop, reasoning, content, reason", [
    (True, ("Let me see.\n", "\n\nHello there."), None, "Let me see.", "Hello there.", "length"),
    (True, ("thinking on and on",), None, "thinking on and on", None, "length"),        # cut off while reasoning
    (True, ("abc\n", "\n\nxyz STOP tail"), " STOP", "abc", "xyz", "stop"),
    (True, ("ab STOP cd\n", "\n\nxyz"), " STOP", "ab", None, "stop"),                     # stopped before </think>
    (False, ("plain answer",), None, None, "plain answer", "length"),
])
def test_chat_reasoning_is_split_into_reasoning_content(tiny_engine, tmp_path, thinking, output, stop, reasoning,
                                                        content, reason):
    engine = ScriptedEngine(tiny_engine, scripted(tiny_engine, *output))
    body = {"chat_template_kwargs": {"enable_thinking": thinking}, "max_tokens": 100}
    records, _, _ = run(engine, tmp_path, [chat("r", **body, **({"stop": stop} if stop else {}))])
    choice = records[0]["response"]["body"]["choices"][0]
    assert choice["message"]["reasoning_content"] == reasoning and choice["message"]["content"] == content
    assert choice["finish_reason"] == reason


def test_completions_keep_the_reasoning_in_the_text(tiny_engine, tmp_path):
    engine = ScriptedEngine(tiny_engine, scripted(tiny_engine, "a\n", "\n\nb"))
    records, _, _ = run(engine, tmp_path, [completion("c", max_tokens=100)])
    assert records[0]["response"]["body"]["choices"][0]["text"] == "a\n\n\nb"


def test_text_stream_matches_a_one_shot_decode_across_chunkings(tiny_engine):
    tok = tiny_engine.tokenizer
    ids = tok.encode("héllo 毕老师 ✓ wörld")
    for chunk in (1, 2, 3, 7):
        stream = TextStream(tok)
        for i in range(0, len(ids), chunk):
            assert stream(ids[i:i + chunk]) is None
        assert stream.finish() == (None, tok.decode(ids))


BAD_LINES = [
    ("not json at all", None, "line 1: invalid JSON"),
    ({"method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}, None, "line 2: custom_id must be"),
    ({**completion("x"), "custom_id": 7}, None, "line 3: custom_id must be a non-empty string"),
    ({**completion("m"), "method": "GET"}, "m", "method must be POST"),
    ({**completion("u"), "url": "/v1/embeddings"}, "u", "url must be"),
    ({**completion("b"), "body": "x"}, "b", "body must be an object"),
    (completion("t", temperature="hot"), "t", "body.temperature must be a number"),
    (completion("t2", temperature=3), "t2", "body.temperature must be in [0, 2]"),
    (completion("mt", max_tokens=0), "mt", "body.max_tokens must be >= 1"),
    (completion("mt2", max_tokens=2.5), "mt2", "body.max_tokens must be an integer"),
    (completion("tp", top_p=0), "tp", "body.top_p must be in (0, 1], got 0"),
    (completion("tk", top_k=True), "tk", "body.top_k must be an integer"),
    (completion("sd", seed="7"), "sd", "body.seed must be an integer"),
    (completion("n", n=2), "n", "body.n must be 1"),
    (completion("st", stream=True), "st", "body.stream"),
    (completion("lp", logprobs=21), "lp", "body.logprobs must be in [0, 20]"),
    (completion("lpt", top_logprobs=2), "lpt", "body.top_logprobs is a chat field"),
    (chat("clp", logprobs=3), "clp", "body.logprobs must be true or false"),
    (chat("ctl", top_logprobs=2), "ctl", "body.top_logprobs needs body.logprobs: true"),
    (completion("pp", presence_penalty=1.5), "pp", "body.presence_penalty is not supported"),
    (completion("rf", response_format={"type": "json_object"}), "rf", "body.response_format is not supported"),
    (completion("sp", stop=[""]), "sp", "body.stop"),
    (completion("ep", prompt=""), "ep", "body.prompt"),
    (completion("long", prompt="x" * 600), "long",
     "tokens) + max_tokens (12) exceeds the model's max_position_embeddings (512) (max_tokens: the batch default"),
    (completion("long2", prompt="x" * 600, max_tokens=5), "long2", "body.prompt (600 tokens) + body.max_tokens (5)"),
    (chat("long3", max_completion_tokens=600), "long3", "body.messages (23 tokens) + body.max_completion_tokens (600)"),
    (completion("vocab", prompt=[5, 10**6]), "vocab", "body.prompt token id(s) [1000000] outside the model's vocab"),
    (chat("nm", messages=None), "nm", "body.messages must be a non-empty list"),
    (chat("role", messages=[{"role": "robot", "content": "x"}]), "role", "body.messages[0]"),
    (chat("kw", chat_template_kwargs={"enable_thinking": "no"}), "kw", "enable_thinking"),
    (chat("kx", chat_template_kwargs={"enable_thinking": False, "foo": 1}), "kx", "chat_template_kwargs: foo"),
    (completion("uf", max_tokenz=3, temprature=0.5), "uf", "unknown field(s) body.max_tokenz, body.temprature"),
    (completion("s70", seed=2**70), "s70", "body.seed must be in"),
]


def test_bad_lines_get_error_records_and_the_rest_still_run(tiny_engine, tmp_path):
    items = [item for item, _, _ in BAD_LINES]
    items.insert(4, completion("good-1", max_tokens=2, presence_penalty=0, logit_bias={}, logprobs=None))
    items.append(chat("good-2", max_tokens=2))
    records, summary, log = run(tiny_engine, tmp_path, items)
    assert len(records) == len(items)
    good = [r for r in records if r["error"] is None]
    assert [r["custom_id"] for r in good] == ["good-1", "good-2"]
    bad = [r for r in records if r["error"] is not None]
    for r, (_, custom_id, message) in zip(bad, BAD_LINES):
        assert r["custom_id"] == custom_id and message in r["error"]["message"], (r["error"]["message"], message)
        assert "max_new_tokens" not in r["error"]["message"]
        assert r["error"]["code"] == "invalid_request"
        assert r["response"]["status_code"] == 400 and r["response"]["body"] is None
    assert summary.ok == 2 and summary.failed == len(BAD_LINES)
    assert f"Failed requests:{' ' * 25}{len(BAD_LINES)}" in log


DEFAULT = "the batch default, as the body sets none"
ENGINE_REFUSALS = [     # Engine.generate arguments, the request's url and body, what its error must say
    (([1, 2], 0, SamplingParams()), {}, "/v1/completions", {"max_tokens": 0}, "body.max_tokens must be >= 1, got 0"),
    (([1, 2], 0, SamplingParams()), {}, "/v1/chat/completions", {"max_completion_tokens": 0},
     "body.max_completion_tokens must be >= 1, got 0"),
    (([1, 2], 0, SamplingParams()), {}, "/v1/completions", {},
     f"max_tokens must be >= 1, got 0 (max_tokens: {DEFAULT})"),
    (([1, 2], 3, SamplingParams(temperature=-1)), {}, "/v1/completions", {"temperature": -1},
     "body.temperature must be >= 0, got -1"),
    (([1, 2], 3, SamplingParams(top_k=-1)), {}, "/v1/completions", {}, f"top_k must be an integer >= 0, got -1 "
                                                                      f"(top_k: {DEFAULT})"),
    (([1, 2], 3, SamplingParams(top_p=0)), {}, "/v1/chat/completions", {"top_p": 0},
     "body.top_p must be in (0, 1], got 0"),
    (([1, 2], 3, SamplingParams(seed=2**70)), {}, "/v1/completions", {"seed": 2**70},
     f"body.seed must be in [-2^63, 2^64), got {2**70}"),
    (([1, 2], 3, SamplingParams()), {"logprobs": 21}, "/v1/completions", {"logprobs": 21},
     "body.logprobs must be in [0, 20], got 21"),
    (([1, 2], 3, SamplingParams()), {"logprobs": 21}, "/v1/chat/completions", {"logprobs": True, "top_logprobs": 21},
     "body.top_logprobs must be in [0, 20], got 21"),
    (([1] * 600, 3, SamplingParams()), {}, "/v1/completions", {"prompt": "x", "max_tokens": 3},
     "body.prompt (600 tokens) + body.max_tokens (3) exceeds the model's max_position_embeddings (512)"),
    (([1] * 600, 3, SamplingParams()), {}, "/v1/chat/completions", {"messages": []},
     f"body.messages (600 tokens) + max_tokens (3) exceeds the model's max_position_embeddings (512) (max_tokens: "
     f"{DEFAULT})"),
    (([5, 10**6], 3, SamplingParams()), {}, "/v1/completions", {"prompt": [5, 10**6]},
     "body.prompt token id(s) [1000000] outside the model's vocabulary (size 300)"),
    (([], 3, SamplingParams()), {}, "/v1/completions", {"prompt": []}, "the body.prompt is empty"),
]


@pytest.mark.parametrize("call, kw, url, body, wanted", ENGINE_REFUSALS, ids=[r[-1] for r in ENGINE_REFUSALS])
def test_engine_refusals_name_the_fields_the_request_wrote(tiny_engine, call, kw, url, body, wanted):
    """Engine.generate's ValueErrors name its own parameters (max_new_tokens, prompt, the SamplingParams fields,
    logprobs): a batch error names the body field each value came from instead, or says it is the batch default."""
    from engine.batch import _in_request_terms
    with pytest.raises(ValueError) as refusal:
        tiny_engine.generate(*call, **kw)
    assert _in_request_terms(str(refusal.value), url, body) == wanted


def test_a_bad_batch_default_is_named_as_one(tiny_engine, tmp_path):
    """Reached through the batch: a default the request left alone fails in SamplingParams.validate and is named."""
    bad_default = RequestDefaults(max_tokens=2, temperature=-1.0, top_k=0, top_p=1.0)
    records, summary, _ = run(tiny_engine, tmp_path, [completion("t")], bad_default)
    assert records[0]["error"]["message"] == (f"line 1: temperature must be >= 0, got -1.0 (temperature: {DEFAULT})")
    assert summary.bad_input == 1


def test_undecodable_lines_fail_alone(tiny_engine, tmp_path):
    """A line that is not UTF-8, holds an integer past Python's digit limit, nests past the recursion limit or
    carries a lone surrogate gets its own error record and the others run (each stopped the whole batch, or crashed
    it while writing the result)."""
    bad = [b'{"custom_id": "caf\xe9"}', b'{"custom_id": "big", "body": {"max_tokens": ' + b"9" * 5000 + b"}}",
           b"[" * 100_000 + b"]" * 100_000, json.dumps(completion("\ud800", max_tokens=2)).encode()]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\r\n".join(bad + [json.dumps(completion("ok", max_tokens=2)).encode()]) + b"\r\n")
    out = tmp_path / "out.jsonl"
    summary = run_batch(tiny_engine, str(path), str(out), GREEDY, log=io.StringIO())
    records = read_records(out)
    assert [r["custom_id"] for r in records] == [None] * 4 + ["ok"] and summary.ok == 1 and summary.failed == 4
    wanted = ["line 1: not UTF-8 (byte 0xe9 at column 19)", "line 2: invalid JSON (Exceeds the limit",
              "line 3: invalid JSON (maximum recursion depth", "line 4: a string holds a lone surrogate escape"]
    for record, message in zip(records, wanted):
        assert record["error"]["message"].startswith(message), (record["error"]["message"], message)


def test_a_duplicate_custom_id_fails_the_later_line_only(tiny_engine, tmp_path):
    """The first line with an id runs; each later one gets an error naming the line that has it, on every run."""
    items = [completion("d", max_tokens=2), completion("ok", max_tokens=2), chat("d", max_tokens=2)]
    records, summary, log = run(tiny_engine, tmp_path, items)
    assert [r["custom_id"] for r in records] == ["d", "ok", "d"]
    assert [r["error"] is None for r in records] == [True, True, False] and summary.failed == 1
    assert records[2]["error"]["message"] == "line 3: duplicate custom_id 'd' (line 1 has it already)"
    assert records[0]["response"]["body"]["object"] == "text_completion"
    records, again, log = run(tiny_engine, tmp_path, items)
    assert again.skipped == 2 and again.ok == 0 and again.failed == 1 and "Skipping 2 requests" in log
    assert [r["custom_id"] for r in records] == ["d", "ok", "d"] and records[2]["error"]["code"] == "invalid_request"


def test_rerun_after_a_crash_skips_finished_ids_and_drops_a_torn_line(tiny_engine, tmp_path):
    items = ["{broken"] + [completion(f"c{i}", max_tokens=2) for i in range(4)]
    run(tiny_engine, tmp_path, items)
    out = tmp_path / "out.jsonl"
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]) + lines[3][:25])          # died while writing the 4th record
    records, summary, log = run(tiny_engine, tmp_path, items)
    assert [r["custom_id"] for r in records] == [None, "c0", "c1", "c2", "c3"]
    assert summary.skipped == 2 and summary.ok == 2 and summary.failed == 1 and "Skipping 2 requests" in log
    records, again, _ = run(tiny_engine, tmp_path, items)      # the broken line fails again, its old error taken out
    assert again.skipped == 4 and again.ok == 0 and again.failed == 1
    assert [r["custom_id"] for r in records] == [None, "c0", "c1", "c2", "c3"]


def test_a_rewritten_output_keeps_its_symlink_and_mode(tiny_engine, tmp_path):
    """The cut of a torn line replaces the file whole: through an --output that is a symlink the target is rewritten
    (not the link replaced by a new file, leaving the target with its torn line), and the file keeps its mode."""
    items = [completion(f"c{i}", max_tokens=2) for i in range(3)]
    run(tiny_engine, tmp_path, items)
    target = tmp_path / "results" / "out.jsonl"
    target.parent.mkdir()
    (tmp_path / "out.jsonl").rename(target)
    (tmp_path / "out.jsonl").symlink_to(target)
    lines = target.read_text().splitlines(keepends=True)
    target.write_text("".join(lines[:2]) + lines[2][:25])
    target.chmod(0o640)
    records, summary, _ = run(tiny_engine, tmp_path, items)
    assert summary.skipped == 2 and summary.ok == 1 and [r["custom_id"] for r in records] == ["c0", "c1", "c2"]
    assert (tmp_path / "out.jsonl").is_symlink() and target.stat().st_mode & 0o777 == 0o640
    assert not list(tmp_path.glob("**/*.rewrite"))


def out_of_memory_on(engine, prompt="oops"):
    """A stand-in for engine.generate that fails as the engine's fault (a 500) for `prompt`'s ids (every prompt when
    None) and generates the others."""
    real = engine.generate

    def generate(ids, *args, **kw):
        if prompt is None or ids == engine.tokenizer.encode(prompt):
            raise RuntimeError("CUDA out of memory")
        return real(ids, *args, **kw)
    return generate


@pytest.mark.parametrize("separate", [False, True], ids=["in the output", "in the errors file"])
def test_rerun_runs_failed_lines_again_and_supersedes_their_records(tiny_engine, tmp_path, monkeypatch, separate):
    """A rerun skips only the requests with a result and runs every failed line again: a 500 (the engine's fault:
    out of memory, say) and a 400 whose line was fixed get their results, a line still bad gets its error again.
    The old error records are taken out, so each line keeps one record, in input order."""
    real = tiny_engine.generate
    items = [completion("ok", max_tokens=2), completion("boom", max_tokens=2, prompt="oops"),
             completion("bad", max_tokens=0), "{broken", completion("worse", max_tokens=0)]
    errors = str(tmp_path / "errors.jsonl") if separate else None
    out = str(tmp_path / "out.jsonl")
    where = errors or out
    monkeypatch.setattr(tiny_engine, "generate", out_of_memory_on(tiny_engine))
    _, first, log = run(tiny_engine, tmp_path, items, errors_path=errors)
    assert first.ok == 1 and first.bad_input == 3 and first.internal_error == 1
    assert log.endswith(f"4 of 5 requests failed (3 bad input, 1 internal error); errors in {where}\n")
    monkeypatch.setattr(tiny_engine, "generate", real)
    items[2]["body"]["max_tokens"], items[3] = 3, completion("mended", max_tokens=2)       # two lines fixed
    records, again, log = run(tiny_engine, tmp_path, items, errors_path=errors)
    assert again.skipped == 1 and again.ok == 3 and again.failed == again.bad_input == 1
    assert f"Skipping 1 requests already in {out}\n" in log
    assert log.endswith(f"1 of 5 requests failed (1 bad input); errors in {where}\n")
    failures = read_records(errors) if separate else [r for r in records if r["error"]]
    assert [r["custom_id"] for r in records if not r["error"]] == ["ok", "boom", "bad", "mended"]
    assert [r["custom_id"] for r in failures] == ["worse"] and "body.max_tokens" in failures[0]["error"]["message"]
    if not separate:            # the retried results put back in their input lines' places
        assert [r["custom_id"] for r in records] == ["ok", "boom", "bad", "mended", "worse"]
    assert records[2]["response"]["body"]["usage"]["completion_tokens"] == 3
    records, third, log = run(tiny_engine, tmp_path, items, errors_path=errors)
    assert third.skipped == 4 and third.ok == 0 and third.failed == 1
    assert f"Skipping 4 requests already in {out}\n" in log
    assert len(records) == (4 if separate else 5) and len(read_records(where)) == (1 if separate else 5)


def test_skipped_requests_are_counted_in_the_file_each_was_found_in(tiny_engine, tmp_path):
    """Only requests with a result are skipped, each counted once, naming the file it is in: here results that an
    earlier run wrote to the file now given as --batch-errors."""
    items = [completion(f"c{i}", max_tokens=2) for i in range(3)]
    first, second = str(tmp_path / "first.jsonl"), str(tmp_path / "second.jsonl")
    run_batch(tiny_engine, write_lines(tmp_path / "in.jsonl", items[:2]), first, GREEDY, log=io.StringIO())
    for skipped, message in [(2, f"Skipping 2 requests already in {first}\n"),
                             (3, f"Skipping 3 requests already in {second} (1) and {first} (2)\n")]:
        log = io.StringIO()
        summary = run_batch(tiny_engine, write_lines(tmp_path / "in.jsonl", items), second, GREEDY, log=log,
                            errors_path=first)
        assert summary.skipped == skipped and message in log.getvalue()
    assert [r["custom_id"] for r in read_records(second)] == ["c2"] and len(read_records(first)) == 2


def test_a_rerun_stopped_before_its_end_keeps_the_old_error_records(tiny_engine, tmp_path, monkeypatch):
    """Old error records are taken out only at the end of a run: one that stops on the way (a crash, ^C) leaves
    them with the new records appended, so no line is left without one; the next run sorts them out."""
    import engine.batch as batch
    items = [completion("a", max_tokens=0), completion("b", max_tokens=0), completion("c", max_tokens=2)]
    run(tiny_engine, tmp_path, items)
    items[0]["body"]["max_tokens"] = items[1]["body"]["max_tokens"] = 2
    real = batch._run_line
    calls = []

    def crash_on_second(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)
    monkeypatch.setattr(batch, "_run_line", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        run(tiny_engine, tmp_path, items)
    records = read_records(tmp_path / "out.jsonl")
    assert [(r["custom_id"], r["error"] is None) for r in records] == [("a", False), ("b", False), ("c", True),
                                                                      ("a", True)]
    monkeypatch.setattr(batch, "_run_line", real)
    records, summary, _ = run(tiny_engine, tmp_path, items)
    assert summary.skipped == 2 and summary.ok == 1 and summary.failed == 0
    assert [(r["custom_id"], r["error"]) for r in records] == [("a", None), ("b", None), ("c", None)]


def test_files_are_rewritten_only_where_a_record_is_superseded_or_out_of_place(tiny_engine, tmp_path, monkeypatch):
    """The end-of-run pass reads and decodes the whole file, so it runs only where this run superseded an error
    record, put a record before one an earlier run wrote, or found the file out of order (a rerun that stopped
    before its pass): not after a first run, nor after a rerun that only appended later lines."""
    import engine.batch as batch
    real_pass, real_generate = batch._finish_file, tiny_engine.generate
    passes = []
    monkeypatch.setattr(batch, "_finish_file", lambda path, numbers, stale: passes.append(path))
    items = [completion("a", max_tokens=2), completion("b", max_tokens=2, prompt="oops"), completion("c", max_tokens=2)]
    monkeypatch.setattr(tiny_engine, "generate", out_of_memory_on(tiny_engine))
    run(tiny_engine, tmp_path, items[:1])
    run(tiny_engine, tmp_path, items)                   # b's 500 and c appended after a: in order, nothing superseded
    assert passes == []
    monkeypatch.setattr(tiny_engine, "generate", real_generate)
    records, _, _ = run(tiny_engine, tmp_path, items)   # b retried, its result after c; the pass "crashed"
    assert [(r["custom_id"], r["error"] is None) for r in records] == [("a", True), ("b", False), ("c", True),
                                                                      ("b", True)] and len(passes) == 1
    monkeypatch.setattr(batch, "_finish_file", real_pass)
    records, summary, _ = run(tiny_engine, tmp_path, items)
    assert summary.skipped == 3 and [(r["custom_id"], r["error"]) for r in records] == [("a", None), ("b", None),
                                                                                       ("c", None)]


def test_rerun_keeps_internal_errors_of_ids_not_in_its_input(tiny_engine, tmp_path, monkeypatch):
    """A 500 is taken out only for a request this run will try again: one whose custom_id is not in the input (the
    output shared with another input file) keeps its record rather than losing it."""
    real = tiny_engine.generate
    monkeypatch.setattr(tiny_engine, "generate", out_of_memory_on(tiny_engine, None))
    run(tiny_engine, tmp_path, [completion("first", max_tokens=2)])
    monkeypatch.setattr(tiny_engine, "generate", real)
    records, summary, _ = run(tiny_engine, tmp_path, [completion("second", max_tokens=2)])
    assert summary.ok == 1 and [r["custom_id"] for r in records] == ["first", "second"]
    assert records[0]["error"]["code"] == "internal_error"


def test_reorder_puts_ids_of_another_input_last_past_blank_lines(tiny_engine, tmp_path, monkeypatch):
    """Input positions are file line numbers, which blank lines push past the count of requests: a record of an id
    this input does not hold (the output shared with another input file) goes after all of them."""
    real = tiny_engine.generate
    run(tiny_engine, tmp_path, [completion("x", max_tokens=2)])
    items = [completion("a", max_tokens=2), "", "", "", completion("b", max_tokens=2, prompt="oops")]
    monkeypatch.setattr(tiny_engine, "generate", out_of_memory_on(tiny_engine))
    run(tiny_engine, tmp_path, items)
    monkeypatch.setattr(tiny_engine, "generate", real)
    records, summary, _ = run(tiny_engine, tmp_path, items)
    assert summary.ok == 1 and [r["custom_id"] for r in records] == ["a", "b", "x"]


def test_errors_file_takes_failures_openai_style(tiny_engine, tmp_path):
    errors = str(tmp_path / "errors.jsonl")
    records, _, _ = run(tiny_engine, tmp_path, [completion("ok", max_tokens=2), completion("bad", n=3)],
                        errors_path=errors)
    assert [r["custom_id"] for r in records] == ["ok"]
    (failure,) = read_records(errors)
    assert failure["custom_id"] == "bad" and failure["response"] is None and "body.n" in failure["error"]["message"]


def test_progress_summary_and_summary_json(tiny_engine, tmp_path):
    summary_path = tmp_path / "summary.json"
    _, summary, log = run(tiny_engine, tmp_path, [completion(f"p{i}", max_tokens=6) for i in range(3)],
                          summary_path=str(summary_path))
    assert "Running batch: 100% | 3/3 [" in log and "req/s]" in log
    for label in ("Successful requests:", "Total generated tokens:", "Output token throughput (tok/s):",
                  "Acceptance rate (%):", "Per-position acceptance (%):"):
        assert label in log
    data = json.loads(summary_path.read_text())
    assert data["completed"] == 3 and data["total_output_tokens"] == 18 == summary.generated
    assert data["spec_decode_draft_tokens"] == summary.drafted > 0
    assert 1 <= data["spec_decode_acceptance_length"] <= 1 + tiny_engine.spec_k
    assert len(data["spec_decode_per_position_acceptance_rates"]) == tiny_engine.spec_k


def test_unreadable_batch_file_is_a_batch_error(tiny_engine, tmp_path):
    with pytest.raises(BatchFileError, match="cannot read batch file .*missing.jsonl"):
        run_batch(tiny_engine, str(tmp_path / "missing.jsonl"), str(tmp_path / "out.jsonl"), GREEDY, log=io.StringIO())


def test_files_that_are_one_or_not_ours_are_refused_before_running(tiny_engine, tmp_path):
    """Checked before any request runs, naming the flags: the input given as --output (its ids would read as
    finished: nothing run) or as the summary (overwritten); a summary path that cannot be written (found only after
    the batch before); an --output that is a directory, or a file of something other than result records (its
    unterminated last line was cut as a torn record)."""
    src = write_lines(tmp_path / "in.jsonl", [completion("a", max_tokens=2)])
    out = str(tmp_path / "out.jsonl")
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\nno newline at the end")
    cases = [((src, src), {}, "--output and --batch-file are the same file"),
             ((src, out), dict(summary_path=src), "--batch-summary-json and --batch-file are the same file"),
             ((src, out), dict(summary_path=str(tmp_path / "nodir" / "s.json")), "cannot write .*s.json"),
             ((src, str(tmp_path)), {}, "cannot read"),
             ((src, str(notes)), {}, "line 1 is not a batch result record")]
    for (in_path, out_path), kw, message in cases:
        with pytest.raises(BatchFileError, match=message):
            run_batch(tiny_engine, in_path, out_path, GREEDY, log=io.StringIO(), **kw)
    assert notes.read_text() == "my notes\nno newline at the end" and not os.path.exists(out)
