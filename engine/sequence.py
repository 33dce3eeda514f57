"""One request's state in the continuous-batching engine (engine/scheduler.py writes it). Plain Python.

Context = prompt_ids + output_ids; its first num_cached tokens are in the caches of `slot` (KV row, k+1 GDN state
slots, conv window; ENGINE.md §1.1): the prompt prefilled so far, then, once running, all but `pending`, the last
token sampled. Status: WAITING -> PREFILLING -> RUNNING -> FINISHED with finish_reason "stop" (a stop id, or
Scheduler.finish), "length" (max_new_tokens or the slot's context) or "abort" (Scheduler.release). A finished
keep_slot sequence holds its slot and caches for a follow-up turn."""
import enum
from dataclasses import dataclass, field

from engine.generate import GenerationStats
from engine.logprobs import MAX_TOP_LOGPROBS
from engine.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    seq_id: object
    prompt_ids: list
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop_ids: frozenset = frozenset()  # ignore_eos empties it, as Engine.generate does
    ignore_eos: bool = False
    logprobs: int | None = None        # alternatives per token to report (engine/logprobs.py); None: none
    keep_slot: bool = False            # a conversation: keep slot and caches after finishing, for the next turn
    # Set by the scheduler.
    status: Status = Status.WAITING
    finish_reason: str | None = None
    slot: int | None = None
    output_ids: list = field(default_factory=list)
    num_cached: int = 0
    cached_prompt_tokens: int = 0      # prompt tokens a follow-up turn found in its slot's caches (not prefilled)
    stats: GenerationStats = field(default_factory=GenerationStats)
    arrival: int = -1                  # order of add()
    queued_at: float = 0.0             # the scheduler's clock at add()
    prefill_started: float = 0.0
    decode_started: float = 0.0        # when the first token came: time to first token = decode_started - queued_at

    def __post_init__(self):
        def fail(name, why):
            raise ValueError(f"sequence {self.seq_id!r}: {name} {why}")

        integer = lambda v, low: isinstance(v, int) and not isinstance(v, bool) and v >= low   # noqa: E731
        prompt = self.prompt_ids
        if not isinstance(prompt, list) or not prompt or not all(integer(t, 0) for t in prompt):
            fail("prompt_ids", "must be a non-empty list of token ids >= 0")
        if not integer(self.max_new_tokens, 1):
            fail("max_new_tokens", f"must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.logprobs is not None and not (integer(self.logprobs, 0) and self.logprobs <= MAX_TOP_LOGPROBS):
            fail("logprobs", f"must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        if not all(integer(t, 0) for t in self.stop_ids):
            fail("stop_ids", f"must be token ids >= 0, got {sorted(map(repr, self.stop_ids))}")
        self.sampling.validate()
        self.stop_ids = frozenset() if self.ignore_eos else frozenset(self.stop_ids)
        self.stats.prompt_tokens = len(self.prompt_ids)

    @property
    def pending(self) -> int | None:
        """The sampled token not yet in the caches (None before the first one)."""
        return self.output_ids[-1] if self.output_ids else None

    @property
    def context(self) -> list:
        return self.prompt_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
