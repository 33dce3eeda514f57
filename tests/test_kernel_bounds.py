"""Per-step device inputs the wrappers cannot inspect (a captured graph replays whatever the buffers hold) never
make a kernel read or write outside its tensors, whatever they hold: lengths short of the new tokens or past the
cache, slot ids past the cache or state pool, token ids outside the vocabulary, accepted counts at the int32
extremes, NaN logits. Each case frames the real tensor with poisoned neighbours, or compares against the same call
on the nearest valid input."""
from dataclasses import replace

import pytest
import torch

from kernels.attention import alloc_partials, prefill_attention, verify, verify_attention, write_kv
from kernels.gdn import causal_conv1d, chunked, gdn_prefill, gdn_verify, recurrent
from kernels.int8 import int8_embedding
from kernels.norms import qk_norm_rope
from kernels.sampler import RejectionWorkspace, SamplingTensors, rejection_sample, sample
from layers.quant import quantize_int8_rows

NAN = float("nan")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def on_the_kernels_device():
    """Every tensor a case makes lives where the kernels run: compiled on a CUDA machine (`pytest` there runs these
    too; CPU tensors would reach the compiled kernels), the interpreter here."""
    with torch.device(DEV):
        yield


HKV, D, ML = 2, 16, 32                  # kv heads, head dim, cache positions per slot
NS = 3                                  # slots of a framed cache or pool
PAST = pytest.mark.parametrize("past", [NS, 2**30], ids=["slot == slots", "slot 2^30"])


def framed(*shape, slots=NS, dtype=torch.float32, poison=NAN):
    """(buffer, pool): a random pool [slots, *shape] as a view inside a buffer with a slot of poison (NaN) before
    and after it."""
    big = torch.full((slots + 2, *shape), poison, dtype=dtype)
    big[1:-1] = torch.randn(slots, *shape).to(dtype)
    return big, big[1:-1]


def framed_caches(slots=NS, poison=NAN):
    """k, v caches [slots, HKV, ML, D] bf16 as views inside buffers with a poisoned (NaN) slot before and after."""
    (kb, kc), (vb, vc) = (framed(HKV, ML, D, slots=slots, dtype=torch.bfloat16, poison=poison) for _ in range(2))
    return [kb, vb], kc, vc


def assert_past_is_padding(run, ids, past):
    """run(slot ids) -> outputs and framed buffers, its inputs drawn afresh from torch's generator: with each -1 of
    ids (a padding row) replaced by `past` (a slot past the pool) they come out bit for bit as with -1, the
    poisoned slots around the pool included."""
    results = []
    for i in (ids, torch.where(ids < 0, past, ids)):
        torch.manual_seed(0)
        results.append(run(i))
    for want, got in zip(*results):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))      # bitwise: NaN poison included


@pytest.mark.parametrize("slot, length", [(0, 1), (2, ML + 2)], ids=["short of the new tokens", "past the cache"])
def test_kv_write_stays_in_its_slot(slot, length):
    big, kc, vc = framed_caches()
    before = [b.clone() for b in big]
    new = torch.ones(1, 3, HKV, D, dtype=torch.bfloat16)
    write_kv(new, new, kc, vc, None, None, torch.tensor([slot], dtype=torch.int32),
             torch.tensor([length], dtype=torch.int32))
    for b, b0 in zip(big, before):
        assert b[0].isnan().all() and b[-1].isnan().all(), "wrote outside the cache"
        others = [s for s in range(1, b.shape[0] - 1) if s != slot + 1]
        assert torch.equal(b[others], b0[others]), "wrote into another slot"
        inside = [p for p in range(length - 3, length) if 0 <= p < ML]
        assert (b[slot + 1, :, inside] == 1).all()


@pytest.mark.parametrize("nseg", [1, 3])
def test_attention_length_past_cache_reads_its_slot_only(nseg):
    big, kc, vc = framed_caches(slots=1)
    q = torch.randn(1, 2, 4, D).bfloat16()
    rows = torch.tensor([0], dtype=torch.int32)
    parts = alloc_partials(1, 4, 2, 3, D, DEV)
    want, got = torch.empty_like(q), torch.empty_like(q)
    cfg = replace(verify.config(q, kc), block_n=16)
    verify_attention(q, kc, vc, None, None, rows, torch.tensor([ML], dtype=torch.int32), want, parts, nseg, cfg=cfg)
    verify_attention(q, kc, vc, None, None, rows, torch.tensor([ML + 8], dtype=torch.int32), got, parts, nseg,
                     cfg=cfg)
    assert torch.equal(got, want)      # the length is taken as the cache's: no key of the NaN slot after it


@PAST
def test_kv_writes_skip_a_slot_past_the_cache(past):
    """write_kv and qk_norm_rope's KV write: a slot id >= the cache's slots is a padding row (nothing written)."""
    B, n, HQ = 2, 3, 2

    def run(rows):
        lens = torch.tensor([5, 7], dtype=torch.int32)
        new = torch.randn(B, n, HKV, D).bfloat16()
        big, kc, vc = framed_caches()
        write_kv(new, new, kc, vc, None, None, rows, lens)
        fused, kc, vc = framed_caches()
        qg, k, v = (torch.randn(B * n, h * D).bfloat16() for h in (2 * HQ, HKV, HKV))
        outs = qk_norm_rope(qg, k, torch.randn(D), torch.randn(D), torch.randn(B * n, D), torch.randn(B * n, D),
                            HQ, HKV, 1e-6, v=v, kv=(kc, vc, None, None, rows, lens))
        return [*outs, *big, *fused]

    assert_past_is_padding(run, torch.tensor([-1, 1], dtype=torch.int32), past)


@PAST
@pytest.mark.parametrize("nseg", [1, 3, "prefill"])
def test_attention_slot_past_the_cache_is_padding(past, nseg):
    """Attention (and the combine, over NaN partials it must not read): a slot id >= the cache's slots is a padding
    row, output 0. The slot after the cache holds finite keys: NaN ones would give a padding row's zeros too."""
    def run(rows):
        big, kc, vc = framed_caches(poison=1.0)
        q = torch.randn(2, 2, 4, D).bfloat16()
        lens = torch.tensor([ML, 9], dtype=torch.int32)
        out = torch.full_like(q, NAN)
        if nseg == "prefill":
            prefill_attention(q, kc, vc, None, None, rows, lens, out,
                              cfg=replace(verify.config(q, kc, block_m=16), block_n=16))
        else:
            verify_attention(q, kc, vc, None, None, rows, lens, out, alloc_partials(2, 4, 2, 3, D, DEV).fill_(NAN),
                             nseg, cfg=replace(verify.config(q, kc), block_n=16))
        assert (out[0] == 0).all()
        return [out, *big]

    assert_past_is_padding(run, torch.tensor([-1, 1], dtype=torch.int32), past)


def gdn_inputs(B, L, HV=2, HK=1, DK=16):
    q, k = torch.randn(B, L, HK, DK), torch.randn(B, L, HK, DK)
    return q, k, torch.randn(B, L, HV, DK), torch.randn(B, L, HV), torch.randn(B, L, HV), torch.rand(HV), \
        torch.randn(HV)


@PAST
@pytest.mark.parametrize("cfg", [None, recurrent.Config(16, 1)], ids=["default", "triton"])
def test_gdn_verify_slot_past_the_pool_is_padding(past, cfg):
    """gdn_verify, the default kernel and the Triton one: a slot id >= the pool's slots is padding. Row 0 starts
    from one (a zero state) and writes one slot of three; row 1 starts from slot 1 and writes two."""
    def run(slots):
        big, pool = framed(2, 16, 16)
        o = gdn_verify(*gdn_inputs(2, 3), pool, slots, torch.tensor([1, 2], dtype=torch.int32), cfg=cfg)
        return o, big

    assert_past_is_padding(run, torch.tensor([[-1, 0, -1], [-1, 1, 2]], dtype=torch.int32), past)


@PAST
def test_gdn_prefill_slot_past_the_pool_is_padding(past):
    """gdn_prefill: row 0 starts from a slot past the pool (zeros), row 1's final state goes to one (nowhere)."""
    def run(slots):
        big, pool = framed(2, 16, 16)
        q, k, v, a, b, A_log, dt_bias = gdn_inputs(2, 5)
        o = gdn_prefill(q, k, v, a, b, A_log, dt_bias, pool, slots[0], slots[1],
                        cfg=replace(chunked.config(q, v), chunk=16))
        return o, big

    assert_past_is_padding(run, torch.tensor([[-1, 1], [2, -1]], dtype=torch.int32), past)


@PAST
@pytest.mark.parametrize("accepted", [None, [2, 1]], ids=["prefill", "verify"])
def test_conv1d_slot_past_the_pool_is_padding(past, accepted):
    """causal_conv1d: a conv state slot past the pool is padding (zero history, nothing written)."""
    def run(slots):
        big, state = framed(8, 3 + 2)
        y = causal_conv1d(torch.randn(2, 3, 8), torch.randn(8, 4), state, slots,
                          None if accepted is None else torch.tensor(accepted, dtype=torch.int32))
        return y, big

    assert_past_is_padding(run, torch.tensor([-1, 1], dtype=torch.int32), past)


def test_embedding_ids_outside_the_table():
    w = quantize_int8_rows(torch.randn(10, 24))
    out = int8_embedding(torch.tensor([-1, 10, 2**30, 3], dtype=torch.int32), w)
    assert torch.equal(out, int8_embedding(torch.tensor([0, 9, 9, 3], dtype=torch.int32), w))


def test_rejection_of_draft_ids_outside_the_vocabulary():
    B, K, V = 3, 3, 64
    params = SamplingTensors.of([1.0, 0.0, 1.0], [0] * B, [1.0] * B, DEV)
    drafts = torch.tensor([[V, 1, 2], [-1, 3, 4], [5, 2**30, 6]], dtype=torch.int32)
    seed, off = torch.tensor([7], dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
    out, n = rejection_sample(torch.randn(B, K + 1, V), torch.randn(B, K, V), drafts, params, seed, off,
                              RejectionWorkspace(B, K, V, V, DEV))
    assert n[0] == 1 and n[1] == 1 and n[2] <= 2                # rejected at the bad id, at the latest
    assert ((out >= 0) & (out < V) | (out == -1)).all()


@pytest.mark.slow
def test_sample_nan_logits_names_a_token():
    V = 3000                                                   # a last block half padding
    logits = torch.randn(4, V)
    logits[0] = NAN
    logits[1, ::2] = NAN
    logits[2, -5:] = NAN
    for t in (0.0, 1.0):
        ids, _ = sample(logits, SamplingTensors.of([t] * 4, [0, 20, 0, 0], [1.0, 1.0, 0.9, 1.0], DEV),
                        torch.tensor([1], dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
        assert ((ids >= 0) & (ids < V)).all(), ids
        if t == 0.0:
            assert ids[3] == logits[3].argmax() and ids[2] == logits[2, :-5].argmax()


def test_accepted_count_int32_extremes():
    """-2^31 is clamped as 0 is (num_accepted - 1 must not wrap to 2^31 - 1), 2^31 - 1 as T is."""
    B, T, HV, HK, DK = 1, 3, 2, 1, 16
    gen = torch.Generator(DEV).manual_seed(0)
    q, k = torch.randn(B, T, HK, DK, generator=gen), torch.randn(B, T, HK, DK, generator=gen)
    v, a, b = torch.randn(B, T, HV, DK, generator=gen), torch.randn(B, T, HV, generator=gen), torch.randn(B, T, HV)
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    pool = torch.randn(B * T, HV, DK, DK, generator=gen)
    slots = torch.arange(T, dtype=torch.int32)[None]
    x, w, conv = torch.randn(B, T, 8, generator=gen), torch.randn(8, 4, generator=gen), torch.randn(2, 8, 3 + T - 1)
    for extreme, same_as in ((-2**31, 0), (2**31 - 1, T)):
        na, ref = torch.tensor([extreme], dtype=torch.int32), torch.tensor([same_as], dtype=torch.int32)
        got_o, want_o = (gdn_verify(q, k, v, a, b, A_log, dt_bias, pool.clone(), slots, n) for n in (na, ref))
        assert torch.equal(got_o, want_o)
        got_y, want_y = (causal_conv1d(x, w, conv.clone(), torch.tensor([1], dtype=torch.int32), n) for n in (na, ref))
        assert torch.equal(got_y, want_y)
