"""Int4-weight GEMV for decode and verify (M ≤ 16 rows) on tensor cores: out[M, N] = x[M, K] @ W[N, K]ᵀ, W in the
canonical int4 layout (layers/quant.py).

Why a second int4 kernel: at M ≤ 16 the step is a pure weight stream, and the Triton kernel (int4_linear.py)
stages every tile through shared memory with ldmatrix-style reads, the padded activation tile read once per warp
and several barriers per group: on the H200 L1/shared ran at ~70% while DRAM ran at ~30%. Here:
* The weights are the mma's A operand (rows = output columns, m16n8k16) and the activations its B operand
  (columns = tokens, n8 or n16), so M ≤ 8 wastes no mma width. A group's words [BN columns, 16 word rows] are
  copied as they lie in the canonical layout (cp.async, 16 bytes per copy) into a ring of shared-memory stages,
  and each thread reads back exactly the words its A fragment needs (8-column units XOR-swizzled by word row, so
  a warp's read hits 32 banks); the layout on disk stays the one shared with the GEMM path.
* Word (8r + j codes) → bf16/fp16 pairs with t = (word >> 4j) & 0x000F000F | MAGIC (codes j and j+4 as 128 + q or
  1024 + q); the mma's k order inside a 32-wide chunk is therefore permuted (slot 16·jhi + 8·jlo + 2·t + e holds
  k = 8·t + 4·e + 2·jhi + jlo for lane-in-quad t and j = 2·jhi + jlo), and the activations are loaded in that
  same order: each thread's 8 values are 8 consecutive k (one 16-byte load), permuted in registers.
* Exact codes in the mma (offset by 128, the offset removed through a ones-operand mma of x: one subtract per
  pair of weights less), the group's partial sum scaled once per group in fp32 (like int4_linear's GEMV form).
* The next groups' words are in flight in the ring (no registers hold them: 8 CTAs of 2 warps fit an SM's
  registers; with the words prefetched into registers the kernel measured 0.60 instead of 0.63 of the copy
  bandwidth at M = 1); activations and scales are loaded one group ahead into registers. On sm_90 the launch
  is a programmatic dependent launch: the first groups' weights stream while the previous kernel finishes.
* Stream-K: the (column tile, K group) work units are cut into one equal range per resident CTA, so every SM
  streams the same bytes (with one split-K count per shape, CTA counts that are no multiple of the SMs left
  up to 21% of the SMs idle at the end; ncu, 34816x5120). A tile shared by programs is summed in an fp64
  workspace (order-independent: deterministic, and a token's output does not depend on the launch's other tokens).
Measured on the H200 (bench/results/kernels-h200.md): 0.45-0.78 of the copy bandwidth at M = 1, 0.38-0.71 at
M = 5 (the small shapes pay the launch's fixed latency: their copy floor is 0.71-0.89). Tried and not kept: 3-4
ring stages (fewer CTAs fit the shared memory: slower), 64-column tiles, activations in the ring too, fewer
registers (maxnreg) for 9-10 CTAs per SM (no faster), two register buffers, L2 prefetch instructions.
Written in Gluon (Triton's explicit-layout dialect): layouts are spelled out so every conversion is checked to be
free (`assert_trivial`). Gluon does not run in the interpreter: the CPU tests cover int4_linear, which computes
the same function; this kernel is checked against the same reference in the GPU tests and compiled for sm_86 and
sm_90 by tests/aot_compile.py. Symmetric weights only (asymmetric ones take int4_linear).
Reference: layers.quant.dequantize_int4."""
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from kernels import device as gpu
from kernels.splitk import workspace
from layers.quant import Int4Weight

MAX_ROWS = 16


def exact_log2(v: int) -> int:
    assert v & (v - 1) == 0, v
    return v.bit_length() - 1


def layouts(bn: int, bt: int, warps: int):
    """(words [BN, 4 (t), 4 (b)], activations [128, BT] in k order) layouts that hand each thread what its mma
    fragments need (the words read back from a ring stage). Row r of a CTA tile: bits 0-2 lane/4, bit 3 register,
    bit 4.. warp, then registers."""
    warp_rows = [[16 << i, 0, 0] for i in range(exact_log2(warps))]
    rep_rows = [[16 * warps << i, 0, 0] for i in range(exact_log2(bn // (16 * warps)))]
    words = gl.DistributedLinearLayout(                             # word 4b + t of the group, column `row`
        reg_bases=[[8, 0, 0], [0, 0, 1], [0, 0, 2]] + rep_rows,
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=warp_rows, block_bases=[], shape=[bn, 4, 4])
    acts = gl.DistributedLinearLayout(
        reg_bases=[[1, 0], [2, 0], [4, 0], [32, 0], [64, 0]] + ([[0, 8]] if bt == 16 else []),
        lane_bases=[[8, 0], [16, 0], [0, 1], [0, 2], [0, 4]], warp_bases=[[0, 0]] * exact_log2(warps),
        block_bases=[], shape=[128, bt])
    return words, acts


def ring_layouts(bn: int, warps: int, stages: int):
    """(copy [BN, 4, 4]: each thread copies 4 consecutive columns, 16 bytes; ring [STAGES, BN, 4, 4] in shared
    memory: columns fastest, then word t, then b, then stage, 8-column units XOR-swizzled by t, so that the mma
    fragment's reads — 8 consecutive columns of 4 word rows t per warp — fall on 32 different banks)."""
    lanes_r = min(32, bn // 4)
    copy = gl.BlockedLayout(size_per_thread=[4, 1, 1], threads_per_warp=[lanes_r, 32 // lanes_r, 1],
                            warps_per_cta=[1, warps, 1] if warps <= 4 // (32 // lanes_r) else [1, 1, warps],
                            order=[0, 1, 2])
    ring = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=4, order=[0, 1, 2])    # of one stage
    return copy, ring


@gluon.jit
def _pair(w, j: gl.constexpr, DT: gl.constexpr):
    """Codes j and j + 4 of each word as two DT numbers 128 + q (bf16) or 1024 + q (fp16): [...] → [..., 2]."""
    w = w >> (4 * j)
    if DT == gl.float16:        # (w & 0x000F000F) | MAGIC in one lop3 (the compiler emits two)
        t = gl.inline_asm_elementwise("lop3.b32 $0, $1, 0x000F000F, 0x64006400, 0xEA;", "=r,r", [w],
                                      dtype=gl.int32, is_pure=True, pack=1)
    else:
        t = gl.inline_asm_elementwise("lop3.b32 $0, $1, 0x000F000F, 0x43004300, 0xEA;", "=r,r", [w],
                                      dtype=gl.int32, is_pure=True, pack=1)
    return gl.join(t.to(gl.int16), (t >> 16).to(gl.int16)).to(DT, bitcast=True)


@gluon.jit
def _chunk_weights(q, b: gl.constexpr, BN: gl.constexpr, DT: gl.constexpr, a_op: gl.constexpr):
    """Words of one group [BN, 4 (t), 4 (b)] → chunk b as the A operand [BN, 32] in DT (offset codes)."""
    w = gl.reshape(q, [BN, 4, 2, 2])                                # [row, t, b1, b0]
    lo, hi = gl.split(w)
    w = hi if b % 2 == 1 else lo
    lo, hi = gl.split(w)
    w = hi if b // 2 == 1 else lo                                   # [row, t]
    u = gl.join(gl.join(_pair(w, 0, DT), _pair(w, 1, DT)), gl.join(_pair(w, 2, DT), _pair(w, 3, DT)))
    u = gl.reshape(gl.permute(u, [0, 4, 3, 1, 2]), [BN, 32])       # [row, t, e, jlo, jhi] → slot 16jhi+8jlo+2t+e
    return gl.convert_layout(u, a_op, assert_trivial=True)


@gluon.jit
def _chunk_acts(x, b: gl.constexpr, BT: gl.constexpr, b_op: gl.constexpr):
    """Activations of one group [128, BT] in k order → chunk b as the B operand [32, BT] in slot order."""
    x = gl.reshape(x, [4, 32, BT])                                  # [b, k % 32, tok]
    x = gl.permute(x, [1, 2, 0])
    x = gl.reshape(x, [32, BT, 2, 2])                               # [k % 32, tok, b1, b0]
    lo, hi = gl.split(x)
    x = hi if b % 2 == 1 else lo
    lo, hi = gl.split(x)
    x = hi if b // 2 == 1 else lo                                   # [k % 32, tok], k % 32 = 8t + 4e + 2jhi + jlo
    x = gl.reshape(x, [4, 2, 2, 2, BT])                             # [t, e, jhi, jlo, tok]
    x = gl.reshape(gl.permute(x, [2, 3, 0, 1, 4]), [32, BT])       # slot 16·jhi + 8·jlo + 2·t + e
    return gl.convert_layout(x, b_op, assert_trivial=True)


@gluon.jit
def _arange3(n: gl.constexpr, dim: gl.constexpr, layout: gl.constexpr):
    """arange(n) along `dim` of a rank-3 tensor in `layout`, size 1 along the other two."""
    if dim == 0:
        r = gl.arange(0, n, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
        return gl.expand_dims(gl.expand_dims(r, 1), 2)
    elif dim == 1:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
        return gl.expand_dims(gl.expand_dims(r, 0), 2)
    else:
        r = gl.arange(0, n, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
        return gl.expand_dims(gl.expand_dims(r, 0), 1)


@gluon.jit
def _unit(u, n_groups, BN: gl.constexpr):
    """Work unit u = tile · n_groups + g → (first column of the tile, g)."""
    tile = u // n_groups
    return tile * BN, u - tile * n_groups


@gluon.jit
def _copy_words(stage, c_ptrs, cr, ct, cb, u, n_groups, N, BN: gl.constexpr, EVEN_N: gl.constexpr):
    """Unit u's words [BN, 4, 4] into a ring stage (cp.async, 16 bytes per thread and copy), one commit group."""
    n0, g = _unit(u, n_groups, BN)
    if EVEN_N:
        async_copy.async_copy_global_to_shared(stage, c_ptrs + g * 16 * N + n0)
    else:
        async_copy.async_copy_global_to_shared(stage, c_ptrs + g * 16 * N + n0,
                                               mask=(n0 + cr < N) & (ct < 4) & (cb < 4))
    async_copy.commit_group()


@gluon.jit
def _load_xs(x_ptrs, s_ptrs, x_ok, sr, u, n_groups, N, BN: gl.constexpr, EVEN_N: gl.constexpr):
    """Unit u's activations [128, BT] and scales [BN]."""
    n0, g = _unit(u, n_groups, BN)
    if EVEN_N:
        s = gl.load(s_ptrs + g * N + n0)
    else:
        s = gl.load(s_ptrs + g * N + n0, mask=n0 + sr < N, other=0)
    return gl.load(x_ptrs + g * 128, mask=x_ok, other=0.0), s


@gluon.jit
def _group_product(q, xg, s, acc, BN: gl.constexpr, BT: gl.constexpr, DT: gl.constexpr, BASE: gl.constexpr,
                   mma: gl.constexpr, a_op: gl.constexpr, b_op: gl.constexpr):
    """acc [BN, BT] += one group, scaled per row in fp32: Σ (code − 8)·x = Σ (BASE + code − 8)·x − BASE·Σx, the
    codes entering the mma as BASE + q and Σx coming from a ones operand (a subtract per pair of weights saved)."""
    part = gl.zeros([BN, BT], gl.float32, mma)
    xsum = gl.zeros([BN, BT], gl.float32, mma)
    for b in gl.static_range(4):
        xb = _chunk_acts(xg, b, BT, b_op)
        part = mma_v2(_chunk_weights(q, b, BN, DT, a_op), xb, part)
        xsum = mma_v2(gl.full([BN, 32], 1.0, DT, a_op), xb, xsum)
    return acc + (part - BASE * xsum) * gl.expand_dims(s.to(gl.float32), 1)


@gluon.jit
def flush_tile(acc, tile, groups, n_groups, out_ptr, ws_ptr, cnt_ptr, M, N, stride_om, BN: gl.constexpr,
               BT: gl.constexpr, mma: gl.constexpr):
    """The tile's sum over `groups` of its n_groups groups: stored when that is all of them, else added into the
    workspace, and stored by the program whose groups complete the tile's count (as kernels/splitk.store_tile).
    The workspace adds in fp64: a sum of fp32 partials whose magnitudes lie within 2^24 of each other is exact
    there, so the order the programs arrive in does not change the bits (fp32 atomics made every call's output a
    little random), and a token's output is the same for every M of the bucket: decoded alone or in a verify step."""
    cols = tile * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    tok = gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
    mask = gl.expand_dims(cols < N, 1) & gl.expand_dims(tok < M, 0)
    out = out_ptr + gl.expand_dims(tok, 0) * stride_om + gl.expand_dims(cols, 1)
    if groups == n_groups:
        gl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ws64 = ws_ptr.to(gl.pointer_type(gl.float64), bitcast=True)
        ws = ws64 + gl.expand_dims(tok, 0) * N + gl.expand_dims(cols, 1)
        gl.atomic_add(ws, acc.to(gl.float64), mask=mask, sem="relaxed")
        gl.thread_barrier()
        arrived = gl.atomic_add(cnt_ptr + tile, groups, sem="acq_rel")
        if arrived + groups == n_groups:
            ws_bits = ws.to(gl.pointer_type(gl.int64), bitcast=True)
            total = gl.atomic_xchg(ws_bits, gl.zeros([BN, BT], gl.int64, mma), mask=mask, sem="relaxed")
            gl.store(out, total.to(gl.float64, bitcast=True).to(out_ptr.dtype.element_ty), mask=mask)
            gl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")


@gluon.jit
def _int4_gemv_kernel(x_ptr, qw_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_om,
                      w_layout: gl.constexpr, x_layout: gl.constexpr, c_layout: gl.constexpr,
                      ring_layout: gl.constexpr, BN: gl.constexpr, BT: gl.constexpr, W: gl.constexpr,
                      STAGES: gl.constexpr, EVEN_N: gl.constexpr, PDL: gl.constexpr):
    # x [M, K] bf16/fp16 (unit column stride), qw int32 [K/8, N], s [K/128, N], out [M, N] (any float dtype);
    # ws fp32 [2·M·N] (used as fp64 [M, N]) and cnt int32 [tiles] zeroed (kernels/splitk.py). Grid (P,): the
    # tiles · K/128 work units (tile, group), tile-major, are cut into P equal contiguous ranges, one per program
    # ("stream-K"): every SM streams the same number of groups; a tile split between programs is summed through
    # the workspace.
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    DT: gl.constexpr = x_ptr.dtype.element_ty
    BASE: gl.constexpr = 1032.0 if DT == gl.float16 else 136.0      # 1024 + 8 or 128 + 8
    n_groups = K // 128
    units = gl.cdiv(N, BN) * n_groups
    pid = gl.program_id(0)
    u_lo = pid * units // gl.num_programs(0)
    u_hi = (pid + 1) * units // gl.num_programs(0)

    cr = _arange3(BN, 0, c_layout)
    ct = _arange3(4, 1, c_layout)
    cb = _arange3(4, 2, c_layout)
    c_ptrs = qw_ptr + (4 * cb + ct) * N + cr
    xk = gl.arange(0, 128, layout=gl.SliceLayout(1, x_layout))
    xt = gl.arange(0, BT, layout=gl.SliceLayout(0, x_layout))
    x_ok = gl.expand_dims(xk < 128, 1) & gl.expand_dims(xt < M, 0)
    x_ptrs = x_ptr + gl.expand_dims(xt, 0).to(gl.int64) * stride_xm + gl.expand_dims(xk, 1)
    sr = gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    s_ptrs = s_ptr + sr

    # The words stream through a ring of STAGES groups in shared memory (cp.async: no registers hold bytes in
    # flight, so STAGES - 1 groups per CTA are); activations and scales, small, one group ahead in registers.
    # The prefetch past the range's end reloads its last unit (no predicates).
    ring = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 4, 4], ring_layout)
    if PDL:
        # Programmatic dependent launch (sm_90): let the next kernel's CTAs start as ours retire; the weights
        # (constants) stream while the previous kernel finishes, which may write x: wait before reading it.
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    for j in gl.static_range(STAGES - 1):
        _copy_words(ring.index(j), c_ptrs, cr, ct, cb, gl.minimum(u_lo + j, u_hi - 1), n_groups, N, BN, EVEN_N)
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    nxt = _load_xs(x_ptrs, s_ptrs, x_ok, sr, u_lo, n_groups, N, BN, EVEN_N)
    acc = gl.zeros([BN, BT], gl.float32, mma)
    for u in range(u_lo, u_hi):
        i = u - u_lo
        async_copy.wait_group(STAGES - 2)          # this thread's copies of unit u have landed
        gl.thread_barrier()                         # everyone's have; everyone has read unit u - 1's stage
        _copy_words(ring.index((i + STAGES - 1) % STAGES), c_ptrs, cr, ct, cb,
                    gl.minimum(u + STAGES - 1, u_hi - 1), n_groups, N, BN, EVEN_N)
        q = ring.index(i % STAGES).load(w_layout)
        xg, s = nxt
        nxt = _load_xs(x_ptrs, s_ptrs, x_ok, sr, gl.minimum(u + 1, u_hi - 1), n_groups, N, BN, EVEN_N)
        acc = _group_product(q, xg, s, acc, BN, BT, DT, BASE, mma, a_op, b_op)
        if (u + 1 == u_hi) | ((u + 1) % n_groups == 0):            # the tile's last group, or the range's
            tile = u // n_groups
            flush_tile(acc, tile, u + 1 - gl.maximum(u_lo, tile * n_groups), n_groups, out_ptr, ws_ptr, cnt_ptr,
                       M, N, stride_om, BN, BT, mma)
            acc = gl.zeros([BN, BT], gl.float32, mma)
    async_copy.wait_group(0)


# Per row bucket (upper bound inclusive): columns per CTA, warps per CTA, ring stages, and CTAs per SM in the grid:
# as many as stay resident at once (64K registers per SM: 2-warp CTAs of ~128 registers per thread (8 tokens) fit
# 8 times, of ~160 (16 tokens) 6 times; a program waiting for a second wave doubles the time; shared memory caps
# it further on smaller parts). H200 sweep at the 27B shapes (bench/kernels_int4.py --sweep): 8 CTAs of 2 stages
# beat 6-7 of 3-4 stages (0.63 / 0.58 of the copy bandwidth at M = 1), and 128 columns beat 64 (0.56 / 0.44 at 8).
ROW_BUCKETS = ((8, dict(block_n=128, warps=2, stages=2, ctas_per_sm=8)),
               (16, dict(block_n=128, warps=2, stages=2, ctas_per_sm=6)))


def supports(x: torch.Tensor, w: Int4Weight) -> bool:
    """Whether this kernel takes the call: CUDA sm_80+, ≤ 16 rows, symmetric weights, group 128."""
    return (x.is_cuda and gpu.capability(x.device) >= (8, 0) and x.numel() // x.shape[-1] <= MAX_ROWS
            and w.zs is None and w.group == 128 and x.dtype in (torch.bfloat16, torch.float16)
            and x.stride(-1) == 1)


def pick(m: int, n: int, k: int, device, **override) -> dict:
    """Launch parameters for m rows: the bucket's tile, and one program per resident CTA (at most one per work
    unit)."""
    p = dict(next(p for bound, p in ROW_BUCKETS if m <= bound), **override)
    ring_bytes = p["stages"] * p["block_n"] * 16 * 4 + 1024          # + the 1 KiB the GPU reserves per CTA
    c = min(p.pop("ctas_per_sm"), gpu.smem_per_sm(device) // ring_bytes)
    p.setdefault("programs", min(triton.cdiv(n, p["block_n"]) * (k // 128), c * gpu.num_sms(device)))
    return p


def int4_gemv(x: torch.Tensor, w: Int4Weight, out: torch.Tensor, block_n: int = None, warps: int = None,
              programs: int = None, stages: int = None) -> torch.Tensor:
    """x [..., K] (≤ 16 rows, bf16/fp16) → out [..., N] (any float dtype); launch parameters default to pick()."""
    k, n = w.k, w.n
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    out2 = out.view(-1, n)
    assert m <= MAX_ROWS and x2.stride(-1) == 1 and out2.stride(-1) == 1 and n % 8 == 0 and k % 128 == 0
    given = {key: v for key, v in dict(block_n=block_n, warps=warps, programs=programs, stages=stages).items()
             if v is not None}
    p = pick(m, n, k, x.device, **given)
    pdl = gpu.pdl(x.device)
    bt = 8 if m <= 8 else 16
    ws, cnt = workspace(x.device, 2 * m * n, triton.cdiv(n, p["block_n"]))      # fp64 [M, N]
    w_layout, x_layout = layouts(p["block_n"], bt, p["warps"])
    c_layout, ring_layout = ring_layouts(p["block_n"], p["warps"], p["stages"])
    _int4_gemv_kernel[(p["programs"],)](
        x2, w.qweight, w.scales, out2, ws, cnt, m, n, k, x2.stride(0), out2.stride(0),
        w_layout, x_layout, c_layout, ring_layout, p["block_n"], bt, p["warps"], p["stages"], n % p["block_n"] == 0,
        pdl,
        num_warps=p["warps"], launch_pdl=pdl)
    return out
