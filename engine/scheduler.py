"""Continuous batching, the CPU side: per step, which prompt chunks prefill and which sequences decode. Plain
Python, deterministic given the clock. The caller alternates schedule() -> run the StepPlan -> update().

* A step: StepPlan.prefill in order (a sequence's chunks consecutive), then one MTP-k step (ENGINE.md §1) over the
  running sequences in the order they started, padded to the smallest bucket that holds them (slot PAD_SLOT,
  num_accepted 1 in the runner), with that bucket's k. A row emits 1..k+1 tokens and commits as many. k may change
  with the bucket: draft k_max for the next step, which verifies the first k.
* Slots are never shared. A new request takes the lowest free slot when it starts prefilling; a finished one frees
  it in that update() (unless keep_slot), for the next schedule(). No free slot: requests wait (no preemption);
  a kept slot stays taken until release().
* Prefill: at most prefill_budget_tokens a step, in chunks of at most prefill_chunk; prefilling sequences first,
  then arrival (FIFO) order; a follow-up turn, which holds its slot, does not wait behind requests for one. The
  last chunk makes the sequence running with the token sampled from its last row.
* Finishing as engine/generate.py does: tokens append up to a stop id (kept) or max_new_tokens, the rest of the
  round is cut. A round writes k+1 KV rows: "length" once num_cached + k_max + 1 > max_len (a slot's context,
  MemoryPlan.max_tokens).
* Multi-turn (ENGINE.md §8): add(seq, follows=prev) takes prev's kept slot; a prompt that extends all prev.num_cached
  cached tokens prefills from there, any other from scratch (GDN state cannot rewind). A kept slot's caches must
  hold exactly num_cached tokens: where update() cut a round, the runner commits len(tokens kept) rows.

Per row the runner reads seq.slot, num_cached (the pending token's position), pending, sampling, logprobs; a chunk
at 0 starts from a zero state. 64 running sequences, k = 4: schedule() + update() ≈ 50 µs (timeit, CPU time)."""
import heapq
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

from engine.sequence import Sequence, Status
from layers.config import MAX_SPEC_K

PAD_SLOT = -1


@dataclass(slots=True)
class PrefillChunk:
    seq: Sequence
    start: int                         # prompt positions [start, end); the tokens before start are cached
    end: int
    last: bool                         # the prompt's last chunk: the step samples the first token from its last row

    @property
    def token_ids(self) -> list:
        return self.seq.prompt_ids[self.start:self.end]


@dataclass(slots=True)
class StepPlan:
    prefill: list                      # PrefillChunk, in the order to run them
    rows: list                         # [bucket] the decoding Sequences, then None for padding rows
    slots: list                        # [bucket] their slots, PAD_SLOT for padding rows
    num_decode: int                    # real rows: rows[:num_decode]
    bucket: int                        # 0: nothing decodes this step
    k: int                             # drafts each row verifies

    @property
    def prefill_tokens(self) -> int:
        return sum(c.end - c.start for c in self.prefill)


class Scheduler:
    def __init__(self, num_slots: int, buckets, spec_k, prefill_chunk: int, prefill_budget_tokens: int,
                 max_len: int, clock=time.perf_counter):
        """buckets: batch sizes with a captured graph (any order; the largest must hold num_slots); spec_k: the
        drafts per step, one int for every bucket or {bucket: k}; max_len: context tokens a slot holds."""
        def integer(name, value, low):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"scheduler: {name} must be an integer >= {low}, got {value!r}")

        integer("num_slots", num_slots, 1)
        integer("prefill_chunk", prefill_chunk, 1)
        integer("prefill_budget_tokens", prefill_budget_tokens, 1)
        buckets = list(buckets)
        for b in buckets:
            integer("a batch bucket", b, 1)
        if not buckets or max(buckets) < num_slots:
            raise ValueError(f"scheduler: the largest batch bucket of {buckets} must hold num_slots = {num_slots}")
        ks = spec_k if isinstance(spec_k, dict) else {b: spec_k for b in buckets}
        for b in buckets:
            if b not in ks:
                raise ValueError(f"scheduler: spec_k gives no draft count for bucket {b}")
            if isinstance(ks[b], bool) or not isinstance(ks[b], int) or not 0 <= ks[b] <= MAX_SPEC_K:
                raise ValueError(f"scheduler: spec_k for bucket {b} must be an integer in [0, {MAX_SPEC_K}], "
                                 f"got {ks[b]!r}")
        self.buckets = sorted(set(buckets))
        self.spec_k = {b: ks[b] for b in self.buckets}
        self.k_max = max(self.spec_k.values())
        integer("max_len", max_len, self.k_max + 2)
        self.num_slots, self.max_len, self.clock = num_slots, max_len, clock
        self.last_start = max_len - self.k_max - 1         # the last num_cached a decode step can start from
        self.prefill_chunk, self.prefill_budget = prefill_chunk, prefill_budget_tokens
        self.free = list(range(num_slots))                 # a heap
        self.waiting = deque()                             # new requests
        self.resuming = deque()                            # follow-up turns, in their slot
        self.prefilling, self.running = [], []
        self._arrivals = 0
        self._outstanding = []                             # plans handed out and not yet update()d, in order


    def add(self, seq: Sequence, follows: Sequence | None = None):
        """Queue a request; follows: the finished keep_slot sequence whose slot (and caches) this turn continues."""
        if seq.status is not Status.WAITING or seq.arrival >= 0:
            raise ValueError(f"sequence {seq.seq_id!r} was added before")
        if len(seq.prompt_ids) > self.max_len:
            raise ValueError(f"sequence {seq.seq_id!r}: prompt ({len(seq.prompt_ids)} tokens) exceeds the "
                             f"{self.max_len} tokens of context a slot holds")
        if follows is not None:
            if follows.status is not Status.FINISHED or follows.slot is None:
                raise ValueError(f"sequence {seq.seq_id!r}: follows {follows.seq_id!r}, which is not a finished "
                                 "sequence holding its slot (keep_slot, not released)")
            seq.slot, follows.slot = follows.slot, None
            n, prompt = follows.num_cached, seq.prompt_ids
            reuse = len(prompt) > n and prompt[:n] == (follows.prompt_ids + follows.output_ids)[:n]
            seq.num_cached = seq.cached_prompt_tokens = n if reuse else 0
        seq.stats.accepted_per_position = [0] * self.k_max
        seq.arrival, self._arrivals = self._arrivals, self._arrivals + 1
        seq.queued_at = self.clock()
        (self.waiting if follows is None else self.resuming).append(seq)

    def release(self, seq: Sequence):
        """Free seq's slot. A queued sequence leaves the queue, an active one ends ("abort"); between steps only."""
        self._between_steps("release")
        if seq.status is Status.WAITING:
            (self.waiting if seq.slot is None else self.resuming).remove(seq)
            seq.num_cached = 0
        if seq.status is not Status.FINISHED:
            self._finish(seq, "abort", self.clock())
            self._drop_active(seq)
        if seq.slot is not None:
            heapq.heappush(self.free, seq.slot)
            seq.slot = None

    def finish(self, seq: Sequence, keep: int | None = None):
        """End an active sequence as the caller decides ("stop": e.g. a stop string its text matched), keeping its
        first `keep` generated tokens (default all); or cut a finished one's output back to `keep` tokens (a stop
        string before the stop id that ended it). Caches holding tokens past the kept context are not reusable:
        num_cached drops to 0 (a follow-up turn prefills from scratch). Between steps only."""
        self._between_steps("finish")
        cut = seq.status is Status.FINISHED and keep is not None and keep < len(seq.output_ids)
        if seq.status not in (Status.PREFILLING, Status.RUNNING) and not cut:
            raise ValueError(f"sequence {seq.seq_id!r} is {seq.status.value}: only an active one can be finished")
        if keep is not None:
            if not 0 <= keep <= len(seq.output_ids):
                raise ValueError(f"sequence {seq.seq_id!r}: keep must be in [0, {len(seq.output_ids)}], got {keep!r}")
            del seq.output_ids[keep:]
            if seq.num_cached > len(seq.prompt_ids) + keep:
                seq.num_cached = 0
        self._drop_active(seq)
        self._finish(seq, "stop", self.clock())

    def _between_steps(self, what):
        if any(plan.prefill for plan in self._outstanding):   # decode rows are skipped once finished; chunks not
            raise RuntimeError(f"{what}() between schedule() and update(): the step's plan still uses the sequence")

    def _drop_active(self, seq):
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.prefilling:
            self.prefilling.remove(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.resuming or self.prefilling or self.running)


    def schedule(self) -> StepPlan:
        if self._outstanding:
            raise RuntimeError("schedule() called again before update() of the previous plan")
        chunks, budget = [], self.prefill_budget
        for seq in self.prefilling:
            if not budget:
                break
            budget = self._chunks(seq, budget, chunks)
        waiting, resuming = self.waiting, self.resuming
        while budget and (resuming or (waiting and self.free)):
            if resuming and not (waiting and self.free and waiting[0].arrival < resuming[0].arrival):
                seq = resuming.popleft()
            else:
                seq = waiting.popleft()
                seq.slot = heapq.heappop(self.free)
            seq.status = Status.PREFILLING
            seq.prefill_started = self.clock()
            self.prefilling.append(seq)
            budget = self._chunks(seq, budget, chunks)
        n = len(self.running)
        if n:
            bucket = self.buckets[bisect_left(self.buckets, n)]
            rows = self.running + [None] * (bucket - n)
            slots = [s.slot for s in self.running] + [PAD_SLOT] * (bucket - n)
            k = self.spec_k[bucket]
        else:
            bucket, rows, slots, k = 0, [], [], 0
        self._outstanding.append(StepPlan(chunks, rows, slots, n, bucket, k))
        return self._outstanding[-1]

    def schedule_ahead(self) -> StepPlan | None:
        """The plan of the step after the one handed out last (by schedule() or schedule_ahead()), made before that
        one's update() so the caller can start it before it reads the first's tokens: the same rows, no prefill.
        Only where the rows cannot change but by finishing — nothing prefilling or resuming (a new request waits
        a step for a freed slot), no running sequence keeping its slot (its caches must end where its tokens do)
        or asking for logprobs (the step's logits are read after it) — and one plan at most ahead: update() then
        skips the rows whose sequences finished in the step before. None where it cannot be known."""
        plan = self._outstanding[0] if len(self._outstanding) == 1 else None
        if (plan is None or not plan.bucket or plan.prefill or self.prefilling or self.resuming
                or not any(s is not None and s.status is Status.RUNNING for s in plan.rows)
                or any(s.keep_slot or s.logprobs is not None for s in self.running)):
            return None
        self._outstanding.append(StepPlan([], list(plan.rows), list(plan.slots), plan.num_decode, plan.bucket,
                                          plan.k))
        return self._outstanding[-1]

    def _chunks(self, seq, budget, chunks) -> int:
        """Plan seq's next chunks within budget; the budget left."""
        pos, end, size = seq.num_cached, len(seq.prompt_ids), self.prefill_chunk
        while pos < end and budget:
            n = min(size, end - pos, budget)
            chunks.append(PrefillChunk(seq, pos, pos + n, pos + n == end))
            pos += n
            budget -= n
        return budget

    def update(self, plan: StepPlan, decoded, sampled) -> list:
        """Apply the outcome of `plan`: decoded[i] the tokens row i emitted (accepted drafts + 1; padding rows, if
        given, are ignored), sampled[j] the first token sampled by chunk plan.prefill[j] where it is the last
        (ignored otherwise). Returns (sequence, tokens appended) for every sequence that got tokens, cut at a
        stop id or max_new_tokens; finished sequences have freed their slots (unless keep_slot)."""
        if not self._outstanding or plan is not self._outstanding[0]:
            raise RuntimeError("update() of a plan that is not the one schedule() handed out last (or, ahead of "
                               "it, schedule_ahead())")
        if len(decoded) < plan.num_decode:
            raise ValueError(f"update: {len(decoded)} decoded rows for {plan.num_decode} decoding sequences")
        if len(sampled) < len(plan.prefill):
            raise ValueError(f"update: {len(sampled)} sampled tokens for {len(plan.prefill)} prefill chunks")
        k, n = plan.k, plan.num_decode
        lengths = list(map(len, decoded[:n]))
        if n and (min(lengths) < 1 or max(lengths) > k + 1):
            i = next(i for i, m in enumerate(lengths) if not 1 <= m <= k + 1)
            raise ValueError(f"update: sequence {plan.rows[i].seq_id!r} emitted {lengths[i]} tokens; a step with "
                             f"k = {k} emits 1 to {k + 1}")
        self._outstanding.pop(0)
        now, out, done = self.clock(), [], False
        for seq, tokens in zip(plan.rows, decoded):
            if seq is None:
                break
            if seq.status is not Status.RUNNING:      # finished since the plan was made (schedule_ahead, finish)
                continue
            kept, reason = self._append(seq, tokens)
            seq.stats.steps += 1
            seq.stats.count_round(k, min(len(tokens) - 1, len(kept)))
            if reason:
                self._finish(seq, reason, now)
                done = True
            out.append((seq, kept))
        if done:
            self.running = [s for s in self.running if s.status is Status.RUNNING]
        for chunk, token in zip(plan.prefill, sampled):
            seq = chunk.seq
            seq.num_cached = chunk.end
            if chunk.last:
                self.prefilling.remove(seq)
                seq.status = Status.RUNNING
                seq.stats.prefill_seconds = now - seq.prefill_started
                seq.decode_started = now
                kept, reason = self._append(seq, [token])
                if reason:
                    self._finish(seq, reason, now)
                else:
                    self.running.append(seq)
                out.append((seq, kept))
        return out

    def _append(self, seq, tokens) -> tuple:
        """Append a step's tokens in order up to a stop id or max_new_tokens and advance num_cached past the
        previous pending token and all but the last kept. The tokens kept, and the finish reason or None."""
        output = seq.output_ids
        room, reason = seq.max_new_tokens - len(output), None
        if len(tokens) >= room:
            tokens, reason = tokens[:room], "length"
        stops = seq.stop_ids
        if stops and not stops.isdisjoint(tokens):
            tokens, reason = tokens[:next(i for i, t in enumerate(tokens) if t in stops) + 1], "stop"
        if output:                                       # a decode step: the pending token and the drafts it kept
            seq.num_cached += len(tokens)
        output.extend(tokens)
        if reason is None and seq.num_cached > self.last_start:
            reason = "length"
        return tokens, reason

    def _finish(self, seq, reason, now):
        if seq.status is Status.RUNNING:
            seq.stats.decode_seconds = now - seq.decode_started
        seq.status, seq.finish_reason = Status.FINISHED, reason
        seq.stats.generated = len(seq.output_ids)
        if not seq.keep_slot and seq.slot is not None:
            heapq.heappush(self.free, seq.slot)
            seq.slot = None
