"""The engine as callers see it: a model directory in, a model + tokenizer + generation defaults + generator out."""
import os
from typing import Callable

import torch

from engine.generate import GenerationResult, Generator
from engine.sampling import SamplingParams
from engine.tokenizer import GenerationDefaults, Tokenizer, load_generation_defaults
from layers.checkpoint import load_model
from layers.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_MODEL = os.path.join(REPO, "models", "demo")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SMALL_MODEL = 100_000_000    # parameters: below this a CPU decode step is too short to gain from more threads


def choose_threads(model, device: str, threads: int | None) -> int:
    """Set torch's CPU thread count for this model and return it. `threads` (--threads) wins; else a small model
    on the CPU runs on one thread unless OMP_NUM_THREADS says otherwise: its steps are short runs of small
    matmuls, and when another process keeps a core busy every multi-threaded op waits for it (the demo model on
    2 busy cores: 2-5 tok/s on 2 threads, 20-85 on one; idle, 105 on 2)."""
    if threads is not None:
        torch.set_num_threads(threads)
    elif (device == "cpu" and "OMP_NUM_THREADS" not in os.environ
          and sum(p.numel() for p in model.parameters()) < SMALL_MODEL):
        torch.set_num_threads(1)
    return torch.get_num_threads()


def check_model_dir(model_dir: str):
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise ConfigError(f"--model {model_dir!r} is a file, not a model directory")
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model directory {model_dir!r} does not exist")


class Engine:
    """The eager plain-torch path. cfg: the ModelConfig; max_context: prompt + generated tokens a request may
    reach (max_context_name says what bounds it)."""
    max_context_name = "the model's max_position_embeddings"

    def __init__(self, model, tokenizer: Tokenizer, defaults: GenerationDefaults, spec_k: int, model_dir: str):
        self.model, self.tokenizer, self.defaults, self.model_dir = model, tokenizer, defaults, model_dir
        self.cfg = model.cfg
        self.max_context = self.cfg.max_position_embeddings
        self.spec_k = spec_k if model.mtp is not None else 0
        self.generator = Generator(model)

    @classmethod
    def load(cls, model_dir: str | None = None, device: str = "cpu", dtype: str = "float32", spec_k: int = 4,
             threads: int | None = None) -> "Engine":
        """threads: torch's CPU threads (None: choose_threads decides)."""
        model_dir = model_dir or DEMO_MODEL
        check_model_dir(model_dir)
        if dtype not in DTYPES:
            raise ValueError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        if spec_k < 0:
            raise ValueError(f"spec_k must be >= 0, got {spec_k}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but CUDA is not available here")
        tokenizer = Tokenizer.from_dir(model_dir)
        defaults = load_generation_defaults(model_dir, tokenizer)
        model = load_model(model_dir, device=device, dtype=DTYPES[dtype], with_mtp=spec_k > 0)
        choose_threads(model, device, threads)
        return cls(model, tokenizer, defaults, spec_k, model_dir)

    def generate(self, prompt_ids: list, max_new_tokens: int, sampling: SamplingParams, *, stop_ids=None,
                 ignore_eos: bool = False, spec_k: int | None = None,
                 on_tokens: Callable[[list], bool | None] | None = None, logprobs: int | None = None
                 ) -> GenerationResult:
        stops = () if ignore_eos else (self.defaults.stop_ids if stop_ids is None else stop_ids)
        k = self.spec_k if spec_k is None else spec_k                     # the generator drops it without MTP
        vocab = self.cfg.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id(s) {bad[:5]} outside the model's vocabulary (size {vocab})")
        return self.generator.generate(list(prompt_ids), max_new_tokens, sampling, stop_ids=stops, spec_k=k,
                                       on_tokens=on_tokens, logprobs=logprobs)
