"""One whole decode step of Qwen3.8-27B as the engine runs it: graphs/runner.py's ModelRunner on a random int4
model at the 27B shape (tools/random_model.random_prepared: made on the GPU by the loader's own code), its
bucket's CUDA graph replayed back to back (so each launch's programmatic dependent launch overlaps the one
before).

For each batch B and draft count k: a runner of B slots, k drafts a step (k = 0: plain decoding), the draft head
the first `--draft-vocab` ids of the lm_head (the runner's draft_tokens; 0: the whole vocabulary), every slot
sampling with Qwen's generation_config (temperature 1, top-k 20, top-p 0.95). A step is the runner's: the MTP
drafting (k > 0), the verify pass at B·(k+1) rows over the 64 layers and the int8 lm_head, rejection sampling
(k = 0: sampling) and the commit. Context: instead of prefilling, the B slots' tables are set as a decode at
`ctx` finds them — seq_len ctx − 1, num_acc k + 1, emitted 1: the pending token at position ctx − 1, the GDN
state in slot k as a prefill leaves it — because what the caches hold does not change the time (the attention
reads every cached key whatever its value, a GDN state is read and written whole), only the lengths do. A step
commits its tokens (seq_len grows by 1 … k+1 a replay), so each timed trial starts from those tables again and
the context stays within REPS·(k+1) tokens of ctx.
Per step: its time (CUDA events over REPS back-to-back replays of the bucket's graph, the median of TRIALS), the
bytes it must move (tools.targets.step_bytes: every weight once per pass that reads it, the recurrent states read
once and written per token, the KV; the logits written once), the fraction of the copy bandwidth measured in the
same run, the launches in its graph, and the tokens per second given how often each draft position is accepted
(`--accept`, default .84/.60/.38/.22: vLLM's MTP on Qwen under load, ENGINE.md §9; a step emits 1 + the accepted
drafts — acceptance depends on the text, not on the kernels); beneath it each phase of the step
(ModelRunner.step_phases: rows, draft, verify, sample — each captured as its own graph, replayed in order; each
phase's time includes its graph's own launch, so they sum to a little more than the step);
then, per batch, the draft count that gives the most tokens per second at those rates (what profiles/ should set
per bucket).
`python -m bench.step [--batch 1,4,64] [--k 0,4] [--ctx 16384] [--draft-vocab 32768]` writes
bench/results/step-<gpu>.json and .md (step-ctx<ctx>-<gpu> at other contexts)."""
import argparse
import gc
import statistics

import torch

from bench.harness import gpu_name, measure_bandwidth, write_results
from bench.kernels_sampler import QWEN
from graphs.runner import ModelRunner
from layers.config import qwen38_27b
from layers.prepared import stderr_progress
from tools.random_model import random_prepared
from tools.targets import row, step_bytes

REPS, TRIALS = 10, 5                # replays a trial, trials (the median's)
MAX_PREFILL = 64                    # the runner's prompt chunk: nothing is prefilled here


def graph_nodes(fn) -> int:
    """Kernel launches fn makes, counted as the nodes of a CUDA graph of one call (0 where cuda-python is absent)."""
    try:
        from cuda.bindings import runtime
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            fn()
        err, _, count = runtime.cudaGraphGetNodes(graph.raw_cuda_graph(), 0)
        return count if err == runtime.cudaError_t.cudaSuccess else 0
    except Exception as e:      # a count is a nicety: the timing stands without it
        print(f"graph_nodes: {type(e).__name__}: {e}")
        return 0


def tokens_per_step(k, accept) -> float:
    """Mean tokens a sequence emits per step with k drafts: 1 + the chance each draft position is accepted."""
    assert k <= len(accept), f"--accept gives rates for {len(accept)} draft positions, not {k}"
    return 1.0 + sum(accept[:k])


def at_context(runner, B: int, ctx: int):
    """Slots 0 … B−1 as a decode at ctx finds them (module docstring): seq_len ctx − 1, num_acc k + 1, the state
    in slot k, emitted 1."""
    b = runner.buf
    b.seq_len[:B].fill_(ctx - 1)
    b.num_acc[:B].fill_(runner.k + 1)
    b.state_at[:B].fill_(runner.k)
    b.emitted[:B].fill_(1)


def replay_us(graphs: list, reset) -> list:
    """Per graph, µs a replay: `graphs` replayed in order REPS times back to back, an event after each replay;
    each graph's mean over a trial, the median over TRIALS trials (reset() before each, untimed; one trial first
    as a warm-up)."""
    per_trial = [[] for _ in graphs]
    for trial in range(TRIALS + 1):
        reset()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(REPS * len(graphs) + 1)]
        events[0].record()
        for i in range(REPS * len(graphs)):
            graphs[i % len(graphs)].replay()
            events[i + 1].record()
        events[-1].synchronize()
        if trial:
            for j, times in enumerate(per_trial):
                times.append(sum(events[i].elapsed_time(events[i + 1])
                                 for i in range(j, REPS * len(graphs), len(graphs))) * 1e3 / REPS)
    return [statistics.median(times) for times in per_trial]


def measure(prepared, B: int, k: int, ctx: int, draft_vocab: int) -> tuple:
    """The runner's step for B slots and k drafts at ctx: (µs a step, launches, [(phase, µs)])."""
    runner = ModelRunner(prepared, B, ctx + (REPS + 1) * (k + 1), spec_k=k, max_prefill=MAX_PREFILL,
                         draft_tokens=torch.arange(draft_vocab) if k and 0 < draft_vocab < prepared.cfg.vocab_size
                         else None)
    for slot in range(B):
        runner.set_sampling(slot, *QWEN)
    runner.capture([B])                           # warms up and captures on padding rows
    runner.set_rows(list(range(B)))
    reset = lambda: at_context(runner, B, ctx)
    step_us, phases = replayed(runner, B, reset)
    return step_us, graph_nodes(lambda: runner.run_step(B)), phases


def replayed(runner, B: int, reset) -> tuple:
    """(µs a replay of the runner's captured bucket B, [(phase, µs)]: each of ModelRunner.step_phases captured as
    its own graph, replayed in order), by replay_us with reset() before each trial."""
    step_us, = replay_us([runner.graphs[B]], reset)
    phases = []
    for name, fn in runner.step_phases(B):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        phases.append((name, graph))
    phase_us = replay_us([graph for _, graph in phases], reset)
    return step_us, [(name, us) for (name, _), us in zip(phases, phase_us)]


def run(batches, ks, ctx, draft_vocab, accept, device="cuda"):
    cfg = qwen38_27b()
    if not 0 <= draft_vocab <= cfg.vocab_size:
        raise ValueError(f"--draft-vocab {draft_vocab}: must be in [0, {cfg.vocab_size}] (0: the whole vocabulary)")
    peak = measure_bandwidth()["copy_Bps"]
    torch.cuda.empty_cache()
    prepared = random_prepared(cfg, device, with_mtp=max(ks) > 0, progress=stderr_progress("random 27B"))
    rows, best = [], []
    for B in batches:
        steps = []
        for k in ks:
            us, launches, phases = measure(prepared, B, k, ctx, draft_vocab)
            gc.collect()                              # the runner's buffers and graphs gone before the next
            torch.cuda.empty_cache()
            shape = f"B{B} k{k} ctx{ctx}" + (f" draft vocab {draft_vocab or cfg.vocab_size}" if k else "")
            tokens = tokens_per_step(k, accept)
            steps.append(row("step", shape, us, step_bytes(cfg, B, k, ctx, draft_vocab or cfg.vocab_size), 0, peak,
                             launches=launches, tokens_per_step=round(tokens, 2),
                             tok_s=round(B * tokens / (us * 1e-6), 1), k=k))
            print(steps[-1], flush=True)
            rows += [steps[-1]] + [row(f"  {name}", shape, phase_us, 0, 0, peak) for name, phase_us in phases]
        top = max(steps, key=lambda r: r["tok_s"])
        best.append(dict(kernel="best k", shape=f"B{B} ctx{ctx}", us=top["us"], k=top["k"], tok_s=top["tok_s"]))
    return rows + best, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes")
    ap.add_argument("--k", default="0,4", help="comma-separated draft counts (0: no drafting)")
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--draft-vocab", type=int, default=32768, help="draft head rows (0: the whole vocabulary)")
    ap.add_argument("--accept", default=".84,.60,.38,.22", help="acceptance rate of draft positions 1, 2, …")
    args = ap.parse_args()
    ks, accept = [int(k) for k in args.k.split(",")], [float(a) for a in args.accept.split(",")]
    if max(ks) > len(accept) or min(ks) < 0:
        ap.error(f"--k {args.k}: each in [0, {len(accept)}] (--accept gives {len(accept)} rates)")
    rows, peak = run([int(b) for b in args.batch.split(",")], ks, args.ctx, args.draft_vocab, accept)
    name = "step" if args.ctx == 16384 else f"step-ctx{args.ctx}"
    print(write_results(name, rows, {"gpu": gpu_name(), "torch": torch.__version__,
                                     "peak_copy_GBps": round(peak / 1e9, 1)}))


if __name__ == "__main__":
    main()
