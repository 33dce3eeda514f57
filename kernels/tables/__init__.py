"""The model runner's per-slot tables (graphs/buffers.py) around a step, one launch each. gather: each row's
entries (slot S, the padding entry, for padding rows) copied into the step's per-row vectors, and the row's
pending token (the last it emitted) into the verify's first column. pass_tables: a pass's kv_lens, rope rows
and GDN slot table. commit: each live row's outcome written into
its sequence's entries — the cached length, the tokens emitted, the GDN / conv kernels' num_accepted, the GDN
slot holding the state (state_at), the emitted ids and the post-norm hiddens the next step's MTP re-runs;
padding rows write nothing, so the padding entry keeps its values. References: ref.py, the torch ops they
replace."""
import triton
import triton.language as tl

from kernels.device import check_dense, pdl_args, pdl_wait


@triton.jit
def _gather_kernel(rows_ptr, rows_long_ptr, seq_len_ptr, emitted_ptr, num_acc_ptr, state_at_ptr, temp_ptr,
                   top_k_ptr, top_p_ptr, row_len_ptr, row_emitted_ptr, row_acc_ptr, row_at_ptr, row_temp_ptr,
                   row_top_k_ptr, row_top_p_ptr, last_ids_ptr, last_stride, ids_ptr, ids_stride, B,
                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One program: B ≤ BLOCK rows."""
    pdl_wait(PDL)
    i = tl.arange(0, BLOCK)
    m = i < B
    slot = tl.load(rows_ptr + i, mask=m, other=0).to(tl.int64)
    tl.store(rows_long_ptr + i, slot, mask=m)
    tl.store(row_len_ptr + i, tl.load(seq_len_ptr + slot, mask=m), mask=m)
    emitted = tl.load(emitted_ptr + slot, mask=m, other=1)
    tl.store(row_emitted_ptr + i, emitted, mask=m)
    tl.store(row_acc_ptr + i, tl.load(num_acc_ptr + slot, mask=m), mask=m)
    tl.store(row_at_ptr + i, tl.load(state_at_ptr + slot, mask=m), mask=m)
    tl.store(row_temp_ptr + i, tl.load(temp_ptr + slot, mask=m), mask=m)
    tl.store(row_top_k_ptr + i, tl.load(top_k_ptr + slot, mask=m), mask=m)
    tl.store(row_top_p_ptr + i, tl.load(top_p_ptr + slot, mask=m), mask=m)
    tl.store(ids_ptr + i * ids_stride, tl.load(last_ids_ptr + slot * last_stride + emitted - 1, mask=m), mask=m)


def gather(rows, rows_long, seq_len, emitted, num_acc, state_at, temperature, top_k, top_p, row_len, row_emitted,
           row_acc, row_at, row_temperature, row_top_k, row_top_p, last_ids, ids):
    """rows [B] int32 slot ids (S: padding) → rows_long [B] int64 the same; row_x[b] = x[rows[b]] for the tables
    seq_len, emitted, num_acc, state_at, temperature, top_k, top_p [S+1] (into row_len, row_emitted, row_acc,
    row_at, row_temperature, row_top_k, row_top_p [B]); ids[b, 0] = last_ids[rows[b], emitted − 1] (ids [B, ≥1],
    last_ids [S+1, Tm], row strides any)."""
    B = rows.shape[0]
    vectors = dict(rows=rows, rows_long=rows_long, seq_len=seq_len, emitted=emitted, num_acc=num_acc,
                   state_at=state_at, temperature=temperature, top_k=top_k, top_p=top_p, row_len=row_len,
                   row_emitted=row_emitted, row_acc=row_acc, row_at=row_at, row_temperature=row_temperature,
                   row_top_k=row_top_k, row_top_p=row_top_p)
    check_dense("gather", **vectors)
    assert last_ids.stride(1) == 1 and ids.stride(1) == 1
    if B:
        _gather_kernel[(1,)](*vectors.values(), last_ids, last_ids.stride(0), ids, ids.stride(0), B,
                             BLOCK=triton.next_power_of_2(B), num_warps=1, **pdl_args(ids.device))


@triton.jit
def _pass_kernel(start_ptr, rows_ptr, acc_ptr, state_at_ptr, cos_table_ptr, sin_table_ptr, kv_lens_ptr, cos_ptr,
                 sin_ptr, slots_ptr, shift_ptr, cap, RD, TM, fixed, T: tl.constexpr, MODE: tl.constexpr,
                 BLOCK_RD: tl.constexpr, PDL: tl.constexpr):
    """Grid (B, T): program (b, t) the rope row and GDN slot of token t; t = 0 also kv_lens (and the shift)."""
    b, t = tl.program_id(0), tl.program_id(1)
    pdl_wait(PDL)
    start = tl.load(start_ptr + b)
    pos = tl.minimum(tl.maximum(start + t, 0), cap - 1).to(tl.int64)     # a padding row's MTP start is 0 − 1
    d = tl.arange(0, BLOCK_RD)
    m = d < RD
    row = (b * T + t).to(tl.int64) * RD
    tl.store(cos_ptr + row + d, tl.load(cos_table_ptr + pos * RD + d, mask=m), mask=m)
    tl.store(sin_ptr + row + d, tl.load(sin_table_ptr + pos * RD + d, mask=m), mask=m)
    if t == 0:
        tl.store(kv_lens_ptr + b, start + T)
    if MODE == 1:                                  # every row's state in slot `fixed`
        tl.store(slots_ptr + b * T + t, tl.load(rows_ptr + b) * TM + fixed)
    if MODE == 2:                                  # rotated from state_at by the accepted count
        shift = tl.load(state_at_ptr + b) - tl.minimum(tl.maximum(tl.load(acc_ptr + b) - 1, 0), T - 1)
        if t == 0:
            tl.store(shift_ptr + b, shift)
        e = (shift + t) % TM
        tl.store(slots_ptr + b * T + t, tl.load(rows_ptr + b) * TM + tl.where(e < 0, e + TM, e))


def pass_tables(start, rows, cos_table, sin_table, kv_lens, cos, sin, slots=None, fixed: int = None, acc=None,
                state_at=None, shift=None, slots_per_seq: int = 1):
    """A verify-shaped pass of B rows × T tokens from positions start [B] (int32; rows [B] their slot ids):
    kv_lens [B] = start + T, cos / sin [B·T, rd] = the tables' rows at clamp(start + t, 0, cap − 1); and the GDN
    slot table slots [B, T] (None: none), either rows·slots_per_seq + fixed, or (acc given) rotated:
    shift [B] = state_at − clamp(acc − 1, 0, T − 1), slots = rows·slots_per_seq + (shift + t) mod
    slots_per_seq (graphs/runner._row_pass)."""
    B, T = kv_lens.shape[0], cos.shape[0] // max(kv_lens.shape[0], 1)
    mode = 0 if slots is None else 1 if acc is None else 2
    check_dense("pass_tables", start=start, rows=rows, cos_table=cos_table, sin_table=sin_table, kv_lens=kv_lens,
                cos=cos, sin=sin, slots=slots, acc=acc, state_at=state_at, shift=shift)
    assert cos.shape[0] == B * T and (mode != 1 or fixed is not None)
    if B:
        dummy = kv_lens
        _pass_kernel[(B, T)](start, rows, acc if mode == 2 else dummy, state_at if mode == 2 else dummy, cos_table,
                             sin_table, kv_lens, cos, sin, dummy if slots is None else slots,
                             shift if mode == 2 else dummy, cos_table.shape[0], cos_table.shape[1], slots_per_seq,
                             fixed or 0, T=T, MODE=mode, BLOCK_RD=triton.next_power_of_2(cos_table.shape[1]),
                             num_warps=1, **pdl_args(cos.device))


@triton.jit
def _commit_kernel(rows_ptr, count_ptr, row_len_ptr, row_shift_ptr, ids_ptr, ids_stride, hid_in_ptr,
                   seq_len_ptr, emitted_ptr, num_acc_ptr, state_at_ptr, last_ids_ptr, last_stride, hidden_ptr,
                   hidden_stride, num_slots, H, acc_offset, TM, T: tl.constexpr, BLOCK_H: tl.constexpr,
                   PDL: tl.constexpr):
    """Grid (B, T): program (b, t) copies row b's t-th id and hidden; t = 0 also its scalars."""
    b, t = tl.program_id(0), tl.program_id(1)
    pdl_wait(PDL)
    slot = tl.load(rows_ptr + b).to(tl.int64)
    if slot < num_slots:
        c = tl.load(count_ptr + b)
        if t == 0:
            tl.store(seq_len_ptr + slot, tl.load(row_len_ptr + b) + c)
            tl.store(emitted_ptr + slot, c)
            tl.store(num_acc_ptr + slot, c + acc_offset)
            at = (tl.load(row_shift_ptr + b) + c - 1) % TM
            tl.store(state_at_ptr + slot, tl.where(at < 0, at + TM, at))     # the remainder of torch's sign
        tl.store(last_ids_ptr + slot * last_stride + t, tl.load(ids_ptr + b * ids_stride + t))
        src = hid_in_ptr + (b * T + t).to(tl.int64) * H
        dst = hidden_ptr + slot * hidden_stride + t * H
        for h0 in range(0, H, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            tl.store(dst + h, tl.load(src + h, mask=h < H), mask=h < H)


def commit(rows, counts, row_len, row_shift, ids, out_hidden, seq_len, emitted, num_acc, state_at, last_ids,
           hidden, acc_offset: int):
    """rows [B] slot ids (int32 / int64; >= S = seq_len's entries − 1: padding), counts, row_len, row_shift [B]
    int32 (the round's emitted count, the row's length before it, _state_table's state_at − c), ids [B, T] int32
    (row stride any), out_hidden [B·T, H]; the tables: seq_len, emitted, num_acc, state_at [S+1] int32, last_ids
    [S+1, ≥T] int32 and hidden [S+1, ≥T, H] (row strides any). For each live row at slot s: seq_len[s] =
    row_len + c, emitted[s] = c, num_acc[s] = c + acc_offset, state_at[s] = (row_shift + c − 1) mod
    last_ids.shape[1], last_ids[s, :T] = ids, hidden[s, :T] = its T hiddens."""
    B, T = ids.shape
    H = out_hidden.shape[-1]
    check_dense("commit", rows=rows, counts=counts, row_len=row_len, row_shift=row_shift, seq_len=seq_len,
                emitted=emitted, num_acc=num_acc, state_at=state_at)
    assert out_hidden.is_contiguous() and out_hidden.shape[0] >= B * T and ids.stride(1) == 1
    assert last_ids.stride(1) == 1 and hidden.stride(1) == H and hidden.stride(2) == 1
    if B:
        _commit_kernel[(B, T)](rows, counts, row_len, row_shift, ids, ids.stride(0), out_hidden, seq_len, emitted,
                               num_acc, state_at, last_ids, last_ids.stride(0), hidden, hidden.stride(0),
                               seq_len.shape[0] - 1, H, acc_offset, last_ids.shape[1], T=T,
                               BLOCK_H=min(triton.next_power_of_2(H), 2048), num_warps=4, **pdl_args(ids.device))


__all__ = ["commit", "gather", "pass_tables"]
