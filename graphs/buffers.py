"""Every static buffer of the model runner (graphs/runner.py), allocated once before any step or capture.

Slots: a sequence owns slot s in [0, S) of every cache; the id S stands for a padding row (every pool has at most
S·(k+1) entries, so S and every id derived from it read as padding to the kernels, ENGINE.md §1.1), and the
per-slot tables below have S + 1 entries so a padding row's gather and scatter land on entry S.
  attention layer (and the MTP layer)  k_cache, v_cache [S, Hkv, cap, D] (fp8 e4m3 codes as uint8, or bf16),
                                       k_scale, v_scale [Hkv] fp32 (1.0: no calibration; bf16 KV: None)
  GDN layer                            state pool [S·(k+1), Hv, dk, dv] fp16, sequence s: slots s·(k+1) + t;
                                       conv window [S, C, K−1+k] bf16 (widened by k, ENGINE.md §1.1)
Per-slot tables, kept on the device from step to step (nothing read back inside a step):
  seq_len [S+1]           tokens in the target's caches (the next verify's first position)
  num_acc [S+1]           the GDN / conv kernels' num_accepted: accepted + 1 + (k − the round's drafts) after a
                          round (the conv window's offset + 1), k + 1 after a prefill (the window ends at its last
                          column)
  state_at [S+1]          which of the sequence's k+1 GDN slots holds its state (k after a prefill; see
                          ModelRunner._row_pass)
  emitted [S+1]           tokens the last round emitted (1 after a prefill: the first sampled token)
  last_ids [S+1, k+1]     the last round's emitted ids (then −1); the pending token is last_ids[emitted − 1]
  hidden [S+1, k+1, H]    the last round's post-norm hiddens, the MTP's inputs of the next step's drafting
  temperature, top_k, top_p [S+1]  sampling parameters (entry S greedy)
Activations are sized for R rows: max(S·(k+1), max_prefill); a pass of M rows uses the first M. Passes of at
most MAX_ROWS rows on an int4 body use `sums` instead for the linears' outputs: int64 sums (kernels/fixed_sum.py)
that the int4 GEMV adds into and each reader converts and clears, so they are all zero between passes."""
import torch
import triton

from kernels.attention import alloc_partials, choose_nseg, kv_cache
from kernels.gdn import prefill_workspace, state_pool
from kernels.int4 import MAX_ROWS
from kernels.norms.ref import rope_tables
from kernels.sampler import RejectionWorkspace, SamplerWorkspace
from kernels import device as gpu

GDN_CHUNK = 64                    # kernels.gdn.chunked's chunk on every device


class Buffers:
    def __init__(self, cfg, max_seqs: int, max_len: int, spec_k: int, max_prefill: int, kv_dtype, device,
                 draft_vocab: int = None, ks=()):
        """ks: the draft counts steps use (one rejection workspace each); draft_vocab: the draft head's rows."""
        S, k, H, V = max_seqs, spec_k, cfg.hidden_size, cfg.vocab_size
        T = k + 1
        self.S, self.k = S, k
        self.cap = -(-(max_len + T) // 64) * 64                 # KV positions, and rows of the rope tables
        self.rows_max = R = max(S * T, max_prefill)
        bf = dict(dtype=torch.bfloat16, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        f32 = dict(dtype=torch.float32, device=device)
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        C, K, I = cfg.linear_conv_dim, cfg.linear_conv_kernel_dim, cfg.intermediate_size
        fp8 = kv_dtype == torch.uint8

        def kv():
            kc, vc = kv_cache(S, hkv, self.cap, d, kv_dtype, device)
            scale = (lambda: torch.ones(hkv, **f32)) if fp8 else (lambda: None)
            return kc, vc, scale(), scale()

        self.layers = []                                        # per layer: (kc, vc, ks, vs) or (pool, conv)
        for t in cfg.layer_types:
            if t == "full_attention":
                self.layers.append(kv())
            else:
                self.layers.append((state_pool(S * T, hv, dk, dv, torch.float16, device),
                                    torch.zeros(S, C, K - 1 + k, **bf)))
        self.conv_windows = [cache[1] for cache in self.layers if len(cache) == 2]
        self.mtp_kv = kv() if k else None

        # per-slot tables
        self.seq_len = torch.zeros(S + 1, **i32)
        self.num_acc = torch.ones(S + 1, **i32)
        self.state_at = torch.zeros(S + 1, **i32)
        self.emitted = torch.ones(S + 1, **i32)
        self.last_ids = torch.zeros(S + 1, T, **i32)
        self.hidden = torch.zeros(S + 1, T, H, **bf)
        self.temperature = torch.zeros(S + 1, **f32)
        self.top_k = torch.zeros(S + 1, **i32)
        self.top_p = torch.ones(S + 1, **f32)

        # per-step inputs (the host fills rows) and what the step derives from them on the device
        self.rows = torch.full((S,), S, **i32)
        self.rows_long = torch.zeros(S, dtype=torch.int64, device=device)
        self.row_len, self.row_acc, self.row_emitted, self.row_at, self.row_shift = (torch.zeros(S, **i32)
                                                                                   for _ in range(5))
        self.kv_lens = torch.zeros(S * T, **i32)                 # [B] of a pass; the draft passes' [k − 1, B]
        self.acc_last = torch.full((S,), T, **i32)              # num_accepted of one-token passes: slot k
        self.row_temperature, self.row_top_p = torch.zeros(S, **f32), torch.ones(S, **f32)
        self.row_top_k = torch.zeros(S, **i32)
        self.state_slots = torch.zeros(S * T, **i32)             # [B, T] as a dense prefix
        self.mtp_start = torch.zeros(S, **i32)
        self.mtp_ids = torch.zeros(S, T, **i32)
        self.arange = torch.arange(R, **i32)
        self.arange_rows = torch.arange(S, **i32) * T
        self.gather_idx = torch.zeros(S, dtype=torch.int64, device=device)
        self.positions = torch.zeros(R, dtype=torch.int64, device=device)
        self.prefill_slots = torch.zeros(2, **i32)              # [initial, final] GDN slot of a prefill chunk
        self.prefill_row = torch.zeros(1, **i32)
        self.prefill_start, self.prefill_len, self.prefill_mtp_len, self.prefill_acc = (torch.zeros(1, **i32)
                                                                                       for _ in range(4))
        self.mtp_prefill_ids = torch.zeros(max_prefill, **i32)
        self.ids = torch.zeros(R, **i32)

        cos, sin = rope_tables(torch.arange(self.cap, device=device), cfg.rotary_dim, cfg.rope_theta, torch.bfloat16)
        self.cos_table, self.sin_table = cos.contiguous(), sin.contiguous()
        self.cos, self.sin = torch.zeros(R, cfg.rotary_dim, **bf), torch.zeros(R, cfg.rotary_dim, **bf)

        # activations
        n_proj = max(C + hv * dv + 2 * hv, 2 * hq * d + 2 * hkv * d) + 8     # + an int4 linear's padding
        self.res, self.y, self.delta, self.attn_out, self.out_hidden = (torch.zeros(R, H, **bf) for _ in range(5))
        self.proj = torch.zeros(R * n_proj, **bf)                # flat: a pass views a dense [M, N] prefix
        self.mixed = torch.zeros(R, C, **bf)
        self.o = torch.zeros(R * max(hv * dv, hq * d), **bf)
        self.q, self.gate = torch.zeros(R, hq, d, **bf), torch.zeros(R, hq, d, **bf)
        self.k_out = torch.zeros(R, hkv, d, **bf)
        self.gate_up = torch.zeros(R, 2 * I, **bf)
        self.act = torch.zeros(R, I, **bf)
        i64 = dict(dtype=torch.int64, device=device)
        self.sums = dict(proj=torch.zeros(MAX_ROWS * n_proj, **i64), attn_out=torch.zeros(MAX_ROWS, H, **i64),
                         gate_up=torch.zeros(MAX_ROWS, 2 * I, **i64), delta=torch.zeros(MAX_ROWS, H, **i64))
        self.logits = torch.zeros(S * T, V, **f32)
        self.nseg_max = choose_nseg(1, hkv, gpu.num_sms(torch.device(device)))
        self.partials = alloc_partials(S, hq, T, self.nseg_max, d, device)
        n = triton.cdiv(max_prefill, GDN_CHUNK)
        w, u, scr = prefill_workspace(1, n * GDN_CHUNK, hv, dk, dv, device, GDN_CHUNK)
        self.gdn_ws = (w.view(-1), u.view(-1), scr.view(-1))
        # sampling
        self.seed = torch.zeros(1, dtype=torch.int64, device=device)
        self.offset = torch.zeros(1, dtype=torch.int64, device=device)
        self.sampler = SamplerWorkspace(S, V, device)
        self.out_ids = torch.full((S, T), -1, **i32)
        self.num_emitted = torch.ones(S, **i32)
        pinned = dict(pin_memory=torch.device(device).type == "cuda")
        self.host_out = [(torch.zeros(S, T, dtype=torch.int32, **pinned), torch.zeros(S, dtype=torch.int32, **pinned))
                         for _ in range(2)]                      # two: a step's copy while the last one is read
        if k:
            self.emb, self.e_norm, self.h_norm, self.y_mtp = (torch.zeros(R, H, **bf) for _ in range(4))
            self.mtp_hidden = torch.zeros(S, T, H, **bf)
            self.y_row = torch.zeros(S, H, **bf)
            self.cat = torch.zeros(R, 2 * H, **bf)
            Vd = draft_vocab or V
            self.draft_logits = torch.zeros(S * k * Vd, **f32)     # flat: a step of B rows, k' drafts views
            self.draft_sampler = SamplerWorkspace(S, Vd, device)   # a dense [B, k', ...] prefix (drafts())
            self.draft_ids = torch.zeros(S * k, **i32)
            self.draft_desc = torch.zeros(S * k * 4, **f32)
            self.rejection = {d: RejectionWorkspace(S, d, V, Vd, device) for d in sorted(set(ks) | {k}) if d}

    def drafts(self, B: int, k: int):
        """(draft_ids [B, k], draft_logits [B, k, Vd], draft_desc [B, k, 4]) of a step drafting k (dense)."""
        if not k:
            return None, None, None
        vd = self.draft_logits.numel() // (self.S * self.k)
        return (self.dense(self.draft_ids, B, k), self.dense(self.draft_logits, B, k, vd),
                self.dense(self.draft_desc, B, k, 4))

    @staticmethod
    def dense(flat, *shape):
        """The dense prefix of a flat buffer as `shape`."""
        n = 1
        for s in shape:
            n *= s
        return flat[:n].view(*shape)

    def gdn_workspace(self, length: int, hv: int, dk: int, dv: int):
        """gdn_prefill's workspace for one sequence of `length` tokens: dense prefixes of the preallocated one."""
        n = triton.cdiv(length, GDN_CHUNK)
        w, u, scr = self.gdn_ws
        return (w[:hv * n * GDN_CHUNK * dk].view(1, hv, n * GDN_CHUNK, dk),
                u[:hv * n * GDN_CHUNK * dv].view(1, hv, n * GDN_CHUNK, dv),
                scr[:hv * n * GDN_CHUNK * GDN_CHUNK].view(hv * n, GDN_CHUNK, GDN_CHUNK))
