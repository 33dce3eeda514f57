"""Log-probabilities of generated tokens (the OpenAI `logprobs` fields), and their two response shapes.

A token's log-probability is taken from the target model's raw logits at its position — before temperature, top-k
and top-p, as vLLM reports them by default (logprobs_mode raw_logprobs) — so the numbers describe the model, not
the sampling settings, and a greedy request gets real values rather than 0. With drafting, the rows are the verify
step's: the same distribution the emitted token was judged by."""
import codecs
from dataclasses import dataclass

import torch

from engine.sampling import saturate

MAX_TOP_LOGPROBS = 20          # alternatives per token a request may ask for (OpenAI's and vLLM's default limit)
MIN_LOGPROB = -9999.0          # the least value reported (vLLM's floor): JSON has no -Infinity


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple                 # ((token id, logprob), ...), most likely first


def token_logprobs(logits: torch.Tensor, tokens: list, n: int) -> list:
    """logits [T, V], the rows that produced tokens [T] -> a TokenLogprob each, with the n most likely tokens. Logits
    are read as the sampler reads them (+inf saturates, NaN is −inf: engine/sampling.scaled_logits) and values kept
    at MIN_LOGPROB or above, so every number is finite (a +inf logit made the whole row NaN, a −inf one −inf: neither
    is JSON)."""
    lp = saturate(logits).log_softmax(-1).clamp_min(MIN_LOGPROB)
    chosen = lp.gather(-1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    top_lp, top_id = lp.topk(n, -1)
    return [TokenLogprob(t, c, tuple(zip(i, v))) for t, c, i, v in zip(tokens, chosen, top_id.tolist(), top_lp.tolist())]


def chat_logprobs(tokenizer, entries: list) -> dict:
    """choices[].logprobs of a chat completion: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    def one(token, logprob):
        raw = tokenizer.token_bytes(token)
        return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}
    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries]}


def completion_logprobs(tokenizer, entries: list) -> dict:
    """choices[].logprobs of a text completion: tokens, token_logprobs, top_logprobs (text -> logprob, the sampled
    token always among them) and text_offset (where each token's text starts in the generated text)."""
    text = lambda t: tokenizer.token_bytes(t).decode("utf-8", "replace")      # noqa: E731
    raws = [tokenizer.token_bytes(e.token) for e in entries]
    tokens = [raw.decode("utf-8", "replace") for raw in raws]
    decoder, offsets, chars = codecs.getincrementaldecoder("utf-8")("replace"), [], 0
    for raw in raws:        # a character split over tokens counts where it completes, as in the returned text
        offsets.append(chars)
        chars += len(decoder.decode(raw))
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{**{text(t): v for t, v in e.top}, token: e.logprob} for e, token in zip(entries, tokens)],
            "text_offset": offsets}
