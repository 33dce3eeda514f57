"""Split-K reduction inside one launch, for kernels whose CTAs each own a [BLOCK_M, BLOCK_N] output tile and a
slice of K.

With split-K every CTA adds its fp32 partial tile into a workspace (atomics at L2), then bumps a counter of the
tile; the CTA that arrives last reads the sum while writing zeros back (atomic exchange), stores the output in
its dtype and resets the counter. Workspace and counters are therefore zero again after every launch: no memset
node, no second kernel, safe to capture in a CUDA graph and to replay. Launches on one stream run one after the
other, so all call sites can share one workspace (`workspace()`), sized for the largest M·N and tile count."""
import torch
import triton
import triton.language as tl

from kernels import device as gpu


@triton.jit
def store_tile(acc, out_ptr, ws_ptr, cnt_ptr, rm, rn, M, N, stride_om, tile, SPLIT: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] fp32 for rows rm, columns rn; tile = index of this output tile (counter slot).
    SPLIT: the launch is split along K over grid axis 2 (tl.num_programs(2) CTAs per tile)."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    out = out_ptr + rm[:, None] * stride_om + rn[None, :]
    if not SPLIT:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ws = ws_ptr + rm[:, None] * N + rn[None, :]
        tl.atomic_add(ws, acc, mask=mask, sem="relaxed")
        tl.debug_barrier()                       # every thread's adds precede the release below
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if arrived == tl.num_programs(2) - 1:
            # exchange on the int32 view: same bits, and the interpreter only exchanges integers
            ws_bits = ws.to(tl.pointer_type(tl.int32), bitcast=True)
            total = tl.atomic_xchg(ws_bits, tl.zeros_like(acc).to(tl.int32), mask=mask, sem="relaxed")
            tl.store(out, total.to(tl.float32, bitcast=True).to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")


MIN_GROUPS_PER_SPLIT = 2


def split_count(tiles: int, groups: int, ctas_per_sm: int, sms: int) -> int:
    """How many K-splits for `tiles` output tiles over `groups` K-groups: enough CTAs for ctas_per_sm per SM, at most
    one wave (a part-filled second wave doubles the time: seen 512 CTAs on 396 slots, 40 → 32 µs at one wave),
    at least MIN_GROUPS_PER_SPLIT groups each, and never an empty split."""
    want = max(1, min(ctas_per_sm * sms // tiles, groups // MIN_GROUPS_PER_SPLIT))
    return triton.cdiv(groups, triton.cdiv(groups, want))


def split_share(groups: int, splits: int, unit: int = 1) -> int:
    """Groups per K-split as kernels/int4_wgmma.py cuts K (whole units of `unit` groups: 2 for their overlapped
    pairs; the last split takes what is left), or 0 where that cut leaves a split empty."""
    per = unit * triton.cdiv(groups // unit, splits)
    return per if (splits - 1) * per < groups else 0


_WORKSPACES = {}   # (device, name) → (fp32 workspace, int32 counters); grown, never shrunk, old ones kept alive


def workspace(device, numel: int, tiles: int, name: str = "sums"):
    """Zeroed fp32 workspace of ≥ numel elements and ≥ tiles int32 counters on `device`, one per name (kernels
    whose workspace need not be zero again after them keep their own). Call once with the largest sizes before
    capturing graphs; growing it later allocates (older buffers stay referenced, so graphs captured with them
    remain valid)."""
    key = (torch.device(device), name)
    ws, cnt, old = _WORKSPACES.get(key, (None, None, []))
    if ws is None or ws.numel() < numel or cnt.numel() < tiles:
        gpu.check_not_capturing(f"the {name!r} workspace", key[0])
        if ws is not None:
            old.append((ws, cnt))
        ws = torch.zeros(max(numel, 0 if ws is None else ws.numel()), dtype=torch.float32, device=key[0])
        cnt = torch.zeros(max(tiles, 0 if cnt is None else cnt.numel()), dtype=torch.int32, device=key[0])
        _WORKSPACES[key] = (ws, cnt, old)
    return ws, cnt
