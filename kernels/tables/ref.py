"""Plain-torch reference of kernels/tables: the runner's commit as torch ops (index_copy_ into the slots' entries,
then the padding entry S put back as it was)."""
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
