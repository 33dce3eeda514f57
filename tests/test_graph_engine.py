"""The graph engine (engine/graph_engine.py) on the CPU: graphs/runner.py in Triton's interpreter (no CUDA graphs),
on a tiny checkpoint with a bf16 body (the demo model's interpreted prefill and steps take 10-25 s each here).
Greedy output is the same with drafting on and off, alone or in a continuous batch (a queued request waiting for a
slot, prefill chunks between decode steps); stop ids, max_new_tokens and a consumer's stop are honoured; a batch
file runs through it; a follow-up turn prefills only its new tokens in the slot it kept."""
import io
import json
from types import SimpleNamespace

import pytest
import torch

from engine.batch import RequestDefaults, run_batch
import engine.graph_engine as graph_engine
from engine.graph_engine import GraphEngine
from engine.repl import run_repl
from engine.sampling import SamplingParams
from engine.tokenizer import GenerationDefaults
from tests.fixtures import make_tiny_checkpoint

GREEDY = SamplingParams(temperature=0)
PROMPTS = [[40, 41, 42, 43, 44, 45], [100, 7, 9, 200, 31], [250, 12, 12, 60, 61, 62, 63]]
PROFILE = {"name": "test", "memory_gib": 2, "bandwidth_GBps": 1, "spec_k": 0, "kv_dtype": "fp8_e4m3",
           "state_dtype": "float16", "batch_buckets": [4, 2, 1], "prefill_chunk": 8, "prefill_budget": 8}


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    """GraphEngine.load on the tiny checkpoint, with a profile of 8-token prefill chunks, one chunk a step."""
    model_dir = make_tiny_checkpoint(str(tmp_path_factory.mktemp("tiny")))
    profile = tmp_path_factory.mktemp("profiles") / "test.json"
    profile.write_text(json.dumps(PROFILE))

    def load(profile=str(profile), **kw):
        return GraphEngine.load(model_dir, device="cpu", profile=profile, body="bf16", graphs=False,
                                progress=lambda *a: None, **{"max_seqs": 3, "max_len": 48, **kw})
    return load


def test_a_plan_that_does_not_fit_fails_before_loading(load, tmp_path, monkeypatch):
    """1 GiB is all reserve: nothing fits, and nothing is prepared or allocated before the error says so."""
    small = tmp_path / "small.json"
    small.write_text(json.dumps({**PROFILE, "memory_gib": 1}))
    monkeypatch.setattr(graph_engine, "prepare", lambda *a, **k: pytest.fail("prepared before the fit check"))
    with pytest.raises(ValueError, match="more than the 1.00 GiB of test: no max_len fits at max_seqs 3"):
        load(profile=str(small))


@pytest.mark.slow
def test_buckets_draft_their_own_counts(load, alone, tmp_path):
    """A profile's spec_k_by_bucket: one row drafts 0, two rows 1, three rows spec_k = 2; outputs as alone."""
    path = tmp_path / "per-bucket.json"
    path.write_text(json.dumps({**PROFILE, "spec_k": 2, "spec_k_by_bucket": {"1": 0, "2": 1}}))
    engine = load(profile=str(path), spec_k=None)
    assert engine.scheduler.spec_k == {1: 0, 2: 1, 3: 2} and engine.spec_k == 2
    results = engine.generate_many([dict(prompt_ids=p, max_new_tokens=6, sampling=GREEDY, ignore_eos=True)
                                    for p in PROMPTS])
    assert [r.token_ids for r in results] == alone


@pytest.fixture(scope="module")
def plain(load):
    return load(spec_k=0)


@pytest.fixture(scope="module")
def alone(plain):
    """Each prompt's 6 greedy tokens, generated alone."""
    return [plain.generate(p, 6, GREEDY, ignore_eos=True).token_ids for p in PROMPTS]


def test_load_plans_buckets_and_context(plain):
    assert plain.buckets == [1, 2, 3] and plain.spec_k == 0 and plain.max_context == 48
    assert plain.cfg.vocab_size == 300 and plain.prefill_chunk == plain.prefill_budget == 8
    with pytest.raises(ValueError, match=r"prompt \(6 tokens\) \+ max_new_tokens \(43\) exceeds a sequence's context"):
        plain.submit(PROMPTS[0], 43, GREEDY)
    with pytest.raises(ValueError, match="spec_k 2: this engine drafts 0"):
        plain.generate(PROMPTS[0], 2, GREEDY, spec_k=2)
    assert not plain.has_work


@pytest.mark.slow
def test_drafting_keeps_the_greedy_output(load, alone):
    result = load(spec_k=2).generate(PROMPTS[0], 6, GREEDY, ignore_eos=True)
    assert result.token_ids == alone[0] and result.stats.drafted > 0
    assert result.stats.as_dict()["step_ms"] > 0


@pytest.mark.slow
def test_a_continuous_batch_gives_each_request_its_output_alone(plain, alone):
    """Four requests on three slots (the last waits for one): plain, a stop id, max_new_tokens, a consumer that
    stops at its second token; with logprobs on the first."""
    stop = alone[1][2]
    cut = alone[1].index(stop) + 1
    seen = []
    results = plain.generate_many([
        dict(prompt_ids=PROMPTS[0], max_new_tokens=6, sampling=GREEDY, ignore_eos=True, logprobs=2),
        dict(prompt_ids=PROMPTS[1], max_new_tokens=6, sampling=GREEDY, stop_ids={stop}),
        dict(prompt_ids=PROMPTS[2], max_new_tokens=3, sampling=GREEDY, ignore_eos=True),
        dict(prompt_ids=PROMPTS[2], max_new_tokens=6, sampling=GREEDY, ignore_eos=True,
             on_tokens=lambda ids: seen.extend(ids) or len(seen) == 2)])
    assert [(r.token_ids, r.finish_reason) for r in results] == [
        (alone[0], "length"), (alone[1][:cut], "stop"), (alone[2][:3], "length"), (alone[2][:2], "stop")]
    assert seen == alone[2][:2] and results[3].stats.generated == 2
    lp = results[0].logprobs
    assert [e.token for e in lp] == alone[0] and all(e.top[0][0] == e.token and e.logprob <= 0 for e in lp)
    assert not plain.has_work and sorted(plain.scheduler.free) == [0, 1, 2]


@pytest.mark.slow
def test_a_follow_up_turn_prefills_only_its_new_tokens(load):
    """With drafting (a round cut by max_new_tokens is cut on the runner too): the second turn finds the first
    turn's context in its slot and gives the tokens of the whole context prefilled afresh."""
    engine = load(spec_k=2)
    first = engine.submit(PROMPTS[0], 4, GREEDY, ignore_eos=True, keep_slot=True)
    out = engine.wait(first).token_ids
    slot, context = first.seq.slot, PROMPTS[0] + out + [7, 8]
    second = engine.submit(context, 3, GREEDY, ignore_eos=True, keep_slot=True, follows=first)
    assert second.seq.slot == slot and first.seq.slot is None
    follow = engine.wait(second).token_ids
    assert second.seq.cached_prompt_tokens == len(PROMPTS[0]) + len(out) - 1
    engine.release(second)
    assert sorted(engine.scheduler.free) == [0, 1, 2]
    assert follow == engine.generate(context, 3, GREEDY, ignore_eos=True).token_ids


@pytest.mark.slow
def test_a_batch_file_runs_as_a_continuous_batch(plain, alone, tmp_path):
    items = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": p, "max_tokens": 3, **({"logprobs": 1} if i == 0 else {})}}
             for i, p in enumerate(PROMPTS)]
    items.insert(1, {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
                     "body": {"prompt": PROMPTS[0], "max_tokens": 60}})
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    out = tmp_path / "out.jsonl"
    defaults = RequestDefaults(max_tokens=3, temperature=0.0, top_k=0, top_p=1.0, ignore_eos=True)
    summary = run_batch(plain, str(tmp_path / "in.jsonl"), str(out), defaults, log=io.StringIO())
    assert summary.ok == 3 and summary.bad_input == 1
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in records] == ["c0", "bad", "c1", "c2"]          # put back in input order
    assert "body.max_tokens (60) exceeds" in records[1]["error"]["message"]
    texts = [r["response"]["body"]["choices"][0]["text"] for r in records if r["error"] is None]
    assert texts == [plain.tokenizer.decode(a[:3]) for a in alone]
    assert len(records[0]["response"]["body"]["choices"][0]["logprobs"]["tokens"]) == 3


@pytest.mark.slow
def test_the_repl_continues_a_conversation_in_its_slot(load, monkeypatch):
    """The second turn's prompt continues the first turn's tokens (prompt, answer, the template's end of the turn)
    and prefills only the rest; /reset frees the slot."""
    plain = load(spec_k=0, max_len=96)
    requests = []
    real = plain.submit
    monkeypatch.setattr(plain, "submit", lambda *a, **kw: requests.append(real(*a, **kw)) or requests[-1])
    out = io.StringIO()
    assert run_repl(plain, GREEDY, max_new_tokens=1, stdin=io.StringIO("hi\nyo\n/reset\n"), stdout=out,
                    enable_thinking=False) == 0
    assert out.getvalue().count("[ Prompt: ") == 2
    first, second = (r.seq for r in requests)
    assert second.prompt_ids[:len(first.context)] == first.context
    assert second.cached_prompt_tokens == len(first.context) - 1 and second.slot is None
    assert sorted(plain.scheduler.free) == [0, 1, 2]


class CountingRunner:
    """A runner without a model, for the engine loop alone: every token is the one before + 1 (mod V), a step
    emits k + 1 of them (every draft accepted). Records cut_round calls."""

    def __init__(self, k=2, max_seqs=2, max_len=64, vocab=50):
        self.k, self.max_seqs, self.max_len, self.max_prefill = k, max_seqs, max_len, 8
        self.cfg = SimpleNamespace(vocab_size=vocab)
        self.pending, self.cuts, self.vocab = {}, [], vocab

    def set_sampling(self, slot, *args):
        pass

    def k_for(self, B):
        return self.k

    def set_seed(self, seed):
        pass

    def _logits(self, tokens):
        return torch.nn.functional.one_hot(torch.tensor(tokens), self.vocab).float() * 10

    def prefill(self, slot, token_ids, start, last=False, next_id=None):
        if not last:
            return self._logits([0])[0]
        self.pending[slot] = (token_ids[-1] + 1) % self.vocab
        return self._logits([self.pending[slot]])[0], torch.tensor([self.pending[slot]])

    def step(self, slots):
        self.out = []
        for s in slots:
            row = [(self.pending.get(s, 0) + 1 + j) % self.vocab for j in range(self.k + 1)]
            if s >= 0:
                self.pending[s] = row[-1]
            self.out.append(row)

    def fetch(self, B):
        out = [list(row) for row in self.out]         # this step's, whatever steps are launched after it
        return SimpleNamespace(wait=lambda: out)

    def step_logits(self, B):
        return self._logits(self.out).view(B, self.k + 1, -1)

    def cut_round(self, slot, kept):
        self.cuts.append((slot, kept))
        self.pending[slot] = self.out[0][kept - 1]


def counting_engine(**kw):
    runner = CountingRunner(**kw)
    defaults = GenerationDefaults(stop_ids=(49,), temperature=0.0, top_k=0, top_p=1.0)
    return GraphEngine(runner, None, defaults, "counting", PROFILE, {}), runner


def test_rounds_cut_by_a_stop_the_runner_too():
    """A kept slot's round cut by max_new_tokens is cut on the runner (cut_round); a consumer stopping before the
    stop id that ended the round keeps its tokens only; logprobs follow the tokens kept."""
    engine, runner = counting_engine()
    first = engine.submit([1, 2, 3], 3, GREEDY, keep_slot=True)
    assert engine.wait(first).token_ids == [4, 5, 6] and runner.cuts == [(first.seq.slot, 2)]
    seen = []
    result = engine.generate([10, 11], 9, GREEDY, stop_ids={15}, logprobs=0,
                             on_tokens=lambda ids: seen.extend(ids) or ids == [13])
    assert result.token_ids == seen == [12, 13] and result.finish_reason == "stop"
    assert [e.token for e in result.logprobs] == [12, 13] and result.stats.generated == 2
    assert engine.generate([40], 20, GREEDY).token_ids == list(range(41, 50))      # the default stop id, 49


def test_steps_run_ahead_and_give_the_same_tokens():
    """A steady batch launches each step before reading the one before (schedule_ahead): the tokens are those of
    steps read one at a time, a sequence finishing ahead of the others loses nothing, the engine ends idle."""
    engine, runner = counting_engine(max_seqs=2)
    launched = []
    step = runner.step
    runner.step = lambda slots: launched.append(list(slots)) or step(slots)
    results = engine.generate_many([dict(prompt_ids=[1], max_new_tokens=7, sampling=GREEDY, ignore_eos=True),
                                    dict(prompt_ids=[20], max_new_tokens=16, sampling=GREEDY, ignore_eos=True)])
    assert [r.token_ids for r in results] == [list(range(2, 9)), list(range(21, 37))]
    assert len(launched) > results[1].stats.steps          # one round ran ahead, past the first one's end
    assert not engine.has_work and engine._ahead is None
