"""Generation: greedy output equals transformers' with and without MTP drafting, drafting never changes the
output (also when drafts are right for a random number of positions, so every rollback depth is exercised), and
speculative sampling emits tokens from exactly the target distribution (statistical tests)."""
import json
import math
from types import SimpleNamespace

import pytest
import torch

import engine.sampling as sampling
from engine.generate import Generator
from engine.logprobs import MIN_LOGPROB, token_logprobs
from engine.sampling import SamplingParams, accept_drafts, probabilities
from layers.checkpoint import load_model
from tests.fixtures import CONFIGS, make_tiny_checkpoint, reference_model

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module", params=list(CONFIGS))
def setup(request, tmp_path_factory):
    model_dir = make_tiny_checkpoint(str(tmp_path_factory.mktemp(request.param)), seed=7, **CONFIGS[request.param])
    ref = reference_model(model_dir)
    ref.generation_config.eos_token_id = None          # generate the full length, like --ignore-eos
    return ref, Generator(load_model(model_dir, dtype=torch.float32))


@pytest.mark.parametrize("k", [0, 1, 3, 4])
@pytest.mark.slow
def test_greedy_equals_transformers(setup, k):
    ref, gen = setup
    prompt = torch.randint(0, 300, (13,), generator=torch.Generator().manual_seed(k)).tolist()
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, 13:].tolist()
    got = gen.generate(prompt, 40, GREEDY, spec_k=k)
    assert got.token_ids == want and got.finish_reason == "length"
    assert got.stats.drafted == k * got.stats.steps


def oracle_drafts(monkeypatch, prompt, want, right=0.75):
    """Random weights accept almost nothing, so the drafter is replaced by an oracle that proposes the true greedy
    continuation `want` but corrupts each position with probability 1 − right."""
    rng = torch.Generator().manual_seed(0)
    real_draft = Generator._draft

    def oracle(self, y, cache, k, params, g):
        real_draft(self, y, cache, k, params, g)                       # keep the MTP's own cache traffic
        done = cache.length - len(prompt) + 1                          # tokens emitted so far
        truth = (want + [0] * (k + 1))[done:done + k]
        drafts = [t if torch.rand(1, generator=rng).item() < right else (t + 1) % 300 for t in truth]
        return torch.tensor([drafts]), None

    monkeypatch.setattr(Generator, "_draft", oracle)


@pytest.mark.slow
def test_greedy_unchanged_by_partly_right_drafts(setup, monkeypatch):
    """With oracle drafts every acceptance count 0…k occurs and the output stays the same, which it only does if
    KV, conv and recurrent state roll back exactly."""
    _, gen = setup
    prompt = list(range(5, 16))
    want = gen.generate(prompt, 48, GREEDY, spec_k=0).token_ids
    seen = set()
    oracle_drafts(monkeypatch, prompt, want)
    for k in (2, 4, 6):
        out = gen.generate(prompt, 48, GREEDY, spec_k=k)
        assert out.token_ids == want
        seen.update(range(out.stats.accepted_per_position.count(0), k + 1))
        assert out.stats.accepted > out.stats.steps                      # drafting really did the work
    assert len(seen) > 3


@pytest.mark.slow
def test_where_a_caller_stops_and_the_counts_do_not_depend_on_spec_k(setup, monkeypatch):
    """Several tokens a step (right drafts): a callback that stops after 5 tokens gets 5 at every spec_k (the step's
    whole chunk was output before), and `accepted` counts only drafts that were output (not those past a stop id or
    the length limit): every step outputs its accepted drafts and then its own token, but the last may be cut
    short."""
    _, gen = setup
    prompt = list(range(5, 16))
    want = gen.generate(prompt, 30, GREEDY, spec_k=0).token_ids
    oracle_drafts(monkeypatch, prompt, want, right=1.0)
    for k in (0, 2, 4):
        seen = []
        out = gen.generate(prompt, 30, GREEDY, spec_k=k, on_tokens=lambda new: seen.extend(new) or len(seen) == 5)
        assert out.token_ids == seen == want[:5] and out.finish_reason == "stop"
        for stop_ids, n in ((set(), 30), ({want[7]}, want.index(want[7]) + 1)):
            out = gen.generate(prompt, 30, GREEDY, spec_k=k, stop_ids=stop_ids)
            assert out.token_ids == want[:n] and n - 1 - out.stats.accepted in (out.stats.steps - 1, out.stats.steps)
            assert out.stats.accepted == sum(out.stats.accepted_per_position)


@pytest.mark.slow
def test_logprobs_are_the_models_with_and_without_drafting(setup, monkeypatch):
    """Each generated token's log-probability and top alternatives are log_softmax of the model's raw logits at its
    position (transformers' own logits), the same whether the token came from decoding or from a verify step that
    accepted drafts (oracle drafts: every acceptance depth), and a token cut by a stop id gets no entry."""
    ref, gen = setup
    prompt = list(range(5, 16))
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, output_logits=True,
                           return_dict_in_generate=True)
    want_lp = torch.cat(out.logits).float().log_softmax(-1)                       # [24, V]
    want = out.sequences[0, len(prompt):].tolist()
    oracle_drafts(monkeypatch, prompt, want)
    for k in (0, 3):
        got = gen.generate(prompt, 24, GREEDY, spec_k=k, logprobs=3)
        assert got.token_ids == want and [e.token for e in got.logprobs] == want
        for e, row in zip(got.logprobs, want_lp):
            top = row.topk(3)
            assert e.logprob == pytest.approx(row[e.token].item(), abs=1e-4)
            assert [t for t, _ in e.top] == top.indices.tolist() and e.top[0] == (e.token, e.logprob)
            assert [v for _, v in e.top] == pytest.approx(top.values.tolist(), abs=1e-4)
    stopped = gen.generate(prompt, 24, GREEDY, spec_k=3, logprobs=0, stop_ids={want[5]})
    assert len(stopped.logprobs) == len(stopped.token_ids) == want.index(want[5]) + 1
    assert all(e.top == () for e in stopped.logprobs)
    assert gen.generate(prompt, 4, GREEDY).logprobs is None
    with pytest.raises(ValueError, match="logprobs must be in"):
        gen.generate(prompt, 4, GREEDY, logprobs=21)


def test_greedy_draft_reads_nan_as_minus_inf(setup, monkeypatch):
    """A NaN draft logit is not the greedy draft (torch's argmax would pick it, for verify to reject): drafts follow
    the target's argmax rule (sampling.next_token)."""
    _, gen = setup
    logits = torch.zeros(1, 10)
    logits[0, 3], logits[0, 7] = float("nan"), 1.0
    monkeypatch.setattr(gen.model, "logits", lambda hidden: logits)
    drafts, dists = gen._draft(torch.zeros(1, 1, 4), SimpleNamespace(mtp=SimpleNamespace(length=0)), 1, GREEDY, None)
    assert drafts.tolist() == [[7]] and dists is None


def test_seed_range():
    """Seeds are what torch.Generator.manual_seed takes: [-2^63, 2^64)."""
    for seed in (-2**63, 0, 2**64 - 1):
        SamplingParams(seed=seed).validate()
        torch.Generator().manual_seed(seed)
    for seed in (-2**63 - 1, 2**64):
        with pytest.raises(ValueError, match="seed must be in"):
            SamplingParams(seed=seed).validate()


def test_logprobs_of_non_finite_logits_are_finite():
    """Rows with +inf, NaN and −inf logits: +inf tokens share the mass (as the sampler reads them), NaN and −inf
    ones get MIN_LOGPROB, and the entries serialise as strict JSON (no NaN, no -Infinity)."""
    inf, nan = float("inf"), float("nan")
    logits = torch.tensor([[1.0, inf, 0.0, inf], [2.0, nan, -inf, 2.0]])
    got = token_logprobs(logits, [1, 0], 3)
    assert got[0].logprob == pytest.approx(math.log(0.5)) and [t for t, _ in got[0].top[:2]] == [1, 3]
    assert got[1].logprob == pytest.approx(math.log(0.5)) and got[1].top[2][1] == MIN_LOGPROB
    json.dumps([(e.logprob, e.top) for e in got], allow_nan=False)


def test_stop_ids_length_and_callback(setup):
    _, gen = setup
    prompt = [3, 1, 4, 1, 5]
    full = gen.generate(prompt, 20, GREEDY, spec_k=2).token_ids
    stop = full[6]
    out = gen.generate(prompt, 20, GREEDY, stop_ids={stop}, spec_k=2)
    assert out.token_ids == full[:full.index(stop) + 1] and out.finish_reason == "stop"
    assert gen.generate(prompt, 3, GREEDY, spec_k=4).token_ids == full[:3]
    chunks = []
    out = gen.generate(prompt, 20, GREEDY, spec_k=3, on_tokens=lambda new: chunks.append(new) or len(chunks) == 3)
    assert sum(chunks, []) == out.token_ids == full[:len(out.token_ids)] and out.finish_reason == "stop"


# ------------------------------------------------------------------------------ statistical exactness
def chi2_pvalue(counts, probs):
    """Pearson χ² goodness of fit; cells with tiny expectation are pooled into one."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = keep.sum() - 1
    return torch.special.gammaincc(dof / 2.0, stat / 2.0).item()


def markov_round(P, Q, k, params, n, seed, bonus_row=None):
    """n independent rounds from state 0 of a Markov target P[prev] with drafts from Markov Q[prev] (as logits).
    Returns emitted [n, k+1] (−1 past the end) and the count of emitted tokens."""
    g = torch.Generator().manual_seed(seed)
    drafts, dists, prev = [], [], torch.zeros(n, dtype=torch.long)
    target_rows = [P[prev]]
    for _ in range(k):
        q = probabilities(Q[prev], params)
        d = sampling.sample(q, g)
        drafts.append(d), dists.append(q)
        prev = d
        target_rows.append(P[prev])
    if bonus_row is not None:                                           # a deliberately wrong bonus row
        target_rows[k] = target_rows[bonus_row]
    drafts, dists = torch.stack(drafts, 1), torch.stack(dists, 1)
    accepted, nxt = accept_drafts(torch.stack(target_rows, 1), drafts, dists, params, g)
    emitted = torch.full((n, k + 1), -1)
    for i in range(n):
        a = accepted[i].item()
        emitted[i, :a] = drafts[i, :a]
        emitted[i, a] = nxt[i]
    return emitted, accepted


def emitted_fit(P, params, emitted, k):
    """Smallest χ² p-value over positions j: among rounds that emitted position j, the token there must follow
    the processed target distribution given the token before it (the bonus position j = k included)."""
    p_target = probabilities(P, params)
    worst = 1.0
    V = P.shape[0]
    for j in range(k + 1):
        rows = emitted[:, j] >= 0
        prev = torch.zeros(int(rows.sum()), dtype=torch.long) if j == 0 else emitted[rows, j - 1]
        for s in range(V):                                               # condition on the previous token
            sel = prev == s
            if sel.sum() < 200:
                continue
            counts = torch.bincount(emitted[rows, j][sel], minlength=V).double()
            worst = min(worst, chi2_pvalue(counts, p_target[s].double()))
    return worst


@pytest.fixture(scope="module")
def markov():
    g = torch.Generator().manual_seed(11)
    V = 6
    P = torch.randn(V, V, generator=g) * 1.5
    return P, P + torch.randn(V, V, generator=g)                        # a draft close to, not equal to, P


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=4, top_p=0.9)])
@pytest.mark.slow
def test_speculative_sampling_is_exact(markov, params):
    """Rounds of k = 3 drafts from a different Markov chain emit tokens distributed exactly as the target.

    The same test with the residual replaced by p itself, or with the bonus drawn from the wrong target row,
    fails (p-value 0.0 in float64 with 40,000 rounds: the two mutant tests below), so it can see both errors."""
    P, Q = markov
    emitted, accepted = markov_round(P, Q, 3, params, 40000, seed=1)
    assert (accepted == 3).any() and (accepted == 0).any()
    assert emitted_fit(P, params, emitted, 3) > 1e-4


@pytest.mark.slow
def test_wrong_residual_is_detected(markov, monkeypatch):
    P, Q = markov
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)
    emitted, _ = markov_round(P, Q, 3, SamplingParams(1.0), 40000, seed=1)
    assert emitted_fit(P, SamplingParams(1.0), emitted, 3) < 1e-8


@pytest.mark.slow
def test_wrong_bonus_is_detected(markov):
    P, Q = markov
    emitted, _ = markov_round(P, Q, 3, SamplingParams(1.0), 40000, seed=1, bonus_row=2)
    assert emitted_fit(P, SamplingParams(1.0), emitted, 3) < 1e-8


@pytest.mark.slow
def test_generator_samples_from_the_target(tmp_path):
    """End to end on a 16-token vocabulary: the second generated token (the first decided by a speculative round)
    must follow Σ_y1 p(y1 | prompt) p(y2 | prompt, y1), computed exactly from the model."""
    model = load_model(make_tiny_checkpoint(str(tmp_path), seed=2, vocab_size=16, tokenizer=False), dtype=torch.float32)
    gen = Generator(model)
    params = SamplingParams(temperature=1.0, top_k=12, top_p=0.95)
    prompt = [1, 2, 3]
    with torch.no_grad():
        p1 = probabilities(model.logits(model(torch.tensor([prompt])))[0, -1], params)
        rows = torch.tensor([prompt + [y] for y in range(16)])
        p2 = probabilities(model.logits(model(rows))[:, -1], params)
    want = (p1[:, None] * p2).sum(0).double()
    counts = torch.zeros(16, dtype=torch.float64)
    accepted = 0
    for seed in range(1000):
        out = gen.generate(prompt, 2, SamplingParams(1.0, 12, 0.95, seed=seed), spec_k=2)
        counts[out.token_ids[1]] += 1
        accepted += out.stats.accepted
    assert accepted > 200                                                 # drafts were really accepted
    assert chi2_pvalue(counts, want) > 1e-4
