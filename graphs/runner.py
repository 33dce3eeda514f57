"""The model runner: a PreparedModel (layers/prepared.py) executed on kernels/, owning every static buffer
(graphs/buffers.py). Read top to bottom: `layer_launches` lists one decoder layer's launches (`_layer` runs
them), `_target` and `_mtp` the passes, `prefill`, `decode` and `step` the entry points.

    runner = ModelRunner(prepared, max_seqs, max_len, spec_k=k, max_prefill=chunk)
    runner.set_sampling(slot, temperature, top_k, top_p)        # once per request (greedy by default)
    runner.prefill(slot, ids, start, last)                      # one chunk of a prompt; last: samples its first token
    ids, n = runner.step(slots)                                 # one MTP-k round over B rows (slot -1: padding)
                                                                # = run_step(set_rows(slots)): device part apart
    logits = runner.decode(slots, tokens)                       # teacher forcing: one given token per row

A step (ENGINE.md §1, engine/generate.py's round) for B rows, all on the device, nothing read back:
  draft   k > 0: the MTP re-runs the last round's k+1 rows of each sequence (its emitted ids, the verify hiddens;
          rows past the accepted ones are padding whose KV later rows overwrite), takes the row of the last emitted
          token, samples d1 from the lm_head, then k − 1 chained one-row passes (kernels.sampler.sample_drafts);
  verify  the target runs [t0, d1 … dk] at positions L … L+k from each sequence's GDN slots, keeping the state
          after every token (gdn_verify, the k+1 slots), writing K/V and widening the conv windows;
  sample  rejection_sample (k = 0: sample) -> ids [B, k+1] (emitted, then −1) and counts [B] = accepted + 1;
  commit  one launch (kernels.tables.commit): seq_len += count; num_accepted := count (the slot the next verify
          reads); the emitted ids and hiddens are kept per slot for the next step's drafting.
Every launch has fixed shapes for a bucket B, reads its per-step inputs from preallocated device buffers (the
host writes only `rows`, the slots) and allocates nothing; the step is written to be captured as one CUDA graph
per bucket (warm-up first: launch configs are resolved on the first call). Prefill: one chunk of one sequence
at a time (chunked GDN prefill carrying the state chunk to chunk in the sequence's slot k); on CUDA a chunk runs
as passes of power-of-two lengths, each length's pass a CUDA graph captured on first use, so that a prompt of
any length costs a few replays instead of ~1,000 kernel launches from Python (each pass reads the weights once
more: about 3.4 ms for 27B on an H200).

Linears: int4 (kernels.int4.int4_linear) or, for a body="bf16" model, torch.mm into the output buffer. The
lm_head and embedding are int8. Logits are fp32."""
import dataclasses
import time
from dataclasses import dataclass

import torch

from graphs.buffers import Buffers
from kernels.attention import choose_nseg, prefill_attention, verify_attention, verify_config
from kernels.gdn import causal_conv1d, gdn_prefill, gdn_verify
from kernels.int4 import defers, int4_linear
from kernels.int8 import int8_embedding, int8_linear
from kernels.norms import add_rmsnorm, gated_rmsnorm, qk_norm_rope, silu_mul
from kernels.precompile import compile_ahead
from kernels.sampler import SamplingTensors, rejection_sample, sample, sample_drafts, target_to_draft
from kernels.tables import commit, gather, pass_tables
from kernels import device as gpu
from layers.config import MAX_SPEC_K
from layers.prepared import AttentionWeights, PreparedModel
from layers.quant import Int4Weight, Int8Weight

OUT_ALIGN = 8           # int4 linears' output columns: a multiple of this for every variant (mma, wgmma_ws)


def linear(x, w, out):
    """out = x @ wᵀ: int4 weights on the kernel, a bf16 weight (body="bf16") by torch."""
    if isinstance(w, torch.Tensor):
        return torch.mm(x, w.t(), out=out)
    return int4_linear(x, w, out=out)


def width(w) -> int:
    """Output columns of a linear (an int4 one's, padded)."""
    return w.shape[0] if isinstance(w, torch.Tensor) else w.n


def aligned(obj):
    """obj (weights dataclasses, recursively) with each int4 linear whose output count is not a multiple of
    OUT_ALIGN padded with zero columns (scale 0), e.g. a GDN in_proj [q|k|v|z|b|a] whose 2·Hv columns b|a
    leave it unaligned (the demo model's 1036); the others are the same objects."""
    if isinstance(obj, Int4Weight):
        pad = -obj.n % OUT_ALIGN
        if not pad:
            return obj
        def widen(t):
            return None if t is None else torch.cat([t, t.new_zeros(t.shape[0], pad, *t.shape[2:])], 1)
        return Int4Weight(widen(obj.qweight), widen(obj.scales), widen(obj.zs), obj.group)
    if isinstance(obj, list):
        return [aligned(o) for o in obj]
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: aligned(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                           if f.name not in ("cfg", "body", "embed", "lm_head")})
    return obj


class StepOutput:
    """A step's tokens on their way to the host (ModelRunner.fetch)."""

    def __init__(self, ids, counts, event):
        self._ids, self._counts, self._event = ids, counts, event

    def wait(self) -> list:
        """Per row, the tokens it emitted (list of 1 … k+1 ids)."""
        if self._event is not None:
            self._event.synchronize()
        return [row[:n] for row, n in zip(self._ids.tolist(), self._counts.tolist())]


@dataclass
class Pass:
    """One forward pass: B rows of T tokens (a prefill: one row of T prompt tokens). Every tensor is a view of
    the runner's buffers; rows [B] slot ids (S: padding), kv_lens [B] tokens cached after the pass, cos / sin
    [B·T, rd]; verify passes: state_slots [B, T] and num_acc [B]; prefill: gdn_slots [2] (initial, final)."""
    B: int
    T: int
    rows: torch.Tensor
    kv_lens: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    state_slots: torch.Tensor = None
    num_acc: torch.Tensor = None
    gdn_slots: torch.Tensor = None
    deferred: bool = False         # the linears leave int64 sums (buf.sums) for their readers

    @property
    def M(self):
        return self.B * self.T

    @property
    def prefill(self):
        return self.gdn_slots is not None


class ModelRunner:
    def __init__(self, prepared: PreparedModel, max_seqs: int, max_len: int, spec_k: int = 0,
                 max_prefill: int = 512, kv_dtype=torch.uint8, device=None, draft_tokens=None, bucket_k=None):
        """max_seqs sequences (slots) of up to max_len tokens, spec_k drafts a step (0: plain decoding; needs the
        MTP weights), prompt chunks of up to max_prefill tokens; kv_dtype torch.uint8 (fp8 e4m3) or bf16.
        draft_tokens: None (drafts over the whole vocabulary), or the sorted target ids of a reduced draft
        vocabulary (QUANT.md §5): the draft head is those rows of the int8 lm_head, draft ids map back through
        d2t, and rejection sampling stays exact (q = 0 outside them). bucket_k: {B: k} drafts a step of B rows
        makes (0 … spec_k; default spec_k), so a bucket drafts what pays at its width; buffers are spec_k's."""
        if spec_k and prepared.mtp is None:
            raise ValueError("spec_k > 0 needs the MTP weights (prepare the checkpoint with its mtp.* tensors)")
        if kv_dtype not in (torch.uint8, torch.bfloat16):
            raise ValueError(f"kv_dtype must be torch.uint8 (fp8 e4m3) or torch.bfloat16, got {kv_dtype}")
        self.w, self.cfg, self.k = aligned(prepared), prepared.cfg, spec_k
        self.bucket_k = dict(bucket_k or {})
        for B, k in self.bucket_k.items():
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= spec_k:
                raise ValueError(f"bucket_k: bucket {B} drafts {k!r}; expected 0 … spec_k = {spec_k}")
        self.device = torch.device(device) if device is not None else prepared.norm.device
        self.max_seqs, self.max_len, self.max_prefill = max_seqs, max_len, max_prefill
        self.draft_head, self.d2t, self.t2d = self.w.lm_head, None, None
        if draft_tokens is not None:
            ids = torch.as_tensor(draft_tokens, dtype=torch.int64, device=self.device)
            V = self.cfg.vocab_size
            if ids.dim() != 1 or not len(ids) or not bool((ids[1:] > ids[:-1]).all()) or not 0 <= int(ids[0]) \
                    or int(ids[-1]) >= V:
                raise ValueError(f"draft_tokens must be sorted distinct target ids in [0, {V})")
            lm = self.w.lm_head
            self.draft_head = Int8Weight(lm.qweight[ids].contiguous(), lm.scales[ids].contiguous())
            self.d2t = (ids - torch.arange(len(ids), device=self.device)).to(torch.int32)
            self.t2d = target_to_draft(self.d2t, V)
        self.buf = Buffers(self.cfg, max_seqs, max_len, spec_k, max_prefill, kv_dtype, self.device,
                           draft_vocab=self.draft_head.qweight.shape[0], ks={spec_k, *self.bucket_k.values()})
        self.num_sms = gpu.num_sms(self.device)
        self.ready = [False] * max_seqs               # per slot: its prompt's last chunk ran (it steps)
        self.graphs = {}                              # B -> torch.cuda.CUDAGraph of run_step(B) (capture())
        self.prefill_graphs = {}                      # (L, n) -> graph of a prefill pass (prefill_pass)
        self._prefill_pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.prefill_pieces = self.device.type == "cuda"
        self._slots = None                            # the slot list buf.rows holds
        self._fetches = 0
        self.compiled_ahead, self.compile_s = 0, 0.0  # capture(): kernels compiled ahead, and the seconds it took

    # ------------------------------------------------------------------------------------------ one layer
    def _layer(self, w, cache, p: Pass, first: bool):
        """One decoder layer over p's M rows: layer_launches run in order."""
        for _, launch in self.layer_launches(w, cache, p, first):
            launch()

    def layer_launches(self, w, cache, p: Pass, first: bool) -> list:
        """One decoder layer over p's M rows as its launches in order, (name, launch) pairs (bench.layer_step
        times them alone and chained). The residual stream is buf.res, updated in place; the layer's output
        increment is left in buf.delta (the next layer's add_rmsnorm adds it; first: there is none)."""
        b, cfg, eps, M = self.buf, self.cfg, self.cfg.rms_norm_eps, p.M
        res, y, delta, attn_out = b.res[:M], b.y[:M], self._out(p, "delta"), self._out(p, "attn_out")
        if first:
            norm = lambda: add_rmsnorm(res, None, w.input_norm, eps, y=y)
        else:
            norm = lambda: add_rmsnorm(delta, res, w.input_norm, eps, h=res, y=y)
        mixer = self._attention if isinstance(w.mixer, AttentionWeights) else self._gdn
        I = cfg.intermediate_size
        gu, act = self._out(p, "gate_up"), b.act[:M]
        return [("add_rmsnorm (input)", norm),
                *mixer(w.mixer, cache, p, y, attn_out),
                ("add_rmsnorm (post-attention)", lambda: add_rmsnorm(attn_out, res, w.post_norm, eps, h=res, y=y)),
                ("mlp gate_up", lambda: linear(y, w.mlp.gate_up, gu)),
                ("silu_mul", lambda: silu_mul(gu[:, :I], gu[:, I:], y=act)),
                ("mlp down", lambda: linear(act, w.mlp.down, delta))]

    def _out(self, p: Pass, name: str, n: int = None):
        """The output buffer of a linear for p's M rows: buf.<name> (bf16), or buf.sums[name] when p.deferred;
        n: columns of a flat buffer (proj)."""
        b = self.buf
        flat = b.sums[name] if p.deferred else getattr(b, name)
        return b.dense(flat, p.M, n) if n is not None else flat[:p.M]

    def _q_max(self, B: int):
        """The attention's tile height for B rows: the widest verify's (MAX_SPEC_K + 1 tokens) where the step is
        width-invariant — every linear of that verify still runs the GEMV — so a row's logits are bitwise the same
        for any k (greedy output with drafting equals without); beyond, its own q_len (the fastest tile)."""
        return MAX_SPEC_K + 1 if defers(B * (MAX_SPEC_K + 1), self.device) else None

    def _gdn(self, w, cache, p: Pass, y, out) -> list:
        """A Gated DeltaNet mixer's launches: y [M, H] -> out [M, H] (layer_launches)."""
        cfg, b, M, B, T = self.cfg, self.buf, p.M, p.B, p.T
        hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                          cfg.linear_value_head_dim)
        pool, conv = cache
        C = cfg.linear_conv_dim
        z_end = C + hv * dv
        proj = self._out(p, "proj", width(w.in_proj))
        mixed = b.mixed[:M].view(B, T, C)
        q, k, v = (t.unflatten(-1, (-1, n)) for t, n in
                   zip(mixed.split([hk * dk, hk * dk, hv * dv], -1), (dk, dk, dv)))
        bb, a = (t.view(B, T, hv) for t in proj[:, z_end:z_end + 2 * hv].split(hv, -1))
        o4 = b.dense(b.o, B, T, hv, dv)
        o = o4.view(M, hv, dv)
        if p.prefill:
            workspace = b.gdn_workspace(T, hv, dk, dv)
            recur = ("gdn_prefill", lambda: gdn_prefill(q, k, v, a, bb, w.A_log, w.dt_bias, pool, p.gdn_slots[:1],
                                                        p.gdn_slots[1:], out=o4, workspace=workspace))
        else:
            recur = ("gdn_verify", lambda: gdn_verify(q, k, v, a, bb, w.A_log, w.dt_bias, pool, p.state_slots,
                                                      p.num_acc, out=o4))
        clear = proj[:, z_end:z_end + 2 * hv] if p.deferred else None
        return [("in_proj qkvz+ba", lambda: linear(y, w.in_proj, proj)),
                ("conv1d", lambda: causal_conv1d(proj[:, :C].view(B, T, C), w.conv_weight, conv, p.rows,
                                                 num_accepted=p.num_acc, out=mixed)),
                recur,
                ("gated_rmsnorm", lambda: gated_rmsnorm(o, proj[:, C:z_end].view(M, hv, dv), w.norm, cfg.rms_norm_eps,
                                                        y=o, clear=clear)),
                ("out_proj", lambda: linear(o.view(M, -1), w.out_proj, out))]

    def _attention(self, w, cache, p: Pass, y, out) -> list:
        """A gated-attention mixer's launches: y [M, H] -> out [M, H] (layer_launches)."""
        cfg, b, M, B, T = self.cfg, self.buf, p.M, p.B, p.T
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        kc, vc, ks, vs = cache
        proj = self._out(p, "proj", width(w.qkv_gate))
        kv = proj[:, 2 * hq * d:2 * hq * d + 2 * hkv * d]
        q, gate = b.q[:M], b.gate[:M]
        o = b.dense(b.o, B, T, hq, d)
        launches = [("qkv_gate", lambda: linear(y, w.qkv_gate, proj)),
                    ("qk_norm_rope + kv write", lambda: qk_norm_rope(
                        proj[:, :2 * hq * d], kv[:, :hkv * d], w.q_norm, w.k_norm, p.cos, p.sin, hq, hkv,
                        cfg.rms_norm_eps, sigmoid_gate=True, q=q, k_out=b.k_out[:M], gate=gate, v=kv[:, hkv * d:],
                        kv=(kc, vc, ks, vs, p.rows, p.kv_lens)))]
        if p.prefill:
            launches += [("attention", lambda: prefill_attention(q.view(B, T, hq, d), kc, vc, ks, vs, p.rows,
                                                                 p.kv_lens, o)),
                         ("output gate", lambda: o.mul_(gate.view(B, T, hq, d)))]
        else:
            nseg = min(choose_nseg(B, hkv, self.num_sms), b.nseg_max)
            q4 = q.view(B, T, hq, d)
            config = verify_config(q4, kc, vc, q_max=self._q_max(B))
            launches.append(("attention", lambda: verify_attention(q4, kc, vc, ks, vs, p.rows, p.kv_lens, o,
                                                                   b.partials, nseg, gate=gate.view(B, T, hq, d),
                                                                   fresh=T, cfg=config)))
        return launches + [("o_proj", lambda: linear(o.view(M, -1), w.o_proj, out))]

    # ------------------------------------------------------------------------------------------ passes
    def _target(self, p: Pass, ids):
        """The target model over p's rows with token ids [M] -> post-final-norm hiddens [M, H] (buf.out_hidden)."""
        b, M = self.buf, p.M
        int8_embedding(ids, self.w.embed, out=b.res[:M])
        for i, (w, cache) in enumerate(zip(self.w.layers, b.layers)):
            self._layer(w, cache, p, first=i == 0)
        add_rmsnorm(self._out(p, "delta"), b.res[:M], self.w.norm, self.cfg.rms_norm_eps, h=b.res[:M],
                    y=b.out_hidden[:M])
        return b.out_hidden[:M]

    def _mtp(self, p: Pass, ids, hidden, out):
        """The MTP module (MODEL.md §5) over p's rows: token ids [M] (each row's next token), hiddens [M, H] ->
        normed output into out [M, H]; writes the MTP layer's own KV."""
        b, m, eps, M = self.buf, self.w.mtp, self.cfg.rms_norm_eps, p.M
        int8_embedding(ids, self.w.embed, out=b.emb[:M])
        add_rmsnorm(b.emb[:M], None, m.pre_fc_norm_embedding, eps, y=b.e_norm[:M])
        add_rmsnorm(hidden, None, m.pre_fc_norm_hidden, eps, y=b.h_norm[:M])
        torch.cat([b.e_norm[:M], b.h_norm[:M]], 1, out=b.cat[:M])
        linear(b.cat[:M], m.fc, b.res[:M])
        self._layer(m.layer, b.mtp_kv, p, first=True)
        add_rmsnorm(self._out(p, "delta"), b.res[:M], m.norm, eps, h=b.res[:M], y=out)
        return out

    def _rope(self, p_rows: int, T: int, start):
        """cos / sin of B rows × T tokens at positions start[b] + t (start: [B] on the device)."""
        b, M = self.buf, p_rows * T
        pos = b.positions[:M]
        torch.add(start.view(-1, 1), b.arange[:T].view(1, T), out=pos.view(p_rows, T))
        pos.clamp_(0, b.cap - 1)                      # a padding row's (its MTP start is 0 − 1)
        torch.index_select(b.cos_table, 0, pos, out=b.cos[:M])
        torch.index_select(b.sin_table, 0, pos, out=b.sin[:M])
        return b.cos[:M], b.sin[:M]

    def _row_pass(self, B, T, start, acc=None, gdn=True) -> Pass:
        """A verify-shaped pass over buf.rows[:B], T tokens each from positions start [B] (device): kv_lens, rope,
        and (gdn: the target's layers, not the MTP's) the GDN slot table (acc None: every row's state in slot k,
        num_accepted k + 1; else `acc` and a rotation), one launch (kernels.tables.pass_tables). The rotation: the
        kernels start from the table's entry c = clamp(acc − 1, 0, T − 1) and leave the state after token t in
        entry t; a sequence's state is in its slot state_at, so entry t is slot (state_at − c + t) mod (k+1) — t
        itself when every round verifies k + 1 tokens (then c = state_at = acc − 1), rotated when a round verifies
        fewer than the last one accepted. The state after the round's token count − 1 is then in (state_at − c +
        count − 1) mod (k+1) (the commit reads buf.row_shift = state_at − c)."""
        b, k, M = self.buf, self.k, B * T
        slots = b.dense(b.state_slots, B, T) if gdn else None
        pass_tables(start, b.rows[:B], b.cos_table, b.sin_table, b.kv_lens[:B], b.cos[:M], b.sin[:M], slots=slots,
                    fixed=k, acc=acc, state_at=b.row_at[:B], shift=b.row_shift[:B], slots_per_seq=k + 1)
        num_acc = None if not gdn else b.acc_last[:B] if acc is None else acc
        return Pass(B, T, b.rows[:B], b.kv_lens[:B], b.cos[:M], b.sin[:M], slots, num_acc,
                    deferred=self.w.body == "int4" and defers(M, self.device))

    def _draft_passes(self, B: int, n: int) -> list:
        """The n one-token MTP passes of a draft, at positions L + j (L: row_len; j < n), their kv_lens and rope
        written up front (pass_tables for each, from positions computed at once) into dense prefixes of the pass
        buffers, free again once the MTP's re-run has run."""
        b = self.buf
        starts = b.positions[:B * n].view(n, B)
        torch.add(b.row_len[:B].view(1, B), b.arange[:n].view(n, 1), out=starts)
        kv_lens, passes = b.dense(b.kv_lens, n, B), []
        for j in range(n):
            rows = slice(j * B, (j + 1) * B)
            pass_tables(starts[j], b.rows[:B], b.cos_table, b.sin_table, kv_lens[j], b.cos[rows], b.sin[rows])
            passes.append(Pass(B, 1, b.rows[:B], kv_lens[j], b.cos[rows], b.sin[rows],
                               deferred=self.w.body == "int4" and defers(B, self.device)))
        return passes

    # ------------------------------------------------------------------------------------------ entry points
    def set_sampling(self, slot: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0):
        """Sampling of the sequence in `slot` (temperature <= 0: greedy)."""
        self._check_slot(slot)
        self.buf.temperature[slot], self.buf.top_k[slot], self.buf.top_p[slot] = temperature, top_k, top_p

    def _check_slot(self, slot):
        if not 0 <= slot < self.max_seqs:
            raise ValueError(f"slot {slot} is outside [0, {self.max_seqs})")

    @torch.no_grad()
    def prefill(self, slot: int, token_ids: list, start: int, last: bool = False, next_id: int = None):
        """Prompt tokens start … start+L−1 of the sequence in `slot` (start = 0: a new sequence; else the caches
        hold exactly the first `start` tokens: an earlier chunk, or a finished turn whose pending token was not
        committed — a follow-up turn continues from the state its last round accepted). Returns the last row's
        logits [V] (fp32, a view). last: the prompt's last chunk: its first token is sampled into the slot's
        tables (returned too: a [1] device tensor) and the sequence is ready to step. next_id: the prompt token
        after the chunk (not last; k > 0: the MTP's input). With prefill_pieces the chunk runs as passes of
        power-of-two lengths, largest first (prefill_pass)."""
        self._check_slot(slot)
        b, k, L = self.buf, self.k, len(token_ids)
        if not 1 <= L <= self.max_prefill:
            raise ValueError(f"prefill chunk of {L} tokens; expected 1 … {self.max_prefill}")
        if start + L + k + 1 > self.max_len:
            raise ValueError(f"prefill to {start + L} tokens leaves no room for a round in max_len {self.max_len}")
        if k and not last and next_id is None:
            raise ValueError("prefill: next_id (the token after the chunk) is needed for the MTP unless last")
        base = slot * (k + 1)
        if start == 0:                                # a new sequence: zero state (initial slot -1), zero history
            b.prefill_slots[0] = -1
            b.num_acc[slot] = k + 1
            for conv in b.conv_windows:
                conv[slot].zero_()
        else:                                         # the state the last round accepted into, slot state_at
            torch.add(b.state_at[slot:slot + 1], base, out=b.prefill_slots[:1])
            if k and self.ready[slot]:            # a follow-up turn (not the next chunk of a prompt)
                self._mtp_catch_up(slot, token_ids[0])
        self.ready[slot] = last
        b.prefill_slots[1] = base + k
        b.prefill_row.fill_(slot)
        ids = list(token_ids) + [next_id]
        sizes = [1 << i for i in reversed(range(L.bit_length())) if L >> i & 1] if self.prefill_pieces else [L]
        done = 0
        for size in sizes:
            end = done + size
            n = (size - 1 if last and end == L else size) if k else 0       # MTP rows (the last prompt row: step's)
            b.ids[:size].copy_(torch.tensor(ids[done:end], dtype=torch.int32))
            if n:
                b.mtp_prefill_ids[:n].copy_(torch.tensor(ids[done + 1:done + 1 + n], dtype=torch.int32))
            b.prefill_start.fill_(start + done)
            b.prefill_len.fill_(start + end)
            b.prefill_mtp_len.fill_(start + done + n)
            b.prefill_acc.copy_(b.num_acc[slot:slot + 1])
            self.prefill_pass(size, n)
            b.prefill_slots[0] = base + k              # the next piece continues from this one's state
            b.num_acc[slot] = k + 1
            done = end
        b.seq_len[slot] = start + L
        b.state_at[slot] = k
        logits = b.logits[0]
        if not last:
            return logits
        b.emitted[slot] = 1
        b.hidden[slot, 0] = b.out_hidden[sizes[-1] - 1]
        params = SamplingTensors(b.temperature[slot:slot + 1], b.top_k[slot:slot + 1], b.top_p[slot:slot + 1])
        token, _ = sample(b.logits[:1], params, b.seed, b.offset, b.sampler)
        b.last_ids[slot, 0] = token[0]
        return logits, token

    def prefill_pass(self, L: int, n: int):
        """One prefill pass of L tokens and n MTP rows, every input in the runner's buffers (ids, mtp_prefill_ids,
        prefill_row / start / len / mtp_len / acc / slots): the target over the L tokens from the GDN slot
        prefill_slots[0] into prefill_slots[1], the last row's logits into logits[0], the MTP over the first n rows
        (each row's next token). On CUDA the first pass of a shape runs eagerly and is then captured (its own
        pool); later ones replay it."""
        graph = self.prefill_graphs.get((L, n))
        if graph is not None:
            graph.replay()
            return
        self._prefill_launches(L, n)
        if self.device.type == "cuda" and self.graphs:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._prefill_pool):
                self._prefill_launches(L, n)
            self.prefill_graphs[(L, n)] = graph

    def _prefill_launches(self, L: int, n: int):
        b = self.buf
        cos, sin = self._rope(1, L, b.prefill_start)
        p = Pass(1, L, b.prefill_row, b.prefill_len, cos, sin, num_acc=b.prefill_acc, gdn_slots=b.prefill_slots)
        hidden = self._target(p, b.ids[:L])
        int8_linear(hidden[L - 1:], self.w.lm_head, out=b.logits[:1])
        if n:
            q = Pass(1, n, b.prefill_row, b.prefill_mtp_len, cos[:n], sin[:n], gdn_slots=b.prefill_slots)
            self._mtp(q, b.mtp_prefill_ids[:n], hidden[:n], b.y_mtp[:n])

    def _mtp_catch_up(self, slot: int, next_id: int):
        """Before a follow-up turn's prefill: the MTP rows of the sequence's last round (positions L − emitted …
        L − 1, which the next step's drafting would have written), the pending token's id replaced by the
        prompt's token at L."""
        b, T = self.buf, self.k + 1
        B, rows = self._fill_rows([slot])
        start = b.mtp_start[:1]
        torch.sub(b.seq_len[slot:slot + 1], b.emitted[slot:slot + 1], out=start)
        ids = b.mtp_ids[0]
        ids.copy_(b.last_ids[slot])
        ids.index_fill_(0, (b.emitted[slot:slot + 1] - 1).long(), next_id)
        self._mtp(self._row_pass(1, T, start, gdn=False), ids, b.hidden[slot], b.y_mtp[:T])

    def _fill_rows(self, slots):
        b, S = self.buf, self.max_seqs
        B = len(slots)
        if not 1 <= B <= S:
            raise ValueError(f"{B} rows; expected 1 … {S}")
        for s in slots:
            if s != -1:
                self._check_slot(s)
        b.rows[:B].copy_(torch.tensor([S if s < 0 else s for s in slots], dtype=torch.int32))
        b.rows_long[:B].copy_(b.rows[:B])
        self._slots = None
        return B, b.rows_long[:B]

    def set_seed(self, seed: int):
        """The sampler's Philox seed; its counter restarts."""
        self.buf.seed.fill_(seed)
        self.buf.offset.zero_()

    @torch.no_grad()
    def decode(self, slots: list, tokens: list):
        """Teacher forcing: row i runs tokens[i] at its sequence's next position and commits it (slot -1:
        padding). Returns logits [B, V] (fp32, a view of the runner's buffer)."""
        B, rows = self._fill_rows(slots)
        b = self.buf
        b.ids[:B].copy_(torch.tensor(tokens, dtype=torch.int32))
        torch.index_select(b.seq_len, 0, rows, out=b.row_len[:B])
        p = self._row_pass(B, 1, b.row_len[:B])
        hidden = self._target(p, b.ids[:B])
        logits = int8_linear(hidden, self.w.lm_head, out=b.logits[:B])
        b.seq_len.index_copy_(0, rows, b.kv_lens[:B])
        b.num_acc.index_fill_(0, rows, self.k + 1)
        b.state_at.index_fill_(0, rows, self.k)
        self._reset_padding()
        return logits

    def _reset_padding(self):
        """The padding entry S of the per-slot tables back to a fixed state after a pass wrote it, so a padding
        row computes the same every step (and replay equals the launches on every row)."""
        b, S = self.buf, self.max_seqs
        b.seq_len[S:].zero_()
        b.num_acc[S:].fill_(1)
        b.emitted[S:].fill_(1)
        b.last_ids[S:].zero_()
        b.hidden[S:].zero_()
        b.state_at[S:].zero_()

    @torch.no_grad()
    def step(self, slots: list):
        """One MTP-k round (module docstring) over B rows (slot -1: padding): the bucket's CUDA graph replayed when
        capture() made one for B, else the launches. Returns (ids [B, k+1] int32: the emitted tokens then −1,
        counts [B] int32), device views valid until the next step (fetch() reads them)."""
        B = self.set_rows(slots)
        graph = self.graphs.get(B)
        if graph is None:
            return self.run_step(B)
        graph.replay()
        return self._outputs(B)

    def set_rows(self, slots: list) -> int:
        """The host's part of a step: the rows' slots into buf.rows (slot -1: padding), copied only when they
        changed since the last step. Returns B."""
        slots = list(slots)
        if slots != self._slots:
            self._fill_rows(slots)
            self._slots = slots
        return len(slots)

    def k_for(self, B: int) -> int:
        """The drafts a step of B rows makes."""
        return self.bucket_k.get(B, self.k)

    def _outputs(self, B):
        b, k = self.buf, self.k_for(B)
        if k:
            return b.rejection[k].out[:B], b.rejection[k].num_emitted[:B]
        return b.out_ids[:B, :1], b.num_emitted[:B]

    @torch.no_grad()
    def run_step(self, B: int):
        """The device's part of a step over buf.rows[:B] (what a bucket's CUDA graph captures): fixed shapes for
        B, inputs read from the runner's buffers, nothing allocated by the kernels, nothing read back."""
        for _, phase in self.step_phases(B):
            phase()
        return self._outputs(B)

    def step_phases(self, B: int) -> list:
        """run_step(B) as (name, launches) in order: "rows" (the rows' tables gathered), "draft" (k > 0),
        "verify" (every layer over the k+1 tokens, the lm_head), "sample" (rejection sampling, or sampling, and
        the commit). For benchmarks that time them apart."""
        b, k = self.buf, self.k_for(B)
        T = k + 1
        rows = b.rows_long[:B]
        params = SamplingTensors(b.row_temperature[:B], b.row_top_k[:B], b.row_top_p[:B])
        ids = b.ids[:B * T].view(B, T)
        logits = b.logits[:B * T].view(B, T, -1)
        draft_ids, draft_logits, draft_desc = b.drafts(B, k)

        def rows_phase():                             # each row's tables, and t0: its last emitted token
            gather(b.rows[:B], rows, b.seq_len, b.emitted, b.num_acc, b.state_at, b.temperature, b.top_k, b.top_p,
                   b.row_len[:B], b.row_emitted[:B], b.row_acc[:B], b.row_at[:B], b.row_temperature[:B],
                   b.row_top_k[:B], b.row_top_p[:B], b.last_ids, ids)

        def draft():
            self._draft(B, rows, params, k)
            ids[:, 1:] = draft_ids

        def verify():
            p = self._row_pass(B, T, b.row_len[:B], acc=b.row_acc[:B])
            hidden = self._target(p, b.ids[:B * T])
            int8_linear(hidden, self.w.lm_head, out=logits.view(B * T, -1))

        def sample_commit():
            if k:
                out, count = rejection_sample(logits, draft_logits, draft_ids, params, b.seed, b.offset,
                                              b.rejection[k], draft_desc, self.t2d)
            else:
                out, count = b.out_ids[:B, :1], b.num_emitted[:B]
                sample(logits.view(B, -1), params, b.seed, b.offset, b.sampler, out=(out[:, 0], b.sampler.desc[:B]))
            commit(b.rows[:B], count, b.row_len[:B], b.row_shift[:B], out, b.out_hidden, b.seq_len, b.emitted,
                   b.num_acc, b.state_at, b.last_ids, b.hidden, acc_offset=self.k - k)   # the conv window's offset

        return ([("rows", rows_phase)] + ([("draft", draft)] if k else [])
                + [("verify", verify), ("sample", sample_commit)])

    def capture(self, buckets) -> dict:
        """One CUDA graph of run_step(B) for each bucket B, captured largest first into one memory pool after a
        warm-up launch (which resolves every launch config) on padding rows — which write nothing a sequence's
        caches hold, so this is harmless at any time. First, every kernel the buckets' steps and the prefill
        passes need is compiled by parallel processes (kernels.precompile; compiled_ahead, compile_s). step()
        replays the graphs. Returns {B: seconds of warm-up + capture}."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device; on the CPU step() launches eagerly")
        pool = self.graphs[max(self.graphs)].pool() if self.graphs else torch.cuda.graph_pool_handle()
        buckets = sorted(set(buckets), reverse=True)
        for B in buckets:
            if not 1 <= B <= self.max_seqs:
                raise ValueError(f"bucket {B} is outside [1, {self.max_seqs}] (the runner's sequence slots)")
        t = time.perf_counter()
        self.compiled_ahead = compile_ahead(lambda: self._launch_all(buckets))
        self.compile_s = time.perf_counter() - t
        seconds = {}
        for B in buckets:
            t = time.perf_counter()
            self.set_rows([-1] * B)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.run_step(B)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.run_step(B)
            torch.cuda.synchronize(self.device)
            self.graphs[B] = graph
            seconds[B] = time.perf_counter() - t
        return seconds

    def _launch_all(self, buckets):
        """Every launch the runner can make: each bucket's step on padding rows, and each prefill pass shape the
        engine's chunks come in (powers of two up to max_prefill; n MTP rows: the piece's length, or one fewer for
        a prompt's last) into the padding entry, which the kernels read as padding (compile_ahead's run)."""
        for B in buckets:
            self.set_rows([-1] * B)
            self.run_step(B)
        b, S, k = self.buf, self.max_seqs, self.k
        b.prefill_row.fill_(S)
        b.prefill_slots.fill_(S * (k + 1))
        b.prefill_slots[0] = -1
        b.prefill_start.zero_()
        b.prefill_acc.fill_(k + 1)
        for i in range(self.max_prefill.bit_length()):
            L = 1 << i
            for n in sorted({L, L - 1} if k else {0}):
                b.prefill_len.fill_(L)
                b.prefill_mtp_len.fill_(n)
                self._prefill_launches(L, n)

    @property
    def captured(self) -> list:
        return sorted(self.graphs)

    def fetch(self, B: int) -> "StepOutput":
        """The last step's tokens copied to pinned host memory behind the step on the stream; StepOutput.wait()
        blocks until they are there. Two fetches may be outstanding (the host enqueues step t+1 before it reads
        step t's tokens)."""
        ids, counts = self._outputs(B)
        host_ids, host_counts = self.buf.host_out[self._fetches % 2]
        self._fetches += 1
        host_ids[:B, :ids.shape[1]].copy_(ids, non_blocking=True)
        host_counts[:B].copy_(counts, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return StepOutput(host_ids[:B], host_counts[:B], event)

    def step_logits(self, B: int):
        """The last step's target logits [B, k+1, V] fp32 (k: k_for(B)): row b, position j produced row b's j-th
        emitted token."""
        T = self.k_for(B) + 1
        return self.buf.logits[:B * T].view(B, T, -1)

    def cut_round(self, slot: int, kept: int):
        """The host kept only the first `kept` tokens the last step emitted for `slot` (1 ≤ kept ≤ its count): the
        slot's caches are made to hold exactly the tokens before the last kept one (which stays pending), as if
        the round had accepted kept − 1 drafts: the GDN state after token kept − 1 is in the slot before (mod k+1)
        the round's last one, the conv window's offset as many columns back."""
        self._check_slot(slot)
        b, s = self.buf, slice(slot, slot + 1)
        if not 1 <= kept <= self.k + 1:
            raise ValueError(f"cut_round: kept must be in [1, {self.k + 1}], got {kept}")
        drop = b.row_len[:1]                          # emitted − kept (a scratch entry between steps)
        torch.sub(b.emitted[s], kept, out=drop)
        for table in (b.seq_len[s], b.num_acc[s], b.state_at[s]):
            table.sub_(drop)
        b.state_at[s].remainder_(self.k + 1)
        b.emitted[slot] = kept

    def _draft(self, B, rows, params, k):
        """k drafts per row into buf.drafts(B, k) (module docstring: draft). The MTP re-runs all k_max + 1 rows of
        the last round (a round of another bucket may have emitted more than k + 1)."""
        b, T = self.buf, self.k + 1
        draft_ids, draft_logits, draft_desc = b.drafts(B, k)
        start = b.mtp_start[:B]                       # the MTP re-runs the last round from L − emitted
        torch.sub(b.row_len[:B], b.row_emitted[:B], out=start)
        p = self._row_pass(B, T, start, gdn=False)
        y = self._mtp(p, torch.index_select(b.last_ids, 0, rows, out=b.mtp_ids[:B]).view(-1),
                      torch.index_select(b.hidden, 0, rows, out=b.mtp_hidden[:B]).view(B * T, -1), b.y_mtp[:B * T])
        idx = b.gather_idx[:B]                        # the row of each sequence's last emitted token
        torch.add(b.arange_rows[:B], b.row_emitted[:B], out=idx)
        idx.sub_(1)
        y_row = torch.index_select(y, 0, idx, out=b.y_row[:B])
        passes = self._draft_passes(B, k - 1)
        for j in range(k):
            int8_linear(y_row, self.draft_head, out=draft_logits[:, j])
            sample_drafts(draft_logits[:, j], params, b.seed, b.offset, b.draft_sampler, d2t=self.d2t,
                          out=(draft_ids[:, j], draft_desc[:, j]))
            if j + 1 < k:                             # the draft at position L + j, from the MTP's own output
                self._mtp(passes[j], draft_ids[:, j], y_row, y_row)
