"""The chat REPL (engine/repl.py) driven by a scripted stdin on a tiny real checkpoint: multi-turn history, /reset,
/exit, end of input, Ctrl-C during an answer, per-turn stats and the thinking display."""
import io
import re

import pytest

from engine.engine import Engine
from engine.repl import EchoStream, run_repl
from engine.sampling import SamplingParams
from tests.fixtures import make_tiny_checkpoint

GREEDY = SamplingParams(temperature=0)
TURN_STATS = re.compile(r"\[ Prompt: [\d.]+ t/s \| Generation: [\d.]+ t/s \| MTP accept: (\d+)/(\d+) \(\d+%\) \]")


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    return Engine.load(make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny"))))


@pytest.fixture
def prompts(tiny_engine, monkeypatch):
    """The decoded prompt of every generate call (special tokens kept), and the generated ids of each."""
    seen = []
    real = tiny_engine.generate

    def spy(prompt_ids, n, sampling, **kw):
        result = real(prompt_ids, n, sampling, **kw)
        seen.append((tiny_engine.tokenizer.decode(prompt_ids, skip_special_tokens=False), result.token_ids))
        return result
    monkeypatch.setattr(tiny_engine, "generate", spy)
    return seen


def chat(engine, script, **kw):
    out = io.StringIO()
    status = run_repl(engine, GREEDY, max_new_tokens=kw.pop("max_new_tokens", 6), stdin=io.StringIO(script),
                      stdout=out, **kw)
    return status, out.getvalue()


def test_turns_share_history_and_reset_forgets_it(tiny_engine, prompts):
    status, out = chat(tiny_engine, "first question\nsecond question\n/reset\nthird question\n/exit\nnever\n",
                       enable_thinking=False, system="Be brief.")
    assert status == 0 and len(prompts) == 3
    (p1, ids1), (p2, _), (p3, _) = prompts
    answer1 = tiny_engine.tokenizer.decode(ids1)
    assert p1.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "first question" in p1
    assert "first question" in p2 and answer1 in p2 and p2.index(answer1) < p2.index("second question")
    assert "first question" not in p3 and "third question" in p3 and "Be brief." in p3
    assert "[ conversation cleared ]" in out and "never" not in "".join(p for p, _ in prompts)
    stats = TURN_STATS.findall(out)
    assert len(stats) == 3 and all(0 <= int(a) <= int(d) and int(d) > 0 for a, d in stats)


def test_answers_stream_to_the_output(tiny_engine, prompts):
    _, out = chat(tiny_engine, "hello\n", enable_thinking=False, max_new_tokens=10)
    answer = tiny_engine.tokenizer.decode(prompts[0][1])
    assert answer.strip() and answer in out


def test_end_of_input_exits_cleanly_and_commands_are_explained(tiny_engine, prompts):
    status, out = chat(tiny_engine, "\n   \n/help\n/clear\n")
    assert status == 0 and not prompts
    assert "unknown command /help" in out and "/exit" in out and "[ conversation cleared ]" in out


def test_ctrl_c_stops_the_answer_not_the_session(tiny_engine, prompts, monkeypatch):
    spy = tiny_engine.generate
    calls = []

    def interrupt_first_answer(prompt_ids, n, sampling, on_tokens, **kw):
        calls.append(1)
        if len(calls) > 1:
            return spy(prompt_ids, n, sampling, on_tokens=on_tokens, **kw)
        emitted = []

        def press_ctrl_c_after_three(ids):
            emitted.extend(ids)
            on_tokens(ids)
            if len(emitted) >= 3:
                raise KeyboardInterrupt
        return spy(prompt_ids, 20, sampling, on_tokens=press_ctrl_c_after_three, ignore_eos=True)
    monkeypatch.setattr(tiny_engine, "generate", interrupt_first_answer)

    status, out = chat(tiny_engine, "tell me a story\nand then?\n", enable_thinking=False)
    assert status == 0 and "[ interrupted ]" in out and len(TURN_STATS.findall(out)) == 1
    assert len(prompts) == 1                              # the interrupted call never returned
    second_prompt = prompts[0][0]
    assert "tell me a story" in second_prompt and "and then?" in second_prompt
    assistant_turn = second_prompt.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert assistant_turn and assistant_turn in out     # the partial answer went back into the history


def test_thinking_is_shown_between_markers(tiny_engine):
    tok = tiny_engine.tokenizer
    ids = tok.encode("hmm, let me think\n") + [tok.token_to_id("</think>")] + tok.encode("\n\nThe answer.")
    out = io.StringIO()
    stream = EchoStream(tok, out, thinking=True)
    for i in range(0, len(ids), 3):
        stream(ids[i:i + 3])
    assert stream.finish() == ("hmm, let me think", "The answer.")
    stream.end_line()
    assert out.getvalue() == "[Start thinking]\nhmm, let me think\n[End thinking]\nThe answer.\n"


def test_thinking_turn_reaches_the_history_without_its_reasoning(tiny_engine, prompts):
    chat(tiny_engine, "q1\nq2\n", enable_thinking=True)
    assert prompts[0][0].endswith("<|im_start|>assistant\n<think>\n")
    assert "[Start thinking]" not in prompts[1][0] and "q1" in prompts[1][0]


def test_a_line_that_is_not_utf8_is_refused_alone(tiny_engine, prompts):
    """Bytes that are not UTF-8 (read with surrogateescape: lone surrogates) get one error line; the session goes on
    (they crashed it, history and all)."""
    status, out = chat(tiny_engine, "caf\udce9\nhello\n", enable_thinking=False)
    assert status == 0 and "error: that line is not valid UTF-8" in out and len(prompts) == 1
    assert "hello" in prompts[0][0]
