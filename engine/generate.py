"""Eager generation, one sequence at a time: prefill, then either plain decode or MTP-k speculative rounds
(MODEL.md §5.1). The same loop serves greedy and sampled decoding; exactness comes from engine.sampling.

A round, with L committed tokens and the pending token t0 (sampled, not yet in the caches):
  verify  the target runs [t0, d1…dk] at positions L…L+k, keeping the GDN state after every token;
  accept  a drafts are accepted, t* is the correction (or the bonus when a = k): a+1 tokens are emitted;
  commit  caches keep L+a+1 tokens (GDN state := state after token a; KV length := L+a+1);
  draft   the MTP re-runs rows 0…a with ids [d1…da, t*] and the verify hiddens (rebuilding its KV), row a gives
          d1', then k−1 chained steps feed each draft and the MTP's own output back in."""
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.logprobs import MAX_TOP_LOGPROBS, token_logprobs
from engine.sampling import SamplingParams, accept_drafts, next_token, probabilities, sample


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated: int = 0
    steps: int = 0                     # target forward passes after the prefill
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    step_ms: float | None = None       # the graph engine: mean time of the decode steps the sequence was in

    def count_round(self, drafted: int, accepted: int):
        """One verify round: `drafted` drafts proposed, the first `accepted` of them output (accepted drafts past a
        stop or the length limit are not)."""
        self.drafted += drafted
        self.accepted += accepted
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first (which the prefill produces) per second of decoding."""
        return (self.generated - 1) / self.decode_seconds if self.decode_seconds > 0 and self.generated > 1 else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.generated - 1) / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "generated": self.generated, "steps": self.steps,
                "drafted": self.drafted, "accepted": self.accepted,
                "accepted_per_position": list(self.accepted_per_position),
                "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None,
                "tokens_per_step": round(self.tokens_per_step, 3),
                "prefill_seconds": round(self.prefill_seconds, 4), "decode_seconds": round(self.decode_seconds, 4),
                "prompt_tokens_per_second": round(self.prompt_tokens_per_second, 2),
                "tokens_per_second": round(self.tokens_per_second, 2),
                **({} if self.step_ms is None else {"step_ms": round(self.step_ms, 3)})}


@dataclass
class GenerationResult:
    token_ids: list                    # generated ids only; a stop id that ended generation is included
    finish_reason: str                 # "stop" | "length"
    stats: GenerationStats
    logprobs: list | None = None       # a TokenLogprob per generated token, when asked for


class Generator:
    def __init__(self, model):
        self.model = model
        self.device = model.embed_tokens.weight.device

    @torch.no_grad()
    def generate(self, prompt_ids: list, max_new_tokens: int, sampling: SamplingParams, *, stop_ids=(),
                 spec_k: int = 4, on_tokens: Callable[[list], bool | None] | None = None,
                 logprobs: int | None = None) -> GenerationResult:
        """logprobs: None, or record each generated token's log-probability and its `logprobs` most likely
        alternatives (engine/logprobs.py)."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sampling.validate()
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {logprobs}")
        model, stats = self.model, GenerationStats(prompt_tokens=len(prompt_ids))
        k = spec_k if model.mtp is not None else 0
        stats.accepted_per_position = [0] * k
        limit = model.cfg.max_position_embeddings
        if len(prompt_ids) + max_new_tokens > limit:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                             f"model's max_position_embeddings ({limit})")
        gen = torch.Generator(self.device)
        if sampling.seed is None:
            gen.seed()                   # fresh entropy for this generator only; torch.seed() would reseed torch's own
        else:
            gen.manual_seed(sampling.seed)
        cache = model.new_cache(1, len(prompt_ids) + max_new_tokens + k + 1)
        out, stop_ids = [], set(stop_ids)
        out_logprobs = None if logprobs is None else []

        def emit(tokens, logits):
            """Append tokens in order up to a stop id, the length limit or on_tokens' request to stop — handed them
            one at a time, so where a caller stops does not depend on how many a step emits (spec_k); logits
            [len(tokens), V] are the rows that produced them. The finish reason, or None to go on."""
            reason, before = None, len(out)
            for t in tokens:
                out.append(t)
                reason = "stop" if t in stop_ids else "length" if len(out) == max_new_tokens else None
                if on_tokens is not None and on_tokens([t]) and reason is None:
                    reason = "stop"
                if reason:
                    break
            if out_logprobs is not None:
                out_logprobs.extend(token_logprobs(logits[:len(out) - before], out[before:], logprobs))
            return reason

        t_start = time.perf_counter()
        ids = torch.tensor([prompt_ids], device=self.device)
        hidden = model(ids, cache)
        logits = model.logits(hidden[:, -1])                              # [1, V]
        t0 = next_token(logits, sampling, gen)                            # [1]
        drafts = draft_probs = None
        if k:
            y = model.mtp_forward(torch.cat([ids[:, 1:], t0[:, None]], 1), hidden, cache)
            drafts, draft_probs = self._draft(y[:, -1:], cache, k, sampling, gen)
        stats.prefill_seconds = time.perf_counter() - t_start
        reason = emit([t0.item()], logits)

        t_start = time.perf_counter()
        while reason is None:
            stats.steps += 1
            if not k:
                logits = model.logits(model(t0[:, None], cache))[:, -1]
                t0 = next_token(logits, sampling, gen)
                reason = emit([t0.item()], logits)
                continue
            hidden = model(torch.cat([t0[:, None], drafts], 1), cache, keep_states=True)   # [1, k+1, H]
            logits = model.logits(hidden)                                 # [1, k+1, V]
            accepted, t_next = accept_drafts(logits, drafts, draft_probs, sampling, gen)
            a = accepted.item()
            cache.commit(a + 1)
            before = len(out)
            reason = emit(drafts[0, :a].tolist() + [t_next.item()], logits[0])
            stats.count_round(k, min(a, len(out) - before))
            if reason is None:
                y = model.mtp_forward(torch.cat([drafts[:, :a], t_next[:, None]], 1), hidden[:, :a + 1], cache)
                drafts, draft_probs = self._draft(y[:, -1:], cache, k, sampling, gen)
            t0 = t_next
        stats.decode_seconds = time.perf_counter() - t_start
        stats.generated = len(out)
        return GenerationResult(out, reason, stats, out_logprobs)

    def _draft(self, y, cache, k, sampling, gen):
        """k drafts from the MTP output y [1, 1, H] of the last committed row; chained steps write provisional MTP KV
        that the next round's rebuild overwrites. Returns drafts [1, k] and their distributions [1, k, V]."""
        model, committed = self.model, cache.mtp.length
        drafts, dists = [], []
        for j in range(k):
            logits = model.logits(y[:, -1])                              # [1, V]
            if sampling.greedy:
                d, q = next_token(logits, sampling, gen), None                # the target's argmax rule (NaN)
            else:
                q = probabilities(logits, sampling)
                d = sample(q, gen)
            drafts.append(d)
            dists.append(q)
            if j + 1 < k:
                y = model.mtp_forward(d[:, None], y, cache)
        cache.mtp.length = committed
        return torch.stack(drafts, 1), (None if sampling.greedy else torch.stack(dists, 1))
