"""The graph engine as callers see it: a prepared model on graphs/runner.py (one CUDA graph per batch bucket)
driven by engine/scheduler.py (continuous batching), with the surface engine/engine.Engine has (tokenizer,
defaults, model_dir, spec_k, cfg, generate).

One step (nano-vllm's LLMEngine.step): schedule() -> each prefill chunk on the runner (the last one's sampled
token read back) -> one MTP-k step over the running sequences' slots (runner.step, then fetch(B).wait()) ->
update() -> each sequence's new tokens handed to its consumer one at a time, as Engine.generate's emit does (a
consumer returning True ends the sequence there: Scheduler.finish). A conversation's sequence keeps its slot
(keep_slot) and a round cut short by a stop id or max_new_tokens is cut on the runner too (cut_round), so the
next turn prefills only its new tokens (submit(..., follows=previous)). In a steady batch the next step is
launched before this one's tokens are read (Scheduler.schedule_ahead), so the host's work hides under the GPU's.

Sampling is per sequence (runner.set_sampling when it takes its slot). The runner has one Philox stream: when
the engine goes from idle to busy it is seeded from the first queued request that carries a seed (fresh entropy
when none does). A seeded request run alone is reproducible, and so is a batch (the same file, the same order);
requests running together draw from the one stream."""
import itertools
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from engine.engine import DEMO_MODEL, check_model_dir
from engine.generate import GenerationResult
from engine.logprobs import token_logprobs
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.tokenizer import Tokenizer, load_generation_defaults
from graphs.plan import Fit, bucket_k, load_profile
from graphs.runner import ModelRunner
from layers.config import MAX_SPEC_K, ModelConfig
from layers.prepared import MANIFEST, load_draft_vocab, load_prepared, prepare, saved_weight_bytes

PREFILL_CHUNK = 1024               # prompt tokens per prefill chunk when the profile names none
KV_DTYPES = {"fp8_e4m3": torch.uint8, "bfloat16": torch.bfloat16}
PROFILE_WARMUP = 8                 # decode steps before the profiler window opens (--profile-steps)
MIN_CONTEXT = 2048                 # tokens a sequence gets at least, where a bucket allows, when max_seqs is not given


def device_profile(name: str | None, device: str) -> dict:
    """profiles/<name>.json (graphs.plan.load_profile); without a name, `device`'s: rtx3090 for a GPU named so,
    else h200 (the CPU too)."""
    if not name:
        name = "rtx3090" if torch.device(device).type == "cuda" and "3090" in torch.cuda.get_device_name(device) \
            else "h200"
    return load_profile(name)


def buckets_for(profile: dict, max_seqs: int) -> list:
    """The batch sizes a step runs at: the profile's below max_seqs, then max_seqs (the runner steps at most
    max_seqs rows)."""
    return sorted({b for b in profile["batch_buckets"] if b < max_seqs} | {max_seqs})


@dataclass(eq=False)
class Request:
    """One submitted generation: its Sequence (the scheduler's), its consumer, and the result once finished."""
    seq: Sequence
    on_tokens: Callable[[list], bool | None] | None = None
    logprobs: list | None = None           # TokenLogprob per delivered token, when asked for
    step_seconds: float = 0.0              # the decode steps it took part in
    started: bool = False                  # its sampling parameters are in its slot's tables
    first_logits: torch.Tensor = None      # its prefill's last row, kept until update() (logprobs only)
    result: GenerationResult | None = None

    @property
    def done(self) -> bool:
        return self.result is not None


@dataclass
class _Profiler:
    """Decode steps warmup+1 … warmup+count bracketed with cudaProfilerStart / Stop (nsys -c cudaProfilerApi)."""
    count: int
    warmup: int
    runtime: object
    steps: int = 0
    active: bool = False

    def call(self, name):
        err, = getattr(self.runtime, name)()
        if err != self.runtime.cudaError_t.cudaSuccess:
            raise RuntimeError(f"{name} failed: {err}")

    def before_step(self):
        if self.steps == self.warmup and not self.active:
            torch.cuda.synchronize()
            self.call("cudaProfilerStart")
            self.active = True

    def after_step(self):
        self.steps += 1
        if self.active and self.steps >= self.warmup + self.count:
            self.stop()

    def stop(self):
        if self.active:
            torch.cuda.synchronize()
            self.call("cudaProfilerStop")
            self.active = False
            sys.stderr.write(f"[ CUDA profiler: decode steps {self.warmup + 1}-{self.steps} ]\n")


class GraphEngine:
    """Engine's surface (tokenizer, defaults, model_dir, spec_k, cfg, max_context, generate) plus continuous
    batching: submit() queues a request, step() advances every request in flight, wait() / generate_many() step
    until theirs are done. runner: a ModelRunner (or one with its interface); timings: load_s, capture_s
    (compile_s and compiled: its kernels compiled ahead)."""

    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, defaults, model_dir: str, profile: dict,
                 timings: dict):
        self.runner, self.tokenizer, self.defaults, self.model_dir = runner, tokenizer, defaults, model_dir
        self.cfg, self.spec_k, self.max_seqs, self.max_len = runner.cfg, runner.k, runner.max_seqs, runner.max_len
        self.profile, self.timings = profile, timings
        self.max_context = self.max_len - self.spec_k      # prompt + generated tokens a sequence may reach
        self.max_context_name = f"a sequence's context (max_len {self.max_len} - spec_k {self.spec_k})"
        self.buckets = buckets_for(profile, self.max_seqs)
        self.prefill_chunk = runner.max_prefill
        self.prefill_budget = profile.get("prefill_budget", self.prefill_chunk)
        self.profiler = None
        self._ids = itertools.count()                 # sequence ids (error messages)
        self.abort()

    @classmethod
    def load(cls, model_dir: str | None = None, device: str = "cuda", profile: str | None = None,
             spec_k: int | None = None, max_seqs: int | None = None, max_len: int | None = None,
             body: str = "int4", graphs: bool = True, progress: Callable | None = None) -> "GraphEngine":
        """model_dir: a checkpoint (prepared on the device: int4 or bf16 body) or a prepared directory (its
        manifest.json; loaded as saved); either may hold a reduced draft vocabulary (layers.prepared.DRAFT_VOCAB),
        which the MTP then drafts from. profile: profiles/<name>.json (default device_profile's). spec_k: the
        profile's by default, with its spec_k_by_bucket (a bucket's own draft count); 0 without MTP weights.
        max_seqs: by default the largest batch bucket that leaves each sequence max_len tokens (MIN_CONTEXT
        when max_len is not given: a 24 GiB card then holds 16 sequences with MTP-4, not 64 of none). max_len:
        the longest that fits (graphs.plan.Fit: the weights, the runner's buffers and a reserve in the profile's
        memory or the device's free memory, whichever is less); a configuration that does not fit fails before
        anything is allocated, saying what would. graphs: capture a CUDA graph per bucket (CUDA only).
        progress: prepare's callback (default: a line on stderr)."""
        model_dir = model_dir or DEMO_MODEL
        check_model_dir(model_dir)
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but CUDA is not available here")
        prof = device_profile(profile, device)
        if prof["kv_dtype"] not in KV_DTYPES:
            raise ValueError(f"profile {prof['name']!r}: kv_dtype {prof['kv_dtype']!r}; the runner's KV cache is "
                             f"one of {', '.join(KV_DTYPES)}")
        largest = max(prof["batch_buckets"])
        if max_seqs is not None and not 1 <= max_seqs <= largest:
            raise ValueError(f"max_seqs must be in [1, {largest}] (the profile's largest batch bucket), "
                             f"got {max_seqs}")
        if spec_k is not None and not 0 <= spec_k <= MAX_SPEC_K:
            raise ValueError(f"spec_k must be in [0, {MAX_SPEC_K}], got {spec_k}")
        started = time.perf_counter()
        tokenizer = Tokenizer.from_dir(model_dir)
        defaults = load_generation_defaults(model_dir, tokenizer)
        cfg = ModelConfig.from_dir(model_dir)
        k = prof["spec_k"] if spec_k is None else spec_k
        per_bucket = bucket_k(prof) if spec_k is None else {}          # an explicit spec_k drafts it everywhere
        limit = cfg.max_position_embeddings
        if max_len is not None and max_len > limit:
            raise ValueError(f"max_len {max_len} exceeds the model's max_position_embeddings ({limit})")
        chunk = prof.get("prefill_chunk", PREFILL_CHUNK)
        free = torch.cuda.mem_get_info(torch.device(device))[0] if torch.device(device).type == "cuda" else None
        fit = Fit(cfg, prof, spec_k=k, prefill_chunk=chunk, weight_bytes=saved_weight_bytes(model_dir), body=body,
                  memory_bytes=free, ks=per_bucket.values())
        if max_seqs is None:
            max_seqs = fit.bucket(prof["batch_buckets"], max_len or min(MIN_CONTEXT, limit))
        if max_len is None:                           # the longest that fits (else check() says what would)
            max_len = fit.max_len(max_seqs) or k + 3
        fit.check(max_seqs, max_len)                  # before anything is allocated
        if max_len < k + 3:
            raise ValueError(f"max_len {max_len}: a slot must hold a prompt token and a round of {k + 1} (fewer "
                             "sequences, or a smaller spec_k, leave more memory to each)")
        if os.path.isfile(os.path.join(model_dir, MANIFEST)):
            prepared = load_prepared(model_dir, device)
        else:
            prepared = prepare(model_dir, device, body=body, progress=progress)
        if prepared.mtp is None:
            k, per_bucket = 0, {}
        runner = ModelRunner(prepared, max_seqs, max_len, spec_k=k, max_prefill=chunk,
                             kv_dtype=KV_DTYPES[prof["kv_dtype"]], device=device,
                             draft_tokens=load_draft_vocab(model_dir, cfg.vocab_size) if k else None,
                             bucket_k=per_bucket)
        timings = {"load_s": time.perf_counter() - started, "capture_s": 0.0, "capture_s_by_bucket": {}}
        if graphs and torch.device(device).type == "cuda":
            started = time.perf_counter()
            timings["capture_s_by_bucket"] = runner.capture(buckets_for(prof, max_seqs))
            timings["capture_s"] = time.perf_counter() - started
            timings["compile_s"], timings["compiled"] = runner.compile_s, runner.compiled_ahead
        return cls(runner, tokenizer, defaults, model_dir, prof, timings)

    # ------------------------------------------------------------------------------------------ requests
    def submit(self, prompt_ids: list, max_new_tokens: int, sampling: SamplingParams, *, stop_ids=None,
               ignore_eos: bool = False, spec_k: int | None = None,
               on_tokens: Callable[[list], bool | None] | None = None, logprobs: int | None = None,
               keep_slot: bool = False, follows: Request | None = None) -> Request:
        """Queue a request (Engine.generate's parameters); step() runs it. keep_slot: keep the slot and its
        caches after finishing for a follow-up turn, submitted with follows= this request (a prompt extending
        this one's prompt + output prefills only the new tokens); release() frees it."""
        if spec_k is not None and spec_k != self.spec_k:
            raise ValueError(f"spec_k {spec_k}: this engine drafts {self.spec_k} tokens a step (set at load)")
        prompt_ids = list(prompt_ids)
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = self.cfg.vocab_size
        bad = [t for t in prompt_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise ValueError(f"prompt token id(s) {bad[:5]} outside the model's vocabulary (size {vocab})")
        if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(prompt_ids) + max_new_tokens > self.max_context:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                             f"{self.max_context_name}: {self.max_context} tokens")
        stops = self.defaults.stop_ids if stop_ids is None else stop_ids
        seq = Sequence(next(self._ids), prompt_ids, max_new_tokens, sampling.validate(), frozenset(stops), ignore_eos,
                       logprobs, keep_slot)
        if not self.scheduler.has_work:
            self.seed = None                          # idle: the next step seeds the sampler afresh
        self.scheduler.add(seq, follows=None if follows is None else follows.seq)
        if follows is not None:
            self.requests.pop(follows.seq, None)
        request = Request(seq, on_tokens, None if logprobs is None else [])
        self.requests[seq] = request
        return request

    def release(self, request: Request):
        """Free a finished keep_slot request's slot (or end a queued / running one); between steps."""
        self.scheduler.release(request.seq)
        self.requests.pop(request.seq, None)

    def abort(self):
        """Forget every request (after a failed step, or an interrupt at any point): a fresh scheduler, all slots
        free (a slot's caches are reset when its next sequence prefills from position 0)."""
        self.scheduler = Scheduler(self.max_seqs, self.buckets, {b: self.runner.k_for(b) for b in self.buckets},
                                   self.prefill_chunk, self.prefill_budget, self.max_len)
        self.requests = {}                            # Sequence -> Request: active ones and kept slots
        self.seed = None
        self._ahead = None                            # (plan, StepOutput) of a step enqueued ahead (step())
        self._last_wait = None                        # when the last step's tokens arrived (step_ms)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def wait(self, request: Request) -> GenerationResult:
        """Step until `request` is finished (the others in flight progress too); its result."""
        while not request.done:
            self.step()
        return request.result

    def generate(self, prompt_ids: list, max_new_tokens: int, sampling: SamplingParams, **kw) -> GenerationResult:
        """Engine.generate's contract (kw: stop_ids, ignore_eos, spec_k, on_tokens, logprobs)."""
        return self.wait(self.submit(prompt_ids, max_new_tokens, sampling, **kw))

    def generate_many(self, requests: list) -> list:
        """Several requests (dicts of generate's arguments) as one continuous batch; their results, in order."""
        handles = [self.submit(**r) for r in requests]
        while not all(h.done for h in handles):
            self.step()
        return [h.result for h in handles]

    # ------------------------------------------------------------------------------------------ the loop
    def step(self) -> list:
        """One scheduler step (module docstring). Returns the requests that finished in it.

        Where the scheduler can tell the next step's rows before this one's tokens are read (schedule_ahead: a
        steady batch, nothing prefilling, no conversation keeping its slot), the next step is enqueued first, so
        the host's reading, delivering and scheduling hide under it (a row that finished runs one round more,
        unread); its plan is taken up by the next call."""
        runner, scheduler = self.runner, self.scheduler
        if self._ahead is not None:                   # enqueued by the last call
            plan, fetched = self._ahead
            sampled = []
        else:
            plan = scheduler.schedule()
            if self.seed is None and (plan.prefill or plan.bucket):
                self._seed(plan)
            sampled = self._prefill(plan)
            fetched = self._launch(plan) if plan.bucket else None
        ahead = scheduler.schedule_ahead() if plan.bucket else None
        self._ahead = (ahead, self._launch(ahead)) if ahead is not None else None
        decoded, seconds = [], 0.0
        if fetched is not None:
            out, launched = fetched
            decoded = out.wait()
            now = time.perf_counter()              # a step's time: from its launch, or the last step's tokens
            seconds, self._last_wait = now - max(launched, self._last_wait or launched), now
            if self.profiler is not None:
                self.profiler.after_step()
        rows = {seq: i for i, seq in enumerate(plan.rows[:plan.num_decode])}
        finished = []
        for seq, kept in scheduler.update(plan, decoded, sampled):
            request = self.requests[seq]
            row = rows.get(seq)
            if row is not None:
                request.step_seconds += seconds
                if seq.keep_slot and seq.slot is not None and len(kept) < len(decoded[row]):
                    runner.cut_round(seq.slot, len(kept))
            self._deliver(request, kept, row, plan.bucket)
            if seq.finished:
                finished.append(self._finish(request))
        if self._ahead is not None and not scheduler.running:
            finished += self.step()                   # nothing left to run ahead of: settle the step in flight
        if not scheduler.has_work:
            self._last_wait = None
            if self.profiler is not None:
                self.profiler.stop()
        return finished

    def _prefill(self, plan) -> list:
        """plan's prefill chunks on the runner; per chunk the first token sampled (its last chunk) or None."""
        runner, sampled, nvtx = self.runner, [], self.profiler is not None
        for chunk in plan.prefill:
            seq, request = chunk.seq, self.requests[chunk.seq]
            if not request.started:                   # it has just taken its slot
                s, request.started = seq.sampling, True
                runner.set_sampling(seq.slot, s.temperature, s.top_k, s.top_p)
            if nvtx:
                torch.cuda.nvtx.range_push(f"prefill[{chunk.end - chunk.start}]")
            if chunk.last:
                logits, token = runner.prefill(seq.slot, chunk.token_ids, chunk.start, True)
                sampled.append(int(token[0]))
                if request.logprobs is not None:
                    request.first_logits = logits[None].clone()
            else:
                runner.prefill(seq.slot, chunk.token_ids, chunk.start, False, next_id=seq.prompt_ids[chunk.end])
                sampled.append(None)
            if nvtx:
                torch.cuda.nvtx.range_pop()
        return sampled

    def _launch(self, plan):
        """Enqueue plan's decode step and the copy of its tokens: (the StepOutput to wait on, when)."""
        launched = time.perf_counter()
        if self.profiler is not None:
            self.profiler.before_step()
            torch.cuda.nvtx.range_push(f"step[B={plan.bucket},k={plan.k}]")
        self.runner.step(plan.slots)
        fetched = self.runner.fetch(plan.bucket)
        if self.profiler is not None:
            torch.cuda.nvtx.range_pop()
        return fetched, launched

    def _seed(self, plan):
        """Seed the sampler as the engine starts from idle (module docstring)."""
        queued = [c.seq for c in plan.prefill] + list(self.scheduler.waiting)
        seeds = [s.sampling.seed for s in queued if s.sampling.seed is not None]
        self.seed = seeds[0] if seeds else random.getrandbits(63)
        self.runner.set_seed(self.seed - 2**64 if self.seed >= 2**63 else self.seed)   # the int64 the buffer holds

    def _deliver(self, request: Request, tokens: list, row: int | None, bucket: int):
        """Hand tokens to the request's consumer one at a time; the consumer's stop ends the sequence there."""
        seq = request.seq
        before = len(seq.output_ids) - len(tokens)
        delivered = len(tokens)
        if request.on_tokens is not None:
            for i, t in enumerate(tokens):
                if request.on_tokens([t]):
                    delivered = i + 1
                    if delivered < len(tokens) or not seq.finished:
                        self.scheduler.finish(seq, keep=before + delivered)
                    break
        if request.logprobs is not None and delivered:
            if row is None:
                logits = request.first_logits
                request.first_logits = None
            else:
                logits = self.runner.step_logits(bucket)[row]
            request.logprobs.extend(token_logprobs(logits[:delivered], tokens[:delivered], seq.logprobs))

    def _finish(self, request: Request) -> Request:
        seq = request.seq
        stats = seq.stats
        stats.step_ms = 1e3 * request.step_seconds / stats.steps if stats.steps else 0.0
        request.result = GenerationResult(list(seq.output_ids), seq.finish_reason, stats, request.logprobs)
        if not seq.keep_slot:
            self.requests.pop(seq, None)
        return request

    # ------------------------------------------------------------------------------------------ profiling
    def profile_steps(self, count: int, warmup: int = PROFILE_WARMUP):
        """Bracket decode steps warmup+1 … warmup+count with the CUDA profiler's start and stop (cuda-python) and
        mark each step and prefill chunk with an NVTX range: `nsys profile -c cudaProfilerApi ...`."""
        if torch.device(self.runner.device).type != "cuda":
            raise ValueError("profiling steps needs the CUDA device")
        self.profiler = _Profiler(count, warmup, profiler_runtime())


def profiler_runtime():
    """cuda-python's runtime bindings (cudaProfilerStart / Stop), or a ValueError saying how to get them."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        raise ValueError("profiling steps needs cuda-python (pip install cuda-python): its cuda.bindings.runtime "
                         "starts and stops the CUDA profiler") from None
    return runtime
