"""The kernel wrappers reject tensor views their kernels would misread: per-sequence vectors given as a column of a
table (slots, lengths, accepted counts, draft ids, sampling parameters) and caller-given outputs that are not
dense rows — each was read or written at the wrong elements, silently, before the wrappers checked them. The
error names the argument. (Each check runs before any launch: nothing here executes a kernel.)"""
import pytest
import torch

from kernels.attention import verify_attention, write_kv
from kernels.gdn import causal_conv1d, gdn_prefill, gdn_verify
from kernels.norms import add_rmsnorm, gated_rmsnorm, qk_norm_rope, silu_mul
from kernels.sampler import SamplingTensors, rejection_sample, sample

B, T, C = 2, 3, 16


def column(values, dtype=torch.int32):
    """values as column 0 of a [len, 2] table: the right numbers at a stride of 2."""
    return torch.tensor([[v, -7] for v in values], dtype=dtype)[:, 0]


def wide(*shape):
    """A [..., n] view of a [..., 2n] buffer: rows at twice their width apart."""
    return torch.zeros(*shape[:-1], 2 * shape[-1])[..., :shape[-1]]


def gdn_args(L):
    q, k = torch.randn(B, L, 1, C), torch.randn(B, L, 1, C)
    return q, k, torch.randn(B, L, 2, C), torch.randn(B, L, 2), torch.randn(B, L, 2), torch.rand(2), torch.randn(2)


def attention_args():
    """q [B, 1, 2 heads, C] and bf16 caches of 4 slots (no scales)."""
    caches = torch.zeros(4, 1, 32, C, dtype=torch.bfloat16), torch.zeros(4, 1, 32, C, dtype=torch.bfloat16)
    return torch.randn(B, 1, 2, C, dtype=torch.bfloat16), *caches, None, None


CASES = {
    "add_rmsnorm x": (lambda: add_rmsnorm(wide(T, C), torch.randn(T, C), torch.randn(C), 1e-6), "x must be"),
    "add_rmsnorm y": (lambda: add_rmsnorm(torch.randn(T, C), torch.randn(T, C), torch.randn(C), 1e-6,
                                          y=wide(T, C)), "y must be"),
    "gated_rmsnorm y": (lambda: gated_rmsnorm(torch.randn(T, 2, C), torch.randn(T, 2, C), torch.randn(C), 1e-6,
                                              y=wide(T, 2 * C).view(T, 2, C)), "y must be"),
    "qk_norm_rope q": (lambda: qk_norm_rope(torch.randn(T, 4 * C), torch.randn(T, C), torch.randn(C),
                                            torch.randn(C), torch.randn(T, 4), torch.randn(T, 4), 2, 1, 1e-6,
                                            q=wide(T, 2 * C).view(T, 2, C)), "q must be"),
    "silu_mul y": (lambda: silu_mul(torch.randn(T, C), torch.randn(T, C), y=wide(T, C)), "y must be"),
    "causal_conv1d conv_slots": (lambda: causal_conv1d(torch.randn(B, T, C), torch.randn(C, 4),
                                                       torch.zeros(4, C, 5), column([1, 3])), "conv_slots must be"),
    "causal_conv1d num_accepted": (lambda: causal_conv1d(torch.randn(B, T, C), torch.randn(C, 4),
                                                         torch.zeros(4, C, 5), torch.tensor([1, 3], dtype=torch.int32),
                                                         column([2, 1])), "num_accepted must be"),
    "causal_conv1d out": (lambda: causal_conv1d(torch.randn(B, T, C), torch.randn(C, 4), torch.zeros(4, C, 5),
                                                torch.tensor([1, 3], dtype=torch.int32),
                                                out=torch.zeros(B, T, 2 * C)[..., ::2]), "unit channel stride"),
    "gdn_verify num_accepted": (lambda: gdn_verify(*gdn_args(T), torch.zeros(B * T, 2, C, C),
                                                   torch.arange(B * T, dtype=torch.int32).view(B, T), column([1, 3])),
                                "num_accepted must be"),
    "gdn_verify out": (lambda: gdn_verify(*gdn_args(T), torch.zeros(B * T, 2, C, C),
                                          torch.arange(B * T, dtype=torch.int32).view(B, T),
                                          torch.tensor([1, 3], dtype=torch.int32),
                                          out=torch.zeros(B, T, 2, 2 * C)[..., ::2]), "unit last stride"),
    "gdn_prefill slots": (lambda: gdn_prefill(*gdn_args(T), torch.zeros(4, 2, C, C), column([0, 1]),
                                              torch.tensor([2, 3], dtype=torch.int32)),
                          "initial_slots must be"),
    "verify_attention cache_rows": (lambda: verify_attention(*attention_args(), column([0, 2]),
                                                             torch.tensor([5, 9], dtype=torch.int32),
                                                             torch.zeros(B, 1, 2, C, dtype=torch.bfloat16), None, 1),
                                    "cache_rows must be"),
    "write_kv kv_lens": (lambda: write_kv(torch.randn(B, 1, 1, C, dtype=torch.bfloat16),
                                          torch.randn(B, 1, 1, C, dtype=torch.bfloat16),
                                          *attention_args()[1:], torch.tensor([0, 2], dtype=torch.int32),
                                          column([5, 9])), "kv_lens must be"),
    "sample temperature": (lambda: sample(torch.randn(B, 64), SamplingTensors(
        column([1.0, 0.5], torch.float32), torch.zeros(B, dtype=torch.int32), torch.ones(B)),
        torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)), "temperature must be"),
    "rejection_sample draft_ids": (lambda: rejection_sample(
        torch.randn(B, 3, 64), torch.randn(B, 2, 64), torch.zeros(B, 3, dtype=torch.int32)[:, 1:],
        SamplingTensors.of([1.0] * B, [0] * B, [1.0] * B, "cpu"), torch.zeros(1, dtype=torch.int64),
        torch.zeros(1, dtype=torch.int64)),
        "draft_ids must be"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_view_rejected_by_name(case):
    call, message = CASES[case]
    with pytest.raises(AssertionError, match=message):
        call()
