"""Generated text as it arrives: an `on_tokens` callback for Engine.generate that detokenises incrementally,
splits the reasoning block off at `</think>` and ends generation at the first stop string. The batch runner uses
it as is; the REPL and the one-shot CLI subclass it to show the text."""
import time

from engine.tokenizer import StreamDecoder


class TextStream:
    """`on_tokens` callback that decodes the generated ids as they arrive, notes where the reasoning block ends
    (the `</think>` id) and ends generation at the first stop string. Subclasses show the text (`_emit`)."""

    def __init__(self, tokenizer, *, stops=(), think_end_id: int | None = None):
        self.decoder = StreamDecoder(tokenizer)
        self.stops = tuple(stops)
        self.think_end_id = think_end_id
        self.reasoning_end = None      # offset in the text where the answer starts, once `</think>` was emitted
        self.cut = None                # offset of the first stop string
        self.first_token_at = None     # perf_counter() of the first emitted token (time to first token)

    def __call__(self, ids: list[int]) -> bool | None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        searched = max(0, len(self.decoder.text) - max(map(len, self.stops), default=0) + 1)
        if self.reasoning_end is None and self.think_end_id in ids:
            end = ids.index(self.think_end_id) + 1
            self._emit(self.decoder.push(ids[:end]))
            self.reasoning_end = len(self.decoder.text)
            self._reasoning_ended()
            ids = ids[end:]
        self._emit(self.decoder.push(ids))
        hits = [i for i in (self.decoder.text.find(s, searched) for s in self.stops) if i >= 0]
        if hits:
            self.cut = min(hits)
            return True
        return None

    def finish(self) -> tuple[str | None, str]:
        """(reasoning, answer): reasoning is None when no `</think>` was emitted; a stop string is cut off."""
        self._emit(self.decoder.flush())
        text = self.decoder.text[:self.cut]
        if self.reasoning_end is None or self.reasoning_end > len(text):      # no `</think>` before the end
            return None, text
        return text[:self.reasoning_end].strip("\n"), text[self.reasoning_end:].lstrip("\n")

    def _emit(self, text: str):
        pass

    def _reasoning_ended(self):
        pass
