"""Weight quantisation in plain torch: the int4 layouts (GPTQ's, read from checkpoints, and the mma layout the
kernels stream), their pack/unpack, round-to-nearest quantisers, the dequantising references the kernels are tested
against, and int8 per-row / per-token quantisers.

GPTQ int4 layout (QUANT.md §2.5, checkpoints): for a linear with weight W [N, K] (out × in), qweight int32 [K/8, N],
word [r, n] holding the 4-bit codes of k = 8r … 8r+7 in bits 4j … 4j+3, LSB first.
Int4Weight (what the kernels read) keeps a column's 128 codes of a K block together, ordered as the tensor cores'
register fragments want them (QUANT.md §3, the Marlin idea): qweight int32 [K/128, N, 16], word i = 4t + w of
column n holding, in nibble j = 4e + 2p1 + p0, the code of k = 128·block + 32w + 16p1 + 8p0 + 2t + e (mma_k below).
Lane 4·l + t of an m16n8k16 / wgmma A fragment needs, for row l, k pairs (2t, 2t+1) + 8·p0 + 16·p1 of each 32-wide
chunk w: one 16-byte load of words 4t … 4t+3 brings all of them, and (word >> 4p) & 0x000F000F is the pair (e = 0, 1)
in the two halves of a register. A column tile's K block is one contiguous run of 64-byte columns.
  scales  fp16/bf16 [K/G, N];
  zs      None (symmetric: W = (q − 8)·s) or [K/G, N] = −z·s (asymmetric: W = q·s + zs, the fma form).
Int8 (lm_head, embeddings): q int8 [N, K] (nn.Linear orientation, rows contiguous), scales [N] = amax/127.
Activations for W4A8: x_q int8 [M, K] and s_a fp32 [M] = amax/127 per token."""
from dataclasses import dataclass
from typing import Optional

import torch

GROUP = 128
BLOCK_K = 128                   # the mma layout's K block (the scale group too, here)


def mma_k(device=None) -> torch.Tensor:
    """int64 [16 (word i = 4t + w), 8 (nibble j = 4e + 2p1 + p0)]: the k inside a block of that code. Built where it
    is used (no host copy: capturable in a CUDA graph)."""
    i, j = torch.arange(16, device=device)[:, None], torch.arange(8, device=device)[None, :]
    t, w, e, p1, p0 = i // 4, i % 4, j // 4, (j // 2) % 2, j % 2
    return 32 * w + 16 * p1 + 8 * p0 + 2 * t + e


def a8_k(device=None) -> torch.Tensor:
    """int64 [32]: the k of a 32-wide chunk that slot k' = 16r + 4t + q of the int8 wgmma operand holds, when the
    mma layout's words are unpacked as (word >> 4r) & 0x0F0F0F0F (kernels/int4/wgmma_ws._a_operand_i8): nibble 2q + r
    of word 4t + w, k = 16·(q & 1) + 8r + 2t + (q >> 1). W4A8 activations are permuted to match (a8_permute)."""
    kp = torch.arange(32, device=device)
    r, t, q = kp // 16, (kp // 4) % 4, kp % 4
    return 16 * (q % 2) + 8 * r + 2 * t + q // 2


def a8_permute(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x [..., K] → x in the W4A8 operand's k order: position 32c + k' holds k = 32c + a8_k[k'] (k's bits q0 r t1 t0
    q1 reordered to r t1 t0 q1 q0; one copy); inverse: back to natural order."""
    *lead, k = x.shape
    assert k % 32 == 0, f"K = {k} must be a multiple of 32"
    if inverse:
        return x.reshape(*lead, k // 32, 2, 4, 2, 2).movedim(-1, -4).reshape(*lead, k)
    return x.reshape(*lead, k // 32, 2, 2, 4, 2).movedim(-4, -1).reshape(*lead, k)


@dataclass
class Int4Weight:
    qweight: torch.Tensor                 # int32 [K/128, N, 16] (the mma layout)
    scales: torch.Tensor                  # fp16/bf16 [K/G, N]
    zs: Optional[torch.Tensor] = None     # like scales (asymmetric), None (symmetric, zero 8)
    group: int = GROUP

    @property
    def k(self) -> int:
        return self.qweight.shape[0] * BLOCK_K

    @property
    def n(self) -> int:
        return self.qweight.shape[1]

    def to(self, device) -> "Int4Weight":
        zs = None if self.zs is None else self.zs.to(device)
        return Int4Weight(self.qweight.to(device), self.scales.to(device), zs, self.group)


@dataclass
class Int8Weight:
    qweight: torch.Tensor                 # int8 [N, K]
    scales: torch.Tensor                  # fp16/bf16 [N]

    def to(self, device) -> "Int8Weight":
        return Int8Weight(self.qweight.to(device), self.scales.to(device))


def pack_int4(codes: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Codes 0…15 → int32 words, 8 consecutive codes along `dim` per word, LSB first.
    dim = 0 on codes [K, N] gives GPTQ qweight [K/8, N]; dim = 1 on zeros [K/G, N] gives GPTQ qzeros [K/G, N/8]."""
    c = codes.movedim(dim, -1).to(torch.int64)
    assert c.shape[-1] % 8 == 0, "packed dimension must be a multiple of 8"
    assert int(c.min()) >= 0 and int(c.max()) <= 15, "codes must lie in 0..15"
    c = c.reshape(*c.shape[:-1], -1, 8) << (4 * torch.arange(8, device=c.device))
    words = c.sum(-1)                                      # < 2^32, no overlap between nibbles
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def unpack_int4(words: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Inverse of pack_int4: int32 words → uint8 codes, 8 per word along `dim`."""
    w = words.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    c = (w[..., None] >> (4 * torch.arange(8, device=w.device))) & 0xF
    return c.reshape(*w.shape[:-1], -1).to(torch.uint8).movedim(-1, dim).contiguous()


def pack_mma(codes: torch.Tensor) -> torch.Tensor:
    """Codes 0…15 [K, N] → the mma layout int32 [K/128, N, 16]."""
    k, n = codes.shape
    assert k % BLOCK_K == 0, f"K = {k} must be a multiple of {BLOCK_K}"
    c = codes.to(torch.int64).reshape(k // BLOCK_K, BLOCK_K, n)[:, mma_k(codes.device)]     # [K/128, 16, 8, N]
    words = (c << (4 * torch.arange(8, device=codes.device))[:, None]).sum(2)                  # [K/128, 16, N]
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.transpose(1, 2).contiguous()


def unpack_mma(words: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_mma: int32 [K/128, N, 16] → uint8 codes [K, N]."""
    nb, n, _ = words.shape
    w = words.to(torch.int64).transpose(1, 2) & 0xFFFFFFFF                                   # [K/128, 16, N]
    c = (w[:, :, None] >> (4 * torch.arange(8, device=words.device))[:, None]) & 0xF        # [K/128, 16, 8, N]
    codes = torch.empty(nb, BLOCK_K, n, dtype=torch.uint8, device=words.device)
    codes[:, mma_k(words.device)] = c.to(torch.uint8)
    return codes.reshape(nb * BLOCK_K, n)


def _group_view(w: torch.Tensor, group: int) -> torch.Tensor:
    n, k = w.shape
    assert k % group == 0 and k % 8 == 0, f"K = {k} must be a multiple of the group size {group}"
    return w.float().reshape(n, k // group, group)


def quantize_int4(w: torch.Tensor, group: int = GROUP, sym: bool = True,
                  scale_dtype: torch.dtype = torch.float16) -> Int4Weight:
    """Round-to-nearest int4 of W [N, K] per group of `group` inputs (the GPTQ quantiser grid, QUANT.md §4):
    symmetric s = 2·amax/15, zero 8; asymmetric s = (max − min)/15 over a range that includes 0, z = round(−min/s).
    Codes are rounded against the stored (rounded) scales so that dequantisation is as close as it can be."""
    g = _group_view(w, group)                                           # [N, K/G, G]
    if sym:
        s = (2 * g.abs().amax(-1) / 15).clamp_min(1e-8).to(scale_dtype)
        sf = s.float()[..., None]
        q = torch.clamp(torch.round(g / sf) + 8, 0, 15)
        zs = None
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        s = ((hi - lo) / 15).clamp_min(1e-8).to(scale_dtype)
        sf = s.float()[..., None]
        z = torch.clamp(torch.round(-lo[..., None] / sf), 0, 15)
        q = torch.clamp(torch.round(g / sf) + z, 0, 15)
        zs = (-z[..., 0] * s.float()).to(scale_dtype).t().contiguous()
    codes = q.reshape(w.shape).t()                                      # [K, N]
    return Int4Weight(pack_mma(codes.to(torch.uint8)), s.t().contiguous(), zs, group)


def dequantize_int4(w: Int4Weight) -> torch.Tensor:
    """The reference: W [N, K] in fp32, exactly what the kernels compute with (scales as stored)."""
    q = unpack_mma(w.qweight).float()                                   # [K, N]
    s = w.scales.float().repeat_interleave(w.group, 0)
    if w.zs is None:
        out = (q - 8) * s
    else:
        out = q * s + w.zs.float().repeat_interleave(w.group, 0)
    return out.t().contiguous()


def int4_from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, sym: bool,
                   group: int = GROUP, v1: bool = True, g_idx: torch.Tensor = None) -> Int4Weight:
    """GPTQ tensors (qweight [K/8, N], qzeros [K/G, N/8], scales [K/G, N], 4-bit) → Int4Weight. GPTQ v1 stores z − 1
    (QUANT.md §2.1), the codes are repacked into the mma layout. Symmetric checkpoints must have every zero at 8;
    asymmetric ones get zs = −z·s. ValueError for what this layout cannot hold, rather than wrong weights: scales
    whose rows are not one per `group` rows of K, or act-order (a g_idx other than k // group: each row's group
    would have to travel with it)."""
    K = qweight.shape[0] * 8
    if scales.shape[0] != -(-K // group):
        raise ValueError(f"scales have {scales.shape[0]} rows: not one per {group} of K = {K} (group size?)")
    if g_idx is not None and not torch.equal(g_idx.cpu().long(), torch.arange(K) // group):
        raise ValueError("act-order GPTQ (g_idx is not k // group_size): not supported")
    z = unpack_int4(qzeros, dim=1).to(torch.int32) + (1 if v1 else 0)
    words = pack_mma(unpack_int4(qweight))
    if sym:
        if not bool((z == 8).all()):
            raise ValueError("sym checkpoint with zero points other than 8")
        return Int4Weight(words, scales.contiguous(), None, group)
    zs = (-z.float() * scales.float()).to(scales.dtype)
    return Int4Weight(words, scales.contiguous(), zs.contiguous(), group)


def concat_outputs(*weights: Int4Weight) -> Int4Weight:
    """Linears of the same input as one: their output columns side by side (e.g. a GDN layer's in_proj_qkvz and
    in_proj_ba, one launch instead of two). Each K block keeps its columns contiguous, so this is a concatenation
    of qweight, scales and zs along N."""
    first = weights[0]
    assert all(w.k == first.k and w.group == first.group and (w.zs is None) == (first.zs is None)
               and w.scales.dtype == first.scales.dtype for w in weights), "concat_outputs: K, group or format differ"
    zs = None if first.zs is None else torch.cat([w.zs for w in weights], 1)
    return Int4Weight(torch.cat([w.qweight for w in weights], 1), torch.cat([w.scales for w in weights], 1), zs,
                      first.group)


def quantize_int8_rows(w: torch.Tensor, scale_dtype: torch.dtype = torch.float16) -> Int8Weight:
    """Per-row symmetric int8 (lm_head, embeddings): s = amax/127 over each row of W [N, K]."""
    s = (w.float().abs().amax(1) / 127).clamp_min(1e-8).to(scale_dtype)
    q = torch.clamp(torch.round(w.float() / s.float()[:, None]), -127, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), s)


def dequantize_int8(w: Int8Weight) -> torch.Tensor:
    """W [N, K] in fp32."""
    return w.qweight.float() * w.scales.float()[:, None]


def quantize_act_int8(x: torch.Tensor):
    """Per-token int8 activations for W4A8 (QUANT.md §3): s_a = max|x[m]|/127 (≥ 1e-6), x_q = round(x/s_a).
    Returns (x_q int8 [M, K], s_a fp32 [M]). In the engine this belongs in the epilogue of the producer kernel."""
    s = (x.float().abs().amax(-1) / 127).clamp_min(1e-6)
    q = torch.clamp(torch.round(x.float() / s[..., None]), -127, 127).to(torch.int8)
    return q, s
