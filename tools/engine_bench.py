"""What bench/engine.py writes for run.py and reads back from it, torch-free (as tools/targets.py is for the
kernel benchmarks): batch files of token-id prompts, result rows from run.py's batch summaries and --json
objects, and the rows an earlier run left in the results file."""
import json
import os
import random
import statistics

PROMPT_ID_RANGE = (1000, 100000)          # ordinary tokens of the Qwen3.5 vocabulary (no special ids)


def batch_lines(n: int, prompt_tokens: int, max_tokens: int, seed: int = 0) -> list:
    """n completions requests (ASSETS.md §5) whose prompts are prompt_tokens token ids, ignore_eos, greedy."""
    rng = random.Random(seed)
    return [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
             "body": {"prompt": [rng.randrange(*PROMPT_ID_RANGE) for _ in range(prompt_tokens)],
                      "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}} for i in range(n)]


def concurrency_row(n: int, summary: dict, prompt_tokens: int, gen_tokens: int) -> dict:
    """The row of n concurrent requests from run.py's --batch-summary-json: generated tokens over the duration."""
    if summary["completed"] != n:
        raise RuntimeError(f"{n} requests: {summary['completed']} completed, {summary['failed']} failed")
    return {"kernel": "concurrency", "shape": f"N{n} prompt{prompt_tokens} gen{gen_tokens} k0",
            "us": round(summary["duration"] * 1e6, 1), "tok_s": round(summary["output_throughput"], 1),
            "generated": summary["total_output_tokens"]}


def demo_row(k: int, greedy: bool, results: list) -> dict:
    """One row from run.py --json objects (one a prompt): generated tok/s over the prompts, acceptance."""
    stats = [r["stats"] for r in results]
    generated, seconds = sum(s["generated"] for s in stats), sum(s["decode_seconds"] for s in stats)
    drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
    return {"kernel": "demo", "shape": f"k{k} {'greedy' if greedy else 'sampled'} {len(stats)} prompts",
            "us": round(seconds / max(1, generated) * 1e6, 2), "tok_s": round(generated / max(seconds, 1e-9), 1),
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "tokens_per_step": round(statistics.mean(s["tokens_per_step"] for s in stats), 3)}


def earlier_rows(path: str, parts: list) -> list:
    """The rows of a results file (bench/results/engine-<gpu>.json) from other parts than these (none when there
    is no file): parts run apart add up."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in json.load(f)["rows"] if r.get("part") not in parts]
