"""Launch tables of the Triton kernel (GPU tests, bench --sweep) and the KV segments of a batch bucket."""

# verify: (BLOCK_N, num_warps, num_stages) at the default rows tile
LAUNCH_CONFIGS = [(64, 4, 3), (64, 4, 2), (64, 8, 2), (32, 4, 2), (32, 8, 3), (128, 8, 2), (128, 4, 2)]
# prefill: (BLOCK_M, BLOCK_N, num_warps, num_stages)
PREFILL_CONFIGS = [(64, 32, 8, 2), (128, 64, 8, 2), (128, 32, 8, 3), (64, 64, 4, 2)]


def choose_nseg(batch: int, num_kv_heads: int, num_sms: int, nseg_max: int = 64) -> int:
    """KV segments per (sequence, kv head): one wave of two programs per SM. Never by length (width invariance)."""
    return max(1, min(nseg_max, 2 * num_sms // (batch * num_kv_heads)))
