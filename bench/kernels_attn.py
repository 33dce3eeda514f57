"""Attention kernels at the 27B shapes (Hq 24, Hkv 4, D 256): split-KV verify (q_len 5) over fp8 / bf16 KV for
B ∈ {1, 8, 64} × ctx {1.5k, 16k, 64k} (on sm_90 with V keys-fastest the Gluon kernel, and the Triton one beside
it), torch SDPA as the peer at B = 1, the KV writer and prefill.
Bytes counted: the KV the attention must read (all kv_lens × Hkv × D × 2 tensors) plus q and out; partials and
the combine are overhead. Beside each fp8 case, `read floor`: a launch that only reads as many bytes (KV, q and
out; bench/floors.py: no kernel that reads them after its PDL wait beats it in this harness). The caches, and
the torch SDPA peer's expanded ones, rotate through copies that L2 cannot hold, every copy in the timed graph
(bench.harness.Rotation); q and out stay (the step's own activations); the KV writer and prefill do not
rotate. `python -m bench.kernels_attn --sweep` times launch configurations instead (tiles, warps, segments)."""
import itertools
from dataclasses import replace

import torch
import torch.nn.functional as F

from bench.floors import read_floor_us
from bench.harness import Rotation, measure_bandwidth, suite_main, time_us
from kernels.attention import (KV_BF16, KV_FP8_BITS, KV_FP8_NATIVE, alloc_partials, choose_nseg, kv_format, prefill,
                               prefill_attention, verify, verify_attention, verify_config, verify_gluon, write_kv)
from kernels.attention.config import LAUNCH_CONFIGS, PREFILL_CONFIGS
from kernels.attention.kv_write import v_transposed
from layers.config import qwen38_27b
from tools.targets import ATTENTION_FLOOR, row

_27B = qwen38_27b()
HQ, HKV, D, Q_LEN = _27B.num_attention_heads, _27B.num_key_value_heads, _27B.head_dim, 5
BATCHES, CONTEXTS = (1, 8, 64), (1536, 16384, 65536)
DEV = "cuda"
FMT_NAME = {KV_BF16: "bf16", KV_FP8_BITS: "fp8-bits", KV_FP8_NATIVE: "fp8-native"}


def make_case(B, ctx, fp8, v_keys_fastest=False):
    """Caches with B full slots of ctx tokens (e4m3 codes without NaN: bit 6 cleared, |x| < 2), inputs, outputs.
    v_keys_fastest: V stored as kernels.attention.kv_cache allocates it (else D-fastest like K)."""
    shape = (B, HKV, ctx, D)
    v_shape = (B, HKV, D, ctx) if v_keys_fastest else shape
    if fp8:
        kc = torch.randint(0, 256, shape, dtype=torch.uint8, device=DEV) & 0xBF
        vc = torch.randint(0, 256, v_shape, dtype=torch.uint8, device=DEV) & 0xBF
    else:
        kc = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
        vc = torch.randn(v_shape, device=DEV, dtype=torch.bfloat16)
    vc = vc.transpose(2, 3) if v_keys_fastest else vc
    scales = torch.full((HKV,), 0.05, device=DEV)
    rows = torch.arange(B, dtype=torch.int32, device=DEV)
    lens = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
    q = torch.randn(B, Q_LEN, HQ, D, device=DEV, dtype=torch.bfloat16)
    return q, kc, vc, scales, scales, rows, lens


def verify_bytes(B, ctx, elem):
    return B * ctx * HKV * D * 2 * elem + 2 * B * Q_LEN * HQ * D * 2


def time_verify(case, nseg, partials, cfg=None):
    """µs of a verify step's attention: the caches rotate through enough copies that they cannot sit in L2 (in a
    model step the layers between two attention layers evict them), and the 5 new keys are the step's own (`fresh`:
    the rest may be read before the previous kernel completes)."""
    q, kc, vc, ks, vs, rows, lens = case
    out = torch.empty_like(q)
    nbytes = 2 * kc.numel() * kc.element_size()
    caches = Rotation(lambda: (kc.clone(), vc.clone()), nbytes)

    def call():
        k, v = caches()
        verify_attention(q, k, v, ks, vs, rows, lens, out, partials, nseg, fresh=Q_LEN, cfg=cfg)
    return time_us(call, reps=caches.reps)


def verify_rows(peak, sms):
    rows_out = []
    partials = alloc_partials(max(BATCHES), HQ, 8, 64, D, DEV)
    floor = make_case(1, 64, fp8=True)  # one tile: the fixed cost of the two launches
    rows_out.append(row("attn_verify[floor]", "B1 ctx64 q5", time_verify(floor, 32, partials), verify_bytes(1, 64, 1),
                        0, peak, nseg=32))
    for B, ctx in itertools.product(BATCHES, CONTEXTS):
        nseg = choose_nseg(B, HKV, sms)
        nbytes = verify_bytes(B, ctx, 1)                        # the bytes the kernel's rows are counted with
        rows_out.append(row(ATTENTION_FLOOR, f"B{B} ctx{ctx} q{Q_LEN}", read_floor_us(nbytes), nbytes, 0,
                            peak))
        case = make_case(B, ctx, fp8=True)
        us = time_verify(case, nseg, partials)                  # V stored like K (D fastest)
        rows_out.append(row(f"attn_verify[{FMT_NAME[kv_format(case[1])]}]", f"B{B} ctx{ctx} q{Q_LEN}", us,
                            verify_bytes(B, ctx, 1), 4 * B * Q_LEN * HQ * ctx * D, peak, nseg=nseg))
        # V stored keys-fastest, as kernels.attention.kv_cache allocates it: the GPU's own e4m3 conversion where it
        # has one, and the integer decode that sm_86 takes
        case = case[:2] + (v_transposed(case[2]),) + case[3:]
        # (on sm_90 the native conversion's launch is the Gluon kernel, kernels/attention/verify_gluon.py: the
        # Triton kernel beside it)
        own = kv_format(case[1])
        for fmt, gluon in dict.fromkeys(((own, None), (own, False), (KV_FP8_BITS, None))):
            if gluon is False and not verify_gluon.supports(case[0], case[1], case[2], fmt):
                continue
            cfg = verify.config(case[0], case[1], fmt) if gluon is False else \
                verify_config(case[0], case[1], case[2], fmt)
            us = time_verify(case, nseg, partials, cfg)
            name = f"{FMT_NAME[fmt]}, V keys-fastest" + (", triton" if gluon is False else "")
            rows_out.append(row(f"attn_verify[{name}]", f"B{B} ctx{ctx} q{Q_LEN}", us,
                                verify_bytes(B, ctx, 1), 4 * B * Q_LEN * HQ * ctx * D, peak, nseg=nseg))
        del case
        if B == 1:
            case = make_case(B, ctx, fp8=False)
            us = time_verify(case, nseg, partials)
            rows_out.append(row("attn_verify[bf16]", f"B1 ctx{ctx} q{Q_LEN}", us, verify_bytes(1, ctx, 2),
                                4 * Q_LEN * HQ * ctx * D, peak, nseg=nseg))
            rows_out.append(sdpa_row(case, ctx, peak))
            del case
        torch.cuda.empty_cache()
    return rows_out


def sdpa_row(case, ctx, peak):
    """Peer: torch SDPA on bf16 KV expanded to the 24 q heads (its fused kernels take no GQA), causal mask for
    the last 5 positions; bytes counted as for our bf16 kernel, so frac_peak compares the same work."""
    q, kc, vc = case[0], case[1][:1], case[2][:1]
    k, v = kc.repeat_interleave(HQ // HKV, 1), vc.repeat_interleave(HQ // HKV, 1)  # [1, Hq, ctx, D]
    qt = q.transpose(1, 2)  # [1, Hq, 5, D]
    mask = torch.arange(ctx, device=DEV)[None, :] <= (ctx - Q_LEN + torch.arange(Q_LEN, device=DEV))[:, None]
    nbytes = 2 * k.numel() * k.element_size()
    caches = Rotation(lambda: (k.clone(), v.clone()), nbytes)          # out of L2, as ours

    def call():
        kx, vx = caches()
        return F.scaled_dot_product_attention(qt, kx, vx, attn_mask=mask)
    try:
        us = time_us(call, reps=caches.reps)
    except RuntimeError as e:  # a backend refusing graph capture must not sink the whole suite
        print("sdpa failed:", e)
        us = float("nan")
    return row("torch_sdpa[bf16, kv expanded]", f"B1 ctx{ctx} q{Q_LEN}", us, verify_bytes(1, ctx, 2),
               4 * Q_LEN * HQ * ctx * D, peak)


def sweep_rows(peak):
    """Launch configurations (kernels/attention/config.py, which the GPU tests check): verify at B 1 by
    format × (BLOCK_N, warps, stages) × segments, segments at B 8 / 64, prefill tiles; V stored keys-fastest."""
    rows_out = []
    partials = alloc_partials(64, HQ, 8, 64, D, DEV)
    configs = [(KV_FP8_NATIVE, *c) for c in LAUNCH_CONFIGS] + [(KV_FP8_BITS, *c) for c in LAUNCH_CONFIGS[1:4:2]]
    for ctx in (1536, 16384, 65536):
        case = make_case(1, ctx, fp8=True, v_keys_fastest=True)
        for (fmt, bn, nw, ns), nseg in itertools.product(configs, (16, 32, 64)):
            shape = f"B1 ctx{ctx} bn{bn} w{nw} s{ns} nseg{nseg}"
            try:
                cfg = replace(verify.config(case[0], case[1], fmt), block_n=bn, num_warps=nw, num_stages=ns)
                us = time_verify(case, nseg, partials, cfg)
            except Exception as e:  # noqa: BLE001 - a config that does not compile here (shared memory) is a row
                rows_out.append({"kernel": f"sweep[{FMT_NAME[fmt]}]", "shape": shape, "error": str(e)[:120]})
                continue
            rows_out.append(row(f"sweep[{FMT_NAME[fmt]}]", shape, us, verify_bytes(1, ctx, 1), 0, peak))
    for B, nsegs in ((8, (4, 8, 16)), (64, (1, 2, 4))):
        case = make_case(B, 16384, fp8=True, v_keys_fastest=True)
        for nseg in nsegs:
            us = time_verify(case, nseg, partials)
            rows_out.append(row("sweep[default fmt]", f"B{B} ctx16384 nseg{nseg}", us, verify_bytes(B, 16384, 1),
                                0, peak))
        del case
    for fp8, (bm, bn, nw, ns) in itertools.product((True, False), PREFILL_CONFIGS):
        us, nbytes, flops = time_prefill(2048, fp8, v_keys_fastest=True, launch=dict(block_m=bm, block_n=bn,
                                                                                    num_warps=nw, num_stages=ns))
        rows_out.append(row(f"sweep[prefill {'fp8' if fp8 else 'bf16'}]", f"T2048 bm{bm} bn{bn} w{nw} s{ns}", us,
                            nbytes, flops, peak, TFLOPs=round(flops / us / 1e6, 1)))
    return rows_out


def time_prefill(T, fp8, v_keys_fastest=False, launch=None):
    """(µs, bytes, FLOPs) of a T-token prefill from an empty cache (KV already written); launch: Config fields to
    set."""
    _, kc, vc, ks, vs, rows, lens = make_case(1, T, fp8, v_keys_fastest)
    q = torch.randn(1, T, HQ, D, device=DEV, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    cfg = replace(prefill.config(q, kc), **(launch or {}))
    us = time_us(lambda: prefill_attention(q, kc, vc, ks, vs, rows, lens, out, cfg=cfg))
    return us, T * HKV * D * 2 * (1 if fp8 else 2) + 2 * T * HQ * D * 2, 4 * HQ * D * T * (T + 1) / 2


def write_and_prefill_rows(peak):
    rows_out = []
    B, n_new = 64, Q_LEN
    k = torch.randn(B, n_new, HKV, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for vt in (False, True):
        _, kc, vc, ks, vs, rows, lens = make_case(B, 2048, fp8=True, v_keys_fastest=vt)
        us = time_us(lambda: write_kv(k, v, kc, vc, ks, vs, rows, lens))
        rows_out.append(row("kv_write[fp8" + (", V keys-fastest]" if vt else "]"), f"B{B} n{n_new}", us,
                            B * n_new * HKV * D * (2 * 2 + 2), 0, peak))
    for fp8, vt in ((True, False), (True, True), (False, False)):
        us, nbytes, flops = time_prefill(2048, fp8, v_keys_fastest=vt)
        rows_out.append(row(f"attn_prefill[{'fp8' if fp8 else 'bf16'}" + (", V keys-fastest]" if vt else "]"),
                            "B1 T2048 from 0", us, nbytes, flops, peak, TFLOPs=round(flops / us / 1e6, 1)))
    return rows_out


def with_read_fraction(rows_out):
    """These kernels only read (KV) in bulk: also give the fraction of the measured read bandwidth."""
    read_Bps = measure_bandwidth()["read_Bps"]
    for r in (r for r in rows_out if "us" in r):
        r["frac_read"] = round(r["bytes"] / (r["us"] * 1e-6) / read_Bps, 3)
    return rows_out


def run(peak_Bps):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return with_read_fraction(verify_rows(peak_Bps, sms) + write_and_prefill_rows(peak_Bps))


def sweep(peak_Bps):
    rows_out = with_read_fraction(sweep_rows(peak_Bps))
    for r in rows_out:
        print(f"{r['kernel']:24s} {r['shape']:34s} " + (f"{r['us']:9.2f} us  {r['frac_peak']:.3f}" if "us" in r
                                                      else r["error"]))
    return rows_out


if __name__ == "__main__":
    suite_main(run, sweep, __doc__)

