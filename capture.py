"""Plan, then on CUDA capture, the engine's static graphs for a model on a hardware profile, and check them.

    python capture.py [--model DIR] [--profile h200] [--spec-k K] [--max-seqs S] [--max-len L] [--body int4]
                      [--check-steps 16] [--json OUT]

1. The memory plan (graphs/plan.py): weights, per-sequence recurrent state (k+1 slots), KV bytes per token, the
   runner's other buffers at S x L, and per batch bucket the longest context that fits; a configuration that
   does not fit fails here, before anything is allocated, saying what would (exit 2).
2. CUDA only (elsewhere it stops after the plan, exit 0): with the process held to the profile's memory
   (a 24 GiB profile on a bigger GPU gets that fraction of it), the graph engine is loaded as run.py loads it
   (engine/graph_engine.GraphEngine.load: a prepared directory loaded, a checkpoint prepared, the runner built
   for S x L and every bucket captured).
3. Replay check per bucket B: one short prompt prefilled into slot 0 (rows 1 … B−1 padding, whose outputs mean
   nothing), sampled at T 1 / top-k 20 / top-p 0.95, --check-steps steps launched eagerly, row 0's tokens, count
   and logits kept; the same prompt prefilled again (start 0 resets the slot, set_seed the sampler) and as many
   steps replayed from the graph: both must be bitwise equal (exit 1 otherwise). Then each bucket's replayed
   step time with all B rows live (CUDA events, median of 10).
Prints the load, capture and start-up (load + quantise + runner + capture) times; --json writes them all."""
import argparse
import json
import statistics
import sys

from graphs.plan import Fit, bucket_k, load_profile, plan, runner_parts
from layers.config import ConfigError, ModelConfig
from layers.prepared import saved_weight_bytes

PROMPT_TOKENS = 16             # the checks' prompt: any ids (the check compares two runs of the same)
TIMED_STEPS, WARMUP_STEPS = 10, 3


def prompt(cfg) -> list:
    return [(17 * i + 5) % cfg.vocab_size for i in range(PROMPT_TOKENS)]


def gib(n) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def print_plan(cfg, profile, fit: Fit, max_seqs: int, max_len: int) -> dict:
    """The plan table (stdout); returns it as a dict for --json."""
    p = plan(cfg, profile)
    parts = runner_parts(cfg, max_seqs, max_len, fit.k, fit.chunk, profile["kv_dtype"], profile.get("sms", 132),
                         ks=fit.ks)
    print(f"{profile['name']}: {profile['memory_gib']} GiB, {profile['bandwidth_GBps']} GB/s, spec_k {fit.k}, "
          f"prefill chunk {fit.chunk}")
    print("| part | size |\n|---|---|")
    print(f"| weights | {gib(fit.weights)} |\n| state per sequence | {p.state_bytes_per_seq / 2**20:.1f} MiB |\n"
          f"| KV per token | {p.kv_bytes_per_token / 2**10:.1f} KiB ({profile['kv_dtype']}) |")
    print(f"| runner buffers at {max_seqs} x {max_len} | {gib(sum(parts.values()))}: "
          + ", ".join(f"{k} {gib(v)}" for k, v in parts.items()) + " |")
    print("\n| batch | context tokens per sequence |\n|---|---|")
    buckets = {}
    for b in profile["batch_buckets"]:
        buckets[b] = fit.max_len(b)
        capped = buckets[b] == cfg.max_position_embeddings
        print(f"| {b} | {buckets[b]:,}{' (max_position_embeddings)' if capped else ''} |")
    return {"weights": fit.weights, "state_per_seq": p.state_bytes_per_seq, "kv_per_token": p.kv_bytes_per_token,
            "runner": parts, "context_by_bucket": buckets}


def replay_check(runner, B: int, steps: int) -> bool:
    """Module docstring, 3: eager steps then replayed steps from the same start give the same tokens and logits."""
    import torch
    slots = [0] + [-1] * (B - 1)
    runner.set_sampling(0, temperature=1.0, top_k=20, top_p=0.95)      # sampled: the seed's draws are checked too
    runs = []
    for replay in (False, True):
        runner.set_seed(0)
        runner.prefill(0, prompt(runner.cfg), 0, last=True)
        out = []
        for _ in range(steps):
            if replay:
                ids, counts = runner.step(slots)
            else:
                runner.set_rows(slots)
                ids, counts = runner.run_step(B)
            out.append((ids[0].clone(), counts[0].clone(), runner.step_logits(B)[0].clone()))   # padding: garbage
        runs.append(out)
    return all(torch.equal(a, b) for x, y in zip(*runs) for a, b in zip(x, y))


def step_ms(runner, B: int) -> float:
    """Median replayed step time with B live rows (each slot prefilled with the short prompt)."""
    import torch
    for s in range(B):
        runner.prefill(s, prompt(runner.cfg), 0, last=True)
    slots, times = list(range(B)), []
    for i in range(WARMUP_STEPS + TIMED_STEPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        runner.step(slots)
        end.record()
        end.synchronize()
        if i >= WARMUP_STEPS:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def capture(args, profile, max_seqs: int, max_len: int) -> dict:
    """Module docstring, 2 and 3: the engine loaded as run.py loads it, then the checks on its runner."""
    import torch
    from engine.graph_engine import GraphEngine
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = profile["memory_gib"] * 2**30 / total
    if fraction < 1:
        torch.cuda.set_per_process_memory_fraction(fraction)
    print(f"\n{torch.cuda.get_device_name()}: held to {min(fraction, 1):.3f} of {gib(total)}")
    engine = GraphEngine.load(args.model, "cuda", profile=args.profile, spec_k=args.spec_k, max_seqs=max_seqs,
                              max_len=max_len, body=args.body)
    runner, t = engine.runner, engine.timings
    seconds = t["capture_s_by_bucket"]
    print(f"loaded in {t['load_s']:.1f} s; capture of buckets {sorted(seconds, reverse=True)} in "
          f"{t['capture_s']:.1f} s ({t['compiled']} kernels compiled ahead in {t['compile_s']:.1f} s); start-up "
          f"{t['load_s'] + t['capture_s']:.1f} s; peak {gib(torch.cuda.max_memory_allocated())}")
    print("\n| batch | capture s | replay check | step ms |\n|---|---|---|---|")
    result = {"load_s": t["load_s"], "capture_s": seconds, "compile_s": t["compile_s"], "compiled": t["compiled"],
              "startup_s": t["load_s"] + t["capture_s"],
              "replay_ok": {}, "step_ms": {}}
    for B in sorted(seconds, reverse=True):
        result["replay_ok"][B] = replay_check(runner, B, args.check_steps)
        result["step_ms"][B] = step_ms(runner, B)
        print(f"| {B} | {seconds[B]:.2f} | {'ok' if result['replay_ok'][B] else 'FAILED'} | "
              f"{result['step_ms'][B]:.3f} |", flush=True)
    result["peak_bytes"] = torch.cuda.max_memory_allocated()
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint or prepared directory (default: the demo model)")
    ap.add_argument("--profile", default="rtx3090", help="profiles/<name>.json or a path (default rtx3090)")
    ap.add_argument("--spec-k", type=int, help="drafts a step (default: the profile's)")
    ap.add_argument("--max-seqs", type=int, help="sequence slots (default: the largest bucket that fits)")
    ap.add_argument("--max-len", type=int, help="tokens per sequence (default: 16384, at most the model's limit)")
    ap.add_argument("--body", choices=("int4", "bf16"), default="int4", help="a checkpoint's body linears")
    ap.add_argument("--check-steps", type=int, default=16, help="steps of each bucket's replay check")
    ap.add_argument("--json", metavar="OUT", help="write the plan and the measurements here")
    args = ap.parse_args(argv)
    from engine.engine import DEMO_MODEL
    args.model = args.model or DEMO_MODEL
    try:
        cfg = ModelConfig.from_dir(args.model)
        profile = load_profile(args.profile)
        for flag, value in (("--spec-k", args.spec_k), ("--max-seqs", args.max_seqs), ("--max-len", args.max_len),
                            ("--check-steps", args.check_steps)):
            if value is not None and value < (0 if flag == "--spec-k" else 1):
                raise ValueError(f"{flag} must be {'>= 0' if flag == '--spec-k' else '>= 1'}, got {value}")
        fit = Fit(cfg, profile, spec_k=args.spec_k, weight_bytes=saved_weight_bytes(args.model), body=args.body,
                  ks=bucket_k(profile).values() if args.spec_k is None else ())
        max_len = args.max_len or min(16384, cfg.max_position_embeddings)
        max_seqs = args.max_seqs or fit.bucket(profile["batch_buckets"], max_len)
        need = PROMPT_TOKENS + (max(args.check_steps, WARMUP_STEPS + TIMED_STEPS) + 1) * (fit.k + 1)
        if max_len < need:
            raise ValueError(f"--max-len {max_len} is too short for the checks ({need} tokens at spec_k {fit.k})")
        report = {"model": args.model, "profile": profile["name"], "spec_k": fit.k, "prefill_chunk": fit.chunk,
                  "max_seqs": max_seqs, "max_len": max_len}
        report["plan"] = print_plan(cfg, profile, fit, max_seqs, max_len)
        report["needed_bytes"] = fit.check(max_seqs, max_len)
    except (ConfigError, ValueError, OSError) as e:        # OSError: a --model that is a file, say
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\nmax_seqs {max_seqs} x max_len {max_len}: needs {gib(report['needed_bytes'])} of "
          f"{profile['memory_gib']} GiB")
    import torch
    if torch.cuda.is_available():
        report.update(capture(args, profile, max_seqs, max_len))
    else:
        print("graph capture needs CUDA: stopping after the plan")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if not all(report.get("replay_ok", {}).values()) else 0


if __name__ == "__main__":
    sys.exit(main())
