"""One whole decode step of Qwen3.8-27B on kernels/, as the engine will run it: back to back in one CUDA graph (so
each launch's programmatic dependent launch overlaps the one before), random weights at the 27B shapes.

A step with MTP-k drafting is k draft passes at B rows — the token's embedding and the last hidden state normed,
the MTP fc, one gated-attention decoder layer, the final norm, a draft lm_head over `--draft-vocab` rows, sampling
(kernels/sampler.sample_drafts) — then the verify pass at B·(k+1) rows: the embedding, the 64 decoder layers (48
Gated DeltaNet, 16 gated attention, as bench/layer_step.py builds them, each with its own weights, state and
`ctx` cached tokens), the final norm, the int8 lm_head and rejection sampling. k = 0 is plain decoding: one
token a step, sampled from B rows.
Per step: its time, the bytes it must move (every weight once per pass that reads it, the recurrent states
read once and written per token, the KV; the logits written once), the fraction of the copy bandwidth measured
in the same run, the launches in its graph, and the tokens per second given how often each draft position is
accepted (`--accept`, default .84/.60/.38/.22: vLLM's MTP on Qwen under load, ENGINE.md §9; a step emits
1 + the accepted drafts — acceptance depends on the text, not on the kernels); then, per batch, the draft count
that gives the most tokens per second at those rates (what profiles/ should set per bucket).
`python -m bench.step [--batch 1,4,64] [--k 0,4] [--ctx 16384] [--draft-vocab 32768]` writes
bench/results/step-<gpu>.json and .md (step-ctx<ctx>-<gpu> at other contexts)."""
import argparse

import torch

from bench.harness import gpu_name, measure_bandwidth, time_us, write_results
from bench.kernels_int4 import random_int4
from bench.kernels_int8 import lm_head_bytes, random_int8
from bench.kernels_sampler import QWEN, params_for
from bench.layer_step import Layer
from kernels.int4 import int4_linear
from kernels.int8 import int8_embedding, int8_linear
from kernels.norms import add_rmsnorm
from kernels.sampler import (RejectionWorkspace, SamplerWorkspace, rejection_sample, sample, sample_drafts,
                             target_to_draft)
from layers.config import qwen38_27b
from tools.targets import int4_bytes, row


class Step:
    """Every buffer of one step for B sequences, k drafts, ctx cached tokens, allocated once; `drafts()`,
    `verify()` and `step()` launch its kernels in order."""

    def __init__(self, B, k, ctx, draft_vocab, cfg=None, device="cuda"):
        cfg = cfg or qwen38_27b()
        self.B, self.k, self.cfg = B, k, cfg
        T, H, V = k + 1, cfg.hidden_size, cfg.vocab_size
        bf = dict(dtype=torch.bfloat16, device=device)
        kinds = {"linear_attention": "gdn", "full_attention": "attn"}
        self.layers = [Layer(kinds[t], B, T, ctx, cfg, device) for t in cfg.layer_types]
        self.embed, self.lm_head = random_int8(V, H), random_int8(V, H)
        self.ids = torch.randint(0, V, (B * T,), dtype=torch.int32, device=device)
        self.h, self.y = torch.zeros(B * T, H, **bf), torch.zeros(B * T, H, **bf)
        self.norm_w = torch.randn(H, **bf) * 0.1
        self.logits = torch.empty(B, T, V, **bf)
        self.params = params_for(B, *QWEN)                            # generation_config's sampling
        self.seed, self.offset = (torch.zeros(1, dtype=torch.int64, device=device) for _ in range(2))
        self.bytes = (sum(layer.bytes() for layer in self.layers) + lm_head_bytes(B * T, V, H, out_bytes=2)
                      + 3 * B * T * H)                                # the embedding's int8 rows in, bf16 out
        if k == 0:
            self.sampler = SamplerWorkspace(B, V, device)
            return
        # the MTP module: fc over [embedding; hidden] (2H -> H) and one gated-attention layer; a reduced draft head
        self.mtp = Layer("attn", B, 1, ctx, cfg, device)
        self.fc = random_int4(H, 2 * H, device)
        self.draft_head = random_int8(draft_vocab, H)
        self.d2t = torch.zeros(draft_vocab, dtype=torch.int32, device=device)      # draft id i is target id i
        self.t2d = target_to_draft(self.d2t, V)
        self.e, self.e_n, self.h_n, self.d_y = (torch.zeros(B, H, **bf) for _ in range(4))
        self.cat = torch.zeros(B, 2 * H, **bf)
        self.fc_out = torch.zeros(B, H, **bf)
        self.draft_logits = torch.empty(B, k, draft_vocab, **bf)
        self.draft_ids = torch.zeros(B, k, dtype=torch.int32, device=device)
        self.draft_desc = torch.zeros(B, k, 4, device=device)
        self.draft_ws = SamplerWorkspace(B, draft_vocab, device)
        self.rejection = RejectionWorkspace(B, k, V, draft_vocab, device)
        self.bytes += k * (self.mtp.bytes() + int4_bytes(B, H, 2 * H) + lm_head_bytes(B, draft_vocab, H, out_bytes=2))

    def drafts(self):
        """k draft passes at B rows. (Kernels read and write their own buffers: the time is the same chain.)"""
        eps = self.cfg.rms_norm_eps
        tok = self.ids[:self.B]
        for i in range(self.k):
            int8_embedding(tok, self.embed, out=self.e)
            add_rmsnorm(self.e, None, self.norm_w, eps, y=self.e_n)                # pre_fc_norm_embedding
            add_rmsnorm(self.h[:self.B], None, self.norm_w, eps, y=self.h_n)      # pre_fc_norm_hidden
            int4_linear(self.cat, self.fc, out=self.fc_out)
            self.mtp.step()
            add_rmsnorm(self.mtp.x, self.mtp.res, self.norm_w, eps, h=self.mtp.res, y=self.d_y)
            int8_linear(self.d_y, self.draft_head, out=self.draft_logits[:, i])
            tok, _ = sample_drafts(self.draft_logits[:, i], self.params, self.seed, self.offset, self.draft_ws,
                                   d2t=self.d2t, out=(self.draft_ids[:, i], self.draft_desc[:, i]))

    def verify(self):
        """The verify pass at B·(k+1) rows (k = 0: a decode step and its sampling)."""
        eps = self.cfg.rms_norm_eps
        int8_embedding(self.ids, self.embed, out=self.h)
        for layer in self.layers:
            layer.step()
        last = self.layers[-1]
        add_rmsnorm(last.x, last.res, self.norm_w, eps, h=last.res, y=self.y)
        int8_linear(self.y, self.lm_head, out=self.logits.view(-1, self.cfg.vocab_size))
        if self.k == 0:
            sample(self.logits.view(-1, self.cfg.vocab_size), self.params, self.seed, self.offset, self.sampler)
        else:
            rejection_sample(self.logits, self.draft_logits, self.draft_ids, self.params, self.seed, self.offset,
                             self.rejection, self.draft_desc, self.t2d)

    def step(self):
        if self.k:
            self.drafts()
        self.verify()


def graph_nodes(fn) -> int:
    """Kernel launches fn makes, counted as the nodes of a CUDA graph of one call (0 where cuda-python is absent)."""
    try:
        from cuda.bindings import runtime
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            fn()
        err, _, count = runtime.cudaGraphGetNodes(graph.raw_cuda_graph(), 0)
        return count if err == runtime.cudaError_t.cudaSuccess else 0
    except Exception as e:      # a count is a nicety: the timing stands without it
        print(f"graph_nodes: {type(e).__name__}: {e}")
        return 0


def tokens_per_step(k, accept) -> float:
    """Mean tokens a sequence emits per step with k drafts: 1 + the chance each draft position is accepted."""
    assert k <= len(accept), f"--accept gives rates for {len(accept)} draft positions, not {k}"
    return 1.0 + sum(accept[:k])


def run(batches, ks, ctx, draft_vocab, accept, device="cuda"):
    peak = measure_bandwidth()["copy_Bps"]
    rows, best = [], []
    for B in batches:
        steps = []
        for k in ks:
            step = Step(B, k, ctx, draft_vocab, device=device)
            shape = f"B{B} k{k} ctx{ctx}" + (f" draft vocab {draft_vocab}" if k else "")
            us = time_us(step.step, reps=2, trials=5)
            tokens = tokens_per_step(k, accept)
            steps.append(row("step", shape, us, step.bytes, 0, peak, launches=graph_nodes(step.step),
                             tokens_per_step=round(tokens, 2), tok_s=round(B * tokens / (us * 1e-6), 1), k=k))
            print(steps[-1], flush=True)
            rows.append(steps[-1])
            if k:
                rows.append(row("  drafts", shape, time_us(step.drafts, reps=2, trials=5), 0, 0, peak))
                rows.append(row("  verify", shape, time_us(step.verify, reps=2, trials=5), 0, 0, peak))
            del step
            torch.cuda.empty_cache()
        top = max(steps, key=lambda r: r["tok_s"])
        best.append(dict(kernel="best k", shape=f"B{B} ctx{ctx}", us=top["us"], k=top["k"], tok_s=top["tok_s"]))
    return rows + best, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes")
    ap.add_argument("--k", default="0,4", help="comma-separated draft counts (0: no drafting)")
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--accept", default=".84,.60,.38,.22", help="acceptance rate of draft positions 1, 2, …")
    args = ap.parse_args()
    rows, peak = run([int(b) for b in args.batch.split(",")], [int(k) for k in args.k.split(",")], args.ctx,
                     args.draft_vocab, [float(a) for a in args.accept.split(",")])
    name = "step" if args.ctx == 16384 else f"step-ctx{args.ctx}"
    print(write_results(name, rows, {"gpu": gpu_name(), "torch": torch.__version__,
                                     "peak_copy_GBps": round(peak / 1e9, 1)}))


if __name__ == "__main__":
    main()
