"""The static memory plan behind the captured graphs: what the weights, the per-sequence recurrent state (k+1
slots of the slot scheme, ENGINE.md §1.1), the widened conv windows and the fp8 KV cache cost for a model on a
hardware profile, and so how many sequences of what context fit. Pure arithmetic on the config."""
import json
import os
from dataclasses import dataclass

from layers.config import ModelConfig

PROFILES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiles")
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8_e4m3": 1}


def load_profile(name: str) -> dict:
    path = name if name.endswith(".json") else os.path.join(PROFILES, name + ".json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        known = ", ".join(sorted(p[:-5] for p in os.listdir(PROFILES) if p.endswith(".json")))
        raise ValueError(f"hardware profile {name!r} not found (known: {known})") from None


@dataclass
class MemoryPlan:
    weight_bytes: int
    state_bytes_per_seq: int           # recurrent state slots + conv windows of every GDN layer
    kv_bytes_per_token: int            # target attention layers + the MTP layer

    def max_tokens(self, memory_bytes: int, batch: int, reserve: float = 0.1) -> int:
        """Context tokens per sequence that fit at this batch size, keeping `reserve` of memory for activations."""
        free = memory_bytes * (1 - reserve) - self.weight_bytes - batch * self.state_bytes_per_seq
        return max(0, int(free // (batch * self.kv_bytes_per_token)))


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
