"""kernels/tables against ref.py. gather: every row's entries (the padding entry S for padding rows) and its
pending token, nothing else written. commit: every live row's slot entries written as the torch ops write them,
padding rows (slot S, any number of them) writing nothing, negative state shifts wrapped as torch's remainder
wraps them, and no other entry touched."""
import pytest
import torch

from kernels.tables import commit, gather, pass_tables
from kernels.tables.ref import commit_ref, gather_ref, pass_tables_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def tables(S, Tm, H, g):
    i32 = dict(dtype=torch.int32, device=DEV)
    return [torch.randint(-9, 99, (S + 1,), generator=g).to(**i32) for _ in range(4)] + [
        torch.randint(-9, 99, (S + 1, Tm), generator=g).to(**i32),
        torch.randn(S + 1, Tm, H, generator=g).to(DEV, torch.bfloat16)]


@pytest.mark.parametrize("T, H", [(1, 200), (5, 200), (3, 5120)])
@pytest.mark.parametrize("rows", [[2, 0], [6, 1, 6, 4, 6]])        # 6 = S: padding, repeated
def test_commit_writes_what_the_torch_ops_write(T, H, rows):
    S, Tm = 6, 5
    g = torch.Generator().manual_seed(T * 7 + len(rows))
    B = len(rows)
    rows = torch.tensor(rows, dtype=torch.int32, device=DEV)
    counts = torch.randint(1, T + 1, (B,), generator=g).to(DEV, torch.int32)
    row_len = torch.randint(0, 1000, (B,), generator=g).to(DEV, torch.int32)
    row_shift = torch.randint(-Tm, Tm, (B,), generator=g).to(DEV, torch.int32)      # negative ones wrap
    ids = torch.randint(0, 5000, (B, Tm), generator=g).to(DEV, torch.int32)[:, :T]  # a row stride of Tm
    hid = torch.randn(B * T + 3, H, generator=g).to(DEV, torch.bfloat16)
    want, got = tables(S, Tm, H, g), None
    got = [t.clone() for t in want]
    commit_ref(rows, counts, row_len, row_shift, ids, hid, *want, acc_offset=2)
    commit(rows, counts, row_len, row_shift, ids, hid, *got, acc_offset=2)
    for name, a, b in zip(("seq_len", "emitted", "num_acc", "state_at", "last_ids", "hidden"), got, want):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("rows", [[3], [6, 0, 6, 2, 5], list(range(7)) * 9 + [6]])   # 6 = S: padding
def test_gather_reads_what_the_torch_ops_read(rows):
    S, Tm = 6, 5
    g = torch.Generator().manual_seed(len(rows))
    B = len(rows)
    i32, f32 = dict(dtype=torch.int32), dict(dtype=torch.float32)
    rows = torch.tensor(rows, **i32).to(DEV)
    emitted = torch.randint(1, Tm + 1, (S + 1,), generator=g).to(DEV, torch.int32)
    tables = [torch.randint(0, 999, (S + 1,), generator=g, **i32).to(DEV), emitted,
              *(torch.randint(0, 999, (S + 1,), generator=g, **i32).to(DEV) for _ in range(2)),
              torch.rand(S + 1, generator=g, **f32).to(DEV), torch.randint(0, 50, (S + 1,), generator=g, **i32).to(DEV),
              torch.rand(S + 1, generator=g, **f32).to(DEV)]
    last_ids = torch.randint(0, 5000, (S + 1, Tm), generator=g, **i32).to(DEV)
    outs = []
    for fn in (gather, gather_ref):
        rows_long = torch.full((B,), -7, dtype=torch.int64, device=DEV)              # poisoned
        vectors = [torch.full((B,), -7, dtype=t.dtype, device=DEV) for t in tables]
        ids = torch.full((B, 4), -7, dtype=torch.int32, device=DEV)
        fn(rows, rows_long, *tables, *vectors, last_ids, ids)
        outs.append([rows_long, *vectors, ids])
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert (outs[0][-1][:, 1:] == -7).all()                  # only the first column is the gather's


@pytest.mark.parametrize("mode", ["rope only", "fixed slot", "rotated"])
@pytest.mark.parametrize("T", [1, 5])
def test_pass_tables_as_the_torch_ops(mode, T):
    B, S, Tm, cap, rd = 5, 6, 5, 40, 24
    g = torch.Generator().manual_seed(T)
    i32 = dict(dtype=torch.int32)
    start = torch.tensor([0, 37, -1, 12, 39], **i32).to(DEV)                      # clamped at both ends
    rows = torch.tensor([2, S, 0, 5, S], **i32).to(DEV)
    acc = torch.randint(1, Tm + 1, (B,), generator=g, **i32).to(DEV)
    state_at = torch.randint(0, Tm, (B,), generator=g, **i32).to(DEV)
    tables = [torch.randn(cap, rd, generator=g).to(DEV, torch.bfloat16) for _ in range(2)]
    outs = []
    for fn in (pass_tables, pass_tables_ref):
        kv_lens = torch.full((B,), -7, **i32, device=DEV)
        cos, sin = (torch.full((B * T, rd), float("nan"), device=DEV, dtype=torch.bfloat16) for _ in range(2))
        slots = None if mode == "rope only" else torch.full((B, T), -7, **i32, device=DEV)
        shift = torch.full((B,), -7, **i32, device=DEV)
        fn(start, rows, *tables, kv_lens, cos, sin, slots=slots, fixed=4 if mode == "fixed slot" else None,
           acc=acc if mode == "rotated" else None, state_at=state_at, shift=shift, slots_per_seq=Tm)
        outs.append([kv_lens, cos, sin, shift] + ([] if slots is None else [slots]))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
