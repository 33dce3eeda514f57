"""graphs/runner.py in Triton's interpreter, against the plain-torch model (layers/model.py) in fp32 on exactly the
prepared weights (dequantised_reference): a tiny checkpoint with a bf16 body and the demo model with an int4 body.
Teacher-forced logits, chunked prefill, slots and padding rows that leave other sequences alone, and MTP-k greedy
output equal to k = 0's and to engine/generate.py's.

Tolerances: the runner keeps activations in bf16 between kernels (fp32 inside them), the reference in fp32. The
tiny random model amplifies rounding: per row 2–7 % relative (2-norm) with bf16 KV, fp8 KV (scale 1) adding
< 1 %, where a bf16 run of the reference itself is off by up to 18 %; the trained demo model stays within 5 %.
Paths that do the same arithmetic in another grouping (chunk sizes, a batch of two) agree to 2 %; a padding row
changes nothing, bitwise. k = 2 and k = 0 emit the same greedy tokens (the same kernels verify them)."""
import os

import pytest
import torch

from engine.generate import Generator
from engine.sampling import SamplingParams
from graphs.runner import ModelRunner
from layers.checkpoint import load_model
from layers.prepared import attention_columns, gdn_in_proj_columns, mlp_columns, prepare
from layers.quant import dequantize_int4, dequantize_int8
from tests.fixtures import CONFIGS, make_tiny_checkpoint, rel_err

CONFIG = "vl-untied"
DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "demo")


def dequantised_reference(model_dir, prepared):
    """The fp32 plain-torch model on exactly the prepared model's weights: linears dequantised and unfused, the
    int8 embedding and lm_head dequantised, norms, conv, A_log and dt_bias as prepared."""
    model, cfg = load_model(model_dir, dtype=torch.float32), prepared.cfg

    def put(module, w, cols=None):
        full = dequantize_int4(w) if prepared.body == "int4" else w.float()
        for name, where in (cols or {None: slice(None)}).items():
            target = module if name is None else getattr(module, name)
            target.weight.copy_(full[where])

    def layer(mod, w):
        mod.input_layernorm.weight.copy_(w.input_norm)
        mod.post_attention_layernorm.weight.copy_(w.post_norm)
        m = w.mixer
        if hasattr(mod, "linear_attn"):
            g, c = mod.linear_attn, gdn_in_proj_columns(cfg)
            put(g, m.in_proj, {"in_proj_qkv": slice(c["q"].start, c["v"].stop), "in_proj_z": c["z"],
                               "in_proj_b": c["b"], "in_proj_a": c["a"]})
            put(g.out_proj, m.out_proj)
            g.conv1d.weight[:, 0].copy_(m.conv_weight)
            g.A_log.copy_(m.A_log)
            g.dt_bias.copy_(m.dt_bias)
            g.norm.weight.copy_(m.norm)
        else:
            a, c = mod.self_attn, attention_columns(cfg)
            put(a, m.qkv_gate, {"q_proj": c["query_gate"], "k_proj": c["k"], "v_proj": c["v"]})
            put(a.o_proj, m.o_proj)
            a.q_norm.weight.copy_(m.q_norm)
            a.k_norm.weight.copy_(m.k_norm)
        c = mlp_columns(cfg)
        put(mod.mlp, w.mlp.gate_up, {"gate_proj": c["gate"], "up_proj": c["up"]})
        put(mod.mlp.down_proj, w.mlp.down)

    with torch.no_grad():
        for mod, w in zip(model.layers, prepared.layers):
            layer(mod, w)
        model.norm.weight.copy_(prepared.norm)
        if prepared.mtp is not None:
            mtp, w = model.mtp, prepared.mtp
            layer(mtp.layers[0], w.layer)
            put(mtp.fc, w.fc)
            for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
                getattr(mtp, name).weight.copy_(getattr(w, name))
        model.embed_tokens.weight.copy_(dequantize_int8(prepared.embed))
        if not cfg.tie_word_embeddings:
            model.lm_head.weight.copy_(dequantize_int8(prepared.lm_head))
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(prepared bf16 body, the fp32 reference on the same weights, 16 token ids)."""
    model_dir = make_tiny_checkpoint(str(tmp_path_factory.mktemp("runner")), **CONFIGS[CONFIG])
    prepared = prepare(model_dir, "cpu", body="bf16", progress=lambda *a: None)
    ref = dequantised_reference(model_dir, prepared)
    ids = torch.randint(0, 256, (16,), generator=torch.Generator().manual_seed(1)).tolist()
    return prepared, ref, ids


def runner(prepared, k=0, kv=torch.bfloat16, seqs=2):
    return ModelRunner(prepared, seqs, 64, spec_k=k, max_prefill=16, kv_dtype=kv)


def teacher_forced(r, slot, ids, n_prompt, chunks=None):
    """Logits [len(ids) − n_prompt + 1, V]: the prompt's last row, then one decode per further token."""
    start, rows = 0, []
    for size in chunks or [n_prompt]:
        logits = r.prefill(slot, ids[start:start + size], start, next_id=ids[start + size])
        start += size
    rows.append(logits.clone())
    for t in ids[n_prompt:-1]:
        rows.append(r.decode([slot], [t])[0].clone())
    return torch.stack(rows)


@pytest.mark.parametrize("kv, tol", [(torch.bfloat16, 0.1), (torch.uint8, 0.12)], ids=["bf16-kv", "fp8-kv"])
def test_logits_match_reference(tiny, kv, tol):
    prepared, ref, ids = tiny
    ids = ids[:11]
    with torch.no_grad():
        want = ref.logits(ref(torch.tensor([ids])))[0, 5:]
    got = teacher_forced(runner(prepared, kv=kv), 1, ids + [0], 6)
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert max(errs) < tol, errs


@pytest.mark.slow
def test_chunked_prefill_equals_one_pass(tiny):
    prepared, _, ids = tiny
    ids = ids[:13]
    one = teacher_forced(runner(prepared), 0, ids, 10)
    for chunks in ([3, 5, 2], [1, 9]):
        got = teacher_forced(runner(prepared), 0, ids, 10, chunks)
        assert max(rel_err(g, w) for g, w in zip(got, one)) < 0.02, chunks
    pieces = runner(prepared)
    pieces.prefill_pieces = True                     # as on CUDA: 10 tokens as passes of 8 and 2
    assert max(rel_err(g, w) for g, w in zip(teacher_forced(pieces, 0, ids, 10), one)) < 0.02


def test_slots_do_not_disturb_each_other(tiny):
    prepared, _, ids = tiny
    a, b = ids[:8], ids[8:16]
    alone = teacher_forced(runner(prepared), 1, a, 5)
    r = runner(prepared)
    r.prefill(0, b[:6], 0)
    r.prefill(1, a[:5], 0, next_id=a[5])
    both = [r.decode([1, 0], [a[5 + i], b[6 + i]])[0].clone() for i in range(2)]
    assert max(rel_err(g, w) for g, w in zip(both, alone[1:3])) < 0.02


def test_padding_row_changes_nothing(tiny):
    prepared, _, ids = tiny
    r = runner(prepared)
    r.prefill(0, ids[:5], 0)
    r.prefill(1, ids[5:9], 0)
    caches = [t.clone() for layer in r.buf.layers for t in layer if t is not None]
    with_pad = r.decode([-1, 0], [7, ids[5]])[1].clone()
    after = [t for layer in r.buf.layers for t in layer if t is not None]
    for before, now in zip(caches, after):          # slot 1's caches (KV row 1, conv row 1, GDN slots 1·(k+1)…)
        assert torch.equal(before[1], now[1])
    assert r.buf.seq_len.tolist()[:2] == [6, 4]
    ref_runner = runner(prepared)
    ref_runner.prefill(0, ids[:5], 0)
    assert torch.equal(with_pad, ref_runner.decode([0], [ids[5]])[0])


def greedy(r, slot, prompt, n):
    """n greedy tokens of the runner from a prompt; also the drafts accepted."""
    _, t = r.prefill(slot, prompt, 0, last=True)
    out, accepted = [int(t[0])], 0
    while len(out) < n:
        ids, count = r.step([slot])
        c = int(count[0])
        out += ids[0, :c].tolist()
        accepted += c - 1
    return out[:n], accepted


def batched(r, prompts, n):
    """n greedy tokens for each {slot: prompt}, decoded together with a padding row, the row order reversed
    every step (each sequence's state lives in its slot, not its row)."""
    out = {}
    for slot, prompt in prompts.items():
        out[slot] = [int(r.prefill(slot, prompt, 0, last=True)[1][0])]
    order = list(prompts) + [-1]
    while min(len(t) for t in out.values()) < n:
        ids, count = r.step(order)
        for row, slot in enumerate(order):
            if slot >= 0:
                out[slot] += ids[row, :int(count[row])].tolist()
        order = order[::-1]
    return {slot: t[:n] for slot, t in out.items()}


@pytest.mark.slow
def test_mtp_greedy_equals_plain_and_generate(tiny):
    """k = 2 gives k = 0's tokens exactly (the same kernels verify them), alone or batched with another sequence
    and a padding row; engine/generate.py's fp32 greedy output is
    the same until a near-tie that bf16 activations decide otherwise, so against the reference each runner token
    must be the argmax of the reference's logits on the runner's own context, or within 1 % of its spread."""
    prepared, ref, ids = tiny
    prompt, other = ids[:8], ids[8:13]
    plain, _ = greedy(runner(prepared, k=0), 1, prompt, 12)
    assert batched(runner(prepared, k=2, seqs=3), {2: prompt, 0: other}, 12)[2] == plain
    want = Generator(ref).generate(prompt, 12, SamplingParams(temperature=0.0), spec_k=2).token_ids
    same = next((i for i, (a, b) in enumerate(zip(plain, want)) if a != b), len(plain))
    with torch.no_grad():
        logits = ref.logits(ref(torch.tensor([prompt + plain[:-1]])))[0, len(prompt) - 1:]
    gap = logits.max(-1).values - logits.gather(-1, torch.tensor(plain)[:, None])[:, 0]
    spread = logits.max(-1).values - logits.min(-1).values
    assert (gap <= 0.01 * spread).all(), (same, gap.tolist())
    assert same >= 6, (plain, want)


@pytest.mark.slow
def test_reduced_draft_vocabulary_keeps_greedy_output(tiny):
    """Drafts from a reduced draft vocabulary (the lm_head's rows of some ids, mapped back through d2t): the
    verify decides, so greedy output is k = 0's."""
    prepared, _, ids = tiny
    prompt = ids[:8]
    plain, _ = greedy(runner(prepared, k=0), 0, prompt, 10)
    used = sorted(set(plain) | set(range(0, prepared.cfg.vocab_size, 3)))
    r = ModelRunner(prepared, 2, 64, spec_k=2, max_prefill=16, kv_dtype=torch.bfloat16, draft_tokens=used)
    assert greedy(r, 1, prompt, 10)[0] == plain
    with pytest.raises(ValueError, match="sorted distinct"):
        ModelRunner(prepared, 2, 64, spec_k=2, max_prefill=16, draft_tokens=[3, 1])


@pytest.fixture(scope="module")
def demo():
    prepared = prepare(DEMO, "cpu", body="int4", progress=lambda *a: None)
    return prepared, dequantised_reference(DEMO, prepared)


DEMO_PROMPT = [547, 1143, 868, 16, 309, 295, 263, 388, 320, 487, 309, 941, 547, 922, 868, 16, 309, 295, 263, 388]
# "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return" in the demo's tokenizer


@pytest.mark.slow
def test_demo_int4_logits_match_reference(demo):
    """The demo model (int4 body, its fused in_proj padded to 1040 columns) against the fp32 model on the
    dequantised weights: prefill and two decodes."""
    prepared, ref = demo
    ids = DEMO_PROMPT[:10]
    with torch.no_grad():
        want = ref.logits(ref(torch.tensor([ids])))[0, 7:]
    got = teacher_forced(ModelRunner(prepared, 1, 32, max_prefill=8, kv_dtype=torch.bfloat16), 0, ids + [0], 8)
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert max(errs) < 0.05, errs


@pytest.mark.slow
def test_demo_mtp_accepts_and_equals_plain(demo):
    """A trained MTP head: drafts are accepted, k = 2 still emits k = 0's greedy tokens, and they are
    engine/generate.py's on the dequantised fp32 model (the demo's predictions are far from ties)."""
    prepared, ref = demo
    make = lambda k: ModelRunner(prepared, 1, 32, spec_k=k, max_prefill=20, kv_dtype=torch.bfloat16)  # noqa: E731
    drafted, accepted = greedy(make(2), 0, DEMO_PROMPT, 7)
    plain, _ = greedy(make(0), 0, DEMO_PROMPT, 7)
    assert drafted == plain and accepted >= 2, (drafted, plain, accepted)
    assert plain == Generator(ref).generate(DEMO_PROMPT, 7, SamplingParams(temperature=0.0), spec_k=2).token_ids


@pytest.mark.slow
def test_follow_up_turn_continues_the_caches(tiny):
    """A second turn prefilled from num_cached (after MTP-k steps) gives the logits, MTP KV and next tokens of
    the whole context prefilled at once."""
    prepared, _, ids = tiny
    r = runner(prepared, k=2)
    out = [int(r.prefill(0, ids[:6], 0, last=True)[1][0])]
    for _ in range(2):
        emitted, count = r.step([0])
        out += emitted[0, :int(count[0])].tolist()
    cached = int(r.buf.seq_len[0])
    assert cached == 6 + len(out) - 1
    context = ids[:6] + out + ids[6:9]
    follow, first = r.prefill(0, context[cached:], cached, last=True)
    fresh_runner = runner(prepared, k=2)
    fresh, fresh_first = fresh_runner.prefill(0, context, 0, last=True)
    assert rel_err(follow, fresh) < 0.02 and int(first[0]) == int(fresh_first[0])
    n = len(context) - 1                          # MTP rows written by the prefill (the last: by the next step)
    for mine, theirs in zip(r.buf.mtp_kv[:2], fresh_runner.buf.mtp_kv[:2]):
        assert rel_err(mine[0, :, :n], theirs[0, :, :n]) < 0.03
    assert r.step([0])[0].tolist() == fresh_runner.step([0])[0].tolist()


@pytest.mark.slow
def test_prefill_pieces_with_drafting_keep_greedy_output(tiny):
    """Prompts prefilled as power-of-two passes (CUDA's way), in two chunks, with MTP rows per pass: k = 2 emits
    k = 0's greedy tokens."""
    prepared, _, ids = tiny
    prompt, out = ids[:11], {}
    for k in (0, 2):
        r = runner(prepared, k=k)
        r.prefill_pieces = True
        r.prefill(0, prompt[:7], 0, next_id=prompt[7])                     # passes of 4, 2, 1
        tokens = [int(r.prefill(0, prompt[7:], 7, last=True)[1][0])]        # 4
        while len(tokens) < 8:
            r.step([0])
            tokens += r.fetch(1).wait()[0]
        out[k] = tokens[:8]
    assert out[2] == out[0]


@pytest.mark.slow
def test_a_draft_count_per_bucket_keeps_greedy_output(tiny):
    """Buckets of 1, 2 and 3 rows drafting 0, 1 and 2 (bucket_k), a sequence stepped through them in turn: a round
    may verify fewer tokens than the last one accepted (the GDN slot table rotates, the conv offset shifts), and
    greedy output stays k = 0's. A round cut short (cut_round) continues as a shorter round would have."""
    prepared, _, ids = tiny
    prompt = ids[:9]
    plain, _ = greedy(runner(prepared, k=0), 0, prompt, 14)
    r = ModelRunner(prepared, 3, 64, spec_k=2, max_prefill=16, kv_dtype=torch.bfloat16, bucket_k={1: 0, 2: 1, 3: 2})
    tokens = [int(r.prefill(1, prompt, 0, last=True)[1][0])]
    widths = iter([3, 1, 3, 2, 3, 3, 1, 2, 2, 3, 1, 3] * 2)
    while len(tokens) < 14:
        width = next(widths)
        slots = [1] + [-1] * (width - 1)
        r.step(slots)
        got = r.fetch(width).wait()[0]
        if width == 3 and len(got) > 1:               # keep one token fewer, as a stop string would
            r.cut_round(1, len(got) - 1)
            got = got[:-1]
        tokens += got
    assert tokens[:14] == plain
    with pytest.raises(ValueError, match="bucket 2 drafts 3"):
        ModelRunner(prepared, 3, 64, spec_k=2, bucket_k={2: 3})
