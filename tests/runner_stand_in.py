"""Stand-ins for the ModelRunner methods the graph engine needs that graphs/runner.py may not have yet (fetch,
cut_round, step_logits): a subclass adding only the missing ones, for CPU tests. Their semantics are the runner's
contract: fetch(B).wait() -> each row's emitted ids; cut_round(slot, kept) keeps the first `kept` tokens the last
step emitted for the slot (the last kept one pending); step_logits(B) -> [B, k+1, V]."""
from graphs.runner import ModelRunner


class _Fetched:
    def __init__(self, ids, counts):
        self.ids, self.counts = ids.tolist(), counts.tolist()

    def wait(self):
        return [row[:n] for row, n in zip(self.ids, self.counts)]


class StandInRunner(ModelRunner):
    pass


if not hasattr(ModelRunner, "fetch"):
    def step(self, slots):
        self._last = ModelRunner.step(self, slots)
        return self._last

    def fetch(self, B):
        ids, counts = self._last
        return _Fetched(ids[:B], counts[:B])

    StandInRunner.step, StandInRunner.fetch = step, fetch

if not hasattr(ModelRunner, "cut_round"):
    def cut_round(self, slot, kept):
        b = self.buf
        count = int(b.emitted[slot])
        assert 1 <= kept <= count
        b.seq_len[slot] -= count - kept
        b.num_acc[slot] = kept
        b.emitted[slot] = kept

    StandInRunner.cut_round = cut_round

if not hasattr(ModelRunner, "step_logits"):
    def step_logits(self, B):
        return self.buf.logits[:B * (self.k + 1)].view(B, self.k + 1, -1)

    StandInRunner.step_logits = step_logits
