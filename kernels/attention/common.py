"""What both verify kernels share: the KV formats, the split-KV partials and the LSE combine that merges them."""
import torch
import triton
import triton.language as tl

from kernels import device as gpu
from kernels.attention.kv_write import load_kv_len
from kernels.device import load_slot, pdl_wait

KV_BF16, KV_FP8_BITS, KV_FP8_NATIVE = 0, 1, 2
NEG = tl.constexpr(-1.0e30)  # "no key seen yet": finite, so fully masked rows give 2^(-inf - NEG) = 0, never NaN
PART_EXTRA = 8  # fp32 words of a partial row after acc[D]: m, l, padding to a 32-byte sector


@triton.jit
def _combine_kernel(part_ptr, rows_ptr, lens_ptr, out_ptr, gate_ptr, nseg, Hq, num_slots, max_len,
                    s_pb, s_ph, s_pt, s_ps, s_ob, s_ot, s_oh, s_gb, s_gt, s_gh,
                    D: tl.constexpr, BLOCK_N: tl.constexpr, SEG_P2: tl.constexpr, BLOCK_D: tl.constexpr,
                    GATED: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    # Grid (B, q_len * Hq, D // BLOCK_D). EARLY (`fresh`): slot and length read before the wait, and only the
    # segments used requested; else all nseg, the unused masked after arrival.
    b = tl.program_id(0)
    t = tl.program_id(1) // Hq
    h = tl.program_id(1) % Hq
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    if not EARLY:
        pdl_wait(PDL)
    slot = load_slot(rows_ptr + b, num_slots)
    kv_len = load_kv_len(lens_ptr + b, slot, max_len)
    n_used = tl.minimum(tl.cdiv(kv_len, BLOCK_N), nseg)       # segments holding at least one tile
    offs_s = tl.arange(0, SEG_P2)
    s_ok = offs_s < n_used
    if EARLY:
        pdl_wait(PDL)
        s_load = s_ok
    else:
        s_load = offs_s < nseg
    base = part_ptr + b * s_pb + h * s_ph + t * s_pt + offs_s * s_ps
    m = tl.load(base + D, mask=s_load, other=NEG)
    l = tl.load(base + D + 1, mask=s_load, other=0.0)
    acc = tl.load(base[:, None] + offs_d[None, :], mask=s_load[:, None], other=0.0)
    m = tl.where(s_ok, m, NEG)
    w = tl.where(s_ok, tl.exp2(m - tl.max(m, 0)), 0.0)
    total = tl.sum(tl.where(s_ok, w * l, 0.0), 0)
    o = tl.sum(tl.where(s_ok[:, None], acc * w[:, None], 0.0), 0)
    o = tl.where(total > 0, o / total, 0.0)
    if GATED:
        o = o * tl.load(gate_ptr + b * s_gb + t * s_gt + h * s_gh + offs_d).to(tl.float32)
    tl.store(out_ptr + b * s_ob + t * s_ot + h * s_oh + offs_d, o.to(out_ptr.dtype.element_ty))


def kv_format(k_cache: torch.Tensor, native=None) -> int:
    """KV_BF16 for a bf16 cache; for e4m3 codes the native conversion where the GPU has one (or as asked)."""
    if k_cache.dtype == torch.bfloat16:
        return KV_BF16
    assert k_cache.dtype in (torch.uint8, torch.float8_e4m3fn), k_cache.dtype
    if native is None:
        native = not gpu.INTERPRET and k_cache.is_cuda and gpu.capability(k_cache.device) >= (8, 9)
    return KV_FP8_NATIVE if native else KV_FP8_BITS


def alloc_partials(batch_max: int, num_q_heads: int, q_max: int, nseg_max: int, head_dim: int, device):
    """Split-KV partials [B_max, Hq, Q_MAX, NSEG_max, D + PART_EXTRA] fp32. Allocate before any graph capture."""
    return torch.empty(batch_max, num_q_heads, q_max, nseg_max, head_dim + PART_EXTRA, dtype=torch.float32,
                       device=device)


def split_args(q, out, partials, nseg, gate):
    """Checked (partials, its strides [4], gate, its strides [3]), out standing in for those not used."""
    B, q_len, hq, D = q.shape
    if nseg > 1:
        assert partials is not None and partials.shape[0] >= B and partials.shape[1] == hq
        assert partials.shape[2] >= q_len and partials.shape[3] >= nseg
        assert partials.shape[4] == D + PART_EXTRA and partials.stride(-1) == 1
        part, s_part = partials, partials.stride()[:4]
    else:
        part, s_part = out, (0, 0, 0, 0)
    if gate is not None:
        assert gate.shape == q.shape and gate.stride(-1) == 1, "gate: [B, q_len, Hq, D], last dim contiguous"
        return part, s_part, gate, gate.stride()[:3]
    return part, s_part, out, (0, 0, 0)


def combine_block_d(batch: int, num_q_heads: int, head_dim: int) -> int:
    """The combine's head-dim slice a program: never by q_len, so decode and verify rows reduce alike."""
    return min(head_dim, 64) if batch * num_q_heads < 48 else head_dim


def combine(partials, cache_rows, kv_lens, out, gate, nseg, num_slots, max_len, block_n, fresh=None):
    """out (times gate) = Σ 2^(m_s−m*)·acc_s / Σ 2^(m_s−m*)·l_s over the segments holding a tile of block_n keys."""
    B, q_len, hq, D = out.shape
    _, s_part, g, s_gate = split_args(out, out, partials, nseg, gate)
    block_d = combine_block_d(B, hq, D)
    _combine_kernel[(B, q_len * hq, D // block_d)](
        partials, cache_rows, kv_lens, out, g, nseg, hq, num_slots, max_len, *s_part, *out.stride()[:3], *s_gate,
        D=D, BLOCK_N=block_n, SEG_P2=triton.next_power_of_2(nseg), BLOCK_D=block_d, GATED=gate is not None,
        EARLY=fresh is not None, **gpu.pdl_args(out.device))
