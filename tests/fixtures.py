"""Tiny real-layout checkpoints written by transformers (ASSETS.md §4), with hand-made mtp.* tensors and a
byte-level tokenizer, for tests that compare our engine with transformers."""
import json
import os

import torch
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

BASE = dict(
    vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                     "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    mtp_num_hidden_layers=1,
)

# Three configurations that differ in every dimension the model has: layout, tying, layer pattern, head counts,
# head dims (GDN key and value dims differ in two), conv kernel and rotary fraction.
CONFIGS = {
    "vl-untied": dict(layout="vl"),
    "text-tied": dict(layout="text", tie_word_embeddings=True, hidden_size=48, num_hidden_layers=5,
                      layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention",
                                   "linear_attention"],
                      num_attention_heads=6, num_key_value_heads=2, head_dim=32,
                      linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8,
                      linear_value_head_dim=24, linear_conv_kernel_dim=3,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5,
                                       "mrope_section": [3, 3, 2], "mrope_interleaved": True}),
    "vl-interval2": dict(layout="vl", hidden_size=40, num_hidden_layers=4, full_attention_interval=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16,
                         linear_value_head_dim=8, intermediate_size=72,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                          "mrope_section": [1, 0, 0], "mrope_interleaved": True}),
}


def randomise(model, seed):
    """HF inits (1+w) norms to 0 and the GDN norm to 1: randomise every weight, 1-D ones included (MODEL.md §9)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)
            elif name.endswith("dt_bias"):
                p.copy_(r * 0.5)
            else:
                p.copy_(r * (0.3 if p.ndim == 1 else 0.2))
    return model


def mtp_tensors(text, seed):
    """mtp.* for a config (transformers writes none): one full-attention decoder layer + fc + three norms."""
    H, I = text["hidden_size"], text["intermediate_size"]
    nh, nkv, hd = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    g = torch.Generator().manual_seed(seed)
    shapes = {"fc.weight": (H, 2 * H), "norm.weight": (H,), "pre_fc_norm_embedding.weight": (H,),
              "pre_fc_norm_hidden.weight": (H,), "layers.0.input_layernorm.weight": (H,),
              "layers.0.post_attention_layernorm.weight": (H,),
              "layers.0.self_attn.q_proj.weight": (2 * nh * hd, H), "layers.0.self_attn.k_proj.weight": (nkv * hd, H),
              "layers.0.self_attn.v_proj.weight": (nkv * hd, H), "layers.0.self_attn.o_proj.weight": (H, nh * hd),
              "layers.0.self_attn.q_norm.weight": (hd,), "layers.0.self_attn.k_norm.weight": (hd,),
              "layers.0.mlp.gate_proj.weight": (I, H), "layers.0.mlp.up_proj.weight": (I, H),
              "layers.0.mlp.down_proj.weight": (H, I)}
    return {"mtp." + n: torch.randn(s, generator=g) * (0.3 if len(s) == 1 else 0.2) for n, s in shapes.items()}


def write_tokenizer(model_dir, vocab_size):
    """Byte-level tokenizer: 256 byte tokens, then the Qwen special tokens (ids 256…260)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    assert tok.get_vocab_size() <= vocab_size
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95,
                   "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}, f)


def make_tiny_checkpoint(model_dir, layout="vl", seed=0, mtp=True, tokenizer=True, **overrides):
    """Write a random tiny checkpoint. layout "vl": Qwen3_5ForConditionalGeneration (model.language_model.*,
    model.visual.*); "text": Qwen3_5ForCausalLM (model.*). tokenizer=False for vocabularies under 261 ids.
    Returns model_dir."""
    from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig
    text = {**BASE, **overrides}
    torch.manual_seed(seed)
    if layout == "vl":
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                      patch_size=16, temporal_patch_size=2, spatial_merge_size=2)
        cfg = Qwen3_5Config(text_config=text, vision_config=vision,
                            tie_word_embeddings=text["tie_word_embeddings"])
        model = Qwen3_5ForConditionalGeneration(cfg)
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text))
    randomise(model, seed).save_pretrained(model_dir)
    if mtp:
        path = os.path.join(model_dir, "model.safetensors")
        tensors = load_file(path)
        tensors.update(mtp_tensors(text, seed + 1))
        save_file(tensors, path, metadata={"format": "pt"})
    if tokenizer:
        write_tokenizer(model_dir, text["vocab_size"])
    return model_dir


def reference_model(model_dir, dtype=torch.float32):
    """transformers' Qwen3_5ForCausalLM for the checkpoint (ignores mtp.* and the vision tower)."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def rel_err(out, ref) -> float:
    """Relative error of a kernel output against its reference, in the 2-norm over all elements (fp32)."""
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def edit_safetensors(path: str, fn) -> str:
    """Rewrite a safetensors file after fn(tensors) edits its {name: tensor} dict in place."""
    tensors = load_file(path)
    fn(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    return path


def edit_json(path: str, fn) -> str:
    """Rewrite a JSON file after fn(obj) edits it in place."""
    with open(path) as f:
        obj = json.load(f)
    fn(obj)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path
