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
