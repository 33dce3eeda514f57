"""Split-KV attention in Triton: verify/decode wherever verify_gluon.py does not run, and (one segment, several
row tiles) prefill. A program owns one kv head and BLOCK_M packed rows of a sequence (row r: token r // G of q head
kvh·G + r % G) and adds the key tiles seg, seg + nseg, … (BLOCK_N keys at absolute positions), writing acc, max m
and sum l to partials for common.combine, or with one segment the output.
Width invariance: a segment's tiles and their order do not depend on kv_len and masked keys add exact zeros, so a
token's row is bitwise the same decoded alone or in a verify step, at the same Config."""
import functools
import math
from dataclasses import dataclass

import triton
import triton.language as tl

from kernels import device as gpu
from kernels.attention.common import KV_FP8_NATIVE, NEG, kv_format, split_args
from kernels.attention.fp8 import E4M3_BITS_UNIT, e4m3_decode
from kernels.attention.kv_write import cache_args, load_kv_len
from kernels.device import load_slot, pdl_wait


@triton.jit
def _load_kv(ptrs, mask, KV_FMT: tl.constexpr):
    # -> the dot operand: bf16 as stored, fp8 -> fp16 (value·2^-8 for the bit decode)
    raw = tl.load(ptrs, mask=mask, other=0)
    if KV_FMT == 1:
        return e4m3_decode(raw)
    elif KV_FMT == 2:
        return raw.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    else:
        return raw


@triton.jit
def _attend_kernel(q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, rows_ptr, lens_ptr, out_ptr, part_ptr, gate_ptr,
                   q_len, nseg, n_tiles, qk_scale, num_slots, max_len,
                   s_qb, s_qt, s_qh, s_ob, s_ot, s_oh, s_cs, s_ch, s_cn, s_vs, s_vh, s_vn, s_vd, s_pb, s_ph, s_pt, s_ps,
                   s_gb, s_gt, s_gh,
                   G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   KV_FMT: tl.constexpr, SPLIT: tl.constexpr, GATED: tl.constexpr, DOT_FP32: tl.constexpr,
                   PDL: tl.constexpr):
    # Shapes as verify_attention's; V with its own strides s_v*. Grid (B * n_tiles, Hkv, nseg).
    b = tl.program_id(0) // n_tiles
    tile = tl.program_id(0) % n_tiles
    kvh = tl.program_id(1)
    seg = tl.program_id(2)
    pdl_wait(PDL)
    slot = load_slot(rows_ptr + b, num_slots)
    # padding rows: length 0
    kv_len = load_kv_len(lens_ptr + b, slot, max_len)
    start = seg * BLOCK_N
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = offs_m // G
    head = kvh * G + offs_m % G
    row_ok = offs_m < q_len * G
    offs_d = tl.arange(0, D)
    DT: tl.constexpr = tl.bfloat16 if KV_FMT == 0 else tl.float16
    # requested with the slot and length
    q = tl.load(q_ptr + b * s_qb + tok[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(DT)
    # segments past the end are skipped (the combine stops at the same count)
    if (start < kv_len) | (nseg == 1):
        if DOT_FP32:  # the interpreter's tl.dot multiplies bf16 bit patterns
            q = q.to(tl.float32)
        if KV_FMT == 0:
            k_unit = 1.0
            v_unit = 1.0
        else:
            unit = E4M3_BITS_UNIT if KV_FMT == 1 else 1.0
            k_unit = tl.load(ks_ptr + kvh) * unit
            v_unit = tl.load(vs_ptr + kvh) * unit
        score_scale = qk_scale * k_unit
        last = kv_len - q_len + tok  # causal limit of each row
        hi = kv_len - q_len + tl.minimum((tile + 1) * BLOCK_M - 1, q_len * G - 1) // G + 1
        k_base = kc_ptr + slot.to(tl.int64) * s_cs + kvh * s_ch
        v_base = vc_ptr + slot.to(tl.int64) * s_vs + kvh * s_vh

        m_i = tl.full([BLOCK_M], NEG, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for n0 in range(start, hi, nseg * BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            in_kv = offs_n < hi
            kt = _load_kv(k_base + offs_d[:, None] + offs_n[None, :] * s_cn, in_kv[None, :], KV_FMT)
            # V past the keys meets p = 0 and is finite: masked by the allocation only, for whole 16-byte loads
            v = _load_kv(v_base + offs_n[:, None] * s_vn + offs_d[None, :] * s_vd, offs_n[:, None] < max_len,
                         KV_FMT)
            if DOT_FP32:
                kt = kt.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, kt) * score_scale
            s = tl.where((offs_n[None, :] <= last[:, None]) & in_kv[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        acc = acc * v_unit

        if SPLIT:
            p_row = part_ptr + b * s_pb + head * s_ph + tok * s_pt + seg * s_ps
            tl.store(p_row[:, None] + offs_d[None, :], acc, mask=row_ok[:, None])
            tl.store(p_row + D, m_i, mask=row_ok)
            tl.store(p_row + D + 1, l_i, mask=row_ok)
        else:
            o = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)
            if GATED:
                o = o * tl.load(gate_ptr + b * s_gb + tok[:, None] * s_gt + head[:, None] * s_gh + offs_d[None, :],
                                mask=row_ok[:, None], other=0.0).to(tl.float32)
            o_ptrs = out_ptr + b * s_ob + tok[:, None] * s_ot + head[:, None] * s_oh + offs_d[None, :]
            tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@dataclass(frozen=True)
class Config:
    block_m: int        # packed rows a tile
    block_n: int
    num_warps: int
    num_stages: int
    kv_fmt: int         # common.KV_*


@functools.lru_cache(maxsize=None)
def default_launch(block_m: int, capability: tuple) -> tuple:
    """(BLOCK_N, num_warps, num_stages) at D 256: sm_90 the H200 sweep's fastest; below, sm_86's shared memory."""
    if capability < (9, 0):
        return (32, 4, 2) if block_m <= 32 else (32, 8, 1)
    if block_m <= 32:
        return 64, 4, 3
    return (32, 8, 2) if block_m <= 64 else (64, 8, 2)


def supports(q, k_cache, v_cache, kv_fmt) -> bool:
    """Any GPU and the interpreter; the native e4m3 conversion from sm_89."""
    return kv_fmt != KV_FP8_NATIVE or (not gpu.INTERPRET and gpu.capability(q.device) >= (8, 9))


def config(q, k_cache, kv_fmt=None, q_max=None, block_m=None) -> Config:
    """One tile of the packed rows of q_max (default q_len) tokens a sequence, or tiles of block_m rows."""
    G = q.shape[2] // k_cache.shape[1]
    block_m = block_m or max(16, triton.next_power_of_2((q_max or q.shape[1]) * G))
    block_n, num_warps, num_stages = default_launch(block_m, gpu.capability(q.device))
    return Config(block_m, block_n, num_warps, num_stages, kv_format(k_cache) if kv_fmt is None else kv_fmt)


def launch(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials, nseg, gate, cfg: Config):
    """The attend kernel: out when nseg == 1, else partials."""
    B, q_len, hq, D = q.shape
    hkv = k_cache.shape[1]
    G = hq // hkv
    assert hq == G * hkv and D == triton.next_power_of_2(D) and q.stride(-1) == 1 and out.stride(-1) == 1
    cache, cache_strides, _ = cache_args(k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, hkv, D)
    n_tiles = triton.cdiv(q_len * G, cfg.block_m)
    assert nseg == 1 or n_tiles == 1, "split-KV is for single-tile (verify) launches"
    part, s_part, g, s_gate = split_args(q, out, partials, nseg, gate)
    _attend_kernel[(B * n_tiles, hkv, nseg)](
        q, *cache, out, part, g,
        q_len, nseg, n_tiles, math.log2(math.e) / math.sqrt(D), k_cache.shape[0], k_cache.shape[2],
        *q.stride()[:3], *out.stride()[:3], *cache_strides, *s_part, *s_gate,
        G=G, D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, KV_FMT=cfg.kv_fmt, SPLIT=nseg > 1, GATED=gate is not None,
        DOT_FP32=gpu.INTERPRET, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **gpu.pdl_args(q.device))
