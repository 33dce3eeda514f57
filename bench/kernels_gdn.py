"""Gated DeltaNet kernels at the 27B shapes (Hv 48, Hk 16, dk = dv 128, conv 10240 channels, K 4, k = 4 drafts):
verify update (T = 5, B ∈ {1, 8, 64}, fp16 and fp32 state; the default kernel and the Triton one), conv update
(T = 5) and prefill, chunked prefill at 4k tokens. Bytes counted: verify = read 1 state + write T states + q, k, v,
a, b + o; conv = x + y + state read and written + weights; prefill = inputs + o + state read and written (its fp32
W/U workspace is overhead, not counted). The verify's state slots and the conv's state and weights rotate through
copies that L2 cannot hold, every copy in the timed graph (bench.harness.Rotation), as do the copies of the
floor rows; the activations (q, k, v, a, b, x: the previous kernel's output) and the prefill's state do not.
`python -m bench.kernels_gdn --sweep` times launch configurations instead (verify: the SWEEPs of
kernels/gdn/recurrent.py and recurrent_gluon.py; prefill: kernels/gdn/chunked.SWEEP). Beside the B = 1 verify
rows, the floor of the same harness: a launch that only reads a state once and writes it T times
(bench/floors.py: the verify's state traffic, no kernel of it beats that), the same with its writes waiting for
inputs read after the launch before (as the verify's do: its tighter floor), a copy moving the verify's bytes (a
memcpy node and a copy kernel) and an empty Triton kernel."""
from dataclasses import replace

import torch
import triton

from bench.floors import read_write_floor_us
from bench.harness import Rotation, suite_main, time_us
from kernels.gdn import causal_conv1d, chunked, gdn_prefill, gdn_verify, prefill_workspace, recurrent, \
    recurrent_gluon, state_pool
from layers.config import qwen38_27b
from tools.targets import GDN_FLOOR, GDN_FLOOR_INPUTS, row

M27 = qwen38_27b()
HV, HK, D, K = M27.linear_num_value_heads, M27.linear_num_key_heads, M27.linear_key_head_dim, M27.linear_conv_kernel_dim
KD = 4                                                                  # drafts
T = KD + 1
C = M27.linear_conv_dim
DEV = "cuda"


def layer_inputs(B, L):
    """q, k, v as views into one conv output [B, L, 10240] (the layer's layout), a, b, A_log, dt_bias."""
    qkv = torch.randn(B, L, C, device=DEV, dtype=torch.bfloat16)
    q, k, v = (t.unflatten(-1, (-1, D)) for t in qkv.split([HK * D, HK * D, HV * D], -1))
    a, b = torch.randn(2, B, L, HV, device=DEV, dtype=torch.bfloat16)
    return q, k, v, a, b, torch.rand(HV, device=DEV), torch.randn(HV, device=DEV)


def timed_row(name, shape, fn, nbytes, flops, peak, out, **kw):
    """Append one row (or a failure note, so one bad launch configuration does not end the suite); print it."""
    try:
        out.append(row(name, shape, time_us(fn, **kw), nbytes, flops, peak))
    except Exception as e:  # noqa: BLE001 - report and go on
        out.append({"kernel": name, "shape": shape, "error": f"{type(e).__name__}: {str(e)[:120]}"})
    print(out[-1], flush=True)


@triton.jit
def _empty_kernel():
    pass


def floor_rows(nbytes, state_bytes, grid, peak, out):
    """What the harness measures for the verify's state traffic (one state read, T written; and so with the writes
    depending on inputs read after the wait, as every state the verify writes depends on its q, k, v, a, b), for
    moving `nbytes` (half read, half written) and for an empty launch."""
    for name, inputs in ((GDN_FLOOR, False), (GDN_FLOOR_INPUTS, True)):
        out.append(row(name, f"state {state_bytes} B, T {T}", read_write_floor_us(state_bytes, T, inputs),
                       (1 + T) * state_bytes, 0, peak))
        print(out[-1], flush=True)
    pairs = Rotation(lambda: (torch.empty(nbytes // 4, device=DEV, dtype=torch.float16).normal_(),
                              torch.empty(nbytes // 4, device=DEV, dtype=torch.float16)), nbytes)
    timed_row("floor: copy_ (memcpy node)", "same bytes", lambda: (lambda s, d: d.copy_(s))(*pairs()), nbytes, 0,
              peak, out, reps=pairs.reps)
    timed_row("floor: mul by 1 (copy kernel)", "same bytes", lambda: (lambda s, d: torch.mul(s, 1, out=d))(*pairs()),
              nbytes, 0, peak, out, reps=pairs.reps)
    for g in ((1,), grid):
        timed_row("floor: empty triton kernel", f"grid {g}", lambda: _empty_kernel[g](), nbytes, 0, peak, out)


def verify_rows(peak, sweep):
    """The default update on the engine's state layout (dk fastest: kernels/gdn.state_pool); beside it the same on
    transformers' layout (dv fastest), where the Triton kernel is also timed."""
    out = []
    widths = (1, 2, 4, 8, 16, 64) if sweep else (1, 8, 64)
    for B, sdt in [(B, torch.float16) for B in widths] + [(1, torch.float32), (8, torch.float32)]:
        inputs = layer_inputs(B, T)
        slots = torch.arange(B * T, dtype=torch.int32, device=DEV).view(B, T)
        num_acc = torch.randint(1, T + 1, (B,), dtype=torch.int32, device=DEV)
        o = torch.empty(B, T, HV, D, device=DEV, dtype=torch.bfloat16)
        state_bytes = B * HV * D * D * sdt.itemsize                  # one state of every sequence
        nbytes = (1 + T) * state_bytes + B * T * (C + 2 * HV + HV * D) * 2
        pool_bytes = B * T * HV * D * D * sdt.itemsize             # the slots a call reads one of and writes
        for dk_major in (True, False):
            # copies of the pool that L2 cannot hold, every one in the timed graph: the state comes from HBM, as in a
            # step (the layers between two verifies of a layer evict it), and as the floor beside it reads it
            pools = Rotation(lambda: (state_pool(B * T, HV, D, D, sdt, DEV) if dk_major
                                      else torch.zeros(B * T, HV, D, D, device=DEV, dtype=sdt)), pool_bytes)
            # the default launch; on the dv-fastest layout also the Triton kernel's
            state = pools()
            configs = [("", None)]
            if not dk_major:
                configs += [("[triton]", recurrent.config(inputs[2], state))]
                configs += [(f"[fma,bv{c.block_v},w{c.num_warps}]", c) for c in recurrent.SWEEP] \
                    if sweep and sdt == torch.float16 else []
            configs += [(f"[gluon,{t}]", recurrent_gluon.config(inputs[2], state, t))
                        for t in recurrent_gluon.SWEEP] if sweep else []
            for tag, cfg in configs:
                name = "gdn_verify" + tag + ("" if dk_major else "[dv fastest]")
                timed_row(name, f"B{B} T{T} state {str(sdt)[6:]}",
                          lambda: gdn_verify(*inputs, pools(), slots, num_acc, out=o, cfg=cfg),
                          nbytes, 8 * B * T * HV * D * D, peak, out, reps=pools.reps)
            pools = None                                  # freed before the next layout's copies
            torch.cuda.empty_cache()
        if B == 1 and sdt == torch.float16:
            floor_rows(nbytes, state_bytes, (B, HV, D // 16), peak, out)
    return out


def conv_rows(peak):
    out = []
    w = torch.randn(C, K, device=DEV, dtype=torch.bfloat16)
    for B, L, na in [(1, T, True), (8, T, True), (64, T, True), (1, 4096, False)]:
        x = torch.randn(B, L, C, device=DEV, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        state_shape = (B, C, K - 1 + KD)
        slots = torch.arange(B, dtype=torch.int32, device=DEV)
        num_acc = torch.randint(1, T + 1, (B,), dtype=torch.int32, device=DEV) if na else None
        const_bytes = (B * C * (K - 1 + KD) + w.numel()) * 2                # conv state and weights: from HBM
        nbytes = 2 * x.numel() * 2 + 2 * B * C * (K - 1 + KD) * 2 + w.numel() * 2
        consts = Rotation(lambda: (w.clone(), torch.randn(state_shape, device=DEV, dtype=torch.bfloat16)), const_bytes)
        timed_row("conv1d_update" if na else "conv1d_prefill", f"B{B} L{L} C{C}",
                  lambda: (lambda wc, st: causal_conv1d(x, wc, st, slots, num_acc, out=y))(*consts()), nbytes,
                  2 * B * L * C * K, peak, out, reps=consts.reps)
    return out


def prefill_rows(peak, sweep, L=4096):
    q, k, v, a, b, A_log, dt_bias = layer_inputs(1, L)
    pool = state_pool(2, HV, D, D, torch.float32, DEV)
    init, final = torch.tensor([0], dtype=torch.int32, device=DEV), torch.tensor([1], dtype=torch.int32, device=DEV)
    o = torch.empty(1, L, HV, D, device=DEV, dtype=torch.bfloat16)
    ws = prefill_workspace(1, L, HV, D, D, DEV)
    cfg = chunked.config(q, v)
    nbytes = L * (C + 2 * HV) * 2 + o.numel() * 2 + 2 * pool[0].numel() * 4
    ch = 64
    flops = 2 * (L // ch) * HV * (3 * ch * D * D + 3 * ch * ch * D + 2 * ch * ch * D + ch ** 3)
    shape = f"B1 L{L} state fp32"
    out = []
    timed_row("gdn_prefill.prepare", shape, lambda: chunked.chunk_prepare(k, v, a, b, A_log, dt_bias, ws, cfg),
              nbytes, flops, peak, out, reps=5, trials=3)
    timed_row("gdn_prefill.states", shape,
              lambda: chunked.chunk_states(q, k, a, b, A_log, dt_bias, pool, init, final, o, ws, cfg), nbytes, flops,
              peak, out, reps=5, trials=3)
    configs = [("", cfg)] + ([(f"[bv{f['block_v']},w{f['prepare_warps']}/{f['state_warps']}]", replace(cfg, **f))
                              for f in chunked.SWEEP] if sweep else [])
    for tag, c in configs:
        timed_row("gdn_prefill" + tag, shape, lambda: gdn_prefill(q, k, v, a, b, A_log, dt_bias, pool, init, final,
                                                                  out=o, workspace=ws, cfg=c),
                  nbytes, flops, peak, out, reps=5, trials=3)
    return out


def run(peak_Bps):
    return verify_rows(peak_Bps, False) + conv_rows(peak_Bps) + prefill_rows(peak_Bps, False)


def sweep(peak_Bps):
    rows = verify_rows(peak_Bps, True) + prefill_rows(peak_Bps, True)
    print(f"\n{'kernel':34s} {'shape':22s} {'us':>8s} {'roofline':>8s} {'frac':>6s}")
    for r in rows:
        print(f"{r['kernel']:34s} {r['shape']:22s} " + (f"{r['us']:8.2f} {r['roofline_us']:8.2f} {r['frac_peak']:6.3f}"
                                                       if "us" in r else r["error"]))
    return rows


if __name__ == "__main__":
    suite_main(run, sweep, __doc__)
