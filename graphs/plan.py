"""The static memory plan behind the captured graphs: what the weights, the per-sequence recurrent state (k+1
slots of the slot scheme, ENGINE.md §1.1), the widened conv windows and the fp8 KV cache cost for a model on a
hardware profile, and so how many sequences of what context fit. Pure arithmetic on the config."""
import json
import os
from dataclasses import dataclass

from layers.config import MAX_SPEC_K, ModelConfig

PROFILES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1}


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
    for field in ("name", "memory_gib", "bandwidth_GBps", "spec_k", "kv_dtype", "state_dtype", "batch_buckets"):
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
    buckets = profile["batch_buckets"]
    if not isinstance(buckets, list) or not buckets or not all(count(b) and b >= 1 for b in buckets):
        fail("batch_buckets", f"must be a non-empty list of batch sizes >= 1, got {buckets!r}")


@dataclass
class MemoryPlan:
    weight_bytes: int
    state_bytes_per_seq: int           # recurrent state slots + conv windows of every GDN layer
    kv_bytes_per_token: int            # target attention layers + the MTP layer
    max_context: int | None = None     # the model's max_position_embeddings: no sequence is planned longer

    def max_tokens(self, memory_bytes: int, batch: int, reserve: float = 0.1) -> int:
        """Context tokens per sequence that fit at this batch size, keeping `reserve` of memory for activations,
        at most max_context."""
        free = memory_bytes * (1 - reserve) - self.weight_bytes - batch * self.state_bytes_per_seq
        fit = max(0, int(free // (batch * self.kv_bytes_per_token)))
        return fit if self.max_context is None else min(fit, self.max_context)


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
                      kv_bytes_per_token=kv, max_context=cfg.max_position_embeddings)
