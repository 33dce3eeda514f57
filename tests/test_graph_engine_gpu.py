"""The graph engine (engine/graph_engine.py) on a GPU with its CUDA graphs, on the demo model (int4 body): what
tests/test_graph_engine.py checks in the interpreter, here through captured decode steps and graphed prefill
passes. Greedy tokens of requests decoded together equal each decoded alone at widths where the step is
width-invariant (the runner's tile rule, 1-4 rows), with and without drafting; a follow-up turn that prefills only
its new tokens gives the tokens of its whole context prefilled afresh; the profiler window opens and closes."""
import os

import pytest
import torch

from engine.graph_engine import GraphEngine
from engine.sampling import SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "demo")
GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module", params=[0, 4], ids=["k0", "k4"])
def engine(request):
    return GraphEngine.load(DEMO, "cuda", profile="h200", spec_k=request.param, max_seqs=4, max_len=1024,
                            progress=lambda *a: None)


@pytest.fixture(scope="module")
def prompts(engine):
    texts = ["import os\n\n\ndef list_files(directory):\n", "class Stack:\n", "def fib(n):\n",
             "with open(path) as f:\n"]
    return [engine.tokenizer.encode(t) for t in texts]


def test_together_equals_alone(engine, prompts):
    alone = [engine.generate(p, 96, GREEDY, ignore_eos=True).token_ids for p in prompts]
    together = engine.generate_many([dict(prompt_ids=p, max_new_tokens=96, sampling=GREEDY, ignore_eos=True)
                                     for p in prompts])
    assert [r.token_ids for r in together] == alone
    assert all(r.stats.step_ms > 0 for r in together)


def test_drafting_matches_plain(engine, prompts):
    """k = 4's greedy tokens are k = 0's (the other engine of the fixture's two, loaded here)."""
    other = GraphEngine.load(DEMO, "cuda", profile="h200", spec_k=4 - engine.spec_k, max_seqs=4, max_len=1024,
                             progress=lambda *a: None)
    for p in prompts:
        assert (engine.generate(p, 128, GREEDY, ignore_eos=True).token_ids
                == other.generate(p, 128, GREEDY, ignore_eos=True).token_ids)


def test_follow_up_turn(engine, prompts):
    first = engine.submit(prompts[0], 20, GREEDY, ignore_eos=True, keep_slot=True)
    out = engine.wait(first).token_ids
    context = prompts[0] + out + prompts[1]
    second = engine.submit(context, 30, GREEDY, ignore_eos=True, keep_slot=True, follows=first)
    follow = engine.wait(second).token_ids
    assert second.seq.cached_prompt_tokens == len(prompts[0]) + len(out) - 1
    engine.release(second)
    assert engine.generate(context, 30, GREEDY, ignore_eos=True).token_ids == follow


def test_profile_steps_window(engine, prompts, capsys):
    pytest.importorskip("cuda.bindings")
    engine.profile_steps(3, warmup=2)
    engine.generate(prompts[0], 64, GREEDY, ignore_eos=True)     # >= 13 steps at 5 tokens a step
    engine.profiler = None
    assert "[ CUDA profiler: decode steps 3-5 ]" in capsys.readouterr().err
