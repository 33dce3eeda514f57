"""Attention over the KV cache (kv_write.py). verify_config picks the verify variant, verify_gluon.py or verify.py;
a Config as `cfg` forces one."""
from kernels.attention import prefill, verify, verify_gluon
from kernels.attention.common import (KV_BF16, KV_FP8_BITS, KV_FP8_NATIVE, alloc_partials, combine,
                                      combine_block_d, kv_format)
from kernels.attention.config import choose_nseg
from kernels.attention.kv_write import kv_cache, kv_scales_from, write_kv

__all__ = ["verify_attention", "prefill_attention", "verify_config", "write_kv", "kv_cache", "kv_scales_from",
           "alloc_partials", "choose_nseg", "combine_block_d", "kv_format", "KV_BF16", "KV_FP8_BITS",
           "KV_FP8_NATIVE", "prefill", "verify", "verify_gluon"]


def verify_config(q, k_cache, v_cache, kv_fmt=None, q_max=None):
    """verify_gluon's Config where it runs, else verify's. q_max: a decode step whose rows must be bitwise a
    verify step's passes the verify's q_len (or reuses its Config)."""
    fmt = kv_format(k_cache) if kv_fmt is None else kv_fmt
    cfg = verify_gluon.config(q, k_cache, q_max)
    if verify_gluon.supports(q, k_cache, v_cache, fmt, cfg.rows):
        return cfg
    assert verify.supports(q, k_cache, v_cache, fmt), f"no verify kernel for KV format {fmt} here"
    return verify.config(q, k_cache, fmt, q_max)


def verify_attention(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials, nseg, gate=None,
                     fresh=None, cfg=None):
    """Attention of the q_len ≤ 8 new tokens of each row over its cache (which holds them already).
    q, out [B, q_len, Hq, D]; caches, scales (None for bf16), cache_rows, kv_lens as kv_write.py; nseg KV segments
    (choose_nseg), partials from alloc_partials when nseg > 1; gate None or like q: out = attention · gate.
    fresh: None, or the keys at the end of each row that this step's kernels write (its q_len): with PDL the rest
    may then be read before the previous kernel completes; the caller promises no kernel of the step writes
    cache_rows, kv_lens, the scales or older keys. cfg: None (verify_config) or a verify / verify_gluon Config."""
    cfg = cfg or verify_config(q, k_cache, v_cache)
    args = (q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials, nseg, gate, cfg)
    if isinstance(cfg, verify_gluon.Config):
        assert verify_gluon.supports(q, k_cache, v_cache, KV_FP8_NATIVE, cfg.rows)
        verify_gluon.launch(*args, fresh=fresh)
    else:
        verify.launch(*args)
    if nseg > 1:
        combine(partials, cache_rows, kv_lens, out, gate, nseg, k_cache.shape[0], k_cache.shape[2], cfg.block_n,
                fresh)
    return out


def prefill_attention(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, cfg=None):
    """Causal prefill, q, out [B, T, Hq, D]: the arguments as verify_attention's; cfg a verify.Config."""
    prefill.launch(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, cfg or prefill.config(q, k_cache))
    return out
