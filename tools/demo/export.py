"""The demo model's architecture and its Hugging Face checkpoint layout (`models/demo/`).

The configuration is the Qwen3.5 text model scaled down: 8 layers in the 3:1 pattern (6 Gated DeltaNet + 2 gated
attention), untied embeddings, head_dim 64 with a quarter rotated (as 256 / 64 in the real model), GDN value
heads = 3 x key heads (r = 3 as in the 27B), one MTP layer. Text weights are saved under `model.*`, plus
`lm_head.weight` and `mtp.*` (which transformers ignores); bf16, except A_log and the GDN norm (fp32, as Qwen3.5).
Shards stay under SHARD_BYTES so every file can travel back from a GPU machine."""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

SHARD_BYTES = 12_000_000
FP32_TENSORS = ("linear_attn.A_log", "linear_attn.norm.weight")


def model_config(vocab_size: int, eot_id: int, im_end_id: int) -> dict:
    """config.json of a Qwen3_5ForCausalLM checkpoint (the keys transformers 5.x writes for qwen3_5_text)."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "dtype": "bfloat16",
        "vocab_size": vocab_size, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 8,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        "full_attention_interval": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "attn_output_gate": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "partial_rotary_factor": 0.25,
        "linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 8192, "tie_word_embeddings": False,
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
        "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "bos_token_id": eot_id, "eos_token_id": im_end_id, "pad_token_id": eot_id,
    }


def generation_config(eot_id: int, im_end_id: int) -> dict:
    # the Qwen3.5 thinking-coding preset (MODEL.md §8): this is a code model
    return {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
            "eos_token_id": [im_end_id, eot_id], "pad_token_id": eot_id, "bos_token_id": eot_id}


def special_ids(tokenizer_path: str) -> tuple[int, int, int]:
    """(vocab size, <|endoftext|> id, <|im_end|> id) of a tokenizer.json."""
    tok = Tokenizer.from_file(tokenizer_path)
    return tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")


def model_config_for(tokenizer_path: str) -> dict:
    return model_config(*special_ids(tokenizer_path))


def write_assets(out_dir: str, tokenizer_path: str) -> dict:
    """config.json, generation_config.json, tokenizer.json, tokenizer_config.json (ChatML + think template).
    Returns the config."""
    from engine.tokenizer import CHATML_TEMPLATE
    os.makedirs(out_dir, exist_ok=True)
    vocab, eot, im_end = special_ids(tokenizer_path)
    cfg = model_config(vocab, eot, im_end)
    files = {"config.json": cfg, "generation_config.json": generation_config(eot, im_end),
             "tokenizer_config.json": {
                 "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                 "bos_token": None, "add_bos_token": False, "model_max_length": cfg["max_position_embeddings"],
                 "clean_up_tokenization_spaces": False, "chat_template": CHATML_TEMPLATE.strip() + "\n"}}
    for name, content in files.items():
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(content, f, indent=2)
            f.write("\n")
    if os.path.abspath(tokenizer_path) != os.path.abspath(os.path.join(out_dir, "tokenizer.json")):
        shutil.copyfile(tokenizer_path, os.path.join(out_dir, "tokenizer.json"))
    return cfg


def checkpoint_name(param_name: str) -> str:
    """Our parameter name -> checkpoint tensor name (the inverse of layers.checkpoint.model_name)."""
    return param_name if param_name.startswith(("lm_head.", "mtp.")) else "model." + param_name


def write_weights(model, out_dir: str, dtype=torch.bfloat16) -> list[str]:
    """model.safetensors, or shards + model.safetensors.index.json when over SHARD_BYTES. Returns the file names."""
    tensors = {}
    for name, p in model.state_dict().items():
        target = torch.float32 if name.endswith(FP32_TENSORS) else dtype
        tensors[checkpoint_name(name)] = p.detach().to("cpu", target).contiguous()
    shards, size = [[]], 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    for stale in os.listdir(out_dir):
        if stale.startswith("model") and stale.endswith((".safetensors", ".index.json")):
            os.remove(os.path.join(out_dir, stale))
    if len(shards) == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        weight_map = {key: fname for fname, keys in zip(names, shards) for key in keys}
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    for fname, keys in zip(names, shards):
        save_file({k: tensors[k] for k in keys}, os.path.join(out_dir, fname), metadata={"format": "pt"})
    return names + (["model.safetensors.index.json"] if len(shards) > 1 else [])
