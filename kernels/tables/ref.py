"""Plain-torch references of kernels/tables: the runner's gather and commit as torch ops."""
import torch


def commit_ref(rows, counts, row_len, row_shift, ids, out_hidden, seq_len, emitted, num_acc, state_at, last_ids,
               hidden, acc_offset: int):
    """As kernels.tables.commit."""
    B, T = ids.shape
    S = seq_len.shape[0] - 1
    live = rows.long() < S
    r, c = rows.long()[live], counts[live]
    seq_len[r] = row_len[live] + c
    emitted[r] = c
    num_acc[r] = c + acc_offset
    state_at[r] = torch.remainder(row_shift[live] + c - 1, last_ids.shape[1]).to(state_at.dtype)
    last_ids[r, :T] = ids[live]
    hidden[r, :T] = out_hidden[:B * T].view(B, T, -1)[live]


def gather_ref(rows, rows_long, seq_len, emitted, num_acc, state_at, temperature, top_k, top_p, row_len,
               row_emitted, row_acc, row_at, row_temperature, row_top_k, row_top_p, last_ids, ids):
    """As kernels.tables.gather."""
    rows_long.copy_(rows)
    for table, row in ((seq_len, row_len), (emitted, row_emitted), (num_acc, row_acc), (state_at, row_at),
                       (temperature, row_temperature), (top_k, row_top_k), (top_p, row_top_p)):
        torch.index_select(table, 0, rows_long, out=row)
    ids[:, 0] = last_ids[rows_long, row_emitted.long() - 1]


def pass_tables_ref(start, rows, cos_table, sin_table, kv_lens, cos, sin, slots=None, fixed: int = None, acc=None,
                    state_at=None, shift=None, slots_per_seq: int = 1):
    """As kernels.tables.pass_tables."""
    B = kv_lens.shape[0]
    T = cos.shape[0] // B
    torch.add(start, T, out=kv_lens)
    t = torch.arange(T, device=start.device, dtype=start.dtype)
    pos = (start.view(B, 1) + t.view(1, T)).clamp(0, cos_table.shape[0] - 1).view(-1).long()
    torch.index_select(cos_table, 0, pos, out=cos)
    torch.index_select(sin_table, 0, pos, out=sin)
    if slots is None:
        return
    base = rows.view(B, 1).expand(B, T) * slots_per_seq
    if acc is None:
        slots.copy_(base + fixed)
        return
    shift.copy_(state_at - (acc - 1).clamp(0, T - 1))
    slots.copy_(base + torch.remainder(shift.view(B, 1) + t.view(1, T), slots_per_seq))
