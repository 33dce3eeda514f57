"""The Qwen3.5 / 3.6 / 3.8 dense hybrid in plain torch (MODEL.md §3, §5), read top to bottom.

This is the reference every kernel is tested against and the eager path that runs anywhere. Parameter names
equal the checkpoint's tensor names with the `model.` / `model.language_model.` prefix removed, so loading is a
name lookup. Activations: [B, T, H]; all sequences of a batch share their positions (cache lengths are equal).

Caches: full-attention layers keep K/V [B, Hkv, capacity, D]; GDN layers keep the last K−1 pre-conv inputs
[B, C, K−1] and the recurrent state [B, Hv, dk, dv] in fp32. A verify pass (`keep_states=True`) keeps the state
after every token, and `Cache.commit(n)` keeps the first n tokens: this is the rollback of speculative decoding."""
import torch
import torch.nn.functional as F
from torch import nn

from kernels.gdn.ref import delta_rule_chunked_ref, delta_rule_recurrent_ref, gates_ref, prepare_qk_ref
from kernels.norms.ref import apply_rope_ref, gated_rmsnorm_ref, rms_norm_1p_ref, rope_tables, silu_mul_ref
from layers.config import ModelConfig


# ---------------------------------------------------------------------------------------------------- norms
# rms_norm_1p_ref (every decoder/final/q/k/MTP norm), gated_rmsnorm_ref (GDN output norm), rope_tables and
# apply_rope_ref live in kernels/norms/ref.py, the fused kernels' reference.


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm_1p_ref(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x, z):
        return gated_rmsnorm_ref(x, z, self.weight, self.eps)


# ---------------------------------------------------------------------------------------------------- caches
class AttentionCache:
    """K/V of one full-attention layer: [B, Hkv, capacity, D]; positions < length are valid."""

    def __init__(self, batch, kv_heads, head_dim, capacity, dtype, device):
        self.k = torch.zeros(batch, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def append(self, k, v):
        """k, v [B, Hkv, T, D] at positions length…length+T−1; returns all valid K, V."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"KV cache capacity {self.k.shape[2]} exceeded (need {end} positions)")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def commit(self, start, n):
        self.length = start + n


class GDNCache:
    """One GDN layer: conv window [B, C, K−1] (pre-conv inputs) and recurrent state [B, Hv, dk, dv] in fp32."""

    def __init__(self, batch, conv_dim, kernel, heads, dk, dv, dtype, device):
        self.conv = torch.zeros(batch, conv_dim, kernel - 1, dtype=dtype, device=device)
        self.state = torch.zeros(batch, heads, dk, dv, dtype=torch.float32, device=device)
        self.pending = None              # after a verify pass: (conv inputs [B, C, K−1+T], states [T, B, Hv, dk, dv])

    def commit(self, start, n):
        if self.pending is not None:
            window, states = self.pending
            self.conv = window[:, :, n: n + self.conv.shape[2]].clone()
            self.state = states[n - 1].clone()
            self.pending = None


class Cache:
    """All per-sequence state of the target model plus the MTP layer's own KV."""

    def __init__(self, cfg: ModelConfig, batch, capacity, dtype, device, with_mtp):
        self.layers = [
            AttentionCache(batch, cfg.num_key_value_heads, cfg.head_dim, capacity, dtype, device)
            if lt == "full_attention" else
            GDNCache(batch, cfg.linear_conv_dim, cfg.linear_conv_kernel_dim, cfg.linear_num_value_heads,
                     cfg.linear_key_head_dim, cfg.linear_value_head_dim, dtype, device)
            for lt in cfg.layer_types]
        self.mtp = AttentionCache(batch, cfg.num_key_value_heads, cfg.head_dim, capacity, dtype, device) if with_mtp else None
        self.length = 0                  # committed target positions
        self.pending_start = None

    def commit(self, n):
        """Keep the first n tokens of the last verify pass (1 <= n <= its length); GDN state := state after token n."""
        for layer in self.layers:
            layer.commit(self.pending_start, n)
        self.length = self.pending_start + n
        self.pending_start = None


# ---------------------------------------------------------------------------------------------------- attention
class GatedAttention(nn.Module):
    """Gated full attention (MODEL.md §3.4): q_proj rows per head [q_h | gate_h], q/k norm before partial RoPE, GQA,
    output gated by sigmoid(gate) before o_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(H, nh * hd * 2, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.cfg = cfg

    def forward(self, x, start, cache: AttentionCache | None):
        cfg, (B, T, _) = self.cfg, x.shape
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q, gate = self.q_proj(x).view(B, T, nh, 2 * hd).split(hd, -1)
        k = self.k_proj(x).view(B, T, nkv, hd)
        v = self.v_proj(x).view(B, T, nkv, hd)
        cos, sin = rope_tables(torch.arange(start, start + T, device=x.device), cfg.rotary_dim, cfg.rope_theta, x.dtype)
        q = apply_rope_ref(self.q_norm(q), cos, sin).transpose(1, 2)           # [B, nh, T, hd]
        k = apply_rope_ref(self.k_norm(k), cos, sin).transpose(1, 2)           # [B, nkv, T, hd]
        v = v.transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)                                      # [B, nkv, start + T, hd]
        o = attention(q, k, v, start)
        o = o.transpose(1, 2).reshape(B, T, nh * hd) * torch.sigmoid(gate.reshape(B, T, nh * hd))
        return self.o_proj(o)


def attention(q, k, v, start):
    """Causal GQA attention of T new queries at positions start… over S = start + T keys; fp32 softmax.
    q [B, Hq, T, D], k/v [B, Hkv, S, D] -> [B, Hq, T, D]; q-head h uses kv-head h // (Hq/Hkv)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    T, S = q.shape[2], k.shape[2]
    future = torch.arange(S, device=q.device)[None, :] > torch.arange(start, start + T, device=q.device)[:, None]
    scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(-1, dtype=torch.float32).to(q.dtype) @ v


# ---------------------------------------------------------------------------------------------------- gated deltanet
class GatedDeltaNet(nn.Module):
    """Gated DeltaNet linear attention (MODEL.md §3.3)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, C = cfg.hidden_size, cfg.linear_conv_dim
        Hv = cfg.linear_num_value_heads
        self.in_proj_qkv = nn.Linear(H, C, bias=False)
        self.in_proj_z = nn.Linear(H, cfg.linear_value_dim, bias=False)
        self.in_proj_b = nn.Linear(H, Hv, bias=False)
        self.in_proj_a = nn.Linear(H, Hv, bias=False)
        self.conv1d = nn.Conv1d(C, C, cfg.linear_conv_kernel_dim, groups=C, bias=False)
        self.A_log = nn.Parameter(torch.zeros(Hv))
        self.dt_bias = nn.Parameter(torch.zeros(Hv))
        self.norm = GatedRMSNorm(cfg.linear_value_head_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(cfg.linear_value_dim, H, bias=False)
        self.cfg = cfg

    def forward(self, x, cache: GDNCache | None, keep_states):
        cfg, (B, T, _) = self.cfg, x.shape
        Hk, Hv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        conv_in = self.in_proj_qkv(x).transpose(1, 2)                      # [B, C, T]
        history = cache.conv if cache is not None else conv_in.new_zeros(B, conv_in.shape[1], self.conv1d.kernel_size[0] - 1)
        window = torch.cat([history, conv_in], -1)                          # [B, C, K−1+T]
        mixed = F.silu(F.conv1d(window, self.conv1d.weight, groups=window.shape[1])).transpose(1, 2)   # [B, T, C]
        q, k, v = mixed.split([cfg.linear_key_dim, cfg.linear_key_dim, cfg.linear_value_dim], -1)
        q, k = prepare_qk_ref(q.reshape(B, T, Hk, dk), k.reshape(B, T, Hk, dk), Hv)    # [B, T, Hv, dk] fp32
        v = v.reshape(B, T, Hv, dv).float()
        g, beta = gates_ref(self.in_proj_a(x), self.in_proj_b(x), self.A_log, self.dt_bias)   # [B, T, Hv]
        state = cache.state if cache is not None else x.new_zeros(B, Hv, dk, dv, dtype=torch.float32)
        if keep_states or T == 1:
            o, states = delta_rule_recurrent_ref(q, k, v, g, beta, state)
            final = states[-1]
        else:
            o, final = delta_rule_chunked_ref(q, k, v, g, beta, state)
        if cache is not None:
            if keep_states:
                cache.pending = (window, states)
            else:
                cache.conv = window[:, :, T:].clone()
                cache.state = final
        z = self.in_proj_z(x).view(B, T, Hv, dv)
        o = self.norm(o.to(x.dtype), z)
        return self.out_proj(o.reshape(B, T, Hv * dv))


# ---------------------------------------------------------------------------------------------------- blocks
class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(silu_mul_ref(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_type):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if layer_type == "full_attention":
            self.self_attn = GatedAttention(cfg)
        else:
            self.linear_attn = GatedDeltaNet(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, start, cache, keep_states=False):
        h = self.input_layernorm(x)
        if hasattr(self, "self_attn"):
            h = self.self_attn(h, start, cache)
        else:
            h = self.linear_attn(h, cache, keep_states)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class MTP(nn.Module):
    """Multi-token prediction layer (MODEL.md §5): fc([norm(embed(next ids)), norm(hidden)]) -> one gated-attention
    decoder layer with its own KV -> mtp.norm. Shares embed_tokens and lm_head with the target."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H = cfg.hidden_size
        self.pre_fc_norm_embedding = RMSNorm(H, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(H, cfg.rms_norm_eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(cfg, "full_attention")])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)

    def forward(self, embeds, hidden, start, cache):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1))
        return self.norm(self.layers[0](x, start, cache))


class Qwen35Model(nn.Module):
    def __init__(self, cfg: ModelConfig, with_mtp: bool = True):
        super().__init__()
        self.cfg = cfg
        # weight given, so nn.Embedding skips its random init (a normal_ that, on the meta device the loader
        # builds on, imports torch._dynamo: ~1.4 s); the loader or the demo's init_weights fills it
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList([DecoderLayer(cfg, lt) for lt in cfg.layer_types])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = MTP(cfg) if with_mtp and cfg.mtp_num_hidden_layers else None

    @property
    def lm_head_weight(self):
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def new_cache(self, batch, capacity) -> Cache:
        w = self.embed_tokens.weight
        return Cache(self.cfg, batch, capacity, w.dtype, w.device, self.mtp is not None)

    def forward(self, ids, cache: Cache | None = None, keep_states: bool = False):
        """ids [B, T] at positions cache.length… -> post-final-norm hidden [B, T, H] (the lm_head and MTP input).
        With keep_states the pass is provisional until cache.commit(n)."""
        start = cache.length if cache is not None else 0
        x = self.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, start, cache.layers[i] if cache is not None else None, keep_states)
        if cache is not None:
            cache.length = start + ids.shape[1]
            cache.pending_start = start if keep_states else None
        return self.norm(x)

    def logits(self, hidden):
        return (hidden @ self.lm_head_weight.T).float()

    def mtp_forward(self, next_ids, hidden, cache: Cache | None = None):
        """Draft rows: row i takes (embed(next_ids[i]), hidden[i]) at position cache.mtp.length + i and returns the
        MTP's normed output (fed to logits() and, when chaining, back in as the next hidden)."""
        mtp_cache = cache.mtp if cache is not None else None
        start = mtp_cache.length if mtp_cache is not None else 0
        return self.mtp(self.embed_tokens(next_ids), hidden, start, mtp_cache)
