"""Tokenizer, chat template, streaming detokenisation and generation defaults (engine/tokenizer.py).

The real Qwen3.5 vocabulary (built offline by tests/qwen_vocab.py) checks ids against MODEL.md §6 / ASSETS.md
§1.1; template plumbing and error paths use a tiny word-level tokenizer, which loads instantly."""
import json
import random

import pytest
import tokenizers
from tokenizers.models import WordLevel

from engine.tokenizer import GenerationDefaults, StreamDecoder, Tokenizer, load_generation_defaults
from qwen_vocab import install_qwen35_tokenizer

IM_START, IM_END, ENDOFTEXT, THINK, END_THINK = 248045, 248046, 248044, 248068, 248069

TEST_VECTORS = {   # MODEL.md §6, ASSETS.md §1.1
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n":
        [248045, 846, 198, 5834, 248046, 198, 248045, 74455, 198, 248068, 198],
    "Hello! 毕老师！1 + 1 = 2": [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17],
    "<|im_start|>user\nhi<|im_end|>\n": [248045, 846, 198, 5834, 248046, 198],
    "<|im_start|>assistant\n<think>\n": [248045, 74455, 198, 248068, 198],
    "<|im_start|>assistant\n<think>\n\n</think>\n\n": [248045, 74455, 198, 248068, 271, 248069, 271],
    "<|im_start|>system\nYou are helpful.<|im_end|>\n": [248045, 8678, 198, 2523, 513, 10631, 13, 248046, 198],
    "\n\n": [271],
}

# multi-byte text whose rarer characters are split across byte-level tokens
MULTIBYTE = "naïve café — 毕老师说：“你好，世界”。𠀋𪚲 emoji 🦜🧬👩‍👩‍👧 done ✓\n\tcode: x = 1_000 ≥ y ∑ z"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("qwen35")
    install_qwen35_tokenizer(model_dir)
    return Tokenizer.from_dir(str(model_dir))


def tiny_dir(path, config=None, template_file=None, specials=("<|endoftext|>", "<|im_end|>")):
    """A checkpoint directory with a word-level tokenizer.json over a few words plus `specials`."""
    path.mkdir(parents=True, exist_ok=True)
    tok = tokenizers.Tokenizer(WordLevel({w: i for i, w in enumerate(("[UNK]", "hi", "there"))}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(specials))
    tok.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    if template_file is not None:
        (path / "chat_template.jinja").write_text(template_file)
    return str(path)


USER_HI = [{"role": "user", "content": "hi"}]


# ---- vocabulary ----------------------------------------------------------------------------------------------

def test_real_vocabulary_matches_reference_vectors(qwen):
    assert qwen.vocab_size == 248077
    assert qwen.eos_token_id == IM_END
    assert [qwen.token_to_id(t) for t in ("<|endoftext|>", "<think>", "</think>", "<|audio_pad|>")] == \
        [ENDOFTEXT, THINK, END_THINK, 248076]
    assert qwen.token_to_id("<not a token>") is None
    for text, ids in TEST_VECTORS.items():
        assert qwen.encode(text) == ids, text


def test_encode_adds_no_bos_and_decode_round_trips(qwen):
    assert qwen.encode("") == []
    assert qwen.encode("hi") == [5834]
    chat = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + MULTIBYTE + "<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nplan\n</think>\n\nAnswer: 42 🦜<|im_end|>\n")
    ids = qwen.encode(chat)
    assert ids.count(IM_START) == 3 and ids.count(IM_END) == 3
    assert qwen.decode(ids, skip_special_tokens=False) == chat
    plain = chat
    for special in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        plain = plain.replace(special, "")
    assert qwen.decode(ids) == plain


# ---- built-in ChatML template -----------------------------------------------------------------------------

def test_builtin_template_generation_prompts_and_token_counts(qwen):
    on = qwen.apply_chat_template(USER_HI)
    off = qwen.apply_chat_template(USER_HI, enable_thinking=False)
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert off == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert qwen.encode(on) == TEST_VECTORS[on]
    assert qwen.encode(off)[-4:] == [THINK, 271, END_THINK, 271]
    # MODEL.md §7 "thinking-off wraps one user message in 12 tokens": 12 template tokens around the content
    # (im_start user \n | content | im_end \n im_start assistant \n <think> \n\n </think> \n\n); thinking-on: 10
    content = "Explain 毕 in one line."
    n = len(qwen.encode(content))
    msgs = [{"role": "user", "content": content}]
    assert len(qwen.encode(qwen.apply_chat_template(msgs, enable_thinking=False))) == n + 12
    assert len(qwen.encode(qwen.apply_chat_template(msgs))) == n + 10
    assert qwen.apply_chat_template(USER_HI, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_builtin_template_conversation(qwen):
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "old thoughts"},
        {"role": "user", "content": [{"type": "text", "text": "q2 "}, {"type": "text", "text": "part"}]},
        {"role": "assistant", "content": "\na2", "reasoning_content": "\nnew thoughts\n"},
    ]
    assert qwen.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nq1<|im_end|>\n"
        "<|im_start|>assistant\na1<|im_end|>\n"                       # before the last user turn: reasoning dropped
        "<|im_start|>user\nq2 part<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\na2<|im_end|>\n")
    raw_reply = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "mull\n</think>\n\nans"}]
    assert qwen.apply_chat_template(raw_reply, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nmull\n</think>\n\nans<|im_end|>\n")


@pytest.mark.parametrize("messages, kwargs, message", [
    ([{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}], {}, "system message must come first"),
    ([{"role": "robot", "content": "hi"}], {}, "no role robot"),
    ([{"role": "user", "content": [{"type": "image", "image": "x.png"}]}], {}, "text parts only"),
    (USER_HI, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "cannot render tools"),
])
def test_builtin_template_refuses_what_it_cannot_render(qwen, messages, kwargs, message):
    with pytest.raises(ValueError, match=message):
        qwen.apply_chat_template(messages, **kwargs)


# ---- template sources and sandbox ------------------------------------------------------------------------

def test_template_from_tokenizer_config(tmp_path):
    template = "{{ bos_token is defined }}|{{ eos_token }}|{{ messages[0].content }}|{{ enable_thinking }}|{{ extra }}"
    tok = Tokenizer.from_dir(tiny_dir(tmp_path, {"chat_template": template, "eos_token": {"content": "<|im_end|>"},
                                                 "bos_token": None}))
    assert tok.eos_token_id == tok.token_to_id("<|im_end|>")
    assert tok.apply_chat_template(USER_HI, enable_thinking=False, extra=7) == "False|<|im_end|>|hi|False|7"


def test_template_list_takes_default_and_jinja_file_wins(tmp_path):
    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT {{ tools }}"}]
    tok = Tokenizer.from_dir(tiny_dir(tmp_path / "a", {"chat_template": named}))
    assert tok.apply_chat_template(USER_HI) == "DEFAULT None"
    tok = Tokenizer.from_dir(tiny_dir(tmp_path / "b", {"chat_template": "CONFIG"}, template_file="FILE {{ tools | length }}"))
    assert tok.apply_chat_template(USER_HI, tools=[{"name": "f"}]) == "FILE 1"
    with pytest.raises(ValueError, match="default"):
        Tokenizer.from_dir(tiny_dir(tmp_path / "c", {"chat_template": named[:1]}))


def test_template_helpers_match_transformers(tmp_path):
    template = ("{%- for m in messages -%}{%- if loop.index0 > 0 -%}{%- break -%}{%- endif -%}"
                "{{ m | tojson }}{%- endfor -%}"
                "{%- if not messages -%}{{ raise_exception('need messages') }}{%- endif -%}")
    tok = Tokenizer.from_dir(tiny_dir(tmp_path, template_file=template))
    # tojson keeps <, > and non-ASCII as is (jinja's own filter would HTML-escape them); loopcontrols work
    assert tok.apply_chat_template([{"role": "user", "content": "<b>毕</b>"}, {"role": "x"}]) == \
        '{"role": "user", "content": "<b>毕</b>"}'
    with pytest.raises(ValueError, match="need messages"):
        tok.apply_chat_template([])


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ messages.append({'role': 'user'}) }}",       # immutable sandbox: no mutating the caller's data
    "{{ raise_exception.__globals__ }}",
    "{{ ''.__class__ }}",                              # even a blocked read that would print "" raises
])
def test_template_sandbox_blocks_escapes(tmp_path, template):
    tok = Tokenizer.from_dir(tiny_dir(tmp_path, template_file=template))
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="chat template"):
        tok.apply_chat_template(messages)
    assert messages == [{"role": "user", "content": "hi"}]


# ---- errors in the directory ----------------------------------------------------------------------------

def test_directory_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_dir(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_dir(str(tmp_path))
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        tiny_dir(tmp_path / "a")
        (tmp_path / "a" / "tokenizer_config.json").write_text("[1, 2")
        Tokenizer.from_dir(str(tmp_path / "a"))
    with pytest.raises(ValueError, match="tokenizer_config.json.*eos_token"):
        Tokenizer.from_dir(tiny_dir(tmp_path / "b", {"eos_token": "<|missing|>"}))
    with pytest.raises(ValueError, match="chat_template.jinja"):
        Tokenizer.from_dir(tiny_dir(tmp_path / "c", template_file="{% if %}"))


# ---- streaming detokenisation --------------------------------------------------------------------------------

def test_stream_decoder_matches_decode_on_multibyte_text(qwen):
    ids = qwen.encode(MULTIBYTE)
    lone = [i for i in ids if qwen.decode([i]).endswith("\ufffd")]
    assert lone, "the text should contain characters split across tokens"
    rng = random.Random(0)
    for chunking in ("single", "random"):
        stream, pieces, pos = StreamDecoder(qwen), [], 0
        while pos < len(ids):
            step = 1 if chunking == "single" else rng.randint(1, 4)
            piece = stream.push(ids[pos:pos + step])
            assert "\ufffd" not in piece
            pieces.append(piece)
            pos += step
        pieces.append(stream.flush())
        assert "".join(pieces) == stream.text == qwen.decode(ids) == MULTIBYTE
        if chunking == "single":
            assert "" in pieces[:-1]               # some token completed no character and was held back


def test_token_bytes_rebuild_text_split_inside_characters(qwen):
    """The logprobs' `bytes`: byte-level tokens that hold part of a UTF-8 character give their raw bytes (decoded
    alone they give U+FFFD); special tokens give their text."""
    text = MULTIBYTE + "<|im_end|>"
    ids = qwen.encode(text)
    assert any(qwen.decode([i]).endswith("\ufffd") for i in ids)
    assert b"".join(qwen.token_bytes(i) for i in ids).decode("utf-8") == text
    assert qwen.token_bytes(IM_END) == b"<|im_end|>" and qwen.token_bytes(271) == b"\n\n"


def test_stream_decoder_special_tokens_and_unfinished_tail(qwen):
    chat = "<|im_start|>assistant\n<think>\n毕🦜\n</think>\n\nok<|im_end|>"
    ids = qwen.encode(chat)
    for skip in (True, False):
        stream = StreamDecoder(qwen, skip_special_tokens=skip)
        out = "".join(stream.push([i]) for i in ids) + stream.flush()
        assert out == stream.text == qwen.decode(ids, skip_special_tokens=skip)
    parrot = qwen.encode("🦜")
    assert len(parrot) > 1, "the emoji should span several byte-level tokens"
    stream = StreamDecoder(qwen)
    assert stream.push(qwen.encode("ok") + parrot[:1]) == "ok"
    assert stream.flush() == "\ufffd"                  # an unfinished character is only let out at the end


# ---- generation defaults -------------------------------------------------------------------------------------

QWEN38_GENERATION_CONFIG = {"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95,
                            "eos_token_id": [248046, 248044], "pad_token_id": 248044, "bos_token_id": 248044}


def write_generation_config(path, config):
    path.mkdir(parents=True, exist_ok=True)
    (path / "generation_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


def test_generation_defaults_from_config(qwen, tmp_path):
    got = load_generation_defaults(write_generation_config(tmp_path / "a", QWEN38_GENERATION_CONFIG), qwen)
    assert got == GenerationDefaults(stop_ids=(248046, 248044), temperature=1.0, top_k=20, top_p=0.95)
    greedy = {**QWEN38_GENERATION_CONFIG, "do_sample": False, "eos_token_id": 248046}
    got = load_generation_defaults(write_generation_config(tmp_path / "b", greedy), qwen)
    assert got == GenerationDefaults(stop_ids=(248046,), temperature=0.0, top_k=20, top_p=0.95)


def test_generation_defaults_fallbacks(qwen, tmp_path):
    assert load_generation_defaults(str(tmp_path), qwen) == \
        GenerationDefaults(stop_ids=(IM_END, ENDOFTEXT), temperature=1.0, top_k=0, top_p=1.0)
    partial = write_generation_config(tmp_path / "p", {"temperature": 0.6, "top_k": None})
    assert load_generation_defaults(partial, qwen) == \
        GenerationDefaults(stop_ids=(IM_END, ENDOFTEXT), temperature=0.6, top_k=0, top_p=1.0)
    # a tokenizer without an eos token or <|im_end|> still stops on <|endoftext|>
    bare = Tokenizer.from_dir(tiny_dir(tmp_path / "bare", specials=("<|endoftext|>",)))
    assert load_generation_defaults(str(tmp_path / "bare"), bare).stop_ids == (bare.token_to_id("<|endoftext|>"),)


@pytest.mark.parametrize("config, field", [
    ("{oops", "cannot read JSON"),
    ([248046], "JSON object"),
    ({"eos_token_id": "<|im_end|>"}, "eos_token_id"),
    ({"eos_token_id": []}, "eos_token_id"),
    ({"eos_token_id": [248046, True]}, "eos_token_id"),
    ({"do_sample": "yes"}, "do_sample"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_k": 20.5}, "top_k"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": "0.9"}, "top_p"),
])
def test_generation_defaults_malformed(qwen, tmp_path, config, field):
    model_dir = write_generation_config(tmp_path, config)
    with pytest.raises(ValueError, match=f"generation_config.json.*{field}") as err:
        load_generation_defaults(model_dir, qwen)
    assert "generation_config.json" in str(err.value)
