"""One decoder layer of a verify step (B sequences × T tokens) as the engine runs it: graphs/runner.py's
ModelRunner.layer_launches — the kernels in the model's order, each with the runner's own buffers, fusions and
launch configs — back to back in one CUDA graph, so each kernel's programmatic dependent launch overlaps the
previous one's tail. The model: random int4 weights at the Qwen3.8-27B shapes (tools/random_model.random_prepared)
with `--layers` Gated DeltaNet layers and as many gated-attention layers (the config's layer_types cut to those),
each with its own weights, GDN state or fp8 KV; the pass: the runner's verify pass over slots 0 … B−1, T tokens
each at positions ctx … ctx+T−1 (attention over ctx + T keys; what the caches hold does not change the time, so
nothing is prefilled). Per layer kind: the time, the bytes it must move (tools.targets.layer_bytes: int4 weights
and scales, the recurrent state read once and written per token, or the KV; activations are small), the fraction
of the copy bandwidth measured in the same run, and beside it the chain launched without PDL and the sum of the
same kernels timed one by one (what the chain saves). The chain runs over the `--layers` layers of the kind, and
each kernel alone cycles through them, so no kernel finds its bytes in L2 (one copy of out_proj would fit).
Beside each kernel's time alone, `in_chain`: what it costs inside the chain (the chain's time less the chain's
without it) — a small kernel that must wait for its producer and hold up its consumer costs more there than
alone. Where the runner's linears leave int64 sums for their readers (kernels/fixed_sum.py: up to 24 rows, the
GEMV's), `chained, outputs stored` is the same chain over the same pass with the sums off (Pass.deferred False:
every linear stores bf16).
`python -m bench.layer_step [--batch 1,8,64] [--tokens 5] [--ctx 16384] [--layers 8]` writes
bench/results/layer-step-<gpu>.json and .md."""
import argparse
import dataclasses
import gc
import itertools

import torch

from bench.harness import gpu_name, measure_bandwidth, time_us, write_results
from graphs.runner import ModelRunner
from kernels import device as gpu
from layers.config import MAX_SPEC_K, qwen38_27b
from layers.prepared import stderr_progress
from tools.random_model import random_prepared
from tools.targets import layer_bytes, row

KINDS = {"gdn": "linear_attention", "attn": "full_attention"}


def layer_model(cfg, n_layers: int, device):
    """A random int4 PreparedModel of cfg's shape with n_layers GDN layers, then n_layers attention layers (and the
    MTP, which a runner of T > 1 tokens needs)."""
    cut = dataclasses.replace(cfg, layer_types=(KINDS["gdn"],) * n_layers + (KINDS["attn"],) * n_layers)
    return random_prepared(cut, device, progress=stderr_progress("random layers"))


def verify_pass(runner, B: int, ctx: int):
    """The runner's verify pass over slots 0 … B−1, its T = k + 1 tokens at positions ctx … ctx+T−1, each
    sequence's GDN state read from slot T − 1."""
    runner.set_rows(list(range(B)))
    b, T = runner.buf, runner.k + 1
    b.row_len[:B].fill_(ctx)
    b.row_acc[:B].fill_(T)
    return runner._row_pass(B, T, b.row_len[:B], acc=b.row_acc[:B])


def chain(layers: list, skip: int = None):
    """The layers' launches in order ((name, launch) lists), but for launch number `skip` of each."""
    def launch_all():
        for launches in layers:
            for i, (_, launch) in enumerate(launches):
                if i != skip:
                    launch()
    return launch_all


def cycling(launches):
    """One launch per call, each call the next layer's."""
    it = itertools.cycle(launches)
    return lambda: next(it)()


def layer_rows(runner, kind: str, p, ctx: int, peak, timer) -> list:
    """The rows of one layer kind over the pass p at ctx (module docstring)."""
    cfg, B, T = runner.cfg, p.B, p.T
    weights = [(w, cache) for w, cache, t in zip(runner.w.layers, runner.buf.layers, cfg.layer_types)
               if t == KINDS[kind]]
    layers = [runner.layer_launches(w, cache, p, first=False) for w, cache in weights]
    n, names = len(layers), [name for name, _ in layers[0]]
    alone = {name: timer(cycling([dict(launches)[name] for launches in layers])) for name in names}
    chained = timer(chain(layers)) / n
    in_chain = {name: chained - timer(chain(layers, skip=i)) / n for i, name in enumerate(names)}
    with gpu.pdl_disabled():
        chain_serial = timer(chain(layers)) / n
    shape = f"B{B} T{T}" + (f" ctx{ctx}" if kind == "attn" else "")
    nbytes = layer_bytes(cfg, kind, B, T, ctx)
    rows = [row(f"layer[{kind}] chained", shape, chained, nbytes, 0, peak),
            row(f"layer[{kind}] chained, no PDL", shape, chain_serial, nbytes, 0, peak)]
    if p.deferred:                                  # the same chain with every linear's output stored
        stored = dataclasses.replace(p, deferred=False)
        layers = [runner.layer_launches(w, cache, stored, first=False) for w, cache in weights]
        rows.append(row(f"layer[{kind}] chained, outputs stored", shape, timer(chain(layers)) / n, nbytes, 0, peak))
    rows.append(row(f"layer[{kind}] kernels alone, summed", shape, sum(alone.values()), nbytes, 0, peak))
    return rows + [row(f"  {kind}: {name}", shape, us, 0, 0, peak, in_chain=round(in_chain[name], 2))
                   for name, us in alone.items()]


def run(batches, T, ctx, n_layers, device="cuda", cfg=None, timer=time_us):
    cfg = cfg or qwen38_27b()
    if not 1 <= T <= MAX_SPEC_K + 1:
        raise ValueError(f"--tokens {T}: must be in [1, {MAX_SPEC_K + 1}] (a verify of up to MAX_SPEC_K drafts)")
    peak = measure_bandwidth()["copy_Bps"]
    torch.cuda.empty_cache()
    prepared = layer_model(cfg, n_layers, device)
    rows = []
    for B in batches:
        runner = ModelRunner(prepared, B, ctx + T, spec_k=T - 1, max_prefill=T)
        p = verify_pass(runner, B, ctx)
        for kind in KINDS:
            new = layer_rows(runner, kind, p, ctx, peak, timer)
            print("\n".join(map(str, new)), flush=True)
            rows += new
        del runner, p
        gc.collect()                                # the runner's caches gone before the next batch's
        torch.cuda.empty_cache()
    return rows, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes")
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=8, help="layers of each kind the chain runs over")
    args = ap.parse_args()
    rows, peak = run([int(b) for b in args.batch.split(",")], args.tokens, args.ctx, args.layers)
    print(write_results("layer-step", rows, {"gpu": gpu_name(), "torch": torch.__version__,
                                             "peak_copy_GBps": round(peak / 1e9, 1)}))


if __name__ == "__main__":
    main()
