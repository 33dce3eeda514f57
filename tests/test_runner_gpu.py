"""graphs/runner.py's CUDA graphs on a GPU: replay is bitwise the launches it captured, and MTP drafting leaves
greedy output unchanged.

Replay: for the three tiny configurations (bf16 body: their widths are not multiples of 128), the demo model
(int4 body) and four layers at the 27B's widths (random int4 weights, 32k-id draft vocabulary: the kernels'
27B launch configurations), k ∈ {0, 1, 4}, every bucket of a 4-slot runner: 64 steps over live sequences (one
greedy, one sampled at temperature 1, one at top-k 20 / top-p 0.95, a padding row where the bucket has one)
launched without a graph, then the same prompts prefilled again with the same seed and 64 replayed steps:
tokens and logits bitwise equal.
Exactness: the demo model with its int4 body, 8 prompts × 256 greedy tokens at k = 4 equal k = 0's, decoded 1, 2
and 4 sequences at a time (the widths where every kernel of the step is width-invariant)."""
import dataclasses
import os

import pytest
import torch

from graphs.runner import ModelRunner
from layers.config import qwen38_27b
from layers.prepared import prepare
from tests.fixtures import CONFIGS, make_tiny_checkpoint
from tools.random_model import random_prepared

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "demo")
STEPS = 64


def quiet(*_):
    pass


def gpu_kernels_fit(cfg: dict) -> bool:
    """The GPU kernels' tl.dot needs inner dims >= 16 (the interpreter does not): attention and GDN head dims
    powers of two >= 16 (text-tied's 8 / 24 and vl-interval2's 8 run in the interpreter only)."""
    dims = [cfg.get(name, 16) for name in ("head_dim", "linear_key_head_dim", "linear_value_head_dim")]
    return all(d >= 16 and d & (d - 1) == 0 for d in dims)


@pytest.fixture(scope="module", params=list(CONFIGS) + ["demo", "27b-widths"])
def model(request, tmp_path_factory):
    """(prepared model, draft vocabulary or None)."""
    if request.param in CONFIGS and not gpu_kernels_fit(CONFIGS[request.param]):
        pytest.skip(f"{request.param}: head dims below what the GPU kernels take (powers of two >= 16)")
    if request.param == "demo":
        return prepare(DEMO, "cuda", body="int4", progress=quiet), None
    if request.param == "27b-widths":
        cfg = qwen38_27b()
        cut = dataclasses.replace(cfg, layer_types=("linear_attention",) * 3 + ("full_attention",))
        return random_prepared(cut, "cuda"), list(range(32768))
    model_dir = make_tiny_checkpoint(str(tmp_path_factory.mktemp(request.param)), **CONFIGS[request.param])
    return prepare(model_dir, "cuda", body="bf16", progress=quiet), None


def prompts(vocab, n, length=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, min(vocab, 256), (length + i,), generator=g).tolist() for i in range(n)]


def run(r, slots, prompt_ids, replay: bool):
    """Prefill each live slot's prompt, then STEPS steps; per step (ids, counts, logits) cloned."""
    r.set_seed(1234)
    sampling = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=1.0, top_k=20, top_p=0.95)]
    for slot, ids in zip([s for s in slots if s >= 0], prompt_ids):
        r.set_sampling(slot, **sampling[slot])
        r.prefill(slot, ids, 0, last=True)
    out = []
    for _ in range(STEPS):
        B = len(slots)
        ids, counts = r.step(slots) if replay else r.run_step(r.set_rows(slots))
        out.append((ids.clone(), counts.clone(), r.step_logits(B).clone()))
    return out


@pytest.mark.parametrize("k", [0, 1, 4])
def test_replay_is_bitwise_the_launches(model, k):
    prepared, draft_tokens = model
    r = ModelRunner(prepared, 4, 64 * 5 + 32, spec_k=k, max_prefill=16, draft_tokens=draft_tokens if k else None)
    r.capture([4, 2, 1])
    assert r.captured == [1, 2, 4]
    for slots in ([0], [1, 0], [2, 0, 1, -1]):
        live = prompts(prepared.cfg.vocab_size, sum(s >= 0 for s in slots))
        eager = run(r, slots, live, replay=False)
        graph = run(r, slots, live, replay=True)
        for step, ((i1, c1, l1), (i2, c2, l2)) in enumerate(zip(eager, graph)):
            assert torch.equal(c1, c2) and torch.equal(i1, i2), (slots, step)
            assert torch.equal(l1, l2), (slots, step)


@pytest.fixture(scope="module")
def demo():
    from engine.tokenizer import Tokenizer
    prepared = prepare(DEMO, "cuda", body="int4", progress=quiet)
    tok = Tokenizer.from_dir(DEMO)
    texts = ["import os\n\n\ndef list_files(directory):\n", "class Stack:\n    def __init__(self):\n",
             "def fib(n):\n", "# Parse command line arguments\nimport argparse\n", "for i in range(10):\n",
             "with open(path) as f:\n", "def main():\n    parser = ", "    raise ValueError("]
    return prepared, [tok.encode(t) for t in texts]


def greedy_batch(r, batch, n):
    """n greedy tokens for each prompt of `batch`, decoded together in slots 0 … len − 1."""
    out = [[int(r.prefill(s, p, 0, last=True)[1][0])] for s, p in enumerate(batch)]
    slots = list(range(len(batch)))
    while min(map(len, out)) < n:
        r.step(slots)
        for row, tokens in enumerate(r.fetch(len(slots)).wait()):
            out[row] += tokens
    return [t[:n] for t in out]


@pytest.mark.parametrize("width", [1, 2, 4])
def test_greedy_with_drafting_equals_without(demo, width):
    prepared, texts = demo
    results = {}
    for k in (0, 4):
        r = ModelRunner(prepared, width, 512, spec_k=k, max_prefill=64)
        r.capture([width])
        results[k] = [t for i in range(0, len(texts), width) for t in greedy_batch(r, texts[i:i + width], 256)]
    for i, (plain, drafted) in enumerate(zip(results[0], results[4])):
        assert plain == drafted, (i, next(j for j, (a, b) in enumerate(zip(plain, drafted)) if a != b))


def test_a_draft_count_per_bucket_keeps_greedy_output(demo):
    """One sequence stepped through buckets drafting 4, 1 and 2 (rows beyond it padding): rounds verify fewer
    tokens than the last one accepted, and greedy output is k = 0's."""
    prepared, texts = demo
    plain = greedy_batch(ModelRunner(prepared, 1, 512, spec_k=0, max_prefill=64), texts[:1], 160)[0]
    r = ModelRunner(prepared, 4, 512, spec_k=4, max_prefill=64, bucket_k={1: 4, 2: 1, 4: 2})
    r.capture([4, 2, 1])
    tokens = [int(r.prefill(0, texts[0], 0, last=True)[1][0])]
    widths = [1, 2, 4, 1, 1, 4, 2]
    while len(tokens) < 160:
        width = widths[len(tokens) % len(widths)]
        r.step([0] + [-1] * (width - 1))
        tokens += r.fetch(width).wait()[0]
    assert tokens[:160] == plain
