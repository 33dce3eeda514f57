"""Split-K reduced inside one launch (store_tile): partial tiles added into a workspace, the last CTA of a tile
(its counter) stores the sum and zeroes workspace and counter again: no memset, safe in CUDA graphs."""
import torch
import triton
import triton.language as tl

from kernels import device as gpu


@triton.jit
def store_tile(acc, out_ptr, ws_ptr, cnt_ptr, rm, rn, M, N, stride_om, tile, SPLIT: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] fp32 of rows rm, columns rn; tile: its counter; SPLIT: K split over grid axis 2."""
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
    """K-splits filling ctas_per_sm per SM in one wave, ≥ MIN_GROUPS_PER_SPLIT groups each, none empty."""
    want = max(1, min(ctas_per_sm * sms // tiles, groups // MIN_GROUPS_PER_SPLIT))
    return triton.cdiv(groups, triton.cdiv(groups, want))


_WORKSPACES = {}   # (device, name) → (workspace, counters, older buffers kept alive)


def workspace(device, numel: int, tiles: int, name: str = "sums"):
    """Zeroed fp32 workspace (≥ numel) and int32 counters (≥ tiles) on `device`, one per name. Size it before graph
    capture; growing it later allocates (older buffers stay referenced for the graphs that use them)."""
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
