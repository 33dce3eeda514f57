"""engine/scheduler.py: admission, chunked prefill, buckets, finishing, multi-turn reuse, and a randomized
simulation against a fake runner that keeps each slot's cached tokens."""
import itertools
import random

import pytest

from engine.scheduler import PAD_SLOT, Scheduler
from engine.sequence import Sequence, Status

STOP = 99


def make(num_slots=4, buckets=(1, 2, 4), spec_k=2, chunk=4, budget=8, max_len=64):
    clock = itertools.count()                        # a step is one tick each for schedule() and update()
    return Scheduler(num_slots, buckets, spec_k, chunk, budget, max_len, clock=lambda: float(next(clock)))


def seq(name, prompt_len=3, max_new=8, **kw):
    return Sequence(name, list(range(1, prompt_len + 1)), max_new, **kw)


def step(s, first=7):
    """schedule() + update(): every decode row emits k+1 tokens of 7, every last chunk samples `first`. Returns the
    plan."""
    plan = s.schedule()
    s.update(plan, [[7] * (plan.k + 1)] * plan.num_decode, [first] * len(plan.prefill))
    return plan


def ids(seqs):
    return [q.seq_id if q is not None else None for q in seqs]


def test_admission_up_to_the_slot_count_in_fifo_order():
    s = make(num_slots=3, budget=100)
    seqs = [seq(i) for i in range(5)]
    for q in seqs:
        s.add(q)
    plan = s.schedule()
    assert [(c.seq.seq_id, c.start, c.end, c.last) for c in plan.prefill] == [(0, 0, 3, True), (1, 0, 3, True),
                                                                              (2, 0, 3, True)]
    assert [q.slot for q in seqs] == [0, 1, 2, None, None]
    assert [q.status for q in seqs[3:]] == [Status.WAITING] * 2 and plan.num_decode == 0
    s.update(plan, [], [7, 7, 7])
    assert [q.status for q in seqs[:3]] == [Status.RUNNING] * 3 and [q.output_ids for q in seqs[:3]] == [[7]] * 3
    plan = step(s)
    assert plan.prefill == [] and ids(plan.rows) == [0, 1, 2, None] and plan.slots == [0, 1, 2, PAD_SLOT]
    s.finish(seqs[1])                                # its slot goes to the first request waiting
    plan = step(s)
    assert [c.seq for c in plan.prefill] == [seqs[3]] and seqs[3].slot == 1 and seqs[4].slot is None
    assert ids(plan.rows) == [0, 2] and plan.slots == [0, 2]
    plan = step(s)
    assert ids(plan.rows) == [0, 2, 3, None] and plan.slots == [0, 2, 1, PAD_SLOT]


def test_chunked_prefill_within_the_budget_interleaved_with_decoding():
    s = make(num_slots=4, chunk=4, budget=6)
    a, b, c = seq("a", 11), seq("b", 3), seq("c", 2)
    for q in (a, b, c):
        s.add(q)
    plan = step(s)
    assert [(x.seq.seq_id, x.start, x.end, x.last) for x in plan.prefill] == [("a", 0, 4, False), ("a", 4, 6, False)]
    assert a.status is Status.PREFILLING and a.num_cached == 6 and b.slot is None
    plan = step(s)                                   # a's last chunk, then b starts within what is left
    assert [(x.seq.seq_id, x.start, x.end, x.last) for x in plan.prefill] == [("a", 6, 10, False),
                                                                              ("a", 10, 11, True), ("b", 0, 1, False)]
    assert a.status is Status.RUNNING and a.output_ids == [7] and a.num_cached == 11
    plan = step(s)                                   # a decodes while b and c prefill
    assert ids(plan.rows) == ["a"] and plan.bucket == 1
    assert [(x.seq.seq_id, x.start, x.end, x.last) for x in plan.prefill] == [("b", 1, 3, True), ("c", 0, 2, True)]
    assert plan.prefill_tokens == 4
    assert a.output_ids == [7, 7, 7, 7] and a.num_cached == 14
    plan = step(s)
    assert ids(plan.rows) == ["a", "b", "c", None] and plan.prefill == []


def test_bucket_is_the_smallest_that_holds_the_rows_and_k_is_its_own():
    s = make(num_slots=8, buckets=(8, 1, 4, 2), spec_k={1: 4, 2: 3, 4: 2, 8: 1}, budget=100, max_len=100)
    assert s.buckets == [1, 2, 4, 8]
    for n, (bucket, k) in zip(range(1, 6), [(1, 4), (2, 3), (4, 2), (4, 2), (8, 1)]):
        s.add(seq(n, max_new=100))
        step(s)                                      # it prefills while the others decode
        plan = step(s)
        assert (plan.num_decode, plan.bucket, plan.k) == (n, bucket, k)
        assert len(plan.rows) == len(plan.slots) == bucket and plan.slots[n:] == [PAD_SLOT] * (bucket - n)
        assert plan.rows[n:] == [None] * (bucket - n)
    plan = s.schedule()
    before = [q.output_ids[:] for q in plan.rows[:5]]
    with pytest.raises(ValueError, match="sequence 4 emitted 3 tokens; a step with k = 1 emits 1 to 2"):
        s.update(plan, [[7]] * 3 + [[7, 7, 7], [7]], [])
    assert [q.output_ids for q in plan.rows[:5]] == before       # nothing applied: the plan can be updated again
    s.update(plan, [[7]] * 5, [])
    assert [len(q.output_ids) for q in plan.rows[:5]] == [len(b) + 1 for b in before]


def test_finishing_on_a_stop_id_cuts_the_round_and_frees_the_slot_for_the_next_request():
    s = make(num_slots=1, spec_k=4, max_len=100)
    a, b = seq("a", stop_ids={STOP}), seq("b")
    s.add(a)
    s.add(b)
    step(s)
    plan = s.schedule()
    assert plan.prefill == [] and b.slot is None
    out = s.update(plan, [[5, STOP, 6, 8, 9]], [])
    assert out == [(a, [5, STOP])] and a.output_ids == [7, 5, STOP] and a.finish_reason == "stop"
    assert a.slot is None and a.num_cached == 3 + 2                  # the pending 7 and 5: STOP is pending
    assert a.stats.accepted == 2 and a.stats.accepted_per_position == [1, 1, 0, 0]   # both kept are drafts
    plan = step(s)                                   # b takes the freed slot the next step
    assert [x.seq for x in plan.prefill] == [b] and b.slot == 0


def test_finishing_on_max_new_tokens_and_on_the_context():
    s = make(num_slots=2, spec_k=2, max_len=12)
    a, b = seq("a", max_new=4), seq("b", 5, max_new=100, ignore_eos=True, stop_ids={7})
    s.add(a)
    s.add(b)
    step(s)
    out = dict((q.seq_id, t) for q, t in s.update(s.schedule(), [[7, 7, 7], [7, 7, 7]], []))
    assert out == {"a": [7, 7, 7], "b": [7, 7, 7]} and a.finish_reason == "length" and a.output_ids == [7] * 4
    assert b.status is Status.RUNNING and b.num_cached == 8               # 8 + k + 1 <= 12: one more round
    s.update(s.schedule(), [[7]], [])
    assert b.num_cached == 9 and b.status is Status.RUNNING              # 9 + 3 <= 12: positions 9…11 still fit
    s.update(s.schedule(), [[7, 7]], [])
    assert b.num_cached == 11 and b.finish_reason == "length" and b.slot is None and s.free == [0, 1]
    assert a.stats.generated == 4 and b.stats.generated == 7


def test_first_token_can_finish_a_sequence():
    s = make()
    a, b = seq("a", max_new=1), seq("b", stop_ids={STOP})
    s.add(a)
    s.add(b)
    step(s, first=STOP)
    assert (a.finish_reason, b.finish_reason) == ("length", "stop") and s.running == [] and len(s.free) == 4
    assert not s.has_work


def test_stats_have_the_shape_and_meaning_of_the_eager_generators():
    now = [0.0]
    s = Scheduler(2, [1, 2], 3, 4, 4, 100, clock=lambda: now[0])
    a = seq("a", 6, max_new=6)
    s.add(a)
    for t, emitted in [(1.0, None), (3.0, None), (4.0, [5, 5, 5, 5]), (6.0, [5, 5])]:
        plan = s.schedule()
        now[0] = t
        s.update(plan, [emitted] if emitted else [], [7] * len(plan.prefill))
    assert a.queued_at == 0.0 and a.decode_started == 3.0 and a.finish_reason == "length"
    assert a.stats.as_dict() == {
        "prompt_tokens": 6, "generated": 6, "steps": 2, "drafted": 6, "accepted": 4, "accepted_per_position": [2, 1, 1],
        "acceptance_rate": 0.6667, "tokens_per_step": 2.5, "prefill_seconds": 3.0, "decode_seconds": 3.0,
        "prompt_tokens_per_second": 2.0, "tokens_per_second": 1.67}


def test_a_follow_up_turn_prefills_only_its_new_tokens_in_the_same_slot():
    s = make(num_slots=2, budget=100, max_len=100)
    other = seq("other", max_new=100)
    a = seq("a", 5, stop_ids={STOP}, keep_slot=True)
    s.add(other)
    s.add(a)
    step(s)
    s.update(s.schedule(), [[7], [8, STOP, 9]], [])
    assert a.finish_reason == "stop" and a.slot == 1 and a.num_cached == 7    # prompt 5 + 7, 8; STOP pending
    turn = Sequence("a2", a.context + [40, 41], 8, keep_slot=True)
    s.add(turn, follows=a)
    assert a.slot is None and turn.slot == 1 and turn.cached_prompt_tokens == 7
    plan = step(s)
    assert [(x.seq, x.start, x.end, x.last) for x in plan.prefill] == [(turn, 7, 10, True)]
    assert turn.status is Status.RUNNING and turn.num_cached == 10
    s.release(turn)
    assert turn.finish_reason == "abort" and turn.slot is None and s.free == [1]


def test_a_follow_up_that_differs_from_the_cache_is_prefilled_from_scratch_in_its_slot():
    s = make(num_slots=2, budget=100, max_len=100)
    a = seq("a", 5, max_new=2, keep_slot=True)
    s.add(a)
    step(s)
    step(s)
    assert a.finish_reason == "length" and a.slot == 0 and a.num_cached == 6
    changed = a.context
    changed[3] = 50                                  # e.g. a template that drops an earlier turn's reasoning
    for prompt in (changed + [40], a.context[:6]):   # a mismatch; nothing new after the cache (no row to sample)
        prev = a
        a = Sequence("again", prompt, 4, keep_slot=True)
        s.add(a, follows=prev)
        plan = step(s)
        assert a.cached_prompt_tokens == 0 and (plan.prefill[0].start, plan.prefill[-1].end) == (0, len(prompt))
        assert a.slot == 0 and s.free == [1]
        s.finish(a)
    with pytest.raises(ValueError, match="not a finished sequence holding its slot"):
        s.add(seq("x"), follows=prev)


def test_finish_by_the_caller_keeps_the_output_it_names():
    s = make(budget=100, max_len=100)
    a = seq("a", 4, keep_slot=True)
    s.add(a)
    step(s)
    step(s)
    assert a.output_ids == [7, 7, 7, 7] and a.num_cached == 7
    s.finish(a, keep=3)                              # the cache holds exactly the kept context: still reusable
    assert a.finish_reason == "stop" and a.output_ids == [7, 7, 7] and a.num_cached == 7 and a.slot == 0
    b = seq("b", 4, keep_slot=True)
    s.add(b)
    step(s)
    step(s)
    s.finish(b, keep=1)                              # the cache holds tokens past the kept output: not reusable
    assert b.num_cached == 0 and b.slot == 1
    with pytest.raises(ValueError, match="only an active one"):
        s.finish(b)


def test_release_of_a_waiting_request_and_misuse_between_steps():
    s = make(num_slots=1)
    a, b = seq("a"), seq("b")
    s.add(a)
    s.add(b)
    plan = s.schedule()
    with pytest.raises(RuntimeError, match="between schedule"):
        s.release(a)
    with pytest.raises(RuntimeError, match="again before update"):
        s.schedule()
    with pytest.raises(ValueError, match="0 sampled tokens for 1 prefill chunks"):
        s.update(plan, [], [])
    s.update(plan, [], [7])
    with pytest.raises(RuntimeError, match="not the one schedule"):
        s.update(plan, [], [7])
    s.release(b)
    assert b.finish_reason == "abort" and list(s.waiting) == []
    with pytest.raises(ValueError, match="added before"):
        s.add(b)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_slots=0), "num_slots must be an integer >= 1"),
    (dict(num_slots=8, buckets=(1, 4)), "largest batch bucket"),
    (dict(spec_k={1: 2, 2: 2}), "no draft count for bucket 4"),
    (dict(spec_k=-1), "spec_k for bucket 1 must be an integer"),
    (dict(chunk=0), "prefill_chunk"), (dict(budget=2.5), "prefill_budget_tokens"),
    (dict(max_len=3), "max_len must be an integer >= 4"),
])
def test_bad_configuration_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_bad_requests_are_named():
    with pytest.raises(ValueError, match="'q': prompt_ids must be a non-empty list"):
        Sequence("q", [], 4)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got 0"):
        Sequence("q", [1], 0)
    with pytest.raises(ValueError, match="logprobs"):
        Sequence("q", [1], 1, logprobs=21)
    with pytest.raises(ValueError, match="exceeds the 64 tokens"):
        make().add(seq("q", 65))


def simulate(rng, num_slots, buckets, spec_k, chunk, budget, max_len, requests, steps=20000):
    """Requests of random lengths, each with a fixed true continuation, some of them conversations with follow-up
    turns that extend their context (or, at times, change it); a fake runner emits 1..k+1 of the next true tokens a
    row and keeps every slot's cached tokens as the contract says. Checks the invariants every step; returns every
    sequence and its true continuation."""
    s = Scheduler(num_slots, buckets, spec_k, chunk, budget, max_len)
    truth, cache, queue, parked, seqs = {}, {}, list(requests), [], []

    def new(prompt, follows=None):
        q = Sequence(len(seqs), prompt, rng.randint(1, 40), stop_ids={STOP}, keep_slot=rng.random() < 0.3)
        truth[q.seq_id] = [rng.choice([STOP] + [5] * 30 + [6] * 30) for _ in range(60)]
        seqs.append(q)
        s.add(q, follows=follows)

    for _ in range(steps):
        while queue and rng.random() < 0.5:
            new([rng.randint(1, 50) for _ in range(queue.pop())])
        plan = s.schedule()
        assert plan.prefill_tokens <= budget and all(0 < c.end - c.start <= chunk for c in plan.prefill)
        held = [q.slot for q in s.prefilling + s.running + list(s.resuming) + parked]
        assert len(set(held)) == len(held) and sorted(held + s.free) == list(range(num_slots))
        n = plan.num_decode
        assert plan.bucket == (min(b for b in buckets if b >= n) if n else 0) and plan.k == (spec_k if n else 0)
        assert plan.slots == [q.slot for q in plan.rows[:n]] + [PAD_SLOT] * (plan.bucket - n)
        decoded, before = [], {}
        for q in plan.rows[:n]:
            assert cache[q.slot] == q.context[:q.num_cached] and q.num_cached + plan.k + 1 <= max_len
            got = len(q.output_ids)
            before[q.seq_id] = q.slot, q.num_cached, q.pending
            decoded.append(truth[q.seq_id][got:got + rng.randint(1, plan.k + 1)])
        for c in plan.prefill:                       # a chunk continues the slot's cache, or starts it afresh
            assert c.start == 0 or cache[c.seq.slot] == c.seq.prompt_ids[:c.start]
            cache[c.seq.slot] = cache[c.seq.slot][:c.start] if c.start else []
            cache[c.seq.slot] += c.token_ids
        for q, kept in s.update(plan, decoded, [truth[c.seq.seq_id][0] for c in plan.prefill]):
            if q.seq_id in before:                   # commit the pending token and the drafts kept
                slot, cached, pending = before[q.seq_id]
                cache[slot] = cache[slot][:cached] + [pending] + kept[:-1]
            if q.finished and q.slot is not None:
                parked.append(q)
        for q in list(parked):                       # a conversation goes on (its context, maybe changed) or ends
            if rng.random() < 0.5:
                parked.remove(q)
                prompt = q.context + [rng.randint(1, 50) for _ in range(rng.randint(0, 9))]
                if rng.random() < 0.2:
                    prompt[rng.randrange(len(prompt))] = 77
                if len(prompt) <= max_len:
                    new(prompt, follows=q)
                    reuse = seqs[-1].cached_prompt_tokens
                    assert reuse in (0, q.num_cached) and (reuse == 0) == (prompt[:q.num_cached] != q.context[
                        :q.num_cached] or len(prompt) == q.num_cached)
                else:
                    s.release(q)
                    assert q.slot is None
        if not queue and not s.has_work:
            break
    assert not queue and not s.has_work
    return seqs, truth


@pytest.mark.parametrize("seed", range(6))
def test_randomized_simulation_keeps_every_invariant(seed):
    rng = random.Random(seed)
    spec_k, max_len = rng.randint(0, 4), 90
    seqs, truth = simulate(rng, 6, [1, 2, 4, 8], spec_k, rng.choice([3, 8, 16]), rng.choice([5, 16, 40]), max_len,
                           [rng.randint(1, 40) for _ in range(150)])
    assert len(seqs) > 170                           # follow-up turns ran too
    for q in seqs:
        out, true = q.output_ids, truth[q.seq_id]
        assert q.finished and out == true[:len(out)] and q.stats.generated == len(out)
        if STOP in true[:len(out)]:
            assert q.finish_reason == "stop" and true.index(STOP) == len(out) - 1
        else:
            assert q.finish_reason == "length"
            assert len(out) == q.max_new_tokens or q.num_cached + spec_k + 1 > max_len
        assert q.stats.accepted == sum(q.stats.accepted_per_position) <= q.stats.drafted == spec_k * q.stats.steps


def test_a_step_ahead_keeps_the_rows_and_skips_the_finished():
    """schedule_ahead(): the next step's plan before this one's update (same rows, no prefill); update() of it
    skips a row whose sequence finished in the step before; none while a sequence prefills, keeps its slot or
    wants logprobs, or when no row of the plan is running any more."""
    s = make(num_slots=2)
    a, b = seq("a", max_new=3), seq("b", max_new=9)
    s.add(a)
    s.add(b)
    first = s.schedule()
    assert s.schedule_ahead() is None                              # prefilling
    s.update(first, [], [10, 20])
    plan = s.schedule()
    ahead = s.schedule_ahead()
    assert ahead.rows[:2] == plan.rows[:2] and not ahead.prefill and s.schedule_ahead() is None
    with pytest.raises(RuntimeError, match="again before update"):
        s.schedule()
    s.update(plan, [[11, 12], [21]], [])                           # a reaches max_new_tokens
    assert a.finished and not b.finished
    out = s.update(ahead, [[13], [22]], [])
    assert [(x.seq_id, t) for x, t in out] == [("b", [22])] and a.output_ids == [10, 11, 12]
    plan = s.schedule()
    s.finish(b)
    assert s.schedule_ahead() is None                              # no row still running
    s.update(plan, [[23]], [])
    assert b.output_ids == [20, 21, 22]
    c = seq("c", max_new=9, logprobs=0)
    s.add(c)
    s.update(s.schedule(), [], [30])
    s.schedule()
    assert s.schedule_ahead() is None                              # logprobs read the step's logits
