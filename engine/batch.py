"""`--batch-file`: run an OpenAI Batch JSONL file (ASSETS.md §5, the format `vllm run-batch` reads and writes).

Every input line is validated up front (JSON, envelope, body parameters, duplicate custom_ids: the first line with
an id runs, each later one fails); a bad line becomes an error record for its custom_id (or its line number) and the
others still run. Errors name the field the request wrote (`body.max_completion_tokens`), never the engine's own
parameter names. On the graph engine (engine/graph_engine.py) up to max_seqs requests run at once, a new one
joining as soon as one finishes (continuous batching); the eager engine runs them one at a time in input order.
Each result is appended and flushed as soon as its request finishes, so a rerun after a crash loses nothing: it skips the requests that already have a result and runs every
other line again, the failed ones included (a 400 whose line was fixed since, a 500 the engine may not repeat). At
the end of a completed run the error records it superseded are taken out and each file is put back in input order,
so every line has one record; the failures left are this run's, `failed` of the summary."""
import contextlib
import json
import math
import os
import re
import sys
import time
import uuid
from dataclasses import dataclass, field

from engine.logprobs import MAX_TOP_LOGPROBS, chat_logprobs, completion_logprobs
from engine.sampling import SEED_RANGE, SamplingParams, seed_in_range
from engine.text_stream import TextStream
from engine.tokenizer import is_utf8

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
# Sampling knobs this engine does not implement: a request that sets them is refused rather than silently changed.
UNSUPPORTED_NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "min_p": 0,
                       "best_of": 1, "echo": False, "suffix": "", "logit_bias": {}, "response_format": {"type": "text"},
                       "tool_choice": "auto", "parallel_tool_calls": True}
# Every body field a request may carry: any other is refused by name (a misspelt "max_tokenz" would otherwise be
# ignored, and the request run on the defaults). OpenAI's bookkeeping fields change nothing generated.
KNOWN_FIELDS = {"model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                "top_k", "seed", "ignore_eos", "stop", "n", "stream", "logprobs", "top_logprobs",
                "chat_template_kwargs", "tools", *UNSUPPORTED_NEUTRAL, "user", "metadata", "store", "stream_options"}


class BatchFileError(ValueError):
    """The batch run as a whole cannot go on (unreadable input, unwritable output)."""


class RequestError(ValueError):
    """One request is invalid: it gets a 400 record and the batch goes on."""


@dataclass(frozen=True)
class RequestDefaults:
    """What a request gets for each parameter it leaves out (the CLI flags, else the model's generation_config)."""
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class Request:
    custom_id: str
    url: str
    model: str | None
    prompt_ids: list
    max_tokens: int
    sampling: SamplingParams
    stops: tuple
    ignore_eos: bool
    thinking: bool                 # the chat prompt opened a `<think>` block: the output starts with reasoning
    logprobs: int | None = None    # alternatives a token to report with its log-probability; None: no logprobs


def _number(body: dict, key: str, default, rule: str, ok, *, integer: bool = False):
    value = body.get(key)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RequestError(f"body.{key} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not ok(value):
        raise RequestError(f"body.{key} must be {rule}, got {value!r}")
    return value


def _stops(body: dict) -> tuple:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(f"body.stop must be a non-empty string or a list of them, got {stop!r}")
    return tuple(stops)


def _message(i: int, message) -> dict:
    if not isinstance(message, dict) or message.get("role") not in MESSAGE_ROLES:
        raise RequestError(f"body.messages[{i}] must be an object with role one of {', '.join(MESSAGE_ROLES)}")
    content = message.get("content")
    if isinstance(content, list):      # OpenAI content parts: only text parts can reach a text-only model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise RequestError(f"body.messages[{i}].content: only text parts are supported")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str) and not (content is None and message["role"] == "assistant"):
        raise RequestError(f"body.messages[{i}].content must be a string or a list of text parts")
    return {**message, "content": content}


def _check_unsupported(body: dict):
    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join('body.' + k for k in unknown)}: not parameters of this engine")
    if body.get("n", 1) != 1:
        raise RequestError(f"body.n must be 1, got {body['n']!r}")
    if body.get("stream"):
        raise RequestError("body.stream is not supported in a batch file")
    for key, neutral in UNSUPPORTED_NEUTRAL.items():
        if body.get(key) is not None and body[key] != neutral:
            raise RequestError(f"body.{key} is not supported by this engine")


def _logprobs(url: str, body: dict) -> int | None:
    """How many alternatives each token's log-probability comes with, or None when none is asked for. Chat takes
    `logprobs: true` plus `top_logprobs: n`; completions take `logprobs: n` (OpenAI's two APIs)."""
    rule = f"in [0, {MAX_TOP_LOGPROBS}]"
    in_range = lambda v: 0 <= v <= MAX_TOP_LOGPROBS          # noqa: E731
    if url == COMPLETIONS_URL:
        if body.get("top_logprobs") is not None:
            raise RequestError("body.top_logprobs is a chat field: /v1/completions takes body.logprobs as a count")
        return _number(body, "logprobs", None, rule, in_range, integer=True)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise RequestError(f"body.logprobs must be true or false on {CHAT_URL}, got {wanted!r}")
    top = _number(body, "top_logprobs", None, rule, in_range, integer=True)
    if top is not None and not wanted:
        raise RequestError("body.top_logprobs needs body.logprobs: true")
    return (top or 0) if wanted else None


def _prompt_ids(engine, url: str, body: dict) -> tuple[list, bool]:
    """Prompt token ids, and whether the generation prompt opened a reasoning block."""
    tokenizer = engine.tokenizer
    if url == COMPLETIONS_URL:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return tokenizer.encode(prompt), False
        if (isinstance(prompt, list) and prompt
                and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)):
            return list(prompt), False
        raise RequestError("body.prompt must be a non-empty string or a list of token ids")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("body.messages must be a non-empty list")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("body.chat_template_kwargs must be an object")
    if set(kwargs) - {"enable_thinking"}:
        extra = ", ".join(sorted(set(kwargs) - {"enable_thinking"}))
        raise RequestError(f"body.chat_template_kwargs: {extra} not supported (only enable_thinking)")
    thinking = kwargs.get("enable_thinking", True)
    if not isinstance(thinking, bool):
        raise RequestError("body.chat_template_kwargs.enable_thinking must be true or false")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("body.tools must be a list")
    text = tokenizer.apply_chat_template([_message(i, m) for i, m in enumerate(messages)],
                                         add_generation_prompt=True, enable_thinking=thinking, tools=tools)
    return tokenizer.encode(text), thinking


def parse_request(engine, record: dict, defaults: RequestDefaults) -> Request:
    """Validate one decoded input line (custom_id already checked) into a Request; RequestError names the field."""
    if record.get("method") != "POST":
        raise RequestError(f"method must be POST, got {record.get('method')!r}")
    url = record.get("url")
    if url not in (CHAT_URL, COMPLETIONS_URL):
        raise RequestError(f"url must be {CHAT_URL} or {COMPLETIONS_URL}, got {url!r}")
    body = record.get("body")
    if not isinstance(body, dict):
        raise RequestError("body must be an object")
    _check_unsupported(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"body.model must be a string, got {model!r}")
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, max_key, defaults.max_tokens, ">= 1", lambda v: v >= 1, integer=True)
    temperature = _number(body, "temperature", defaults.temperature, "in [0, 2]", lambda v: 0 <= v <= 2)
    top_p = _number(body, "top_p", defaults.top_p, "in (0, 1]", lambda v: 0 < v <= 1)
    top_k = _number(body, "top_k", defaults.top_k, ">= 0 (or -1 for off)", lambda v: v >= -1, integer=True)
    seed = _number(body, "seed", defaults.seed, f"in {SEED_RANGE}", seed_in_range, integer=True)
    ignore_eos = body.get("ignore_eos", defaults.ignore_eos)
    if not isinstance(ignore_eos, bool):
        raise RequestError(f"body.ignore_eos must be true or false, got {ignore_eos!r}")
    logprobs = _logprobs(url, body)
    prompt_ids, thinking = _prompt_ids(engine, url, body)
    sampling = SamplingParams(temperature=float(temperature), top_k=max(top_k, 0), top_p=float(top_p), seed=seed)
    return Request(record["custom_id"], url, model, prompt_ids, max_tokens, sampling, _stops(body), ignore_eos,
                   thinking, logprobs)


def _timings(stats, started: float, first_token_at: float | None) -> dict:
    prompt_ms, predicted_ms = stats.prefill_seconds * 1e3, stats.decode_seconds * 1e3
    return {"prompt_n": stats.prompt_tokens, "prompt_ms": round(prompt_ms, 3),
            "prompt_per_second": round(stats.prompt_tokens_per_second, 3),
            "predicted_n": stats.generated, "predicted_ms": round(predicted_ms, 3),
            "predicted_per_second": round(stats.tokens_per_second, 3),
            "ttft_ms": round(((first_token_at or time.perf_counter()) - started) * 1e3, 3),
            "draft_n": stats.drafted, "draft_n_accepted": stats.accepted}


@dataclass
class Job:
    """A parsed request on its way through the engine: its input line, the TextStream its tokens go to (stop
    strings, the reasoning split), when it started."""
    line: "InputLine"
    request: Request
    stream: TextStream
    started: float

    @classmethod
    def start(cls, engine, line: "InputLine", defaults: RequestDefaults, think_end_id: int | None) -> "Job":
        request = parse_request(engine, line.record, defaults)
        stream = TextStream(engine.tokenizer, stops=request.stops,
                            think_end_id=think_end_id if request.url == CHAT_URL else None)
        return cls(line, request, stream, time.perf_counter())

    def generation(self) -> tuple[list, int, SamplingParams, dict]:
        """The arguments of engine.generate (and GraphEngine.submit) for this request."""
        r = self.request
        return r.prompt_ids, r.max_tokens, r.sampling, dict(ignore_eos=r.ignore_eos, on_tokens=self.stream,
                                                             logprobs=r.logprobs)

    @contextlib.contextmanager
    def refusals(self):
        """The engine refusing the request (a ValueError, e.g. a prompt longer than its context) as a RequestError
        naming the body fields."""
        try:
            yield
        except ValueError as e:
            raise RequestError(_in_request_terms(str(e), self.request.url, self.line.record["body"])) from None

    def response(self, engine, result) -> tuple[dict, object]:
        """The response body for the engine's GenerationResult, and its GenerationStats."""
        request, stream = self.request, self.stream
        reasoning, answer = stream.finish()
        finish_reason = "stop" if stream.cut is not None else result.finish_reason
        stats = result.stats
        common = {"created": int(time.time()),
                  "model": request.model or os.path.basename(engine.model_dir.rstrip("/")),
                  "usage": {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated,
                            "total_tokens": stats.prompt_tokens + stats.generated},
                  "timings": _timings(stats, self.started, stream.first_token_at)}
        if request.url == COMPLETIONS_URL:
            logprobs = None if result.logprobs is None else completion_logprobs(engine.tokenizer, result.logprobs)
            choice = {"index": 0, "text": answer, "logprobs": logprobs, "finish_reason": finish_reason}
            return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "choices": [choice],
                    **common}, stats
        think_end_id = stream.think_end_id
        if reasoning is None and request.thinking and think_end_id is not None:
            reasoning, answer = answer, None           # cut off inside the reasoning block: all of it is reasoning
        message = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
        logprobs = None if result.logprobs is None else chat_logprobs(engine.tokenizer, result.logprobs)
        choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "choices": [choice],
                **common}, stats


def _record(custom_id, status: int | None, body=None, error: dict | None = None) -> dict:
    response = None if status is None else {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}",
                                            "body": body}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": response, "error": error}


@dataclass
class InputLine:
    number: int                    # 1-based line number in the input file
    custom_id: str | None
    record: dict | None = None     # the decoded line, when it is valid JSON with a usable custom_id
    error: str | None = None       # why the line is refused before running


def _decode_line(number: int, raw: bytes):
    """(record, None), or (None, why) for a line that is not UTF-8 JSON whose strings all encode back to UTF-8."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"line {number}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
    try:
        record = json.loads(text)
    except (ValueError, RecursionError) as e:          # JSONDecodeError, an int past Python's digit limit, nesting
        return None, f"line {number}: invalid JSON ({getattr(e, 'msg', None) or e})"
    if not is_utf8(json.dumps(record, ensure_ascii=False)):    # "\ud800" parses, but cannot be written back out
        return None, f"line {number}: a string holds a lone surrogate escape (not valid UTF-8)"
    return record, None


def read_input(path: str) -> list[InputLine]:
    """Decode every non-blank line on its own: a line that is not UTF-8 JSON, or has no custom_id or the custom_id of
    an earlier line, carries an error and the others run."""
    try:
        with open(path, "rb") as f:
            raws = f.read().split(b"\n")
    except OSError as e:
        raise BatchFileError(f"cannot read batch file {path}: {e.strerror or e}") from None
    lines = []
    for number, raw in enumerate(raws, 1):
        if not raw.strip():
            continue
        record, error = _decode_line(number, raw)
        if error:
            lines.append(InputLine(number, None, error=error))
            continue
        custom_id = record.get("custom_id") if isinstance(record, dict) else None
        if not isinstance(custom_id, str) or not custom_id:
            lines.append(InputLine(number, None, error=f"line {number}: custom_id must be a non-empty string"))
            continue
        lines.append(InputLine(number, custom_id, record))
    first_line = {}
    for line in lines:            # the first line with a custom_id runs; a later one cannot be told apart from it
        if line.custom_id is not None and line.custom_id in first_line:
            line.error = (f"line {line.number}: duplicate custom_id {line.custom_id!r} "
                          f"(line {first_line[line.custom_id]} has it already)")
        elif line.custom_id is not None:
            first_line[line.custom_id] = line.number
    return lines


RECORD_KEYS = {"id", "custom_id", "response", "error"}     # a result line's keys (_record)


def _line_numbers(lines: list) -> dict:
    """custom_id -> the input line number (1-based in the file: blank lines count) of its first line, the one that
    runs."""
    numbers = {}
    for line in lines:
        if line.custom_id is not None:
            numbers.setdefault(line.custom_id, line.number)
    return numbers


def _position(record: dict, numbers: dict) -> float:
    """Where a result record belongs in input order: a failure at the line its message names (duplicated custom_ids
    each have their own), a result at its custom_id's line (numbers: _line_numbers), after every input line for an
    id the input does not hold."""
    error = record["error"]
    match = re.match(r"line (\d+):", (error.get("message") if isinstance(error, dict) else None) or "")
    return int(match.group(1)) if match else numbers.get(record["custom_id"], math.inf)


@dataclass
class Found:
    """What a results file holds for this input (_found_in)."""
    done: set = field(default_factory=set)     # custom_ids of this input with a result (a 200): skipped
    stale: set = field(default_factory=set)    # 0-based indices of its lines that are error records of this input
    last: float | None = 0                     # input position (_position) of the last record it keeps (stale
                                               # ones aside); None: those are out of order already


def _found_in(path: str | None, numbers: dict, last_line: int) -> Found:
    """Read what an earlier run left in `path` (numbers: _line_numbers; last_line: the input's last line number).
    Every error record of this input — its custom_id is one of the input's, or it has none and names one of its
    lines — is stale: the line runs again, since a 400's line may have been fixed and a 500 (out of memory, say) was
    not the request's fault; the record is taken out at the end of the run (_finish_file) once the new one is
    written. Error records of other ids stay, as no line of this input would write them again. A torn last line
    (the process died mid-write: a record's start) is cut off so the next append starts on a fresh line. A file
    that holds anything but result records is refused: it is not ours to change."""
    found = Found()
    if not path or not os.path.exists(path):
        return found
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BatchFileError(f"cannot read {path}: {e.strerror}") from None
    complete, _, torn = data.rpartition(b"\n")
    for index, raw in enumerate(complete.split(b"\n") if complete else []):
        try:
            record = json.loads(raw) if raw.strip() else None
        except (ValueError, RecursionError):
            record = {}
        if record is None:
            continue
        if not (isinstance(record, dict) and set(record) == RECORD_KEYS):
            raise BatchFileError(f"{path}: line {index + 1} is not a batch result record: not a results file "
                                 "to resume (give another --output)")
        position, custom_id = _position(record, numbers), record["custom_id"]
        if record["error"] is not None and (custom_id in numbers or (custom_id is None and position <= last_line)):
            found.stale.add(index)
            continue
        if found.last is not None:
            found.last = position if position >= found.last else None
        if record["error"] is None and custom_id in numbers:
            found.done.add(custom_id)
    if torn and not torn.startswith(b'{"id": "batch_req_'):
        raise BatchFileError(f"{path}: its last line is not a batch result record: not a results file to resume "
                             "(give another --output)")
    if torn:
        _rewrite(path, complete + b"\n" if complete else b"")
    return found


def _finish_file(path: str, numbers: dict, stale: set):
    """At the end of a run: take out the error records it superseded (stale: Found.stale) and put the file in input
    order (one line per input, as vLLM writes it), which appending breaks where a rerun ran a line before later
    ones already there. It reads and decodes the whole file: run_batch calls it only where there is a record to
    take out or one out of place."""
    with open(path, "rb") as f:
        raws = [raw for index, raw in enumerate(f.read().split(b"\n")) if index not in stale and raw.strip()]
    order = [_position(json.loads(raw), numbers) for raw in raws]
    if stale or order != sorted(order):
        _rewrite(path, b"".join(raw + b"\n" for _, raw in sorted(zip(order, raws), key=lambda p: p[0])))


def _rewrite(path: str, data: bytes):
    """Replace path's content at once (a crash leaves the old file or the new one, never half of either). A symlink
    is followed (its target rewritten, the link kept) and the file keeps its permission bits."""
    path = os.path.realpath(path)
    tmp = f"{path}.rewrite"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise BatchFileError(f"cannot rewrite {path}: {e.strerror}") from None


class Progress:
    """`Running batch: 37% | 37/100 [00:12<00:20, 3.0 req/s]` on stderr: redrawn in place on a terminal, else a
    line at most every few seconds and at the end."""

    def __init__(self, total: int, stream):
        self.total, self.stream, self.started = total, stream, time.perf_counter()
        self.tty = getattr(stream, "isatty", lambda: False)()
        self.last_line = -1e9

    @staticmethod
    def _clock(seconds: float) -> str:
        m, s = divmod(int(seconds), 60)
        return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m:02d}:{s:02d}"

    def update(self, done: int):
        now = time.perf_counter()
        if not self.tty and done < self.total and now - self.last_line < 5:
            return
        self.last_line = now
        elapsed = now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (self.total - done) / rate if rate > 0 else 0.0
        pct = 100 * done // self.total if self.total else 100
        text = (f"Running batch: {pct}% | {done}/{self.total} [{self._clock(elapsed)}<{self._clock(left)}, "
                f"{rate:.1f} req/s]")
        self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
        if self.tty and done == self.total:
            self.stream.write("\n")
        self.stream.flush()


@dataclass
class BatchSummary:
    requests: int = 0              # lines of the input
    ok: int = 0
    bad_input: int = 0             # failed with a 400: the request's fault
    internal_error: int = 0        # failed with a 500: the engine's
    skipped: int = 0
    prompt_tokens: int = 0
    generated: int = 0
    steps: int = 0                 # verify steps of the requests that drafted
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def failed(self) -> int:
        return self.bad_input + self.internal_error

    def failures(self, errors_in: str) -> str:
        """One line for stderr: how many requests failed, of which kind, and the file their records are in."""
        kinds = [f"{self.bad_input} bad input"] if self.bad_input else []
        if self.internal_error:
            kinds.append(f"{self.internal_error} internal error{'s' if self.internal_error > 1 else ''}")
        return f"{self.failed} of {self.requests} requests failed ({', '.join(kinds)}); errors in {errors_in}"

    def add(self, stats):
        self.ok += 1
        self.prompt_tokens += stats.prompt_tokens
        self.generated += stats.generated
        if stats.drafted:
            self.steps += stats.steps
            self.drafted += stats.drafted
            self.accepted += stats.accepted
            for i, n in enumerate(stats.accepted_per_position):
                if i == len(self.accepted_per_position):
                    self.accepted_per_position.append(0)
                self.accepted_per_position[i] += n

    def as_dict(self) -> dict:
        """vLLM benchmark key names."""
        d = max(self.elapsed, 1e-9)
        return {"completed": self.ok, "failed": self.failed, "skipped": self.skipped, "duration": self.elapsed,
                "total_input_tokens": self.prompt_tokens, "total_output_tokens": self.generated,
                "request_throughput": self.ok / d, "output_throughput": self.generated / d,
                "total_token_throughput": (self.prompt_tokens + self.generated) / d,
                "spec_decode_acceptance_rate": 100 * self.accepted / self.drafted if self.drafted else None,
                "spec_decode_acceptance_length": 1 + self.accepted / self.steps if self.steps else None,
                "spec_decode_num_drafts": self.steps, "spec_decode_draft_tokens": self.drafted,
                "spec_decode_accepted_tokens": self.accepted,
                "spec_decode_per_position_acceptance_rates":
                    [100 * n / self.steps for n in self.accepted_per_position] if self.steps else []}

    def format(self) -> str:
        d = self.as_dict()
        rows = [("Successful requests:", d["completed"]), ("Failed requests:", d["failed"]),
                ("Skipped (already in output):", d["skipped"]), ("Duration (s):", f"{d['duration']:.2f}"),
                ("Total input tokens:", d["total_input_tokens"]), ("Total generated tokens:", d["total_output_tokens"]),
                ("Request throughput (req/s):", f"{d['request_throughput']:.2f}"),
                ("Output token throughput (tok/s):", f"{d['output_throughput']:.2f}"),
                ("Total token throughput (tok/s):", f"{d['total_token_throughput']:.2f}")]
        lines = ["{s:{c}^{n}}".format(s=" Batch Result ", n=50, c="=")]
        lines += [f"{k:<40} {v:<10}" for k, v in rows]
        if self.drafted:
            lines.append("{s:{c}^{n}}".format(s=" Speculative Decoding ", n=50, c="-"))
            per_position = ", ".join(f"{p:.1f}" for p in d["spec_decode_per_position_acceptance_rates"])
            lines += [f"{k:<40} {v:<10}" for k, v in [
                ("Acceptance rate (%):", f"{d['spec_decode_acceptance_rate']:.2f}"),
                ("Acceptance length:", f"{d['spec_decode_acceptance_length']:.2f}"),
                ("Drafts:", d["spec_decode_num_drafts"]), ("Draft tokens:", d["spec_decode_draft_tokens"]),
                ("Accepted tokens:", d["spec_decode_accepted_tokens"]),
                ("Per-position acceptance (%):", per_position)]]
        lines.append("=" * 50)
        return "\n".join(lines)


def _open_append(path: str):
    try:
        return open(path, "a", encoding="utf-8")
    except OSError as e:
        raise BatchFileError(f"cannot write {path}: {e.strerror}") from None


def _check_paths(in_path: str, out_path: str, errors_path: str | None, summary_path: str | None):
    """Before any request runs: no two of the files are one (the input would be read as finished results, or
    overwritten by the summary), and the summary can be written where it goes (not found out after the batch)."""
    named = [(n, p) for n, p in (("--batch-file", in_path), ("--output", out_path), ("--batch-errors", errors_path),
                                 ("--batch-summary-json", summary_path)) if p]
    seen = {}
    for name, path in named:
        real = os.path.realpath(path)
        if real in seen:
            raise BatchFileError(f"{name} and {seen[real]} are the same file: {path}")
        seen[real] = name
    if summary_path:
        parent = os.path.dirname(os.path.abspath(summary_path))
        if os.path.isdir(summary_path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            raise BatchFileError(f"cannot write {summary_path}: not a writable file path")


def _skipping(skipped: list, found: dict) -> str:
    """`Skipping 11 requests already in out.jsonl` (skipped: the input lines with a result; found: _found_in per
    file), naming how many each file holds where they are in more than one."""
    counts = dict.fromkeys(found, 0)
    for line in skipped:
        counts[next(path for path, f in found.items() if line.custom_id in f.done)] += 1
    counts = {path: n for path, n in counts.items() if n}
    places = " and ".join(f"{path} ({n})" if len(counts) > 1 else path for path, n in counts.items())
    return f"Skipping {len(skipped)} requests already in {places}"


def run_batch(engine, in_path: str, out_path: str, defaults: RequestDefaults, *, errors_path: str | None = None,
              summary_path: str | None = None, log=None) -> BatchSummary:
    """Run every request of `in_path`, appending one record per line to `out_path` (failures to `errors_path`
    instead, OpenAI style, when given). Progress, the summary and, where a request failed, a line saying how many
    and where their records are go to `log` (default: stderr)."""
    log = log or sys.stderr
    _check_paths(in_path, out_path, errors_path, summary_path)
    lines = read_input(in_path)
    numbers = _line_numbers(lines)
    last_line = lines[-1].number if lines else 0
    found = {path: _found_in(path, numbers, last_line) for path in dict.fromkeys((out_path, errors_path)) if path}
    done = set().union(*(f.done for f in found.values()))
    skipped = [line for line in lines if not line.error and line.custom_id in done]
    todo = [line for line in lines if line.error or line.custom_id not in done]
    summary = BatchSummary(requests=len(lines), skipped=len(skipped))
    if skipped:
        log.write(_skipping(skipped, found) + "\n")
    think_end_id = engine.tokenizer.token_to_id("</think>")
    out = _open_append(out_path)
    errors = _open_append(errors_path) if errors_path else out
    progress = Progress(len(todo), log)
    first_new = {}                             # per file: the least input position of a record this run added
    last_new, disordered = {}, set()           # per file: the last one; files this run wrote out of input order
    records = _continuous if hasattr(engine, "submit") else _one_at_a_time
    started = time.perf_counter()
    try:
        for n, (line, record) in enumerate(records(engine, todo, defaults, think_end_id, summary,
                                               separate_errors=errors is not out), 1):
            failed = record["error"] is not None
            target = errors if failed else out
            target.write(json.dumps(record, ensure_ascii=False) + "\n")
            target.flush()
            path = errors_path if failed and errors_path else out_path
            first_new[path] = min(first_new.get(path, math.inf), line.number)      # _position
            if line.number < last_new.get(path, 0):
                disordered.add(path)
            last_new[path] = line.number
            progress.update(n)
    finally:
        summary.elapsed = time.perf_counter() - started
        out.close()
        if errors is not out:
            errors.close()
    for path, f in found.items():              # a record put before one kept from an earlier run, or this run's
        if (f.stale or f.last is None or first_new.get(path, f.last) < f.last     # out of input order (requests
                or path in disordered):                                            # finishing out of turn)
            _finish_file(path, numbers, f.stale)
    log.write(summary.format() + "\n")
    if summary.failed:
        log.write(summary.failures(errors_path or out_path) + "\n")
    if summary_path:
        try:
            with open(summary_path, "w", encoding="utf-8") as f:
                json.dump(summary.as_dict(), f, indent=2)
        except OSError as e:
            raise BatchFileError(f"cannot write {summary_path}: {e.strerror}") from None
    return summary


def _in_request_terms(message: str, url: str, body: dict) -> str:
    """Engine.generate's ValueErrors name its parameters (prompt, max_new_tokens, the SamplingParams fields,
    logprobs); the user wrote a batch request: each becomes the body field its value came from (`body.max_tokens`
    or `body.max_completion_tokens`, `body.messages` for a chat's prompt), and a value the body left out is said to
    be the batch default."""
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    fields = {"prompt": "prompt" if url == COMPLETIONS_URL else "messages", "max_new_tokens": max_key,
              "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seed": "seed",
              "logprobs": "logprobs" if url == COMPLETIONS_URL else "top_logprobs"}
    defaulted = []

    def field_name(match) -> str:
        key = fields[match.group(0)]
        if body.get(key) is not None:
            return f"body.{key}"
        defaulted.append(key)
        return key

    text = re.sub(r"\b(?:" + "|".join(fields) + r")\b", field_name, message)
    if defaulted:
        text += f" ({', '.join(dict.fromkeys(defaulted))}: the batch default, as the body sets none)"
    return text


def _outcome(line: InputLine, summary: BatchSummary, separate_errors: bool, work) -> dict | None:
    """The record of `line`: work() -> (body, stats) makes a 200; None: the request is on its way (no record yet);
    a line refused when read, a ValueError (a RequestError, the tokenizer refusing a message) or any other
    exception (the engine's fault: one broken request must not end the batch) a failure record."""
    def failure(status: int, code: str, message: str) -> dict:
        if status == 400:
            summary.bad_input += 1
        else:
            summary.internal_error += 1
        return _record(line.custom_id, None if separate_errors else status, error={"code": code, "message": message})

    if line.error:
        return failure(400, "invalid_request", line.error)
    try:
        done = work()
    except ValueError as e:
        return failure(400, "invalid_request", f"line {line.number}: {e}")
    except Exception as e:
        return failure(500, "internal_error", f"line {line.number}: {type(e).__name__}: {e}")
    if done is None:
        return None
    body, stats = done
    summary.add(stats)
    return _record(line.custom_id, 200, body)


def _run_line(engine, line: InputLine, defaults: RequestDefaults, think_end_id, summary: BatchSummary, *,
              separate_errors: bool) -> dict:
    """One line on an engine that generates one request at a time (engine/engine.Engine): its record."""
    def work():
        job = Job.start(engine, line, defaults, think_end_id)
        prompt_ids, max_tokens, sampling, kw = job.generation()
        with job.refusals():
            result = engine.generate(prompt_ids, max_tokens, sampling, **kw)
        return job.response(engine, result)
    return _outcome(line, summary, separate_errors, work)


def _one_at_a_time(engine, todo: list, defaults, think_end_id, summary, *, separate_errors: bool):
    """(line, record) for each line, in input order, each run to its end before the next starts."""
    for line in todo:
        yield line, _run_line(engine, line, defaults, think_end_id, summary, separate_errors=separate_errors)


def _continuous(engine, todo: list, defaults, think_end_id, summary, *, separate_errors: bool):
    """(line, record) for each line as its request completes, on an engine with a submit / step API
    (engine/graph_engine.GraphEngine): up to engine.max_seqs requests in flight, a new one submitted as soon as
    one finishes. A step that fails fails every request in flight (500s) and the engine starts afresh."""
    jobs = {}                                  # the engine's Request -> Job
    lines = iter(todo)
    line = next(lines, None)
    while line is not None or jobs:
        while line is not None and len(jobs) < engine.max_seqs:
            def submit(line=line):
                job = Job.start(engine, line, defaults, think_end_id)
                prompt_ids, max_tokens, sampling, kw = job.generation()
                with job.refusals():
                    jobs[engine.submit(prompt_ids, max_tokens, sampling, **kw)] = job
            record = _outcome(line, summary, separate_errors, submit)
            if record is not None:
                yield line, record
            line = next(lines, None)
        if not jobs:
            continue
        try:
            finished = engine.step()
        except Exception as e:
            engine.abort()
            failed, jobs = list(jobs.values()), {}
            for job in failed:
                def fail(e=e):
                    raise e
                yield job.line, _outcome(job.line, summary, separate_errors, fail)
            continue
        for request in finished:
            job = jobs.pop(request)
            yield job.line, _outcome(job.line, summary, separate_errors,
                                     lambda: job.response(engine, request.result))
