"""One decoder layer of a verify step (B sequences x T tokens) run as the engine will: kernels/ in the model's order
(layers/model.py: DecoderLayer), back to back in one CUDA graph, so each kernel's programmatic dependent launch
overlaps the previous one's tail. Random weights at the Qwen3.8-27B shapes, a GDN layer and a gated-attention layer
(fp8 KV, V stored keys-fastest, `ctx` cached tokens). Per layer: the time, the bytes it must move (int4 weights and
scales, the recurrent state read once and written per token, or the KV; activations are small), the fraction of
the copy bandwidth measured in the same run, and beside it the chain launched without PDL and the sum of the same
kernels timed one by one (what the chain saves). The step runs over `--layers` copies with their own weights, state
and KV, as a model's layers are, and each kernel alone cycles through them, so no kernel finds its bytes in L2 (one
copy of out_proj would fit). Beside each kernel's time alone, `in_chain`: what it costs inside the chain (the
chain's time less the chain's without it) — a small kernel that must wait for its producer and hold up its
consumer costs more there than alone.
`python -m bench.layer_step [--batch 1,8,64] [--tokens 5] [--ctx 16384] [--layers 8]` writes
bench/results/layer-step-<gpu>.json and .md. Fused as the model will take them: the GDN layer's in_proj_qkvz and
in_proj_ba as one linear (layers.quant.concat_outputs), the KV write in qk_norm_rope, the attention output gate in
the attention kernel's store; up to 24 rows the linears leave int64 sums for their consumers to convert
(kernels/fixed_sum.py; `chained, outputs stored`: the same chain without)."""
import argparse
import itertools

import torch

from bench.harness import gpu_name, measure_bandwidth, time_us, write_results
from bench.kernels_int4 import random_int4
from kernels import device as gpu, fixed_sum
from kernels.attention import alloc_partials, choose_nseg, kv_cache, verify_attention
from kernels.gdn import causal_conv1d, gdn_verify, state_pool
from kernels.int4 import MAX_ROWS, int4_linear
from kernels.norms import add_rmsnorm, gated_rmsnorm, qk_norm_rope, silu_mul
from kernels.norms.ref import rope_tables
from layers.config import ModelConfig, qwen38_27b
from layers.quant import concat_outputs
from tools.targets import int4_bytes, row


class Layer:
    """Weights, caches and every buffer of one layer, allocated once; `kernels()` lists its launches in order.
    deferred: up to 24 rows (the GEMV's) every linear leaves int64 sums for its consumers to convert
    (kernels/fixed_sum.py): in_proj (conv1d, gdn_verify, gated_rmsnorm, which also clears b and a), out_proj /
    o_proj and down (add_rmsnorm), gate_up (silu_mul), qkv_gate (qk_norm_rope)."""

    def __init__(self, kind, B, T, ctx, cfg: ModelConfig, device, deferred=True):
        self.B, self.T, self.kind, self.cfg = B, T, kind, cfg
        H, I = cfg.hidden_size, cfg.intermediate_size
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bf = dict(dtype=torch.bfloat16, device=device)
        M = B * T
        sums = dict(dtype=torch.int64, device=device) if deferred and M <= MAX_ROWS else bf
        self.x = torch.zeros(M, H, **sums)
        self.res = torch.randn(M, H, **bf)
        self.norm_w = torch.randn(H, **bf) * 0.1
        self.gate_up = random_int4(2 * I, H, device)
        self.down = random_int4(H, I, device)
        self.gu = torch.zeros(M, 2 * I, **sums)
        self.act = torch.empty(M, I, **bf)
        self.mlp_out = torch.empty(M, H, **bf)
        if kind == "gdn":
            conv_dim = cfg.linear_conv_dim
            # in_proj_qkvz and in_proj_ba as one linear (layers.quant.concat_outputs): one launch
            self.in_proj = concat_outputs(random_int4(conv_dim + hv * dv, H, device),
                                          random_int4(2 * hv, H, device))
            self.out_proj = random_int4(H, hv * dv, device)
            self.conv_w = torch.randn(conv_dim, cfg.linear_conv_kernel_dim, **bf) * 0.3
            self.conv_state = torch.randn(B, conv_dim, cfg.linear_conv_kernel_dim - 1 + T - 1, **bf)
            self.A_log = torch.rand(hv, device=device)
            self.dt_bias = torch.randn(hv, device=device)
            self.gnorm_w = torch.randn(dv, device=device)
            self.pool = state_pool(B * T, hv, dk, dv, torch.float16, device)      # the engine's layout
            self.pool.copy_(torch.randn_like(self.pool) * 0.1)
            self.state_slots = torch.arange(B * T, dtype=torch.int32, device=device).view(B, T)
            self.rows = torch.arange(B, dtype=torch.int32, device=device)
            self.num_acc = torch.full((B,), T, dtype=torch.int32, device=device)
            self.proj = torch.zeros(M, self.in_proj.n, **sums)
            self.mixed = torch.empty(B, T, conv_dim, **bf)
            self.o = torch.empty(B, T, hv, dv, **bf)
            self.attn_out = torch.zeros(M, H, **sums)
            self.state_bytes = (1 + T) * B * hv * dk * dv * 2
        else:
            self.qkv = random_int4(hq * d * 2 + 2 * hkv * d, H, device)
            self.out_proj = random_int4(H, hq * d, device)
            self.q_w, self.k_w = torch.randn(d, **bf) * 0.1, torch.randn(d, **bf) * 0.1
            max_len = -(-(ctx + T) // 64) * 64
            self.kc, self.vc = kv_cache(B, hkv, max_len, d, torch.uint8, device)
            self.kc.random_(0, 256).bitwise_and_(0xBF)                # e4m3 codes without NaN
            self.vc.random_(0, 256).bitwise_and_(0xBF)
            self.ks = self.vs = torch.full((hkv,), 0.05, device=device)
            self.rows = torch.arange(B, dtype=torch.int32, device=device)
            self.lens = torch.full((B,), ctx + T, dtype=torch.int32, device=device)
            pos = torch.arange(ctx, ctx + T, device=device).repeat(B)
            self.cos, self.sin = rope_tables(pos, cfg.rotary_dim, cfg.rope_theta, torch.bfloat16)
            self.proj = torch.zeros(M, self.qkv.n, **sums)
            self.q = torch.empty(M, hq, d, **bf)
            self.k = torch.empty(M, hkv, d, **bf)
            self.gate = torch.empty(M, hq, d, **bf)
            self.o = torch.empty(B, T, hq, d, **bf)
            self.attn_out = torch.zeros(M, H, **sums)
            self.nseg = choose_nseg(B, hkv, gpu.num_sms(torch.device(device)))
            self.partials = alloc_partials(B, hq, T, max(self.nseg, 1), d, device)
            self.state_bytes = B * ctx * hkv * d * 2

    def weights(self):
        return [self.in_proj, self.out_proj] if self.kind == "gdn" else [self.qkv, self.out_proj]

    def bytes(self) -> int:
        return sum(int4_bytes(0, w.n, w.k) for w in self.weights() + [self.gate_up, self.down]) + self.state_bytes

    def kernels(self):
        """(name, launch) pairs in the order of DecoderLayer.forward; the residual stream is updated in place."""
        cfg, B, T, I, eps = self.cfg, self.B, self.T, self.cfg.intermediate_size, self.cfg.rms_norm_eps
        hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                          cfg.linear_value_head_dim)
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        M = B * T
        ks = [("add_rmsnorm (input)", lambda: add_rmsnorm(self.x, self.res, self.norm_w, eps, h=self.res,
                                                          y=self.mlp_out))]
        y = self.mlp_out
        if self.kind == "gdn":
            conv_dim = self.conv_w.shape[0]
            z_end = conv_dim + hv * dv
            qkv = self.proj[:, :conv_dim].view(B, T, conv_dim)
            z = self.proj[:, conv_dim:z_end].view(M, hv, dv)
            q, k, v = (t.unflatten(-1, (-1, n)) for t, n in
                       zip(self.mixed.split([hk * dk, hk * dk, hv * dv], -1), (dk, dk, dv)))
            b, a = (t.view(B, T, hv) for t in self.proj[:, z_end:].split(hv, -1))
            clear_ba = self.proj[:, z_end:] if fixed_sum.deferred(self.proj) else None
            ks += [("in_proj qkvz+ba", lambda: int4_linear(y, self.in_proj, out=self.proj)),
                   ("conv1d", lambda: causal_conv1d(qkv, self.conv_w, self.conv_state, self.rows,
                                                    num_accepted=self.num_acc, out=self.mixed)),
                   ("gdn_verify", lambda: gdn_verify(q, k, v, a, b, self.A_log, self.dt_bias, self.pool,
                                                     self.state_slots, self.num_acc, out=self.o)),
                   ("gated_rmsnorm", lambda: gated_rmsnorm(self.o.view(M, hv, dv), z, self.gnorm_w, eps,
                                                           y=self.o.view(M, hv, dv), clear=clear_ba)),
                   ("out_proj", lambda: int4_linear(self.o.view(M, -1), self.out_proj, out=self.attn_out))]
        else:
            kv = self.proj[:, hq * 2 * d:]
            ks += [("qkv_gate", lambda: int4_linear(y, self.qkv, out=self.proj)),
                   ("qk_norm_rope + kv write", lambda: qk_norm_rope(
                       self.proj[:, :hq * 2 * d], kv[:, :hkv * d], self.q_w, self.k_w, self.cos,
                       self.sin, hq, hkv, eps, sigmoid_gate=True, q=self.q, k_out=self.k, gate=self.gate,
                       v=kv[:, hkv * d:], kv=(self.kc, self.vc, self.ks, self.vs, self.rows, self.lens))),
                   ("attention", lambda: verify_attention(self.q.view(B, T, hq, d), self.kc, self.vc,
                                                          self.ks, self.vs, self.rows, self.lens, self.o,
                                                          self.partials, self.nseg,
                                                          gate=self.gate.view(B, T, hq, d), fresh=T)),
                   ("o_proj", lambda: int4_linear(self.o.view(M, -1), self.out_proj, out=self.attn_out))]
        ks += [("add_rmsnorm (post-attention)", lambda: add_rmsnorm(self.attn_out, self.res, self.norm_w, eps,
                                                                    h=self.res, y=self.mlp_out)),
               ("mlp gate_up", lambda: int4_linear(y, self.gate_up, out=self.gu)),
               ("silu_mul", lambda: silu_mul(self.gu[:, :I], self.gu[:, I:], y=self.act)),
               ("mlp down", lambda: int4_linear(self.act, self.down, out=self.x))]
        return ks

    def step(self, skip=None):
        """The layer's launches in order, but for kernel number `skip`."""
        for i, (_, launch) in enumerate(self.kernels()):
            if i != skip:
                launch()


def cycling(launches):
    """One launch per call, each call the next layer's."""
    it = itertools.cycle(launches)
    return lambda: next(it)()


def run(batches, T, ctx, n_layers, device="cuda", cfg=None, timer=time_us):
    cfg = cfg or qwen38_27b()
    peak = measure_bandwidth()["copy_Bps"]
    rows = []
    for B, kind in itertools.product(batches, ("gdn", "attn")):
        layers = [Layer(kind, B, T, ctx, cfg, device) for _ in range(n_layers)]
        names = [name for name, _ in layers[0].kernels()]
        alone = {name: timer(cycling([dict(layer.kernels())[name] for layer in layers])) for name in names}
        chain = timer(lambda: [layer.step() for layer in layers]) / n_layers
        in_chain = {name: chain - timer(lambda: [layer.step(skip=i) for layer in layers]) / n_layers
                    for i, name in enumerate(names)}
        with gpu.pdl_disabled():
            chain_serial = timer(lambda: [layer.step() for layer in layers]) / n_layers
        shape = f"B{B} T{T}" + (f" ctx{ctx}" if kind == "attn" else "")
        rows.append(row(f"layer[{kind}] chained", shape, chain, layers[0].bytes(), 0, peak))
        rows.append(row(f"layer[{kind}] chained, no PDL", shape, chain_serial, layers[0].bytes(), 0, peak))
        if B * T <= MAX_ROWS:                       # the same chain with every linear's output stored
            del layers
            layers = [Layer(kind, B, T, ctx, cfg, device, deferred=False) for _ in range(n_layers)]
            stored = timer(lambda: [layer.step() for layer in layers]) / n_layers
            rows.append(row(f"layer[{kind}] chained, outputs stored", shape, stored, layers[0].bytes(), 0, peak))
        rows.append(row(f"layer[{kind}] kernels alone, summed", shape, sum(alone.values()), layers[0].bytes(), 0,
                        peak))
        rows += [row(f"  {kind}: {name}", shape, us, 0, 0, peak, in_chain=round(in_chain[name], 2))
                 for name, us in alone.items()]
        del layers
        torch.cuda.empty_cache()
    return rows, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", default="1", help="comma-separated batch sizes")
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=8, help="layer copies the step runs over")
    args = ap.parse_args()
    rows, peak = run([int(b) for b in args.batch.split(",")], args.tokens, args.ctx, args.layers)
    print(write_results("layer-step", rows, {"gpu": gpu_name(), "torch": torch.__version__,
                                             "peak_copy_GBps": round(peak / 1e9, 1)}))


if __name__ == "__main__":
    main()
