"""The engine end to end on a GPU, beside the roofline. Writes bench/results/engine-<gpu>.json
and .md (bench/harness.write_results: the GPU, the copy bandwidth measured in the same run, result rows).

    python -m bench.engine --model bench/random-27b [--parts step,demo,concurrency,prefill,transformers]
                           [--ctx 4096] [--ks 0,1,2,3,4] [--accept .84,.60,.38,.22] [--concurrency 1,2,4,...,64]

Parts (each selectable):
  step          one request at --ctx context on --model (the random 27B prepared dir, tools/random_model.py),
                really prefilled, for each k: the runner's replayed step and its phases (bench.step.replayed: each
                phase captured as its own graph), the host gap (a run.py-like loop: wall time per step − the
                replayed step), the roofline of the step's bytes
                (tools.targets.step_bytes), and tok/s projected at --accept (bench.step.tokens_per_step). bench.step
                times the same runner on a random model made in memory, its context set rather than prefilled
  demo          `run.py --model models/demo --json --ignore-eos --max-new-tokens 256` on the GPU, k 0 and 4, greedy
                and the model's sampling, --demo-prompts prompts: tok/s and acceptance from the JSON
  concurrency   N = 1, 2, 4, … 64 requests of --prompt-tokens token ids and --gen-tokens generated (ignore_eos) in
                one batch file through `run.py --batch-file … --spec-k 0 --max-seqs N`: generated tok/s from
                --batch-summary-json (total generated tokens / the batch's duration)
  prefill       prompts of 4k and 32k token ids, max_tokens 1, one each through the batch path: the record's
                timings.prompt_per_second
  transformers  transformers' Qwen3_5ForCausalLM built from --model's config in bf16 on the GPU (random weights),
                greedy generate of --hf-new-tokens at 1 and 16 sequences: tok/s; skipped (a row saying why) when
                transformers lacks the class or the model does not fit
run.py subprocesses run on CUDA with the graph engine (its default there). Parts run apart (one call each, as a
device's time limit may ask) add up: the results keep the rows of the parts not run this time."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from tools.engine_bench import PROMPT_ID_RANGE, batch_lines, concurrency_row, demo_row, earlier_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("step", "demo", "concurrency", "prefill", "transformers")
DEMO = os.path.join(REPO, "models", "demo")
RANDOM_27B = os.path.join(REPO, "models", "random-27b")
DEMO_PROMPTS = ["def fibonacci(n):", "import os\n\ndef walk(root):", "class Stack:\n    def __init__(self):",
                "Write a function that parses a CSV line."]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=RANDOM_27B, help="prepared dir (default: the random 27B of "
                    "bench/run_benchmarks.sh)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--ctx", type=int, default=4096, help="context of the step part")
    ap.add_argument("--ks", default="0,1,2,3,4", help="draft counts of the step part")
    ap.add_argument("--accept", default=".84,.60,.38,.22", help="acceptance of draft positions 1, 2, … (projection)")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=512)
    ap.add_argument("--prefill-lengths", default="4096,32768")
    ap.add_argument("--demo-prompts", type=int, default=len(DEMO_PROMPTS))
    ap.add_argument("--hf-batches", default="1,16")
    ap.add_argument("--hf-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown or not args.parts:
        ap.error(f"--parts: {', '.join(unknown) or 'none given'}; choose from {', '.join(PARTS)}")
    try:
        args.ks, args.concurrency, args.prefill_lengths, args.hf_batches = (
            [int(x) for x in getattr(args, name).split(",")] for name in ("ks", "concurrency", "prefill_lengths",
                                                                           "hf_batches"))
        args.accept = [float(x) for x in args.accept.split(",")]
    except ValueError as e:
        ap.error(f"a comma-separated list is not numbers: {e}")
    if max(args.ks) > len(args.accept) or min(args.ks) < 0:
        ap.error(f"--ks {args.ks}: each in [0, {len(args.accept)}] (--accept gives {len(args.accept)} rates)")
    if not 1 <= args.demo_prompts <= len(DEMO_PROMPTS):
        ap.error(f"--demo-prompts must be in [1, {len(DEMO_PROMPTS)}]")
    return args


# ------------------------------------------------------------------------------------------------ run.py
def run_py(*flags, timeout=1800) -> subprocess.CompletedProcess:
    """run.py on CUDA as a subprocess; fails with its stderr's tail."""
    cmd = [sys.executable, os.path.join(REPO, "run.py"), "--device", "cuda", *map(str, flags)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[1:])[:200]} exited {done.returncode}: {done.stderr[-800:]}")
    return done


def run_batch(model: str, lines: list, *flags) -> tuple:
    """lines through `run.py --batch-file`: (the summary JSON, the output records)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out, summary = (os.path.join(tmp, n) for n in ("in.jsonl", "out.jsonl", "summary.json"))
        with open(src, "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        run_py("--model", model, "--batch-file", src, "--output", out, "--batch-summary-json", summary, *flags)
        with open(summary) as f, open(out) as g:
            return json.load(f), [json.loads(line) for line in g if line.strip()]


def part_concurrency(args) -> list:
    rows = []
    for n in args.concurrency:
        summary, _ = run_batch(args.model, batch_lines(n, args.prompt_tokens, args.gen_tokens),
                               "--spec-k", 0, "--max-seqs", n)
        rows.append(concurrency_row(n, summary, args.prompt_tokens, args.gen_tokens))
        print(rows[-1], flush=True)
    return rows


def part_prefill(args) -> list:
    rows = []
    for length in args.prefill_lengths:
        _, records = run_batch(args.model, batch_lines(1, length, 1), "--spec-k", 0, "--max-seqs", 1,
                               "--max-len", length + 64)
        t = records[0]["response"]["body"]["timings"]
        rows.append({"kernel": "prefill", "shape": f"prompt{t['prompt_n']}", "us": round(t["prompt_ms"] * 1e3, 1),
                     "tok_s": t["prompt_per_second"]})
        print(rows[-1], flush=True)
    return rows


def part_demo(args) -> list:
    rows = []
    for k in (0, 4):
        for greedy in (True, False):
            prompts = [f for p in DEMO_PROMPTS[:args.demo_prompts] for f in ("--prompt", p)]
            done = run_py("--model", DEMO, "--json", "--ignore-eos", "--max-new-tokens", 256, "--spec-k", k,
                          "--seed", 0, *(["--temperature", 0] if greedy else []), *prompts)
            rows.append(demo_row(k, greedy, [json.loads(line) for line in done.stdout.splitlines() if line.strip()]))
            print(rows[-1], flush=True)
    return rows


# ------------------------------------------------------------------------------------------------ step
def fill_context(runner, ctx: int):
    """Slot 0 prefilled with ctx prompt tokens, chunk by chunk."""
    import random
    rng = random.Random(0)
    ids = [rng.randrange(*PROMPT_ID_RANGE) for _ in range(ctx + 1)]
    for start in range(0, ctx, runner.max_prefill):
        stop = min(ctx, start + runner.max_prefill)
        runner.prefill(0, ids[start:stop], start, last=stop == ctx, next_id=ids[stop])


def part_step(args, peak) -> list:
    import torch
    from bench.step import at_context, replayed, tokens_per_step
    from graphs.runner import ModelRunner
    from layers.prepared import load_draft_vocab, load_prepared
    from tools.targets import row, step_bytes
    prepared = load_prepared(args.model, "cuda")
    draft = load_draft_vocab(args.model, prepared.cfg.vocab_size)     # the engine's draft head (None: the lm_head)
    draft_vocab = prepared.cfg.vocab_size if draft is None else len(draft)
    rows = []
    for k in args.ks:
        runner = ModelRunner(prepared, 1, args.ctx + 512, spec_k=k, max_prefill=2048,
                             draft_tokens=draft if k else None)
        runner.capture([1])
        fill_context(runner, args.ctx)
        runner.set_rows([0])
        step_us, phases = replayed(runner, 1, lambda r=runner: at_context(r, 1, args.ctx))   # trials from ctx
        wall = []
        for _ in range(30):                           # as run.py's loop: step, fetch, wait for the tokens
            t = time.perf_counter()
            runner.step([0])
            runner.fetch(1).wait()
            wall.append((time.perf_counter() - t) * 1e3)
        tokens = tokens_per_step(k, args.accept)
        rows.append(row("runner step", f"B1 k{k} ctx{args.ctx}", step_us,
                        step_bytes(prepared.cfg, 1, k, args.ctx, draft_vocab), 0, peak,
                        **{f"{n}_us": round(us, 1) for n, us in phases},
                        host_gap_us=round((statistics.median(wall)) * 1e3 - step_us, 1),
                        tokens_per_step=round(tokens, 2),
                        tok_s=round(tokens / (step_us * 1e-6), 1)))
        print(rows[-1], flush=True)
        del runner
        torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------------------ transformers
def part_transformers(args) -> list:
    import torch
    try:
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    except ImportError as e:
        return [{"kernel": "transformers", "shape": "skipped", "note": f"no Qwen3_5ForCausalLM: {e}"[:120]}]
    with open(os.path.join(args.model, "config.json")) as f:
        raw = json.load(f)
    raw = {k: v for k, v in raw.items() if k not in ("architectures", "model_type", "torch_dtype")}
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)           # built in bf16: an fp32 27B would not fit beside its copy
    try:
        with torch.device("cuda"):
            model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**raw)).eval()
    except torch.cuda.OutOfMemoryError as e:
        return [{"kernel": "transformers", "shape": "skipped", "note": f"does not fit: {e}"[:120]}]
    finally:
        torch.set_default_dtype(default)
    rows = []
    for B in args.hf_batches:
        ids = torch.randint(*PROMPT_ID_RANGE, (B, args.prompt_tokens), device="cuda")
        try:
            with torch.no_grad():
                model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)       # warm-up
                torch.cuda.synchronize()
                t = time.perf_counter()
                model.generate(ids, max_new_tokens=args.hf_new_tokens, min_new_tokens=args.hf_new_tokens,
                               do_sample=False)
                torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError as e:
            rows.append({"kernel": "transformers", "shape": f"B{B}", "note": f"out of memory: {e}"[:120]})
            continue
        seconds = time.perf_counter() - t
        rows.append({"kernel": "transformers generate bf16", "shape": f"B{B} prompt{args.prompt_tokens} "
                     f"gen{args.hf_new_tokens}", "us": round(seconds / args.hf_new_tokens * 1e6, 1),
                     "tok_s": round(B * args.hf_new_tokens / seconds, 1)})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from bench.harness import gpu_name, measure_bandwidth, write_results
    if not torch.cuda.is_available():
        print("bench.engine needs CUDA", file=sys.stderr)
        return 2
    peak = measure_bandwidth()["copy_Bps"]
    torch.cuda.empty_cache()
    from bench.harness import RESULTS, gpu_slug
    rows = earlier_rows(os.path.join(RESULTS, f"engine-{gpu_slug()}.json"), args.parts)
    for part in args.parts:
        new = part_step(args, peak) if part == "step" else globals()[f"part_{part}"](args)
        rows += [{"part": part, **r} for r in new]
        torch.cuda.empty_cache()                      # nothing held while the next part's run.py runs
    meta = {"gpu": gpu_name(), "torch": torch.__version__, "peak_copy_GBps": round(peak / 1e9, 1),
            "model": args.model, "accept": args.accept}
    print(write_results("engine", rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
