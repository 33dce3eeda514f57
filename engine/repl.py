"""`run.py --interactive`: a multi-turn chat on the terminal, plus the streaming text display it shares with the
one-shot CLI. Input and output streams are parameters so tests can drive a session with a script."""
import sys

from engine.text_stream import TextStream
from engine.tokenizer import is_utf8

HELP = "/reset or /clear forgets the conversation, /exit quits; Ctrl-C stops an answer, Ctrl-D quits"


class EchoStream(TextStream):
    """A TextStream that writes the text to `out` as it is generated, the reasoning block between
    `[Start thinking]` and `[End thinking]` (the think tags are special tokens, invisible in decoded text)."""

    def __init__(self, tokenizer, out, *, thinking: bool):
        think_end_id = tokenizer.token_to_id("</think>") if thinking else None
        super().__init__(tokenizer, think_end_id=think_end_id)
        self.out = out
        self.at_line_start = True
        self.answer_pending = False     # between `</think>` and the answer's first visible character
        if think_end_id is not None:
            self._write("[Start thinking]\n")

    def _write(self, text: str):
        if text:
            self.out.write(text)
            self.out.flush()
            self.at_line_start = text.endswith("\n")

    def _emit(self, text: str):
        if self.answer_pending:         # the answer starts after "\n\n"; [End thinking] already ended the line
            text = text.lstrip("\n")
            self.answer_pending = not text
        self._write(text)

    def _reasoning_ended(self):
        self._write(("" if self.at_line_start else "\n") + "[End thinking]\n")
        self.answer_pending = True

    def end_line(self):
        self._write("" if self.at_line_start else "\n")


def chat_prompt_ids(tokenizer, messages: list[dict], enable_thinking: bool) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                          enable_thinking=enable_thinking))


def mtp_summary(stats) -> str:
    """`a/b (p%)` accepted over drafted tokens."""
    return f"{stats.accepted}/{stats.drafted} ({100 * stats.accepted / max(stats.drafted, 1):.0f}%)"


def turn_summary(stats) -> str:
    parts = [f"Prompt: {stats.prompt_tokens_per_second:.1f} t/s", f"Generation: {stats.tokens_per_second:.1f} t/s"]
    if stats.drafted:
        parts.append(f"MTP accept: {mtp_summary(stats)}")
    return "[ " + " | ".join(parts) + " ]"


class Turns:
    """A conversation's turns on an engine. The eager engine runs each turn on the chat template's rendering of the
    whole conversation. On the graph engine (a submit API) each turn keeps its slot and caches (keep_slot) and the
    next one follows it, its prompt continuing the last turn's tokens: the answer as generated (its reasoning
    block too, which a re-rendered history would drop, changing tokens the caches hold), the template's end of
    that turn, then the new turn as the template renders it; so only the new turn prefills. Where the template
    does not render turns that way, the whole conversation is rendered and prefills afresh in the kept slot.
    reset() frees the slot."""
    MARK = "\ue000"                     # stands in for an answer when finding how the template closes a turn

    def __init__(self, engine):
        self.engine = engine
        self.last = None                # the graph engine's request of the last turn, holding its slot

    def prompt_ids(self, messages: list[dict], enable_thinking: bool) -> list[int]:
        tokenizer = self.engine.tokenizer
        if self.last is None:
            return chat_prompt_ids(tokenizer, messages, enable_thinking)
        render = lambda turns, generation: tokenizer.apply_chat_template(   # noqa: E731
            turns, add_generation_prompt=generation, enable_thinking=enable_thinking)
        new_turn = render(messages[-1:], True)
        closed = render([messages[-1], {"role": "assistant", "content": self.MARK}], False)
        closing = closed[closed.index(self.MARK) + len(self.MARK):]          # e.g. "<|im_end|>\n"
        whole = render(messages, True)
        if not whole.endswith(closing + new_turn):
            return tokenizer.encode(whole)
        seq = self.last.seq
        end = tokenizer.decode(seq.output_ids[-1:], skip_special_tokens=False)
        if seq.finish_reason == "stop" and end and closing.startswith(end):     # the answer's stop token
            closing = closing[len(end):]
        return seq.prompt_ids + seq.output_ids + tokenizer.encode(closing + new_turn)

    def generate(self, prompt_ids, max_new_tokens, sampling, **kw):
        engine = self.engine
        if not hasattr(engine, "submit"):
            return engine.generate(prompt_ids, max_new_tokens, sampling, **kw)
        request = engine.submit(prompt_ids, max_new_tokens, sampling, keep_slot=True, follows=self.last, **kw)
        self.last = request
        return engine.wait(request)

    def reset(self):
        if self.last is not None:
            self.engine.release(self.last)
            self.last = None

    def interrupted(self):
        """Ctrl-C mid-turn, at any point of a step: the graph engine drops everything in flight."""
        if self.last is not None:
            self.engine.abort()
            self.last = None


def _read_line(stdin, stdout) -> str | None:
    """One input line without its newline, None at end of input. A real terminal gets line editing (input())."""
    if stdin is sys.stdin and stdin.isatty():
        try:
            return input("> ")
        except EOFError:
            return None
    stdout.write("> ")
    stdout.flush()
    line = stdin.readline()
    return line.rstrip("\n") if line else None


def run_repl(engine, sampling, *, max_new_tokens: int, enable_thinking: bool = True, system: str | None = None,
             ignore_eos: bool = False, stdin=None, stdout=None) -> int:
    """Chat until /exit or end of input; returns the exit status. The assistant's answers (an interrupted one
    too, as far as it got) go back into the history, so each turn sees the whole conversation."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    if stdin is sys.stdin and hasattr(stdin, "reconfigure"):
        stdin.reconfigure(errors="surrogateescape")     # bytes that are not UTF-8 reach the check below, not a crash
    stdout.write(f"Chatting with {engine.model_dir}. {HELP}\n")
    history: list[dict] = []
    turns = Turns(engine)
    while True:
        try:
            line = _read_line(stdin, stdout)
        except KeyboardInterrupt:       # Ctrl-C at the prompt drops the line being typed, not the session
            stdout.write("\n")
            continue
        if line is None:
            stdout.write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if not is_utf8(text):
            stdout.write("error: that line is not valid UTF-8\n")
            continue
        if text.startswith("/"):
            command = text.split()[0]
            if command == "/exit":
                return 0
            if command in ("/reset", "/clear"):
                history.clear()
                turns.reset()
                stdout.write("[ conversation cleared ]\n")
            else:
                stdout.write(f"unknown command {command}: {HELP}\n")
            continue
        system_turn = [{"role": "system", "content": system}] if system else []
        user_turn = {"role": "user", "content": text}
        try:
            prompt_ids = turns.prompt_ids(system_turn + history + [user_turn], enable_thinking)
        except ValueError as e:
            stdout.write(f"error: {e}\n")
            continue
        stream = EchoStream(engine.tokenizer, stdout, thinking=enable_thinking)
        try:
            result = turns.generate(prompt_ids, max_new_tokens, sampling, ignore_eos=ignore_eos, on_tokens=stream)
        except KeyboardInterrupt:
            turns.interrupted()
            result = None
        except ValueError as e:         # e.g. the conversation no longer fits the context: /reset helps
            stdout.write(f"error: {e}\n")
            continue
        reasoning, answer = stream.finish()
        stream.end_line()
        assistant_turn = {"role": "assistant", "content": answer}
        if reasoning is not None:
            assistant_turn["reasoning_content"] = reasoning
        history += [user_turn, assistant_turn]
        stdout.write("[ interrupted ]\n" if result is None else turn_summary(result.stats) + "\n")
        stdout.flush()
