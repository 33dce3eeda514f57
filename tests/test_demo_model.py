"""The committed demo checkpoint (models/demo/) and the code that makes it (tools/demo)."""
import json
import os

import pytest
import torch

from tools.demo import corpus, export
from tools.demo.train import MTP_WEIGHTS, init_weights, losses
from layers.checkpoint import load_model
from layers.config import ModelConfig
from layers.model import Qwen35Model

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "demo")
CODE = 'import os\n\n\ndef fibonacci(n):\n    """Return the n-th number."""\n    if n < 2:\n        return n\n'


def rel_err(out, ref):
    return ((out - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(DEMO, "tokenizer.json"))


def test_transformers_and_engine_agree_on_logits(tokenizer):
    from transformers import AutoModelForCausalLM
    ids = torch.tensor([tokenizer.encode(CODE).ids])
    ref = AutoModelForCausalLM.from_pretrained(DEMO, dtype=torch.float32).eval()
    ours = load_model(DEMO, dtype=torch.float32)
    with torch.no_grad():
        expected = ref(ids).logits
        got = ours.logits(ours(ids))
    assert expected.shape == got.shape == (1, ids.shape[1], ours.cfg.vocab_size)
    assert rel_err(got, expected) < 1e-4
    assert ours.mtp is not None                            # the MTP weights are ours alone, but they are there


def test_checkpoint_layout_and_sizes():
    cfg = json.load(open(os.path.join(DEMO, "config.json")))
    assert cfg["model_type"] == "qwen3_5_text" and cfg["architectures"] == ["Qwen3_5ForCausalLM"]
    assert cfg["mtp_num_hidden_layers"] == 1 and cfg["tie_word_embeddings"] is False
    parsed = ModelConfig.from_dict(cfg)
    assert parsed.layer_types.count("full_attention") * 3 == parsed.layer_types.count("linear_attention")
    sizes = {f: os.path.getsize(os.path.join(DEMO, f)) for f in os.listdir(DEMO)}
    assert sum(sizes.values()) <= 25e6 and max(sizes.values()) <= 15e6
    index = json.load(open(os.path.join(DEMO, "model.safetensors.index.json")))["weight_map"]
    assert any(k.startswith("mtp.") for k in index) and "lm_head.weight" in index
    assert all(k.startswith(("model.", "mtp.", "lm_head.")) for k in index)


def test_tokenizer_specials_stop_ids_and_chat_template(tokenizer):
    from engine.tokenizer import Tokenizer
    ids = {s: tokenizer.token_to_id(s) for s in corpus.SPECIALS}
    assert list(ids.values()) == list(range(len(corpus.SPECIALS)))
    gen = json.load(open(os.path.join(DEMO, "generation_config.json")))
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert tokenizer.decode(tokenizer.encode(CODE).ids) == CODE
    tok = Tokenizer.from_dir(DEMO)
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs).endswith("<|im_start|>assistant\n<think>\n")
    assert tok.apply_chat_template(msgs, enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_split_is_by_sorted_index():
    assert [corpus.split_of(i) for i in (0, 1, 10, 19, 20, 30)] == ["test", "train", "val", "train", "test", "val"]


def test_tokenizer_training_puts_specials_first_and_splits_digits():
    tok = corpus.train_tokenizer(["def f(x):\n    return x + 12345\n"] * 20, vocab_size=300)
    assert [tok.token_to_id(s) for s in corpus.SPECIALS] == [0, 1, 2, 3, 4]
    assert tok.encode("x = 2024").tokens[-4:] == ["2", "0", "2", "4"]
    assert tok.decode(tok.encode("<|im_start|>ü\n").ids, skip_special_tokens=False) == "<|im_start|>ü\n"


def tiny_config():
    raw = export.model_config(vocab_size=64, eot_id=0, im_end_id=2)
    raw.update(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
               linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=8)
    return ModelConfig.from_dict(raw)


def test_training_losses_cover_main_and_chained_mtp_and_learn():
    torch.manual_seed(0)
    model = Qwen35Model(tiny_config())
    init_weights(model, seed=0)
    windows = torch.randint(0, 64, (2, 20 + 1 + len(MTP_WEIGHTS)))
    main, mtp = losses(model, windows)
    assert len(mtp) == len(MTP_WEIGHTS) and all(torch.isfinite(x) for x in [main, *mtp])
    assert abs(main.item() - torch.log(torch.tensor(64.0)).item()) < 0.5      # near-uniform at init
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(5):                                                          # memorise one batch
        main, mtp = losses(model, windows)
        opt.zero_grad()
        (main + sum(mtp)).backward()
        opt.step()
    after, mtp_after = losses(model, windows)
    assert after < main and sum(mtp_after) < sum(mtp)


def test_export_round_trips_through_the_loader(tmp_path, monkeypatch):
    torch.manual_seed(1)
    model = Qwen35Model(tiny_config())
    init_weights(model, seed=1)
    with torch.no_grad():                                  # non-zero norms, so a (1+w) / w mix-up would show
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(torch.randn(p.shape) * 0.3)
    monkeypatch.setattr(export, "SHARD_BYTES", 20_000)     # force several shards + index
    raw = export.model_config(64, 0, 2)
    raw.update({k: getattr(model.cfg, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                   "num_key_value_heads", "head_dim", "linear_num_key_heads",
                                                   "linear_num_value_heads", "linear_key_head_dim",
                                                   "linear_value_head_dim")})
    with open(tmp_path / "config.json", "w") as f:
        json.dump(raw, f)
    files = export.write_weights(model, str(tmp_path))
    assert "model.safetensors.index.json" in files and len(files) > 2
    loaded = load_model(str(tmp_path), dtype=torch.float32)
    ids = torch.randint(0, 64, (1, 13))
    with torch.no_grad():
        want = model.to(torch.bfloat16).float()(ids)       # export stores bf16 (A_log, GDN norm in fp32)
        got = loaded(ids)
    assert rel_err(got, want) < 2e-2
    for name, p in loaded.named_parameters():
        assert p.dtype == torch.float32 and torch.isfinite(p).all(), name
