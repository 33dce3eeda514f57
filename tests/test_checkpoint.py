"""Loader and config errors: each names what is wrong (file, tensor, field) and nothing half-loaded is returned."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from layers.checkpoint import CheckpointError, load_model
from layers.config import ConfigError, ModelConfig
from tests.fixtures import edit_json, edit_safetensors, make_tiny_checkpoint


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("src")), seed=1)


@pytest.fixture
def ckpt(source, tmp_path):
    return shutil.copytree(source, str(tmp_path / "ckpt"))


def edit_tensors(model_dir, fn):
    return edit_safetensors(os.path.join(model_dir, "model.safetensors"), fn)


def edit_config(model_dir, fn):
    return edit_json(os.path.join(model_dir, "config.json"), fn)


def test_loads_release_layout_and_keeps_fp32_tensors(ckpt):
    def to_bf16(t):
        for name in t:
            if name.endswith(("A_log", "linear_attn.norm.weight")):
                t[name] = t[name].bfloat16()
    edit_tensors(ckpt, to_bf16)
    model = load_model(ckpt, dtype=torch.bfloat16)
    gdn = model.layers[0].linear_attn
    assert gdn.A_log.dtype == gdn.norm.weight.dtype == torch.float32
    assert model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16 and model.mtp is not None
    assert not any(p.is_meta for p in model.parameters())


def test_sharded_checkpoint_loads_same_weights(ckpt, tmp_path):
    tensors = load_file(os.path.join(ckpt, "model.safetensors"))
    os.remove(os.path.join(ckpt, "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, os.path.join(ckpt, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(ckpt, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    model = load_model(ckpt, dtype=torch.float32)
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])
    assert torch.equal(model.mtp.fc.weight, tensors["mtp.fc.weight"])


def test_missing_tensor(ckpt):
    edit_tensors(ckpt, lambda t: t.pop("model.language_model.layers.2.linear_attn.in_proj_z.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) layers\.2\.linear_attn\.in_proj_z\.weight"):
        load_model(ckpt)


def test_unexpected_tensor(ckpt):
    path = edit_tensors(ckpt, lambda t: t.update({"model.language_model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=f"{path}: unexpected tensor 'model.language_model.layers.0.extra.weight'"):
        load_model(ckpt)


def test_wrong_shape(ckpt):
    key = "model.language_model.layers.3.self_attn.k_proj.weight"
    path = edit_tensors(ckpt, lambda t: t.update({key: t[key][:-1]}))
    with pytest.raises(CheckpointError, match=rf"{path}: tensor '{key}' has shape \[31, 64\], expected \[32, 64\]"):
        load_model(ckpt)


def test_truncated_file(ckpt):
    path = os.path.join(ckpt, "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1000)
    with pytest.raises(CheckpointError, match=path):
        load_model(ckpt)


def test_partial_mtp_is_an_error_and_no_mtp_disables_drafting(ckpt):
    edit_tensors(ckpt, lambda t: [t.pop(k) for k in [k for k in t if k.startswith("mtp.")]])
    with pytest.warns(UserWarning, match="no mtp"):
        assert load_model(ckpt).mtp is None
    edit_tensors(ckpt, lambda t: t.update({"mtp.fc.weight": torch.zeros(64, 128)}))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\) mtp\."):
        load_model(ckpt)


def test_pickle_only_and_missing_shard(ckpt):
    os.rename(os.path.join(ckpt, "model.safetensors"), os.path.join(ckpt, "pytorch_model.bin"))
    with pytest.raises(CheckpointError, match="pickle formats are not loaded"):
        load_model(ckpt)
    with open(os.path.join(ckpt, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"lm_head.weight": "model-00001-of-00001.safetensors"}}, f)
    with pytest.raises(CheckpointError, match="model-00001-of-00001.safetensors: listed in the index but missing"):
        load_model(ckpt)


@pytest.mark.parametrize("edit, field", [
    (lambda c: c.update(model_type="qwen3_5_moe"), "'model_type'"),
    (lambda c: c["text_config"].update(num_experts=8), "'text_config.num_experts'"),
    (lambda c: c["text_config"].update(layer_types=["linear_attention", "mamba", "x", "y"]), r"'text_config.layer_types\[1\]'"),
    (lambda c: c["text_config"].update(linear_num_value_heads=3), "'text_config.linear_num_value_heads'"),
    (lambda c: c["text_config"].pop("hidden_size"), "'text_config.hidden_size'"),
    (lambda c: c["text_config"].update(head_dim=-4), "'text_config.head_dim'"),
    (lambda c: c["text_config"].update(mtp_num_hidden_layers=2), "'text_config.mtp_num_hidden_layers'"),
    (lambda c: c["text_config"].update(mtp_num_hidden_layers=True), "'text_config.mtp_num_hidden_layers'"),
    (lambda c: c.update(tie_word_embeddings="false"), "'tie_word_embeddings'"),     # bool("false") is True
    (lambda c: c["text_config"].update(rope_parameters="default"), "'text_config.rope_parameters'"),
    (lambda c: c["text_config"].update(rope_parameters={"rope_type": "default", "rope_theta": "abc"}),
     "'text_config.rope_parameters.rope_theta'"),
    (lambda c: c["text_config"].update(rope_parameters={"rope_type": "default"}, partial_rotary_factor="0.25"),
     "'text_config.partial_rotary_factor'"),
])
def test_config_errors_name_the_field(ckpt, edit, field):
    path = edit_config(ckpt, edit)
    with pytest.raises(ConfigError, match=f"{path}: field {field}"):
        ModelConfig.from_dir(ckpt)


def test_config_variants():
    flat = dict(model_type="qwen3_5_text", vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=8,
                num_attention_heads=2, num_key_value_heads=1, head_dim=4, linear_num_key_heads=1,
                linear_num_value_heads=2, linear_key_head_dim=4, linear_value_head_dim=8, tie_word_embeddings=True,
                partial_rotary_factor=0.5)
    cfg = ModelConfig.from_dict(flat)
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + ("full_attention",)
    assert cfg.rotary_dim == 2 and cfg.tie_word_embeddings and cfg.linear_conv_dim == 2 * 4 + 2 * 8
    nested = ModelConfig.from_dict({"model_type": "qwen3_5", "tie_word_embeddings": False,
                                    "text_config": {**flat, "full_attention_interval": 2, "model_type": "qwen3_5_text"}})
    assert nested.layer_types[:2] == ("linear_attention", "full_attention") and not nested.tie_word_embeddings
    with pytest.raises(ConfigError, match="not found"):
        ModelConfig.from_dir("/nonexistent")


def test_tied_config_with_a_different_head_in_the_file_is_refused(ckpt):
    """tie_word_embeddings true while the file holds an lm_head.weight of its own: transformers unties them, so
    dropping the head would run another model without a word; an lm_head equal to the embedding loads tied."""
    edit_config(ckpt, lambda c: c.update(tie_word_embeddings=True))
    with pytest.raises(CheckpointError, match=r"tensor 'lm_head.weight' differs from '.*embed_tokens.weight'"):
        load_model(ckpt)
    embed = next(k for k in load_file(os.path.join(ckpt, "model.safetensors")) if k.endswith("embed_tokens.weight"))
    edit_tensors(ckpt, lambda t: t.update({"lm_head.weight": t[embed].clone()}))
    model = load_model(ckpt)
    assert model.lm_head_weight is model.embed_tokens.weight


def test_quantised_checkpoint_is_refused_saying_so(ckpt):
    """A GPTQ checkpoint's extra tensors are refused with the config's quant_method named (this loader reads float
    weights only; the int4 kernels take their own layout, layers/quant.py)."""
    edit_config(ckpt, lambda c: c.update(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128}))
    edit_tensors(ckpt, lambda t: t.update({"model.language_model.layers.0.mlp.down_proj.g_idx": torch.zeros(4)}))
    with pytest.raises(CheckpointError, match=r"down_proj.g_idx' .*quantization_config is 'gptq'"):
        load_model(ckpt)


def test_model_path_that_is_a_file_or_a_directory_named_like_a_file(ckpt, tmp_path):
    """--model naming a file, and model.safetensors being a directory, fail naming them (they said 'does not exist'
    and 'No such device (os error 19)')."""
    with pytest.raises(ConfigError, match="a file, not a model directory"):
        ModelConfig.from_dir(os.path.join(ckpt, "config.json"))
    os.remove(os.path.join(ckpt, "model.safetensors"))
    os.mkdir(os.path.join(ckpt, "model.safetensors"))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_model(ckpt)
