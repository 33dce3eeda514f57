#!/usr/bin/env bash
# Install check on a GPU machine, about a minute: every Triton kernel compiles for this GPU's architecture
# (tools/aot_compile.py), and the demo model's graphs capture for every batch bucket and replay bitwise like
# eager steps (capture.py). Exit status 0 only when both hold.
#
#   bench/verify.sh [PROFILE]     (default h200; rtx3090 on a bigger GPU holds capture to 24 GiB)
set -euo pipefail
cd "$(dirname "$0")/.."
arch=$(python -c "import torch; major, minor = torch.cuda.get_device_capability(); print(10 * major + minor)")
env -u TRITON_INTERPRET python -m tools.aot_compile "$arch" | grep -v " ok$"     # failures and the count
python capture.py --model models/demo --profile "${1:-h200}" --check-steps 8
echo "verify: ok"
