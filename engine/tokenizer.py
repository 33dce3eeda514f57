"""Tokenizer, chat template and generation defaults of a checkpoint directory (MODEL.md §6-§8).

Text <-> ids goes through the HF `tokenizers` library (tokenizer.json). Chat prompts are rendered from the
checkpoint's own jinja template in a sandbox, as transformers does, so the engine never re-implements a model's
prompt format; a ChatML + think template (MODEL.md §7) is built in for directories that ship none.
"""
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

# ChatML with Qwen's think block (MODEL.md §7). Tools are not rendered: their format is the checkpoint's own
# business, so asking for them here is an error rather than a guess.
CHATML_TEMPLATE = r"""
{%- macro text_of(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part.type == 'text' -%}
                {{- part.text -}}
            {%- else -%}
                {{- raise_exception('the built-in chat template renders text parts only, not ' ~ part.type) -}}
            {%- endif -%}
        {%- endfor -%}
    {%- elif content is not none -%}
        {{- raise_exception('message content must be a string or a list of text parts') -}}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- raise_exception('the built-in chat template cannot render tools; add the checkpoint chat_template.jinja') -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
    {%- if message.role == 'user' -%}
        {%- set ns.last_user = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
    {%- set content = text_of(message.content) -%}
    {%- if message.role == 'system' -%}
        {%- if not loop.first -%}
            {{- raise_exception('the system message must come first') -}}
        {%- endif -%}
        {{- '<|im_start|>system\n' + content + '<|im_end|>\n' -}}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\n' + content + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {%- set reasoning = '' -%}
        {%- if message.reasoning_content is string -%}
            {%- set reasoning = message.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {#- a raw thinking-on reply: the reasoning is everything before </think> -#}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {#- reasoning of turns before the last user message is dropped, as the Qwen templates do -#}
        {%- if loop.index0 > ns.last_user and reasoning -%}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n')
               + '<|im_end|>\n' -}}
        {%- else -%}
            {{- '<|im_start|>assistant\n' + content + '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- raise_exception('the built-in chat template knows no role ' ~ message.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n<think>\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
"""

BUILTIN_TEMPLATE_SOURCE = "built-in ChatML template"

# the special-token names transformers hands to chat templates
_TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(value, path: Path, field: str) -> str | None:
    """A special token as tokenizer_config.json spells it: a string, {"content": ...}, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"{path}: field {field!r} must be a string or {{'content': str}}, got {value!r}")


def _template_source(model_dir: Path, config: dict) -> tuple[str, str]:
    """(template text, where it came from): chat_template.jinja, then tokenizer_config.json, then built-in."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8"), str(jinja_file)
    where = f"{model_dir / 'tokenizer_config.json'} field 'chat_template'"
    template = config.get("chat_template")
    if template is None:
        return CHATML_TEMPLATE, BUILTIN_TEMPLATE_SOURCE
    if isinstance(template, list):                 # named templates, e.g. "default" and "tool_use"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
        where += "['default']"
    if not isinstance(template, str):
        raise ValueError(f"{where}: expected a template string (or a list holding a 'default' one)")
    return template, where


def _raise_exception(message):
    raise jinja2.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson HTML-escapes <, > and &, which would corrupt prompts (transformers replaces it too)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj, attribute):
        # jinja's sandbox answers a blocked attribute with an undefined that prints as "": fail loudly instead
        raise jinja2.sandbox.SecurityError(f"access to {type(obj).__name__}.{attribute} is not allowed")


def _compile_template(source: str, where: str) -> jinja2.Template:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template ({where}): {e}") from e


def _byte_level_alphabet() -> dict[str, int]:
    """The character a ByteLevel tokenizer spells each byte with (GPT-2's table): printable Latin-1 bytes as
    themselves, the n-th of the others as chr(256 + n). Returns character -> byte."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def is_utf8(text: str) -> bool:
    """Whether text encodes as UTF-8: a str can hold lone surrogates (argv and stdin bytes that are not UTF-8 arrive
    as such under surrogateescape; JSON's "\\ud800" parses to one), which neither the tokenizer nor an output file
    takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Tokenizer:
    """A checkpoint's tokenizer.json plus its chat template; `from_dir` is the usual way in."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, special_tokens: dict[str, str] | None = None,
                 chat_template: str = CHATML_TEMPLATE, template_source: str = BUILTIN_TEMPLATE_SOURCE):
        self._tok = tokenizer
        self._special_tokens = dict(special_tokens or {})    # e.g. {"eos_token": "<|im_end|>"}
        self._template = _compile_template(chat_template, template_source)
        self._template_source = template_source
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self._added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
        self._bytes_of = _byte_level_alphabet() if isinstance(tokenizer.decoder, tokenizers.decoders.ByteLevel) else None
        eos = self._special_tokens.get("eos_token")
        self.eos_token_id: int | None = None if eos is None else tokenizer.token_to_id(eos)

    @classmethod
    def from_dir(cls, model_dir: str) -> "Tokenizer":
        model_dir = Path(model_dir)
        tok_file = model_dir / "tokenizer.json"
        try:
            tok = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as e:                 # the library raises plain Exception for missing and bad files
            raise ValueError(f"{tok_file}: cannot load tokenizer: {e}") from e
        config_file = model_dir / "tokenizer_config.json"
        config = _read_json(config_file) if config_file.exists() else {}
        specials = {}
        for name in _TEMPLATE_TOKENS:
            text = _token_text(config.get(name), config_file, name)
            if text is not None:
                specials[name] = text
        if "eos_token" in specials and tok.token_to_id(specials["eos_token"]) is None:
            # a stop token missing from the vocabulary would let generation run on silently
            raise ValueError(f"{config_file}: field 'eos_token' {specials['eos_token']!r} is not in the vocabulary")
        return cls(tok, specials, *_template_source(model_dir, config))

    def encode(self, text: str) -> list[int]:
        # special tokens written in the text always match; add_special_tokens=False keeps any post-processor
        # from adding a BOS (Qwen has none, other tokenizer.json files may)
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (the OpenAI logprobs' `bytes`): a byte-level token can hold part of a
        UTF-8 character, which decoding it alone would turn into U+FFFD. Exact for added tokens and under a plain
        ByteLevel decoder (the Qwen family's); any other token is decoded alone, so under another decoder a
        byte-fallback piece (`<0xE4>`) gives U+FFFD's bytes and a SentencePiece word may lose its leading space."""
        token_id = int(token_id)
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self._tok.id_to_token(token_id)
        if self._bytes_of is not None and piece is not None and all(c in self._bytes_of for c in piece):
            return bytes(self._bytes_of[c] for c in piece)
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            enable_thinking: bool = True, tools: list | None = None, **kwargs) -> str:
        variables = {**self._special_tokens, **kwargs, "messages": messages, "tools": tools,
                     "add_generation_prompt": add_generation_prompt, "enable_thinking": enable_thinking}
        try:
            return self._template.render(**variables)
        except Exception as e:                 # the template is arbitrary code: any failure is the template's
            raise ValueError(f"chat template ({self._template_source}): {e}") from e


class StreamDecoder:
    """Turns ids arriving a few at a time into text, emitting only complete characters.

    Byte-level tokens can end inside a UTF-8 sequence, which decodes to U+FFFD until the next token completes it,
    so text is emitted only once the decoded tail is not U+FFFD. Each step decodes a short window: the ids since
    the last emission, plus the ids of that emission as a prefix, so tokenizers whose decoding of a token depends
    on its left neighbour still decode consistently; the new text is the window's decoding minus the prefix's.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0        # window start
        self._read = 0          # ids before this are already emitted
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def _pending(self) -> tuple[str, str]:
        prefix_text = self._tokenizer.decode(self._ids[self._prefix:self._read], self._skip)
        window_text = self._tokenizer.decode(self._ids[self._prefix:], self._skip)
        return prefix_text, window_text

    def _emit(self, prefix_text: str, window_text: str) -> str:
        new = window_text[len(prefix_text):]
        self._prefix, self._read = self._read, len(self._ids)
        self._pieces.append(new)
        return new

    def push(self, ids: list[int]) -> str:
        out = []
        for i in ids:           # one at a time, so complete text before an unfinished character still goes out
            self._ids.append(int(i))
            prefix_text, window_text = self._pending()
            if len(window_text) > len(prefix_text) and not window_text.endswith("\ufffd"):
                out.append(self._emit(prefix_text, window_text))
        return "".join(out)

    def flush(self) -> str:
        """Everything still held back, an unfinished character included (as U+FFFD)."""
        return self._emit(*self._pending())


@dataclass(frozen=True)
class GenerationDefaults:
    stop_ids: tuple[int, ...]
    temperature: float      # 0 = greedy
    top_k: int              # 0 = off
    top_p: float


def _fallback_stop_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    candidates = (tokenizer.eos_token_id, tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>"))
    return tuple(dict.fromkeys(i for i in candidates if i is not None))


def _number(config: dict, field: str, path: Path, default: float, ok, rule: str) -> float:
    value = config.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise ValueError(f"{path}: field {field!r} must be {rule}, got {value!r}")
    return value


def load_generation_defaults(model_dir: str, tokenizer: Tokenizer) -> GenerationDefaults:
    """Stop ids and sampling settings from generation_config.json (MODEL.md §8); what it lacks falls back to
    the tokenizer's end tokens and plain sampling (T 1, no top-k, no top-p). A missing `do_sample` does not
    force greedy decoding (unlike transformers), since the engine samples unless told otherwise."""
    path = Path(model_dir) / "generation_config.json"
    config = _read_json(path) if path.exists() else {}

    eos = config.get("eos_token_id")
    if eos is None:
        stop_ids = _fallback_stop_ids(tokenizer)
    else:
        ids = [eos] if not isinstance(eos, list) else eos
        if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError(f"{path}: field 'eos_token_id' must be a token id or a non-empty list of them, "
                             f"got {eos!r}")
        stop_ids = tuple(dict.fromkeys(ids))

    do_sample = config.get("do_sample", True)
    if not isinstance(do_sample, bool):
        raise ValueError(f"{path}: field 'do_sample' must be true or false, got {do_sample!r}")
    temperature = _number(config, "temperature", path, 1.0, lambda v: v >= 0, "a number >= 0")
    top_k = _number(config, "top_k", path, 0, lambda v: isinstance(v, int) and v >= 0, "an integer >= 0")
    top_p = _number(config, "top_p", path, 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")
    return GenerationDefaults(stop_ids=stop_ids, temperature=float(temperature) if do_sample else 0.0,
                              top_k=int(top_k), top_p=float(top_p))
