"""Split-KV attention for verify/decode (q_len = 1…8 new tokens per sequence) over the KV cache, plus the LSE
combine of the KV segments (ENGINE.md §4, fp8 KV §5). The same kernel, with one segment and several row tiles,
is the prefill kernel (kernels/attention_prefill.py). Cache layout: kernels/kv_write.py. On sm_90 an fp8 cache
(V keys-fastest) is attended by kernels/attention_verify_gluon.py instead (same partials and combine; the notes
below are this kernel's).

GQA packing: one program owns one kv head and a tile of BLOCK_M packed rows of one sequence; packed row r is
query token r // G of q head kvh·G + r % G, so a 5-token verify at G = 6 is a single 32-row tile and K/V are read
once for all six heads. Token i of a row with q_len new tokens sees key positions <= kv_len - q_len + i.
Program (b·n_tiles + tile, kvh, seg) covers the key tiles seg, seg + nseg, seg + 2·nseg, … (BLOCK_N keys each, at
absolute positions: which tiles a segment holds, and in which order it adds them, does not depend on kv_len, so a
token's row gets the same partials — keys past its causal limit add exact zeros — whether it is decoded alone or
inside a verify step of more tokens; with the same BLOCK_M the output is bitwise the same), and writes
unnormalised acc[D], running max m (log2 units) and sum l to partials[b, h, i, seg] (fp32 rows of D + PART_EXTRA);
the combine kernel merges them: O = Σ 2^(m_s−m*)·acc_s / Σ 2^(m_s−m*)·l_s. With one segment the kernel
normalises and writes the output itself (no partials, no combine launch).
KV formats: bf16, or e4m3 codes decoded with integer bit operations (any GPU; kernels/fp8.py) or with the
native conversion (sm_89+). K and V scales are applied to fp32 scores and to acc, never to the 8-bit tiles.
Tried and not kept (H200, fp8 KV, V keys-fastest, us against this kernel in the same run): e4m3 operands straight
into the tensor cores — q and p split into e4m3 hi + lo (bf16's precision), keys on the wgmma's M side, nothing
decoded — B1 16k 19.0 against 19.3, 64k 54.9 against 51.0, B8 16k 103 against 93, B64 1.5k 80 against 73 (with
the rows on M, Triton decodes e4m3 operands to fp16 for mma.sync anyway); an L2 prefetch of each program's first
1 / 2 / 4 tiles before the PDL wait: B1 16k 19.4 / 20.0 / 21.4 against 19.5, and after a 4 MB copy kernel 25.0
against 22.9 (2 tiles); partials as each segment's normalised output in fp16 (half the bytes written and combined):
B1 16k 19.4 against 19.7, 64k 51.7 against 50.8, ctx 64 9.3 against 8.3, B8 16k 91.9 against 91.0 (the combine's
~3.5 us at B1 16k is latency, not bytes). ncu, B1 16k: 8 warps per SM, issue slots 32% busy, stalls spread
(issuing 21%, long scoreboard 20%, wait 19%); attend alone (combine skipped) 16.0 us, with it 19.5; at ctx 64
4.9 and 7.7. The cache rows and lengths read before the wait for the previous kernel (the step's inputs, written
long before): B1 ctx 64 / 1.5k / 16k 7.12 / 10.27 / 19.34 against 7.69 / 10.40 / 19.46 us, B8 16k 92.7
against 92.0 (not worth a caller's promise that nothing of the last few launches wrote them).
What bounds it (session 15): the KV tiles are pipelined (cp.async two tiles ahead: 86 KB of shared memory and 227
registers, so 2 CTAs of 4 warps per SM); ncu at B1 16k: 0.39 instructions issued per scheduler cycle at 4.8
cycles each, DRAM 39% busy — each warp's instruction stream (~1,400 a tile: conversions, mma, softmax) is the
time. More warps per SM by smaller tiles was slower (us at B1 16k / B1 64k / B8 16k, against 19.6 / 50.9 / 92.7):
16-row tiles (two programs per kv head and segment, half the accumulator, 128-183 registers) with 32 / 64-key
tiles at 33-66 segments 21.3-40 / 57-136 / 108-181; 32-key tiles capped at 168 registers (3 CTAs per SM) at 64-99
segments 25.9-28.8 / 63-86 / 117-127; 8 warps with 64 / 128-key tiles 19.7-28 / 54-78; 128 segments 29.6 / 60.6.
Only 1.5k gained (16-row tiles of 64 keys: 8.3 against 10.5 us), where its target is met already. The SASS
says why the stream is long: Triton puts the 4 warps along the keys (warpsPerCTA [1, 4]), so every tile's row max,
row sum and the hand-over of P to the PV mma cross warps through shared memory — 8 CTA barriers in the ~1,130
instructions of a tile's loop. Warps along the rows instead (each owning whole rows: reductions in-warp, P passed
in registers, as FlashAttention-2) needs explicit layouts (Gluon); Triton cannot be asked for them.
Tried in Gluon and not kept (session 16, H200, same harness, us against this kernel): (1) warps along the rows on
mma.sync m16n8k32 e4m3 — sm_90 has no e4m3 mma.sync: ptxas emulates it (F2FP conversions + HMMA.16816), its loop
was 1,690 instructions a warp and tile against ~1,130 here, not run. (2) FlashAttention-3's shape: one warpgroup
with the rows on the wgmma's M (padded to 64), e4m3 QGMMA straight from the cp.async ring (K as stored, V
keys-fastest), q and p as e4m3 hi + lo, P handed to the PV wgmma in registers (K's rows stored in the A
fragment's key order), one warp per 16 rows: 748 instructions a warp and tile, 2 CTAs per SM; B1 1.5k / 16k /
64k 15.9 / 23.0 / 51.9 against 10.6 / 19.9 / 50.6, B8 16k 90.7 against 91.8, B64 1.5k 70.4 against 74.5; without
the lo halves' mma (half the tensor work) 15.0 / 21.9 / 51.1 — not tensor-bound; alone (nseg 1) a program took
1.29 us a tile with two ring stages, and three stages (1 CTA per SM) were slower. Its outputs were still wrong
when dropped (cause not found). Both leave the combine's ~3.5 us: 70% at B1 16k (11.2 us) would need the
attend at the bandwidth roofline as well. Seen in this kernel's SASS (sm_90, fp8 native, the B1 verify launch):
~290 of the ~1,130 instructions of a tile's loop are register moves (IMAD.MOV) — ptxas keeps q's A fragments (loop
invariant, 32 registers) unaligned and copies 4 registers into an aligned quad before each of the 64 QK mma;
feeding the dot a zero accumulator from registers (the causal mask as its input) or reloading q inside the loop
did not change that (1,113 / 1,461 instructions). A kernel holding q in shared memory (ldmatrix per k step, as
Gluon allows) would drop them."""
import functools
import math

import torch
import triton
import triton.language as tl

from kernels import attention_verify_gluon, device as gpu
from kernels.device import load_slot, pdl_wait
from kernels.fp8 import E4M3_BITS_UNIT, decode_e4m3_ref, e4m3_decode
from kernels.kv_write import cache_args, load_kv_len

KV_BF16, KV_FP8_BITS, KV_FP8_NATIVE = 0, 1, 2
_NEG = tl.constexpr(-1.0e30)  # "no key seen yet": finite, so fully masked rows give 2^(-inf - NEG) = 0, never NaN
# fp32 words of a partial's row after its acc[D]: m, l and padding that starts every row on a 32-byte sector, so the
# attend's stores of acc fill whole sectors (with D + 2 a row straddled them). H200, Gluon kernel + combine, caches
# out of L2, us against D + 2 (same run): B1 1.5k / 16k / 64k 8.75 / 18.1 / 46.4 against 10.1 / 19.5 / 46.8, B2 16k
# 29.0 / 30.0, B8 1.5k / 16k 15.8 / 84.5 against 17.4 / 86.0. Rows of D + 16 (strides divisible by 16 elements,
# which Triton specialises on: the combine's loads then 16-byte vectors) measured 8.5 / 19.8 / 47.7, 28.2, 17.1 /
# 84.7; the acc stored in 16-byte runs along D (a layout conversion through shared memory first) slower still.
PART_EXTRA = 8


@triton.jit
def _load_kv(ptrs, mask, KV_FMT: tl.constexpr):
    # one K or V tile -> the dot operand type: bf16 as stored, fp8 -> fp16 (value·2^-8 for the bit decode)
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
    # q, out [B, q_len, Hq, D] (D contiguous); k cache [slots, Hkv, max_len, D] (D contiguous), v cache of the same
    # shape with its own strides s_v* (kernels/kv_write.kv_cache: keys contiguous); k/v scales [Hkv] fp32;
    # cache_rows, kv_lens [B] int32; partials [B_max, Hq, Q_MAX, NSEG_max, D + PART_EXTRA] fp32 (SPLIT only); gate
    # like out (GATED: out = attention · gate). Grid (B * n_tiles, Hkv, nseg).
    b = tl.program_id(0) // n_tiles
    tile = tl.program_id(0) % n_tiles
    kvh = tl.program_id(1)
    seg = tl.program_id(2)
    pdl_wait(PDL)
    slot = load_slot(rows_ptr + b, num_slots)
    # padding rows (a slot < 0 or past the cache) attend to nothing and output 0; a length past the cache (the
    # caller's error) reads no other slot
    kv_len = load_kv_len(lens_ptr + b, slot, max_len)
    start = seg * BLOCK_N
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = offs_m // G
    head = kvh * G + offs_m % G
    row_ok = offs_m < q_len * G
    offs_d = tl.arange(0, D)
    DT: tl.constexpr = tl.bfloat16 if KV_FMT == 0 else tl.float16
    # requested with the sequence's slot and length, not after them
    q = tl.load(q_ptr + b * s_qb + tok[:, None] * s_qt + head[:, None] * s_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(DT)
    # segments past the end are skipped; the combine stops at the same count. Without a split, always write.
    if (start < kv_len) | (nseg == 1):
        if DOT_FP32:  # the interpreter multiplies bf16 bit patterns in tl.dot (ENGINE.md §7)
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
        # keys past this tile's last row's limit are never needed (prefill tiles stop early)
        hi = kv_len - q_len + tl.minimum((tile + 1) * BLOCK_M - 1, q_len * G - 1) // G + 1
        k_base = kc_ptr + slot.to(tl.int64) * s_cs + kvh * s_ch
        v_base = vc_ptr + slot.to(tl.int64) * s_vs + kvh * s_vh

        m_i = tl.full([BLOCK_M], _NEG, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for n0 in range(start, hi, nseg * BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            in_kv = offs_n < hi
            # K is loaded already transposed, so only elementwise ops sit between load and dot (no tl.trans):
            # H200, bf16 KV: 9-16 % faster than loading [BLOCK_N, D] and transposing; fp8 unchanged (~2 %)
            kt = _load_kv(k_base + offs_d[:, None] + offs_n[None, :] * s_cn, in_kv[None, :], KV_FMT)
            # V rows past the tile's keys meet p = 0 and hold finite values (kernels/kv_write.py), so V is masked
            # by the allocation only: stored keys-fastest, its loads stay whole 16-byte copies along the keys
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


@triton.jit
def _combine_kernel(part_ptr, rows_ptr, lens_ptr, out_ptr, gate_ptr, nseg, Hq, num_slots, max_len,
                    s_pb, s_ph, s_pt, s_ps, s_ob, s_ot, s_oh, s_gb, s_gt, s_gh,
                    D: tl.constexpr, BLOCK_N: tl.constexpr, SEG_P2: tl.constexpr, BLOCK_D: tl.constexpr,
                    GATED: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    # partials [B_max, Hq, Q_MAX, NSEG_max, D + PART_EXTRA] fp32 -> out [B, q_len, Hq, D] (GATED: times gate, out's
    # shape). Grid (B, q_len * Hq, D // BLOCK_D): one (row, token, head) and a BLOCK_D slice of the head dim. EARLY: the
    # slot and length are the step's inputs (attend's `fresh`), read before the wait, and only the segments used
    # are requested; else all nseg are, with the length (unused ones hold stale values, masked after arrival).
    b = tl.program_id(0)
    t = tl.program_id(1) // Hq
    h = tl.program_id(1) % Hq
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    if not EARLY:
        pdl_wait(PDL)
    slot = load_slot(rows_ptr + b, num_slots)
    kv_len = load_kv_len(lens_ptr + b, slot, max_len)
    n_used = tl.minimum(tl.cdiv(kv_len, BLOCK_N), nseg)       # segments holding at least one tile
    offs_s = tl.arange(0, SEG_P2)
    s_ok = offs_s < n_used
    if EARLY:
        pdl_wait(PDL)
        s_load = s_ok
    else:
        s_load = offs_s < nseg
    base = part_ptr + b * s_pb + h * s_ph + t * s_pt + offs_s * s_ps
    m = tl.load(base + D, mask=s_load, other=_NEG)
    l = tl.load(base + D + 1, mask=s_load, other=0.0)
    acc = tl.load(base[:, None] + offs_d[None, :], mask=s_load[:, None], other=0.0)
    m = tl.where(s_ok, m, _NEG)
    w = tl.where(s_ok, tl.exp2(m - tl.max(m, 0)), 0.0)
    total = tl.sum(tl.where(s_ok, w * l, 0.0), 0)
    o = tl.sum(tl.where(s_ok[:, None], acc * w[:, None], 0.0), 0)
    o = tl.where(total > 0, o / total, 0.0)
    if GATED:
        o = o * tl.load(gate_ptr + b * s_gb + t * s_gt + h * s_gh + offs_d).to(tl.float32)
    tl.store(out_ptr + b * s_ob + t * s_ot + h * s_oh + offs_d, o.to(out_ptr.dtype.element_ty))


def kv_format(k_cache: torch.Tensor, native=None) -> int:
    """KV_BF16 for a bf16 cache; for e4m3 codes the native conversion where the GPU has one (or as asked)."""
    if k_cache.dtype == torch.bfloat16:
        return KV_BF16
    assert k_cache.dtype in (torch.uint8, torch.float8_e4m3fn), k_cache.dtype
    if native is None:
        native = not gpu.INTERPRET and k_cache.is_cuda and gpu.capability(k_cache.device) >= (8, 9)
    return KV_FP8_NATIVE if native else KV_FP8_BITS


def alloc_partials(batch_max: int, num_q_heads: int, q_max: int, nseg_max: int, head_dim: int, device):
    """Split-KV partials [B_max, Hq, Q_MAX, NSEG_max, D + PART_EXTRA] fp32. Allocate once, before any graph
    capture: captured graphs hold its address."""
    return torch.empty(batch_max, num_q_heads, q_max, nseg_max, head_dim + PART_EXTRA, dtype=torch.float32,
                       device=device)


def choose_nseg(batch: int, num_kv_heads: int, num_sms: int, nseg_max: int = 64) -> int:
    """KV segments per (sequence, kv head) for a batch bucket: as many as fit one wave of two programs per SM
    (H200, B 8, 16k: 8 segments 113 µs, 9 segments — a partial second wave — 183 µs; B 1: 64 beat 32 by 15 % at
    64k). Short contexts use fewer automatically: a segment is at least one tile. Fewer segments would be faster
    there (the Gluon kernel with its combine, caches out of L2, B1 512 / 1.5k / 4k / 16k / 64k us, 16 / 32 / 64
    segments: 6.7 / 7.6 / 9.9, 8.3 / 9.3 / 10.3, 11.0 / 11.2 / 13.3, 27.2 / 19.7 / 19.5, 91.5 / 52.9 / 46.7; B8 1.5k /
    16k, 4 / 8: 15.8 / 17.5, 95.2 / 85.5), but a bucket's count must not follow the length: a token's tiles must
    fall to the same segments in a decode and a verify step (bitwise width invariance). The longest contexts
    decide: at 64k the gap is largest in µs."""
    return max(1, min(nseg_max, 2 * num_sms // (batch * num_kv_heads)))


def combine_block_d(batch: int, num_q_heads: int, head_dim: int) -> int:
    """The combine's slice of the head dim per program. By batch and heads, never by q_len: a decode step and a
    verify step of one bucket then reduce the segments in the same order (bitwise the same rows). H200, the combine
    alone (choose_nseg's segments, 5 tokens, 24 heads of 256), us for slices of 64 / 128 / 256: B1 3.05 / 3.46 /
    3.20, B2 4.86 / 4.76 / 3.70, B4 3.53 / 3.13 / 2.50, B8 5.63 / 3.33 / 2.95, B16 10.3 / 5.64 / 3.18, B32 19.6 /
    10.4 / 5.64: whole heads per program once that still makes a few hundred programs."""
    return min(head_dim, 64) if batch * num_q_heads < 48 else head_dim


@functools.lru_cache(maxsize=None)
def default_launch(block_m: int, capability: tuple) -> tuple:
    """(BLOCK_N, num_warps, num_stages) at D 256 for a row tile of block_m. sm_90: the fastest of the H200 sweep
    (bench/kernels_attn.py; 5-token verify: 64/4/3; 128-row prefill tiles: 64/8/2). Below sm_90 (untested):
    half-height KV tiles and fewer stages, to stay inside sm_86's 99 KiB of shared memory."""
    if capability < (9, 0):
        return (32, 4, 2) if block_m <= 32 else (32, 8, 1)
    if block_m <= 32:
        return 64, 4, 3
    return (32, 8, 2) if block_m <= 64 else (64, 8, 2)


def attend(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials=None, nseg=1, gate=None,
           block_m=None, block_n=None, kv_fmt=None, num_warps=None, num_stages=None, gluon=None, fresh=None):
    """Attention of the q_len new tokens of each row over its cache (which already holds them).
    q, out [B, q_len, Hq, D]; caches [slots, Hkv, max_len, D] (uint8 e4m3 codes or bf16; V any strided view, best
    keys-fastest as kernels/kv_write.kv_cache allocates it); scales [Hkv] fp32
    (None for bf16); cache_rows, kv_lens [B] int32; partials from alloc_partials when nseg > 1; gate None or like q
    (last dim contiguous): out = attention · gate, the gated-attention output gate (sigmoid already applied).
    block_m None packs all q_len·G rows in one tile (verify); prefill passes a tile size. A decode step whose rows
    must be bitwise those of a verify step (greedy with drafting == without) passes the verify's block_m.
    gluon: None takes kernels/attention_verify_gluon.py for a one-tile launch at the default tiles wherever it runs
    (its `supports`), True / False that kernel / this one.
    fresh: None, or the keys at the end of each row that kernels of this step write (a verify step's own q_len,
    kv_write's): with programmatic dependent launch the Gluon kernel may then read cache_rows, kv_lens, the scales
    and the keys before those before the previous kernel completes. The caller promises that no kernel of the
    captured step writes any of those (they come from the host or earlier steps: kernels/device.py's rule)."""
    B, q_len, hq, D = q.shape
    hkv = k_cache.shape[1]
    G = hq // hkv
    assert hq == G * hkv and D == triton.next_power_of_2(D) and q.stride(-1) == 1 and out.stride(-1) == 1
    fmt = kv_format(k_cache) if kv_fmt is None else kv_fmt
    cache, cache_strides, _ = cache_args(k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, hkv, D)
    rows = q_len * G
    block_m = block_m or max(16, triton.next_power_of_2(rows))
    as_tuned = block_n is None and num_warps is None and num_stages is None
    dflt_n, dflt_warps, dflt_stages = default_launch(block_m, gpu.capability(q.device))
    block_n, num_warps, num_stages = block_n or dflt_n, num_warps or dflt_warps, num_stages or dflt_stages
    n_tiles = triton.cdiv(rows, block_m)
    split = nseg > 1
    pdl = gpu.pdl_args(q.device)
    if split:
        assert n_tiles == 1 and partials is not None, "split-KV is for single-tile (verify) launches"
        assert partials.shape[0] >= B and partials.shape[1] == hq and partials.shape[2] >= q_len
        assert partials.shape[3] >= nseg and partials.shape[4] == D + PART_EXTRA and partials.stride(-1) == 1
    part = partials if split else out
    s_part = partials.stride()[:4] if split else (0, 0, 0, 0)
    gated = gate is not None
    if gated:
        assert gate.shape == q.shape and gate.stride(-1) == 1, "gate: [B, q_len, Hq, D], last dim contiguous"
    g, s_gate = (gate, gate.stride()[:3]) if gated else (out, (0, 0, 0))
    if gluon is None:       # the Gluon kernel wherever it runs, for a verify (one row tile) at default tiles
        gluon = n_tiles == 1 and as_tuned and attention_verify_gluon.supports(q, k_cache, v_cache, fmt, block_m)
    if gluon:
        assert n_tiles == 1 and attention_verify_gluon.supports(q, k_cache, v_cache, fmt, block_m)
        attention_verify_gluon.attend(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials,
                                      nseg, gate, rows=block_m, fresh=fresh)
        block_n = attention_verify_gluon.BLOCK_N.value
    else:
        _attend_kernel[(B * n_tiles, hkv, nseg)](
            q, *cache, out, part, g,
            q_len, nseg, n_tiles, math.log2(math.e) / math.sqrt(D), k_cache.shape[0], k_cache.shape[2],
            *q.stride()[:3], *out.stride()[:3], *cache_strides, *s_part, *s_gate,
            G=G, D=D, BLOCK_M=block_m, BLOCK_N=block_n, KV_FMT=fmt, SPLIT=split, GATED=gated,
            DOT_FP32=gpu.INTERPRET, num_warps=num_warps, num_stages=num_stages, **pdl)
    if split:
        block_d = combine_block_d(B, hq, D)
        _combine_kernel[(B, q_len * hq, D // block_d)](
            partials, cache_rows, kv_lens, out, g, nseg, hq, k_cache.shape[0], k_cache.shape[2], *s_part,
            *out.stride()[:3], *s_gate,
            D=D, BLOCK_N=block_n, SEG_P2=triton.next_power_of_2(nseg), BLOCK_D=block_d, GATED=gated,
            EARLY=fresh is not None, **pdl)
    return out


def verify_attention(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials, nseg, gate=None,
                     **kw):
    """Split-KV verify/decode attention: q, out [B, q_len ≤ 8, Hq, D]; see `attend` for the other arguments."""
    return attend(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens, out, partials, nseg, gate, **kw)


def dequantize_kv(cache, scale, slot: int, length: int) -> torch.Tensor:
    """fp32 [Hkv, length, D] of one slot of a cache (e4m3 codes times the per-head scale, or bf16)."""
    if cache.dtype == torch.bfloat16:
        return cache[slot, :, :length].float()
    return decode_e4m3_ref(cache.view(torch.uint8)[slot, :, :length], scale.view(-1, 1, 1))


def attention_ref(q, k_cache, v_cache, k_scale, v_scale, cache_rows, kv_lens) -> torch.Tensor:
    """Plain-torch reference of `attend`: dequantised KV, fp32 softmax. Returns fp32 [B, q_len, Hq, D]."""
    B, q_len, hq, D = q.shape
    G = hq // k_cache.shape[1]
    out = torch.zeros(B, q_len, hq, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        slot, length = int(cache_rows[b]), int(kv_lens[b])
        if slot < 0:
            continue
        k = dequantize_kv(k_cache, k_scale, slot, length).repeat_interleave(G, 0)  # [Hq, L, D]: head h -> h // G
        v = dequantize_kv(v_cache, v_scale, slot, length).repeat_interleave(G, 0)
        s = torch.einsum("thd,hld->htl", q[b].float(), k) / math.sqrt(D)
        pos = torch.arange(length, device=q.device)
        allowed = pos[None, :] <= (length - q_len + torch.arange(q_len, device=q.device))[:, None]  # [t, L]
        p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
        out[b] = torch.einsum("htl,hld->thd", p, v)
    return out
