"""Sort-free, graph-capturable sampling: temperature, top-k, top-p (a tie group kept or dropped whole) and exact
speculative rejection sampling (ENGINE.md §2, §3, §6); reference engine/sampling.py. A token is the argmax over
the support of (x − M) − log E_v, E_v ~ Exp(1) from Philox(seed; v, row, offset, stream); seed, offset: int64 [1]
device tensors. desc [4] = (1/T, M, tau, Zs): p(v) = exp(x_v − M) / Zs for x_v >= tau, else 0 (1/T == 0: greedy),
x = logit · 1/T, +inf saturated at FLT_MAX, NaN as −inf. Padding rows should be greedy (equal logits under top-k
and top-p take the slow exact path). H200: one row (top-k 20, top-p .95) 18 µs; five rows + rejection 35 µs."""
import torch

from kernels import device as gpu
from kernels.sampler import passes, rejection
from kernels.sampler.common import Config, SamplingTensors, config
from kernels.sampler.passes import SamplerWorkspace
from kernels.sampler.rejection import RejectionWorkspace, target_to_draft

__all__ = ["sample", "sample_drafts", "rejection_sample", "target_to_draft", "SamplingTensors", "Config", "config",
           "SamplerWorkspace", "RejectionWorkspace"]


def sample(logits, params: SamplingTensors, seed, offset, ws: SamplerWorkspace = None, *, rows_per_param=1,
           d2t=None, advance=True, out=None, cfg: Config = None):
    """logits [R, V] -> (ids [R] int32, desc [R, 4] fp32); row r takes params[r // rows_per_param]; offset += 1
    when `advance`. d2t: ids mapped to target ids (desc stays in draft space). Graph-safe with `ws` (returns views
    of it). out: (ids [R], desc [R, 4]) to write instead, any row strides. cfg: None = ws's."""
    R, V = logits.shape
    assert logits.stride(1) == 1
    gpu.check_dense("sample", temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, d2t=d2t)
    ws = ws or SamplerWorkspace(R, V, logits.device, cfg)
    cfg = cfg or ws.cfg
    assert R <= ws.rows and V == ws.vocab and cfg == ws.cfg
    ids, desc = out or (ws.ids[:R], ws.desc[:R])
    assert ids.shape == (R,) and ids.dtype == torch.int32 and desc.shape == (R, 4) and desc.stride(1) == 1
    assert desc.dtype == torch.float32
    passes.launch(logits, params, seed, offset, ws, ids, desc, rows_per_param, d2t, advance, cfg)
    return ids, desc


def sample_drafts(draft_logits, params: SamplingTensors, seed, offset, ws: SamplerWorkspace = None, d2t=None,
                  out=None, cfg: Config = None):
    """`sample` of a draft step: (target-space ids [R], q descriptors [R, 4]), kept as [B, k, 4] for
    rejection_sample (out: write them there)."""
    return sample(draft_logits, params, seed, offset, ws, d2t=d2t, out=out, cfg=cfg)


def rejection_sample(target_logits, draft_logits, draft_ids, params: SamplingTensors, seed, offset,
                     ws: RejectionWorkspace = None, draft_desc=None, t2d=None, *, cfg: Config = None):
    """target_logits [B, k+1, V], draft_logits [B, k, Vd], draft_ids [B, k] (target ids), params per sequence,
    draft_desc [B, k, 4] (None: recomputed), t2d from target_to_draft -> (out_ids [B, k+1] int32: accepted drafts,
    the correction or bonus, then −1; num_emitted [B] int32 = accepted + 1). offset += 1."""
    B, K1, V = target_logits.shape
    K, Vd = K1 - 1, draft_logits.shape[-1]
    assert draft_logits.stride(-1) == 1, "rejection_sample: draft_logits with a unit last stride"
    gpu.check_dense("rejection_sample", draft_ids=draft_ids, draft_desc=draft_desc, t2d=t2d)
    ws = ws or RejectionWorkspace(B, K, V, Vd, target_logits.device, cfg)
    cfg = cfg or ws.target.cfg
    assert cfg == ws.target.cfg
    t_rows, d_rows = target_logits.view(B * K1, V), draft_logits.view(B * K, Vd)
    t_ids, t_desc = sample(t_rows, params, seed, offset, ws.target, rows_per_param=K1, advance=False)
    if draft_desc is None:
        draft_desc = sample(d_rows, params, seed, offset, ws.draft, rows_per_param=K, advance=False)[1]
    rejection.launch(t_rows, d_rows, B, K, draft_ids, params, seed, offset, ws, t_ids, t_desc,
                     draft_desc.view(B * K, 4), t2d, cfg)
    return ws.out[:B], ws.num_emitted[:B]
