"""Sampler at the 27B model's vocabulary, bf16 logits shaped like an LM's (a Gaussian bulk plus a few dozen strong
tokens): sample() per parameter set and row count; one verify step, "5 rows + rejection" (B1 k4: sampling the
target's B·(k+1) rows and the accept/residual/bonus pass, i.e. everything rejection_sample launches, with the draft
descriptors from sample_drafts) and the same with the descriptors recomputed and for B8; the torch peers (topk +
softmax + multinomial; full-sort top-p). Bytes counted: one read of the logits the call consumes (every row pass
after the first hits L2). The logits are one buffer for every timed call (not rotated: in a step the lm_head has
just written them), bf16 as bench/step.py's lm_head writes them; the draft logits span the full vocabulary.
`--sweep` prints a compact table: the main rows, launch-configuration variants and a per-kernel breakdown (torch
profiler)."""
import dataclasses

import torch

from bench.harness import suite_main, time_us
from kernels.sampler import (RejectionWorkspace, SamplerWorkspace, SamplingTensors, config, rejection_sample, sample,
                             sample_drafts)
from layers.config import qwen38_27b
from tools.targets import row

V, DEV, K = qwen38_27b().vocab_size, "cuda", 4
QWEN = (1.0, 20, 0.95)                                     # generation_config default
CASES = [("qwen T1 k20 p.95", 1, QWEN), ("top-p .9 only T.7", 1, (0.7, 0, 0.9)), ("top-k 1024", 1, (1.0, 1024, 1.0)),
         ("untruncated T1", 1, (1.0, 0, 1.0)), ("greedy", 1, (0.0, 0, 1.0)), ("qwen T1 k20 p.95", 5, QWEN),
         ("qwen T1 k20 p.95", 64, QWEN), ("top-p .95 only T1.5 (wide)", 1, (1.5, 0, 0.95))]


def llm_logits(R, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(R, V, device=DEV, generator=g) * 2.0
    top = torch.randint(0, V, (R, 64), device=DEV, generator=g)
    x.scatter_add_(1, top, torch.rand(R, 64, device=DEV, generator=g) * 12)
    return x.to(torch.bfloat16)


def rng():
    return torch.tensor([1], dtype=torch.int64, device=DEV), torch.tensor([0], dtype=torch.int64, device=DEV)


def params_for(R, t, k, p):
    return SamplingTensors.of([t] * R, [k] * R, [p] * R, DEV)


def sample_step(R, tkp, cfg=None):
    """A timed callable: sample() of R rows."""
    logits, params, (seed, off) = llm_logits(R), params_for(R, *tkp), rng()
    ws = SamplerWorkspace(R, V, DEV, cfg)
    return lambda: sample(logits, params, seed, off, ws)


def sample_case(name, R, tkp, peak, cfg=None, label="sample"):
    return row(f"{label} {name}", f"{R}x{V}", time_us(sample_step(R, tkp, cfg)), R * V * 2, 0, peak)


def verify_step(B, with_q, cfg=None):
    """A timed callable: one verify step of B sequences with K drafts (rejection_sample on given drafts)."""
    target, draft = llm_logits(B * (K + 1), 1).view(B, K + 1, V), llm_logits(B * K, 2).view(B, K, V)
    params, (seed, off) = params_for(B, *QWEN), rng()
    dws = SamplerWorkspace(B, V, DEV, cfg)
    steps = [sample_drafts(draft[:, i].contiguous(), params, seed, off, dws) for i in range(K)]
    ids = torch.stack([s[0].clone() for s in steps], 1)
    desc = torch.stack([s[1].clone() for s in steps], 1)
    ws = RejectionWorkspace(B, K, V, V, DEV, cfg)
    return lambda: rejection_sample(target, draft, ids, params, seed, off, ws, desc if with_q else None)


def rejection_case(B, with_q, peak, cfg=None, label=""):
    us = time_us(verify_step(B, with_q, cfg))
    name = f"{label}{B * (K + 1)} rows + rejection" + ("" if with_q else " (q recomputed)")
    return row(name, f"B{B} k{K} V{V}", us, B * (2 * K + 1) * V * 2, 0, peak, rows_sampled=B * (K + 1))


def time_any(fn):
    """time_us (CUDA graph); eager back-to-back calls timed by events when fn cannot be captured."""
    try:
        return time_us(fn), "graph"
    except RuntimeError:
        torch.cuda.synchronize()
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / 50, "eager"


def peers(peak):
    """torch: top-20 then softmax, top-p within the 20, multinomial; and the full-sort top-p sampler."""
    logits = llm_logits(1)
    t, k, p = QWEN

    def topk_path():
        vals, idx = logits.float().topk(k)
        probs = torch.softmax(vals / t, -1)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= p, 0.0)
        return idx.gather(-1, torch.multinomial(probs, 1))

    def sort_path():
        vals, idx = logits.float().sort(-1, descending=True)
        probs = torch.softmax(vals / t, -1)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= p, 0.0)
        return idx.gather(-1, torch.multinomial(probs, 1))

    out = []
    for name, fn in [("peer torch.topk(20)+softmax+top-p+multinomial", topk_path),
                     ("peer full sort+softmax+cumsum top-p+multinomial", sort_path),
                     ("peer torch.softmax (one row)", lambda: torch.softmax(logits.float(), -1))]:
        us, how = time_any(fn)
        out.append(row(name, f"1x{V}", us, V * 2, 0, peak, timing=how))
    return out


def main_rows(peak_Bps):
    rows = [sample_case(name, R, tkp, peak_Bps) for name, R, tkp in CASES]
    return rows + [rejection_case(1, True, peak_Bps), rejection_case(1, False, peak_Bps),
                   rejection_case(8, True, peak_Bps)]


def run(peak_Bps):
    return main_rows(peak_Bps) + peers(peak_Bps)   # peers last: one that cannot be captured must not disturb others


def show(r):
    print(f"{r['kernel']:58s} {r['shape']:20s} {r['us']:9.2f} us", flush=True)


def same_results(cfg):
    """ids and descriptors of `cfg` equal the default configuration's (same seed and offset)."""
    t, k, p = zip(*(tkp for _, _, tkp in CASES))
    logits, params = llm_logits(len(t)), SamplingTensors.of(list(t), list(k), list(p), DEV)
    out = []
    for c in (None, cfg):
        seed, off = rng()
        ids, desc = sample(logits, params, seed, off, SamplerWorkspace(len(t), V, DEV, c))
        out.append((ids.clone(), desc.clone(), off.item()))
    return torch.equal(out[0][0], out[1][0]) and torch.allclose(out[0][1], out[1][1], rtol=1e-5) and out[1][2] == 1


def sweep(peak):
    """Main rows, where the time goes (per-kernel device time, torch profiler), then variants of the launch
    configuration on the rows the targets name."""
    rows = []
    for r in main_rows(peak):
        show(r)
        rows.append(r)
    for what, fn in [("1 row", sample_step(1, QWEN)), ("5 rows + rejection", verify_step(1, True))]:
        fn()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
        for ev in prof.key_averages():
            if ev.key.endswith("_kernel") and ev.count >= 50:
                rows.append(row(f"stage ({what}) {ev.key} x{ev.count // 50}", f"1x{V}",
                                ev.device_time_total / ev.count, 0, 0, peak))
                show(rows[-1])
    for change in VARIANTS:
        cfg = dataclasses.replace(config(1, V, DEV), **change)
        tag = "[" + ",".join(f"{k}={v}" for k, v in change.items()) + "] "
        try:
            same = same_results(cfg)
            for name, R, tkp in (CASES[0], CASES[5], CASES[7]):
                rows.append(sample_case(name, R, tkp, peak, cfg, label=tag + "sample"))
                show(rows[-1])
            rows.append(rejection_case(1, True, peak, cfg, label=tag))
            show(rows[-1])
            print(f"{tag}results equal the default's: {same}", flush=True)
        except Exception as e:   # e.g. a configuration that does not build
            print(f"{tag}failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return rows


VARIANTS = [dict(block=2048), dict(pivots=16), dict(levels=2)]


if __name__ == "__main__":
    suite_main(run, sweep, __doc__)
