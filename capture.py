"""Plan (and, on CUDA, capture) the engine's static graphs for a model on a hardware profile.

Prints the static memory plan: weights, per-sequence recurrent state (k+1 slots), KV bytes per token, and the
context each batch bucket can hold. CUDA-graph capture of the draft + verify + sample step is being built in
graphs/ (issue 3 provides its kernels); until then this command stops after the plan."""
import argparse
import sys

from graphs.plan import load_profile, plan
from layers.config import ConfigError, ModelConfig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the demo model)")
    ap.add_argument("--profile", default="rtx3090", help="profiles/<name>.json or a path (default rtx3090)")
    args = ap.parse_args(argv)
    from engine.engine import DEMO_MODEL
    try:
        cfg = ModelConfig.from_dir(args.model or DEMO_MODEL)
        profile = load_profile(args.profile)
    except (ConfigError, ValueError, OSError) as e:        # OSError: a --model that is a file, say
        print(f"error: {e}", file=sys.stderr)
        return 2
    p = plan(cfg, profile)
    memory = profile["memory_gib"] * 2**30
    print(f"{profile['name']}: {profile['memory_gib']} GiB, {profile['bandwidth_GBps']} GB/s, spec_k {profile['spec_k']}")
    print(f"weights ~{p.weight_bytes / 2**30:.2f} GiB | state {p.state_bytes_per_seq / 2**20:.1f} MiB/seq | "
          f"KV {p.kv_bytes_per_token / 2**10:.1f} KiB/token ({profile['kv_dtype']})")
    print("| batch | context tokens per sequence |\n|---|---|")
    for b in profile["batch_buckets"]:
        tokens = p.max_tokens(memory, b)
        print(f"| {b} | {tokens:,}{' (max_position_embeddings)' if tokens == p.max_context else ''} |")
    print("graph capture: not available yet (the plan above is what it will allocate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
