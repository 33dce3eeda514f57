"""Loading a Hugging Face checkpoint directory: safetensors only (one file, or shards listed in
`model.safetensors.index.json`), tensors streamed to the target device one at a time.

Every header is checked before any tensor is read, so a missing, unexpected or wrong-shaped tensor stops the load
before work is done; a tensor that cannot be read stops it too. The model is only returned when every parameter
was filled: nothing half-loaded is ever used."""
import json
import os
import warnings

import torch
from safetensors import SafetensorError, safe_open

from layers.config import ModelConfig
from layers.model import Qwen35Model

FP32_TENSORS = ("linear_attn.A_log", "linear_attn.norm.weight")   # bf16 or fp32 in checkpoints; kept in fp32
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")                        # what load_model reads (safetensors' names)


class CheckpointError(ValueError):
    pass


def model_name(key: str) -> str | None:
    """Checkpoint tensor name -> our parameter name; None for tensors this engine skips (the vision tower)."""
    if key.startswith("model.visual."):
        return None
    for prefix in ("model.language_model.", "model."):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key                             # lm_head.weight, mtp.*


def shard_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid index (needs a 'weight_map' object): {e}") from None
        files = sorted(set(weight_map.values()))
    elif os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        found = sorted(f for f in os.listdir(model_dir) if f.endswith((".bin", ".pt", ".pth", ".ckpt")))
        hint = f" (found {', '.join(found)}: pickle formats are not loaded, convert them to safetensors)" if found else ""
        raise CheckpointError(f"{model_dir}: no model.safetensors or model.safetensors.index.json{hint}")
    paths = [os.path.join(model_dir, f) for f in files]
    for p in paths:
        if not os.path.exists(p):
            raise CheckpointError(f"{p}: listed in the index but missing")
    return paths


def read_headers(paths: list[str]) -> dict:
    """name -> (file, checkpoint key, shape, safetensors dtype name) for every tensor the model uses."""
    found = {}
    for path in paths:
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    name = model_name(key)
                    if name is None:
                        continue
                    if name in found:
                        raise CheckpointError(f"{path}: tensor '{key}' also appears in {found[name][0]}")
                    s = f.get_slice(key)
                    found[name] = (path, key, tuple(s.get_shape()), s.get_dtype())
        except SafetensorError as e:
            raise CheckpointError(f"{path}: unreadable safetensors file: {e}") from None
    return found


def _quantized(model_dir: str) -> str:
    """Why a tensor this loader cannot take is there, when config.json's quantization_config says (a quantised
    checkpoint's packed weights, zero points, g_idx): a clause for the error, else ''."""
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            method = (json.load(f).get("quantization_config") or {}).get("quant_method")
    except (OSError, ValueError, AttributeError):
        method = None
    return f"; config.json's quantization_config is {method!r}: quantised checkpoints are not loaded" if method else ""


def _check_tied_head(head, embed):
    """... unless the file's lm_head.weight differs from embed_tokens (an untied export left so): transformers then
    unties them; dropping the head would run another model without a word, so refuse."""
    (head_path, head_key, *_), (embed_path, embed_key, *_) = head, embed or head
    with safe_open(head_path, framework="pt") as f, safe_open(embed_path, framework="pt") as g:
        if not torch.equal(f.get_tensor(head_key), g.get_tensor(embed_key)):
            raise CheckpointError(f"{head_path}: tensor '{head_key}' differs from '{embed_key}' but config.json sets "
                                  "tie_word_embeddings true (set it false to use this head)")


def checked_headers(model_dir: str, with_mtp: bool = True, dtypes=FLOAT_DTYPES) -> tuple[Qwen35Model, dict]:
    """Every header checked against the config's model, before any tensor is read: (the model on the meta device,
    its mtp None when not asked for or absent from the checkpoint, {parameter name: (file, checkpoint key, shape,
    dtype)} of exactly the tensors to load, each of one of `dtypes`; a tied head's lm_head.weight, equal to the
    embedding, left out)."""
    cfg = ModelConfig.from_dir(model_dir)
    with torch.device("meta"):
        model = Qwen35Model(cfg, with_mtp=with_mtp)
    expected = {n: tuple(p.shape) for n, p in model.named_parameters()}
    found = read_headers(shard_files(model_dir))
    if cfg.tie_word_embeddings and "lm_head.weight" in found:     # tied: the embedding is the head ...
        _check_tied_head(found["lm_head.weight"], found.get("embed_tokens.weight"))
        found.pop("lm_head.weight")
    mtp_names = [n for n in expected if n.startswith("mtp.")]
    if model.mtp is not None and not any(n in found for n in mtp_names):
        warnings.warn(f"{model_dir}: config asks for an MTP layer but the checkpoint has no mtp.* tensors; "
                      "speculative decoding is off")
        model.mtp = None
        expected = {n: s for n, s in expected.items() if not n.startswith("mtp.")}
    if not with_mtp or model.mtp is None:
        found = {n: v for n, v in found.items() if not n.startswith("mtp.")}

    for name, (path, key, shape, dtype) in found.items():
        if name not in expected:
            raise CheckpointError(f"{path}: unexpected tensor '{key}' (no such parameter in this model"
                                  f"{_quantized(model_dir)})")
        if shape != expected[name]:
            raise CheckpointError(f"{path}: tensor '{key}' has shape {list(shape)}, expected {list(expected[name])}")
        if dtype not in dtypes:
            raise CheckpointError(f"{path}: tensor '{key}' has dtype {dtype}; expected {'/'.join(dtypes)} "
                                  "(quantised checkpoints are not loaded)")
    missing = [n for n in expected if n not in found]
    if missing:
        raise CheckpointError(f"{model_dir}: missing tensor(s) {', '.join(missing[:5])}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return model, found


def by_file(found: dict) -> dict:
    """checked_headers' tensors grouped by file: {path: [(name, key, shape, dtype)]}, to open each file once."""
    out = {}
    for name, (path, *rest) in found.items():
        out.setdefault(path, []).append((name, *rest))
    return out


def load_model(model_dir: str, device="cpu", dtype=torch.bfloat16, with_mtp: bool = True) -> Qwen35Model:
    model, found = checked_headers(model_dir, with_mtp)
    for path, items in by_file(found).items():
        with safe_open(path, framework="pt") as f:
            for name, key, *_ in items:
                try:
                    tensor = f.get_tensor(key)
                except Exception as e:       # truncated or corrupt data
                    raise CheckpointError(f"{path}: tensor '{key}' could not be read: {e}") from None
                target = torch.float32 if name.endswith(FP32_TENSORS) else dtype
                owner, _, leaf = name.rpartition(".")
                model.get_submodule(owner)._parameters[leaf] = torch.nn.Parameter(
                    tensor.to(device=device, dtype=target), requires_grad=False)
    return model.eval()
