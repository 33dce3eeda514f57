"""The static memory plan behind the captured graphs: what the weights, the per-sequence recurrent state (k+1
slots of the slot scheme, ENGINE.md §1.1), the widened conv windows and the fp8 KV cache cost for a model on a
hardware profile, and so how many sequences of what context fit. Pure arithmetic on the config.

    plan(cfg, profile)                      the per-sequence / per-token figures (MemoryPlan)
    runner_parts(cfg, S, L, k, P, kv)       what graphs/buffers.Buffers allocates, by kind (runner_bytes: the sum)
    check_fit(cfg, profile, S, L, k, P)     weights + runner buffers + RESERVE_BYTES within the profile's memory,
                                            else a ValueError saying the largest max_len / max_seqs that fit
Profiles (profiles/<name>.json) also set prefill_chunk (the runner's max_prefill: prompt tokens a prefill pass
takes) and prefill_budget (prompt tokens the engine prefills between two decode steps)."""
import json
import os
from dataclasses import dataclass

from kernels.attention.common import PART_EXTRA
from kernels.int4 import MAX_ROWS
from kernels.sampler.common import Config as SamplerConfig
from layers.config import MAX_SPEC_K, ModelConfig

PROFILES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1}
RESERVE_BYTES = 1 << 30     # beside the plan: CUDA context, library workspaces, graph pools, allocator slack
GDN_CHUNK = 64              # graphs/buffers.GDN_CHUNK (its prefill workspace is sized in these)


def load_profile(name: str) -> dict:
    """profiles/<name>.json (or a path), its fields checked: ValueError naming the file and field."""
    path = name if name.endswith(".json") else os.path.join(PROFILES, name + ".json")
    try:
        with open(path) as f:
            profile = json.load(f)
    except FileNotFoundError:
        known = ", ".join(sorted(p[:-5] for p in os.listdir(PROFILES) if p.endswith(".json")))
        raise ValueError(f"hardware profile {name!r} not found (known: {known})") from None
    except (OSError, ValueError) as e:              # a directory, unreadable, not JSON
        raise ValueError(f"{path}: not a readable JSON profile: {e}") from None
    _check_profile(path, profile)
    return profile


def _check_profile(path: str, profile):
    def fail(field, why):
        raise ValueError(f"{path}: field '{field}': {why}")

    if not isinstance(profile, dict):
        raise ValueError(f"{path}: must be a JSON object")
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")  # noqa: E731
    count = lambda v: isinstance(v, int) and not isinstance(v, bool)                                  # noqa: E731
    for field in ("name", "memory_gib", "bandwidth_GBps", "spec_k", "kv_dtype", "state_dtype", "batch_buckets",
                  "prefill_chunk", "prefill_budget"):
        if field not in profile:
            fail(field, "missing")
    for field in ("memory_gib", "bandwidth_GBps"):
        if not number(profile[field]):
            fail(field, f"must be a positive number, got {profile[field]!r}")
    if not count(profile["spec_k"]) or not 0 <= profile["spec_k"] <= MAX_SPEC_K:
        fail("spec_k", f"must be an integer in [0, {MAX_SPEC_K}], got {profile['spec_k']!r}")
    for field in ("kv_dtype", "state_dtype"):
        if profile[field] not in BYTES:
            fail(field, f"{profile[field]!r} is not one of {', '.join(BYTES)}")
    for field in ("prefill_chunk", "prefill_budget"):
        if not count(profile[field]) or profile[field] < 1:
            fail(field, f"must be a positive integer (prompt tokens), got {profile[field]!r}")
    buckets = profile["batch_buckets"]
    if not isinstance(buckets, list) or not buckets or not all(count(b) and b >= 1 for b in buckets):
        fail("batch_buckets", f"must be a non-empty list of batch sizes >= 1, got {buckets!r}")
    by_bucket = profile.get("spec_k_by_bucket", {})       # optional: {"64": 1, …}, the others draft spec_k
    if not isinstance(by_bucket, dict):
        fail("spec_k_by_bucket", f"must be an object of bucket: drafts, got {by_bucket!r}")
    for b, k in by_bucket.items():
        if not (b.isdigit() and int(b) in buckets):
            fail("spec_k_by_bucket", f"{b!r} is not one of batch_buckets {buckets}")
        if not count(k) or not 0 <= k <= profile["spec_k"]:
            fail("spec_k_by_bucket", f"bucket {b}: drafts must be an integer in [0, spec_k = {profile['spec_k']}], "
                 f"got {k!r}")


def bucket_k(profile: dict) -> dict:
    """{bucket: drafts} of the profile's spec_k_by_bucket (the buckets it leaves out draft spec_k)."""
    return {int(b): k for b, k in profile.get("spec_k_by_bucket", {}).items()}


@dataclass
class MemoryPlan:
    """The plan's per-model figures (Fit turns them, with the runner's buffers, into what fits)."""
    weight_bytes: int
    state_bytes_per_seq: int           # recurrent state slots + conv windows of every GDN layer
    kv_bytes_per_token: int            # target attention layers + the MTP layer


def plan(cfg: ModelConfig, profile: dict, weight_bits: float = 4.25) -> MemoryPlan:
    """weight_bits: bits per body-linear weight (int4 + a fp16 scale per 128 = 4.125, plus int8 head/embed)."""
    k = profile["spec_k"]
    H, V = cfg.hidden_size, cfg.vocab_size
    gdn_layers = cfg.layer_types.count("linear_attention")
    attn_layers = cfg.num_hidden_layers - gdn_layers + cfg.mtp_num_hidden_layers
    per_attn = H * cfg.num_attention_heads * cfg.head_dim * 3 + 2 * H * cfg.num_key_value_heads * cfg.head_dim
    per_gdn = H * (cfg.linear_conv_dim + 2 * cfg.linear_value_dim)
    body = cfg.num_hidden_layers * 3 * H * cfg.intermediate_size + gdn_layers * per_gdn + attn_layers * per_attn
    heads = V * H * (1 if cfg.tie_word_embeddings else 2)
    state = BYTES[profile["state_dtype"]] * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    conv = 2 * cfg.linear_conv_dim * (cfg.linear_conv_kernel_dim - 1 + k)
    kv = BYTES[profile["kv_dtype"]] * 2 * cfg.num_key_value_heads * cfg.head_dim * attn_layers
    return MemoryPlan(weight_bytes=int(body * weight_bits / 8 + heads), state_bytes_per_seq=gdn_layers * ((k + 1) * state + conv),
                      kv_bytes_per_token=kv)


def _blocks(vocab: int) -> int:
    """The sampler's per-row block count, rounded up to a power of two (SamplerWorkspace.nbp)."""
    return 1 << (-(-vocab // SamplerConfig().block) - 1).bit_length()


def _sampler_bytes(rows: int, vocab: int) -> int:
    """kernels.sampler.SamplerWorkspace(rows, vocab)."""
    c = SamplerConfig()
    return 4 * (rows * (5 * _blocks(vocab) + 3 * c.levels * c.pivots + 7 * (c.levels + 1) + 2 * c.cap + 7) + 1)


def _rejection_bytes(S: int, k: int, V: int, Vd: int) -> int:
    """kernels.sampler.RejectionWorkspace(S, k, V, Vd)."""
    return (_sampler_bytes(S * (k + 1), V) + _sampler_bytes(S * k, Vd) + 8 * S * _blocks(V)
            + 4 * (S * (k + 1) + 2 * S + 1))


def runner_parts(cfg: ModelConfig, max_seqs: int, max_len: int, spec_k: int, max_prefill: int,
                 kv_dtype: str = "fp8_e4m3", num_sms: int = 132, draft_vocab: int = None, ks=()) -> dict:
    """Bytes graphs/buffers.Buffers allocates for these runner arguments, by kind: kv (attention layers, the MTP
    layer's when spec_k > 0), state (GDN state pools and conv windows), logits (target and draft, fp32),
    activations (row buffers for max(S·(k+1), max_prefill) rows, rope tables, attention partials, the GDN
    prefill workspace, the int4 linears' int64 sums), tables (per-slot and per-step), sampler (its workspaces).
    num_sms: the profile's "sms" (the attention partials are sized by it); draft_vocab: the drafts' head rows
    (default: the vocabulary); ks: the buckets' draft counts (bucket_k's values)."""
    S, k, H, V = max_seqs, spec_k, cfg.hidden_size, cfg.vocab_size
    Vd, T = draft_vocab or V, k + 1
    cap = -(-(max_len + T) // 64) * 64
    R = max(S * T, max_prefill)
    hq, hkv, d, rd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rotary_dim
    hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    C, K, I = cfg.linear_conv_dim, cfg.linear_conv_kernel_dim, cfg.intermediate_size
    gdn = cfg.layer_types.count("linear_attention")
    attn = cfg.num_hidden_layers - gdn + (1 if k else 0)
    n_proj = max(C + hv * dv + 2 * hv, 2 * hq * d + 2 * hkv * d) + 8
    nseg = max(1, min(64, 2 * num_sms // hkv))
    n = -(-max_prefill // GDN_CHUNK) * GDN_CHUNK
    acts = (2 * R * (5 * H + n_proj + C + max(hv * dv, hq * d) + 2 * hq * d + hkv * d + 3 * I) + 4 * (cap + R) * rd
            + 4 * S * hq * T * nseg * (d + PART_EXTRA) + hv * n * (2 * dk + 2 * dv + 4 * GDN_CHUNK)
            + 8 * MAX_ROWS * (n_proj + 2 * H + 2 * I))
    tables = (4 * (S + 1) * (7 + T) + 2 * (S + 1) * T * H + 4 * S * (17 + 4 * T) + 16 * R + 4 * max_prefill
              + 44)
    sampler = _sampler_bytes(S, V)
    if k:
        acts += 2 * R * 6 * H + 2 * S * (T + 1) * H
        tables += 4 * S * 5 * k
        sampler += _sampler_bytes(S, Vd) + sum(_rejection_bytes(S, d, V, Vd) for d in set(ks) | {k} if d)
    return {"kv": attn * (2 * S * hkv * cap * d * BYTES[kv_dtype] + (8 * hkv if BYTES[kv_dtype] == 1 else 0)),
            "state": gdn * (2 * S * T * hv * dk * dv + 2 * S * C * (K - 1 + k)),
            "logits": 4 * S * T * V + 4 * S * k * Vd, "activations": acts, "tables": tables, "sampler": sampler}


def runner_bytes(cfg: ModelConfig, max_seqs: int, max_len: int, spec_k: int, max_prefill: int,
                 kv_dtype: str = "fp8_e4m3", num_sms: int = 132, draft_vocab: int = None, ks=()) -> int:
    """Every static buffer of a ModelRunner(prepared, max_seqs, max_len, spec_k, max_prefill), in bytes."""
    return sum(runner_parts(cfg, max_seqs, max_len, spec_k, max_prefill, kv_dtype, num_sms, draft_vocab,
                            ks).values())


def _largest(fits, hi: int) -> int:
    """The largest n in [1, hi] with fits(n) (fits holds up to some n, then never), 0 if not even 1."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


class Fit:
    """The memory a runner configuration needs on a profile: weights (plan's estimate unless given) + the runner's
    buffers + RESERVE_BYTES. spec_k / prefill_chunk default to the profile's."""

    def __init__(self, cfg: ModelConfig, profile: dict, spec_k: int = None, prefill_chunk: int = None,
                 weight_bytes: int = None, body: str = "int4", memory_bytes: int = None, ks=()):
        """weight_bytes: the weights' size where known (a prepared directory's files), else the plan's estimate
        for `body` (int4 or bf16 body linears); memory_bytes: less than the profile's (a smaller device); ks: the
        buckets' draft counts where they differ from spec_k."""
        self.cfg, self.profile, self.ks = cfg, profile, tuple(ks)
        self.k = profile["spec_k"] if spec_k is None else spec_k
        self.chunk = profile["prefill_chunk"] if prefill_chunk is None else prefill_chunk
        bits = 16 if body == "bf16" else 4.25
        self.weights = plan(cfg, profile, weight_bits=bits).weight_bytes if weight_bytes is None else weight_bytes
        self.memory = int(profile["memory_gib"] * 2**30)
        if memory_bytes is not None:
            self.memory = min(self.memory, memory_bytes)

    def runner(self, max_seqs: int, max_len: int) -> int:
        return runner_bytes(self.cfg, max_seqs, max_len, self.k, self.chunk, self.profile["kv_dtype"],
                            self.profile.get("sms", 132), ks=self.ks)

    def needed(self, max_seqs: int, max_len: int) -> int:
        return self.weights + self.runner(max_seqs, max_len) + RESERVE_BYTES

    def fits(self, max_seqs: int, max_len: int) -> bool:
        return self.needed(max_seqs, max_len) <= self.memory

    def max_len(self, max_seqs: int) -> int:
        """The longest max_len (at most max_position_embeddings) that fits with max_seqs sequences; 0: none."""
        return _largest(lambda n: self.fits(max_seqs, n), self.cfg.max_position_embeddings)

    def max_seqs(self, max_len: int, limit: int = 1 << 16) -> int:
        return _largest(lambda s: self.fits(s, max_len), limit)

    def bucket(self, buckets, max_len: int) -> int:
        """The largest of `buckets` whose sequences fit at max_len tokens each, else the smallest."""
        return max((b for b in buckets if self.fits(b, max_len)), default=min(buckets))

    def check(self, max_seqs: int, max_len: int) -> int:
        """The bytes needed, or a ValueError saying what would fit instead."""
        need = self.needed(max_seqs, max_len)
        if need <= self.memory:
            return need
        gib = lambda n: f"{n / 2**30:.2f}"                                                    # noqa: E731
        by_len, by_seqs = self.max_len(max_seqs), self.max_seqs(max_len)
        raise ValueError(
            f"max_seqs {max_seqs} x max_len {max_len} (spec_k {self.k}, prefill chunk {self.chunk}) needs "
            f"{gib(need)} GiB (weights {gib(self.weights)}, runner buffers {gib(self.runner(max_seqs, max_len))}, "
            f"reserve {gib(RESERVE_BYTES)}), more than the {gib(self.memory)} GiB of {self.profile['name']}: "
            + (f"at max_seqs {max_seqs} at most max_len {by_len} fits" if by_len else
               f"no max_len fits at max_seqs {max_seqs}")
            + (f"; at max_len {max_len} at most max_seqs {by_seqs}" if by_seqs else
               f"; no max_seqs fits at max_len {max_len}") + self._without_drafting(max_seqs, max_len))

    def _without_drafting(self, max_seqs: int, max_len: int) -> str:
        """What spec_k 0 would fit (one GDN state slot a sequence instead of k + 1), where drafting is on."""
        if not self.k:
            return ""
        plain = Fit(self.cfg, self.profile, 0, self.chunk, self.weights, memory_bytes=self.memory)
        if plain.fits(max_seqs, max_len):
            return f"; without drafting (spec_k 0) max_seqs {max_seqs} x max_len {max_len} fits"
        by_len = plain.max_len(max_seqs)
        return f"; without drafting (spec_k 0) max_len {by_len} at max_seqs {max_seqs}" if by_len else ""
