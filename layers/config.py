"""Model configuration: the text part of a dense Qwen3.5 / 3.6 / 3.8 `config.json` (MODEL.md §1).

Accepts the release layout (`Qwen3_5ForConditionalGeneration`, nested `text_config`) and the text-only layout
(`Qwen3_5ForCausalLM`, `model_type: qwen3_5_text`, flat). Anything this engine cannot run fails here, with the
offending field named, rather than as a shape error deep inside the model."""
import json
import os
from dataclasses import dataclass

SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
LAYER_TYPES = ("linear_attention", "full_attention")
MAX_SPEC_K = 16              # MTP drafts a step may take: each costs a draft pass; beyond a few, acceptance is ~0


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple                   # "linear_attention" (Gated DeltaNet) | "full_attention", one per layer
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dim: int                      # first rotary_dim dims of each head are rotated (partial RoPE)
    rope_theta: float
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    mtp_num_hidden_layers: int
    max_position_embeddings: int

    @property
    def num_hidden_layers(self) -> int:
        return len(self.layer_types)

    @property
    def linear_key_dim(self) -> int:     # q and k width of a GDN layer
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:    # channels of the GDN causal conv: [q | k | v]
        return 2 * self.linear_key_dim + self.linear_value_dim

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        def fail(field, why):
            raise ConfigError(f"{source}: field '{field}': {why}")

        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            fail("model_type", f"{model_type!r} is not supported (expected one of {SUPPORTED_MODEL_TYPES})")
        text = raw.get("text_config", raw) if model_type == "qwen3_5" else raw
        if not isinstance(text, dict):
            fail("text_config", "must be an object")
        prefix = "text_config." if text is not raw else ""
        for field in ("num_experts", "num_local_experts", "moe_intermediate_size"):
            if text.get(field):
                fail(prefix + field, "mixture-of-experts models are not supported (dense family only)")

        def get(field, default=None, kind=int):
            value = text.get(field, default)
            if value is None:
                fail(prefix + field, "missing")
            if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                fail(prefix + field, f"must be a positive integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                fail(prefix + field, f"must be a positive number, got {value!r}")
            return value

        n_layers = get("num_hidden_layers")
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = get("full_attention_interval", 4)
            layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            fail(prefix + "layer_types", f"must list {n_layers} layer types")
        for i, lt in enumerate(layer_types):
            if lt not in LAYER_TYPES:
                fail(f"{prefix}layer_types[{i}]", f"unknown layer type {lt!r}")

        rope_key = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
        rope = text.get(rope_key) or {}
        if not isinstance(rope, dict):
            fail(prefix + rope_key, f"must be an object, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            fail(prefix + "rope_parameters.rope_type", f"{rope_type!r} is not supported")

        def number(field, default):             # rope_parameters' own value, else the top-level one
            where, value = (f"{rope_key}.{field}", rope[field]) if field in rope else (field, text.get(field, default))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                fail(prefix + where, f"must be a positive number, got {value!r}")
            return value

        theta, frac = number("rope_theta", 10000.0), number("partial_rotary_factor", 1.0)
        heads = get("num_attention_heads")
        head_dim = get("head_dim", get("hidden_size") // heads)
        rotary_dim = int(head_dim * frac)
        if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
            fail(prefix + "partial_rotary_factor", f"gives rotary dim {rotary_dim} for head_dim {head_dim}; must be even")
        kv_heads = get("num_key_value_heads")
        if heads % kv_heads:
            fail(prefix + "num_key_value_heads", f"{kv_heads} does not divide num_attention_heads {heads}")
        lk, lv = get("linear_num_key_heads"), get("linear_num_value_heads")
        if lv % lk:
            fail(prefix + "linear_num_value_heads", f"{lv} is not a multiple of linear_num_key_heads {lk}")
        if text.get("attn_output_gate", True) is not True:
            fail(prefix + "attn_output_gate", "only gated attention (true) is supported")
        gate_type = text.get("output_gate_type", "swish")
        if gate_type not in ("swish", "silu"):
            fail(prefix + "output_gate_type", f"{gate_type!r} is not supported (swish)")
        if text.get("hidden_act", "silu") != "silu":
            fail(prefix + "hidden_act", f"{text.get('hidden_act')!r} is not supported (silu)")
        if text.get("attention_bias", False):
            fail(prefix + "attention_bias", "biases are not supported")
        mtp = text.get("mtp_num_hidden_layers", 0) or 0
        if isinstance(mtp, bool) or mtp not in (0, 1):
            fail(prefix + "mtp_num_hidden_layers", f"{mtp}: only 0 or 1 MTP layer is supported")
        if text.get("mtp_use_dedicated_embeddings", False):
            fail(prefix + "mtp_use_dedicated_embeddings", "dedicated MTP embeddings are not supported")
        tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        if not isinstance(tie, bool):       # bool("false") is True: the embedding would replace lm_head silently
            fail(("" if "tie_word_embeddings" in raw else prefix) + "tie_word_embeddings",
                 f"must be true or false, got {tie!r}")
        return cls(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"), intermediate_size=get("intermediate_size"),
            layer_types=tuple(layer_types), num_attention_heads=heads, num_key_value_heads=kv_heads,
            head_dim=head_dim, rotary_dim=rotary_dim, rope_theta=float(theta),
            linear_num_key_heads=lk, linear_num_value_heads=lv,
            linear_key_head_dim=get("linear_key_head_dim"), linear_value_head_dim=get("linear_value_head_dim"),
            linear_conv_kernel_dim=get("linear_conv_kernel_dim", 4), rms_norm_eps=get("rms_norm_eps", 1e-6, float),
            tie_word_embeddings=tie, mtp_num_hidden_layers=mtp,
            max_position_embeddings=get("max_position_embeddings", 262144))

    @property
    def linear_shapes(self) -> dict:
        """The body's fused linears as {name: (N, K)} (out features, in features), one layer's worth each."""
        h, q_heads, kv_heads, d = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        return {"gdn_in_proj_qkvz": (2 * self.linear_key_dim + 2 * self.linear_value_dim, h),
                "out_proj": (h, self.linear_value_dim),
                "attn_qkv_gate": (2 * q_heads * d + 2 * kv_heads * d, h),
                "mlp_gate_up": (2 * self.intermediate_size, h),
                "mlp_down": (h, self.intermediate_size)}

    @classmethod
    def from_dir(cls, model_dir: str) -> "ModelConfig":
        path = os.path.join(model_dir, "config.json")
        if os.path.exists(model_dir) and not os.path.isdir(model_dir):
            raise ConfigError(f"{model_dir}: a file, not a model directory")
        try:
            return cls.from_file(path)
        except FileNotFoundError:
            raise ConfigError(f"{path}: not found (is {model_dir!r} a model directory?)") from None

    @classmethod
    def from_file(cls, path: str) -> "ModelConfig":
        """A config.json at `path`; FileNotFoundError if there is none, ConfigError naming what else is wrong."""
        try:
            with open(path) as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid JSON: {e}") from None
        except OSError as e:                       # a directory, unreadable
            raise ConfigError(f"{path}: cannot be read: {e.strerror}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: must hold a JSON object")
        return cls.from_dict(raw, path)


QWEN38_27B = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "qwen3.8-27b.json")


def qwen38_27b() -> ModelConfig:
    """The Qwen3.8-27B shape (configs/qwen3.8-27b.json): what benchmarks and shape tests run at."""
    return ModelConfig.from_file(QWEN38_27B)
