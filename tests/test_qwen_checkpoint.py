"""A tiny release-layout checkpoint with the real Qwen3.5 vocabulary (248,320 embedding rows), its tokenizer and the
Qwen3.8 generation_config: what a user points run.py at, end to end — chat prompt ids, sampling defaults, and
generation ending on <|im_end|> through the default stop ids."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import run
from engine.engine import Engine
from tests.fixtures import make_tiny_checkpoint
from tests.qwen_vocab import install_qwen35_tokenizer

IM_START, IM_END, THINK = 248045, 248046, 248068
QWEN38_GENERATION = {"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95,
                     "eos_token_id": [IM_END, 248044], "pad_token_id": 248044, "bos_token_id": 248044}


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("qwen"))
    make_tiny_checkpoint(model_dir, seed=4, vocab_size=248320, hidden_size=32, intermediate_size=48, tokenizer=False)
    install_qwen35_tokenizer(model_dir)
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump(QWEN38_GENERATION, f)
    return model_dir


def test_chat_prompt_and_defaults(qwen_dir):
    engine = Engine.load(qwen_dir)
    d = engine.defaults
    assert d.stop_ids == (IM_END, 248044) and (d.temperature, d.top_k, d.top_p) == (1.0, 20, 0.95)
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert engine.tokenizer.encode(prompt) == [IM_START, 846, 198, 5834, IM_END, 198, IM_START, 74455, 198, THINK, 198]


@pytest.mark.slow
def test_run_stops_on_im_end(qwen_dir, capsys):
    """Rewrite lm_head so that <|im_end|> dominates after the chat prompt: run.py must stop on it at once, with the
    model's default sampling and MTP drafting on."""
    engine = Engine.load(qwen_dir)
    ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]))
    with torch.no_grad():
        h = engine.model(torch.tensor([ids]))[0, -1]
    path = os.path.join(qwen_dir, "model.safetensors")
    tensors = load_file(path)
    tensors["lm_head.weight"][IM_END] = h * (100 / h.pow(2).sum())          # logit 100 there, O(5) elsewhere
    save_file(tensors, path, metadata={"format": "pt"})
    assert run.main(["--model", qwen_dir, "--prompt", "hi", "--max-new-tokens", "16", "--json", "--seed", "0"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[0])
    assert out["token_ids"] == [IM_END] and out["finish_reason"] == "stop" and out["text"] == ""
